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
import json
import os
import signal
import subprocess
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
_ORPHAN_NAMES = ("bwrap",)


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
            with open(f"/proc/{info.si_pid}/comm") as comm:
                name = comm.read().strip()
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


class _StdioProtocol(asyncio.SubprocessProtocol):
    def __init__(self, capture: Capture, done: asyncio.Future[None]) -> None:
        self._capture = capture
        self._done = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The process exists from here until asyncio has reaped it: the orphan
        # reaper must not take its exit status.
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._pid = transport.get_pid()
        SPAWNED.add(self._pid)

    def process_exited(self) -> None:
        SPAWNED.discard(self._pid)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._capture.feed("stdout" if fd == 1 else "stderr", data)

    def connection_lost(self, exc: Exception | None) -> None:
        # Called once the process has exited and both pipes are closed.
        if not self._done.done():
            self._done.set_result(None)


class _ReadProtocol(asyncio.Protocol):
    def __init__(self, sink: Any, done: asyncio.Future[None]) -> None:
        self._sink = sink
        self._done = done

    def data_received(self, data: bytes) -> None:
        self._sink(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


class SandboxProcess:
    """One bwrap run. Create it, put ``fds`` into the argv, then ``await run(argv)``."""

    def __init__(self, capture: Capture, extra_streams: Sequence[str] = ()) -> None:
        self.capture = capture
        self._pipes: dict[str, tuple[int, int]] = {}
        for name in (*extra_streams, "_status"):
            self._pipes[name] = os.pipe2(os.O_CLOEXEC)
        self._status = bytearray()
        # Resolved with the sandbox's PID 1 (as the host sees it) once bwrap
        # reports it: what a network helper needs to join the namespaces.
        self.child_pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.SubprocessTransport | None = None
        self._killed = False
        self._status_closed = False
        self._fallback: asyncio.TimerHandle | None = None

    @property
    def fds(self) -> dict[str, int]:
        """The write-end descriptor numbers the child will see, by stream name."""
        return {name: w for name, (_, w) in self._pipes.items() if name != "_status"}

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
        if self._transport is None:
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
        if self._transport is not None and self._transport.get_returncode() is None:
            try:
                self._transport.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _on_status(self, data: bytes) -> None:
        self._status.extend(data)
        if not self.child_pid.done():
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

    def _close_all(self) -> None:
        for r, w in self._pipes.values():
            for fd in (r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pipes.clear()

    async def run(
        self,
        argv: Sequence[str],
        timeout: float,
        pass_fds: Sequence[int] = (),
        stdin: int | None = None,
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        waits: list[asyncio.Future[None]] = []
        stdio_done: asyncio.Future[None] = loop.create_future()
        waits.append(stdio_done)
        write_fds = [w for _, w in self._pipes.values()] + list(pass_fds)
        try:
            with spawning():
                transport, _ = await loop.subprocess_exec(
                    lambda: _StdioProtocol(self.capture, stdio_done),
                    *argv,
                    stdin=subprocess.DEVNULL if stdin is None else stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=write_fds,
                    close_fds=True,
                    env={},
                )
        except OSError as exc:
            self._close_all()
            raise SandboxSetupFailed(f"Could not start {argv[0]}: {exc}") from exc
        self._transport = transport
        readers: list[asyncio.ReadTransport] = []
        try:
            for name, (r, w) in list(self._pipes.items()):
                os.close(w)
                done: asyncio.Future[None] = loop.create_future()
                waits.append(done)
                if name == "_status":
                    done.add_done_callback(lambda _: self._on_status_closed())
                sink = self._on_status if name == "_status" else _feeder(self.capture, name)
                pipe = os.fdopen(r, "rb", buffering=0)
                reader, _ = await loop.connect_read_pipe(_protocol_factory(sink, done), pipe)
                readers.append(reader)
            self._pipes.clear()
            timed_out = False
            if self._killed:  # killed before the transport existed
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
            for reader in readers:
                reader.close()
            transport.close()
            self._close_all()
            if self._fallback is not None:
                self._fallback.cancel()
            reap_orphans()
            if not self.child_pid.done():
                self.child_pid.cancel()
        duration = time.monotonic() - started
        status = _parse_status(bytes(self._status))
        returncode = transport.get_returncode()
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


def _protocol_factory(
    sink: Callable[[bytes], Any], done: asyncio.Future[None]
) -> Callable[[], _ReadProtocol]:
    return lambda: _ReadProtocol(sink, done)


def _feeder(capture: Capture, name: str) -> Any:
    return lambda data: capture.feed(name, data)


def _parse_status(raw: bytes) -> list[dict[str, Any]]:
    """bwrap writes several JSON documents, one after another, to the status fd."""
    docs: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
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
