"""Spawns a bubblewrap process, streams its pipes, enforces the time limit, kills.

Theory of operation
-------------------
The daemon runs ``bwrap`` (possibly behind ``setpriv``) with stdin from
/dev/null, stdout and stderr on pipes, and optionally more pipes passed as
extra descriptors (test mode's runner output and control lines, and bwrap's
``--json-status-fd``). bwrap unshares the PID namespace, so when its first
child exits, or when bwrap itself is killed (``--die-with-parent`` takes its
init with it), the kernel kills every process in the sandbox, including
double-forked and ``setsid`` ones. Killing the one bwrap process is
therefore enough to kill the whole tree, and once it is gone every write end
of our pipes is closed, so reading to EOF always ends.

Output is kept as a bounded tail per stream (and per group of streams, for
the interleaved ``output``), so a command that prints gigabytes costs the
daemon a fixed amount of memory.

The program's failure (a non-zero exit) is data; the sandbox's failure
(bwrap could not set up, seen as no ``child-pid`` on the status pipe) is
raised as SandboxSetupFailed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import json
import os
import shutil
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandboxd.errors import SandboxSetupFailed

_EOF_GRACE_SECONDS = 5.0
_KILL_FALLBACK_SECONDS = 2.0
PR_SET_CHILD_SUBREAPER = 36

# Processes a SandboxProcess (or a network helper) waits for itself: the
# orphan reaper must leave their exit status to asyncio.
SPAWNED: set[int] = set()
# While a spawn is under way its pid is not known yet: reaping then could take
# a child asyncio is about to watch.
_spawning = 0
_ORPHAN_NAMES = (b"bwrap",)


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    global _spawning
    _spawning += 1
    try:
        yield
    finally:
        _spawning -= 1


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


KEYCTL_JOIN_SESSION_KEYRING = 1


def leave_session_keyring() -> bool:
    """Join a new, empty, anonymous session keyring.

    Sandboxes inherit the daemon's session keyring; the user's login keyring
    (with whatever keys it holds) must not be that one. seccomp refuses keyctl
    inside too: this is the second wall.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return bool(libc.syscall(250, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0)


def become_subreaper() -> bool:
    """Adopt our descendants' orphans instead of leaving them to PID 1.

    bwrap leaves one process of each sandbox behind when it exits; a PID 1
    that does not reap (as in some containers and VMs) would keep it as a
    zombie, and zombies count against the sandbox uid's RLIMIT_NPROC.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def seal_descriptors() -> None:
    """Open 0-2 if our parent closed them; make every other descriptor we hold
    close-on-exec.

    Sandboxes are spawned without a sweep of the daemon's descriptors:
    ``posix_spawn`` hands over exactly the ones it names and relies on all
    others being close-on-exec, as Python makes its own. So a descriptor our
    parent leaked to us (an editor's, a shell's) must be sealed once at
    start-up, and a closed 0, 1 or 2 must be filled, or a pipe could take that
    number and be overwritten by a child's standard streams.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor
                os.set_inheritable(int(name), False)


def reap_orphans() -> int:
    """Reap exited orphans of sandboxes adopted as subreaper; return how many.

    Looks without reaping first (WNOWAIT) and stops at any child that is not a
    sandbox orphan, so no other child's exit status is ever taken.
    """
    reaped = 0
    while not _spawning:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in SPAWNED:
            break
        try:
            fd = os.open(f"/proc/{info.si_pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
            try:
                name = os.read(fd, 64).strip()
            finally:
                os.close(fd)
        except OSError:
            break
        if name not in _ORPHAN_NAMES:
            break
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            break
        reaped += 1
    return reaped


class TailBuffer:
    """Keeps the last ``limit`` bytes fed to it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.dropped = False

    def feed(self, data: bytes) -> None:
        if len(data) >= self.limit:
            self.dropped = self.dropped or self._size > 0 or len(data) > self.limit
            self._chunks.clear()
            self._chunks.append(data[-self.limit :])
            self._size = self.limit
            return
        self._chunks.append(data)
        self._size += len(data)
        while self._size > self.limit:
            excess = self._size - self.limit
            head = self._chunks[0]
            if len(head) <= excess:
                self._chunks.popleft()
                self._size -= len(head)
            else:
                self._chunks[0] = head[excess:]
                self._size -= excess
            self.dropped = True

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        return self.getvalue().decode("utf-8", errors="replace")


class Capture:
    """Named streams, each kept as a tail, and interleaved per group in arrival order."""

    def __init__(self, limit: int, groups: dict[str, str | None]) -> None:
        self.streams = {name: TailBuffer(limit) for name in groups}
        self._group_of = groups
        self.groups = {g: TailBuffer(2 * limit) for g in set(groups.values()) if g is not None}
        # Called with every chunk as it arrives (streaming exec); never buffers.
        self.listener: Callable[[str, bytes], None] | None = None

    def feed(self, name: str, data: bytes) -> None:
        if self.listener is not None:
            self.listener(name, data)
        self.streams[name].feed(data)
        group = self._group_of[name]
        if group is not None:
            self.groups[group].feed(data)

    @property
    def truncated(self) -> bool:
        return any(b.dropped for b in (*self.streams.values(), *self.groups.values()))


@dataclass
class Outcome:
    exit_code: int | None
    timed_out: bool
    killed: bool
    duration: float
    status: list[dict[str, Any]] = field(default_factory=list)


class SandboxProcess:
    """One bwrap run. Create it, put ``fds`` into the argv, then ``await run(argv)``.

    The process is started with ``posix_spawn`` (vfork and exec, nothing of
    the daemon copied) and watched straight from the event loop: a pidfd says
    when it has exited, and each pipe's read end is a plain reader callback.
    asyncio's subprocess transports did the same with a Popen object, a
    transport and protocol per pipe and a child watcher, which cost about a
    millisecond of CPU per exec: a tenth of bubblewrap's own start.
    """

    def __init__(self, capture: Capture, extra_streams: Sequence[str] = ()) -> None:
        self.capture = capture
        self._pipes: dict[str, tuple[int, int]] = {}
        for name in ("stdout", "stderr", *extra_streams, "_status"):
            self._pipes[name] = os.pipe2(os.O_CLOEXEC)
        self._status = bytearray()
        # Resolved with the sandbox's PID 1 (as the host sees it) once bwrap
        # reports it: what a network helper needs to join the namespaces.
        self.child_pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pid: int | None = None
        # Open from the spawn until the process is reaped: signals go through
        # it, so they can never reach another process that reused the pid.
        self._pidfd: int | None = None
        self._returncode: int | None = None
        self._killed = False
        self._status_closed = False
        self._fallback: asyncio.TimerHandle | None = None

    @property
    def fds(self) -> dict[str, int]:
        """The write-end descriptor numbers the child will see, by stream name."""
        return {
            name: w
            for name, (_, w) in self._pipes.items()
            if name not in ("stdout", "stderr", "_status")
        }

    @property
    def status_fd(self) -> int:
        return self._pipes["_status"][1]

    def kill(self) -> None:
        """Kill the sandbox: its PID 1 (and so, through the PID namespace, everything
        in it) and bwrap.

        Killing bwrap alone is not enough while it is still setting up: its child
        may not have armed --die-with-parent yet and would live on, orphaned. So
        the sandbox's PID 1 is killed by pid, and until bwrap has reported that
        pid, bwrap is left alive (for at most _KILL_FALLBACK_SECONDS) so the
        report can still come.
        """
        self._killed = True
        if self._pid is None:
            return  # run() kills as soon as there is something to kill
        if self.child_pid.done() and not self.child_pid.cancelled():
            _sigkill(self.child_pid.result())
            self._kill_bwrap()
        elif self._status_closed:
            self._kill_bwrap()  # bwrap will never report a child
        elif self._fallback is None:
            loop = asyncio.get_running_loop()
            self._fallback = loop.call_later(_KILL_FALLBACK_SECONDS, self._kill_bwrap)

    def _kill_bwrap(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _on_status(self, data: bytes) -> None:
        self._status.extend(data)
        if not self.child_pid.done() and b'"child-pid"' in self._status:
            for doc in _parse_status(bytes(self._status)):
                if "child-pid" in doc:
                    self.child_pid.set_result(int(doc["child-pid"]))
                    if self._killed:
                        self.kill()
                    break

    def _on_status_closed(self) -> None:
        self._status_closed = True
        if self._killed:
            self.kill()

    def _sink(self, name: str) -> Callable[[bytes], None]:
        if name == "_status":
            return self._on_status
        return lambda data: self.capture.feed(name, data)

    def _close_all(self) -> None:
        for r, w in self._pipes.values():
            for fd in (r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pipes.clear()

    def _spawn(self, argv: Sequence[str], pass_fds: Sequence[int], stdin: int | None) -> int:
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) if stdin is None else -1
        actions: list[tuple[int, int, int]] = [
            (os.POSIX_SPAWN_DUP2, stdin if stdin is not None else devnull, 0),
            (os.POSIX_SPAWN_DUP2, self._pipes["stdout"][1], 1),
            (os.POSIX_SPAWN_DUP2, self._pipes["stderr"][1], 2),
        ]
        # Every descriptor of ours is close-on-exec; a dup2 onto itself clears
        # the flag in the child only (glibc 2.29+, POSIX 2024), so exactly the
        # descriptors named here are inherited.
        keep = [w for name, (_, w) in self._pipes.items() if name not in ("stdout", "stderr")]
        actions += [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in (*keep, *pass_fds)]
        try:
            with spawning():
                pid = os.posix_spawn(
                    _executable(argv[0]),
                    list(argv),
                    {},
                    file_actions=actions,
                    setsigmask=(),
                    setsigdef=_DEFAULT_SIGNALS,
                )
                SPAWNED.add(pid)
        finally:
            if devnull != -1:
                os.close(devnull)
        return pid

    async def run(
        self,
        argv: Sequence[str],
        timeout: float,
        pass_fds: Sequence[int] = (),
        stdin: int | None = None,
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            pid = self._spawn(argv, pass_fds, stdin)
        except OSError as exc:
            self._close_all()
            raise SandboxSetupFailed(f"Could not start {argv[0]}: {exc}") from exc
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            # Out of descriptors (or a kernel without pidfds): the process runs
            # but cannot be watched. Kill and reap it here, or its zombie would
            # stay first in line and stop every later orphan reap.
            _sigkill(pid)
            await asyncio.to_thread(os.waitpid, pid, 0)
            SPAWNED.discard(pid)
            self._close_all()
            raise SandboxSetupFailed(f"Could not watch {argv[0]}: {exc}") from exc
        self._pid, self._pidfd = pid, pidfd
        exited: asyncio.Future[None] = loop.create_future()
        waits = [exited]
        readers: list[int] = []
        try:
            loop.add_reader(pidfd, self._on_exit, exited)
            for name in list(self._pipes):
                # Taken out of _pipes one by one, so that _close_all never
                # closes a descriptor twice (its number may be reused by then).
                r, w = self._pipes.pop(name)
                os.close(w)
                readers.append(r)
                os.set_blocking(r, False)
                eof: asyncio.Future[None] = loop.create_future()
                if name == "_status":
                    eof.add_done_callback(lambda _: self._on_status_closed())
                waits.append(eof)
                loop.add_reader(r, _read_ready, r, self._sink(name), eof)
            timed_out = False
            if self._killed:  # killed before the process existed
                self.kill()
            try:
                # asyncio.wait, not wait_for: a timeout must not cancel the futures
                # we still wait on after the kill.
                _, pending = await asyncio.wait(waits, timeout=timeout)
                if pending:
                    timed_out = not self._killed
                    self.kill()
                    await asyncio.wait(pending, timeout=_EOF_GRACE_SECONDS)
            except asyncio.CancelledError:
                self.kill()
                raise
        finally:
            for r in readers:
                loop.remove_reader(r)
                os.close(r)
            if not exited.done():
                # Still running (cancelled, or stuck past the grace period): kill
                # it; the pidfd reader stays and reaps it when it is gone.
                self._kill_bwrap()
            self._close_all()
            if self._fallback is not None:
                self._fallback.cancel()
            reap_orphans()
            if not self.child_pid.done():
                self.child_pid.cancel()
        duration = time.monotonic() - started
        status = _parse_status(bytes(self._status))
        returncode = self._returncode
        exit_code: int | None = None
        for doc in status:
            if "exit-code" in doc:
                exit_code = int(doc["exit-code"])
        if exit_code is None and returncode is not None and returncode >= 0:
            exit_code = returncode
        started_child = any("child-pid" in doc for doc in status)
        if not started_child and not timed_out and not self._killed:
            message = self.capture.streams["stderr"].text().strip()
            raise SandboxSetupFailed(
                f"bubblewrap could not create the sandbox: {message or f'exit status {returncode}'}"
            )
        killed_by_us = timed_out or self._killed
        return Outcome(
            exit_code=None if killed_by_us else exit_code,
            timed_out=timed_out,
            killed=self._killed and not timed_out,
            duration=duration,
            status=status,
        )

    def _on_exit(self, exited: asyncio.Future[None]) -> None:
        """The pidfd is readable: the process has exited; reap it."""
        assert self._pid is not None and self._pidfd is not None
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self._pid, -1
        if pid == 0:
            return  # not yet (spurious wake-up)
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        if status != -1:
            self._returncode = os.waitstatus_to_exitcode(status)
        SPAWNED.discard(self._pid)
        if not exited.done():
            exited.set_result(None)


# What asyncio's pipe transports read at once.
_READ_SIZE = 256 * 1024


def _read_ready(fd: int, sink: Callable[[bytes], None], eof: asyncio.Future[None]) -> None:
    try:
        data = os.read(fd, _READ_SIZE)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if data:
        sink(data)
        return
    asyncio.get_running_loop().remove_reader(fd)
    if not eof.done():
        eof.set_result(None)


# The child starts with every signal at its default disposition and none
# blocked: Python ignores SIGPIPE and SIGXFSZ, and an ignored signal would
# survive the exec into the sandbox (``yes | head`` would never end). glibc
# keeps its two internal real-time signals (32, 33) out of any signal set and
# leaves them ignored in a posix_spawn child; glibc programs install their
# own handlers for them when they need them.
_DEFAULT_SIGNALS = tuple(
    s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
)


@functools.lru_cache(maxsize=8)
def _executable(name: str) -> str:
    """The launcher's path, looked up as exec with an empty environment would
    (posix_spawnp would use the daemon's own PATH instead)."""
    if "/" in name:
        return name
    found = shutil.which(name, path=os.defpath)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"{name} not found in {os.defpath}")
    return found


_DECODER = json.JSONDecoder()


def _parse_status(raw: bytes) -> list[dict[str, Any]]:
    """bwrap writes several JSON documents, one after another, to the status fd."""
    docs: list[dict[str, Any]] = []
    decoder = _DECODER
    text = raw.decode("utf-8", errors="replace")
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return docs
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return docs
        if isinstance(doc, dict):
            docs.append(doc)
