"""One command run in a sandbox: from an ExecRequest to an ExecResult.

Builds the capture and the bwrap argv (through bwrap.py), hands bwrap its
arguments, the seccomp program and the workspace as descriptors, runs it
(through runner.py), watches the workspace's disk quota, and shapes the
answer, splitting a test-mode run into the command's part and the runner's.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxd import bwrap, testsuite
from sandboxd.errors import SandboxSetupFailed
from sandboxd.models import CommandResult, ExecRequest, ExecResult, TestsResult
from sandboxd.runner import SPAWNED, Capture, Outcome, SandboxProcess, spawning
from sandboxd.toolchains import Toolchain
from sandboxd.workspace import Owner, resolve_folder, workspace_usage

_QUOTA_CHECK_SECONDS = 1.0
_TEST_STREAMS = ("runner_stdout", "runner_stderr", "ctl")
_NETWORK_ATTEMPTS = 100


@dataclass(frozen=True)
class Placement:
    """Where and as whom a sandbox's commands run; fixed per sandbox."""

    workspace: Path
    home: Path
    etc_dir: Path
    toolchain: Toolchain
    owner: Owner | None
    bwrap: str
    seccomp_bpf: bytes | None
    tmp_bytes: int
    workspace_quota: int
    network: bool = False
    slirp4netns: str = "slirp4netns"


NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2), linux/nsfs.h


def _owning_userns(pid: int) -> int:
    """A descriptor of the user namespace bwrap created for the sandbox.

    The sandbox's processes live in a nested one (--disable-userns makes it),
    whose parent owns the network namespace.
    """
    nested = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(nested, NS_GET_PARENT)
    finally:
        os.close(nested)


def _memfd(name: str, data: bytes) -> int:
    """A descriptor bwrap reads from the start: its arguments or the seccomp program.

    A memfd, not a pipe: a pipe holds 64 KiB before the writer blocks, and a
    command can be longer than that.
    """
    # Close-on-exec like every descriptor of ours: the spawn hands it to its
    # own bwrap only, never to another sandbox started meanwhile.
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _descriptors(place: Placement, stdin: str | None) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    try:
        fds["workspace"] = os.open(place.workspace, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        if place.seccomp_bpf is not None:
            fds["seccomp"] = _memfd("sandboxd-seccomp", place.seccomp_bpf)
        if stdin is not None:
            fds["stdin"] = _memfd("sandboxd-stdin", stdin.encode())
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


@dataclass(frozen=True)
class Event:
    """Something a streaming client sees while a command runs."""

    kind: str  # "stdout", "stderr" or "phase"
    text: str


# Which events the streams of a run become; the runner's output is stdout and
# stderr too, after a "phase" event says the tests started.
_EVENT_OF = {
    "stdout": "stdout",
    "stderr": "stderr",
    "runner_stdout": "stdout",
    "runner_stderr": "stderr",
}


class Execution:
    def __init__(
        self,
        place: Placement,
        request: ExecRequest,
        rlimits: bwrap.Rlimits,
        output_bytes: int,
        test_wait_seconds: float,
    ) -> None:
        self.place = place
        self.request = request
        self.rlimits = rlimits
        groups: dict[str, str | None] = {"stdout": "command", "stderr": "command"}
        if request.test:
            groups.update(runner_stdout="runner", runner_stderr="runner", ctl=None)
        self.capture = Capture(output_bytes, groups)
        self.proc = SandboxProcess(self.capture, _TEST_STREAMS if request.test else ())
        self._wait_us = round(test_wait_seconds * 1_000_000)
        self.quota_exceeded = False
        self._network_error: str | None = None
        # Checked before anything runs: a folder inside the workspace, no links.
        self.cwd = resolve_folder(place.workspace, request.cwd) if request.cwd else ()

    def kill(self) -> None:
        self.proc.kill()

    def stream_to(self, sink: Callable[[Event], None]) -> None:
        """Send output to ``sink`` as it arrives, decoded as UTF-8 across chunk edges."""
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in _EVENT_OF}
        runner = self.place.toolchain.runner

        def on_chunk(name: str, data: bytes) -> None:
            if name == "ctl":
                if b"runner-start" in data:
                    sink(Event("phase", runner))
                return
            text = decoders[name].decode(data)
            if text:
                sink(Event(_EVENT_OF[name], text))

        self.capture.listener = on_chunk

    def _command(self) -> list[str]:
        if not self.request.test:
            return ["/bin/sh", "-c", self.request.command]
        fds = self.proc.fds
        return [
            "/bin/bash",
            "-c",
            testsuite.SUPERVISOR,
            "sandboxd-test",
            self.request.command,
            str(self._wait_us),
            str(fds["runner_stdout"]),
            str(fds["runner_stderr"]),
            str(fds["ctl"]),
            *self.place.toolchain.runner_argv,
        ]

    async def _watch_quota(self) -> None:
        while True:
            await asyncio.sleep(_QUOTA_CHECK_SECONDS)
            used = await workspace_usage(self.place.workspace)
            if used > self.place.workspace_quota:
                self.quota_exceeded = True
                self.proc.kill()
                return

    async def _start_network_helper(
        self, pid: int
    ) -> tuple[asyncio.subprocess.Process, bytes, str]:
        """Start slirp4netns once; return it, what it said on --ready-fd, and its errors."""
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        userns = _owning_userns(pid)
        try:
            argv = bwrap.slirp4netns_argv(
                self.place.slirp4netns, pid, ready_w, userns, self.place.owner
            )
            with spawning():
                helper = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=[ready_w, userns],
                    env={},
                )
            SPAWNED.add(helper.pid)
            os.close(ready_w)
            ready_w = -1
            ready = await asyncio.wait_for(asyncio.to_thread(os.read, ready_r, 1), 10)
        finally:
            os.close(ready_r)
            os.close(userns)
            if ready_w != -1:
                os.close(ready_w)
        err = ""
        if ready != b"1" and helper.stderr is not None:
            with contextlib.suppress(TimeoutError):
                err = (await asyncio.wait_for(helper.stderr.read(), 2)).decode(errors="replace")
        return helper, ready, err.strip()

    async def _attach_network(self, release_fd: int) -> None:
        """Give the sandbox its network, then let bwrap run the command.

        bwrap waits on ``--block-fd`` after building the namespaces; slirp4netns
        joins the sandbox's network namespace through its PID 1 and says when
        tap0 is configured. bwrap reports the PID a moment before the child has
        finished setting up its user namespace, so joining can fail with EPERM
        at first: that is retried briefly. On any other failure the sandbox is
        killed before the block is released, so the command never runs
        half-connected.
        """
        helper: asyncio.subprocess.Process | None = None
        try:
            pid = await self.proc.child_pid
            for _ in range(_NETWORK_ATTEMPTS):
                helper, ready, err = await self._start_network_helper(pid)
                if ready == b"1":
                    break
                await helper.wait()
                SPAWNED.discard(helper.pid)
                if "setns" not in err or "Operation not permitted" not in err:
                    raise OSError(err or "no network came up")
                await asyncio.sleep(0.01)
            else:
                raise OSError(err or "no network came up")
            os.write(release_fd, b"1")
            await asyncio.Event().wait()  # keep the helper until the command ends
        except (OSError, TimeoutError) as exc:
            self._network_error = f"slirp4netns failed: {exc}"
            self.proc.kill()
        finally:
            os.close(release_fd)
            if helper is not None:
                if helper.returncode is None:
                    helper.kill()
                    await helper.wait()
                SPAWNED.discard(helper.pid)

    async def run(self, timeout: float) -> ExecResult:
        place = self.place
        with _descriptors(place, self.request.stdin) as fds:
            attach: asyncio.Task[None] | None = None
            if place.network:
                fds["block"], release_fd = os.pipe()
                attach = asyncio.create_task(self._attach_network(release_fd))
            spec = bwrap.SandboxSpec(
                workspace=place.workspace,
                home=place.home,
                etc_dir=place.etc_dir,
                toolchain=place.toolchain,
                command=self._command(),
                drop_to=place.owner,
                rlimits=self.rlimits,
                status_fd=self.proc.status_fd,
                seccomp_fd=fds.get("seccomp"),
                workspace_fd=fds["workspace"],
                tmp_bytes=place.tmp_bytes,
                block_fd=fds.get("block"),
                network=place.network,
                cwd="/".join((bwrap.WORKSPACE, *self.cwd)),
                extra_env=dict(self.request.env),
            )
            fds["args"] = _memfd("sandboxd-args", bwrap.encode_args(bwrap.bwrap_options(spec)))
            argv = bwrap.build_argv(spec, place.bwrap, args_fd=fds["args"])
            watcher = asyncio.create_task(self._watch_quota())
            try:
                # stdin becomes descriptor 0 and only that: under its own number
                # too, the command would find it open a second time.
                passed = [fd for name, fd in fds.items() if name != "stdin"]
                outcome = await self.proc.run(
                    argv, timeout, pass_fds=passed, stdin=fds.get("stdin")
                )
            finally:
                watcher.cancel()
                # A command that wrote past the quota and exited between two
                # checks is caught here: the answer says so, and the next exec
                # is refused until files are deleted.
                if not self.quota_exceeded:
                    used = await workspace_usage(place.workspace)
                    self.quota_exceeded = used > place.workspace_quota
                if attach is not None:
                    attach.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await attach
        if self._network_error:
            raise SandboxSetupFailed(self._network_error)
        return self._result(outcome)

    def _result(self, outcome: Outcome) -> ExecResult:
        streams = self.capture.streams
        result = ExecResult(
            output=self.capture.groups["command"].text(),
            exit_code=outcome.exit_code,
            stdout=streams["stdout"].text(),
            stderr=streams["stderr"].text(),
            duration_ms=round(outcome.duration * 1000, 3),
            timed_out=outcome.timed_out,
            truncated=self.capture.truncated,
            quota_exceeded=self.quota_exceeded,
        )
        if self.request.test:
            result = _with_tests(result, self.capture, self.place.toolchain, outcome.timed_out)
        return result


def _with_tests(
    command: ExecResult, capture: Capture, toolchain: Toolchain, timed_out: bool
) -> ExecResult:
    """Split a test-mode run into the command's result and the runner's."""
    ctl = capture.streams["ctl"].text().split()
    runner_started = "runner-start" in ctl
    runner_exit = _after(ctl, "runner-exit")
    command_exit = _after(ctl, "command-exit")
    runner_stdout = capture.streams["runner_stdout"].text()
    runner_stderr = capture.streams["runner_stderr"].text()
    runner_output = capture.groups["runner"].text()
    counts = testsuite.PARSERS[toolchain.runner](runner_output, runner_exit)
    tests = TestsResult(
        runner=toolchain.runner,
        command=toolchain.runner_display,
        exit_code=runner_exit,
        passed=counts.passed,
        failed=counts.failed,
        skipped=counts.skipped,
        errors=counts.errors,
        no_tests=counts.no_tests,
        summary=_summary(counts.summary, toolchain, runner_started, runner_exit, runner_output),
        output=runner_output,
        stdout=runner_stdout,
        stderr=runner_stderr,
    )
    own = CommandResult(
        exit_code=command_exit,
        still_running=runner_exit is not None and command_exit is None,
        output=command.output,
        stdout=command.stdout,
        stderr=command.stderr,
    )
    return command.model_copy(
        update={
            "output": command.output + runner_output,
            "stdout": command.stdout + runner_stdout,
            "stderr": command.stderr + runner_stderr,
            "exit_code": runner_exit if not timed_out else None,
            "command": own,
            "tests": tests,
        }
    )


def _summary(
    parsed: str | None,
    toolchain: Toolchain,
    started: bool,
    exit_code: int | None,
    output: str,
) -> str | None:
    if not started:
        return "the time limit ran out before the tests started"
    if exit_code == 127 or (exit_code and "No module named pytest" in output):
        return f"{toolchain.runner} was not found in the sandbox: {toolchain.runner_hint}"
    if exit_code is None:
        return parsed or "the time limit ran out while the tests ran"
    return parsed


def _after(words: list[str], key: str) -> int | None:
    for i, word in enumerate(words[:-1]):
        if word == key:
            try:
                return int(words[i + 1])
            except ValueError:
                return None
    return None
