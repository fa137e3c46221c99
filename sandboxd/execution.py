"""One command run in a sandbox: from an ExecRequest to an ExecResult.

Builds the capture and the bwrap argv (through bwrap.py), hands bwrap its
arguments, the seccomp program and the workspace as descriptors, runs it
(through runner.py), watches the workspace's disk quota, and shapes the
answer, splitting a test-mode run into the command's part and the runner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxd import bwrap, testsuite
from sandboxd.models import CommandResult, ExecRequest, ExecResult, TestsResult
from sandboxd.runner import Capture, Outcome, SandboxProcess
from sandboxd.toolchains import Toolchain
from sandboxd.workspace import Owner, disk_usage

_POLL_STEP = 0.05  # the supervisor's wait granularity, in seconds
_QUOTA_CHECK_SECONDS = 1.0
_TEST_STREAMS = ("runner_stdout", "runner_stderr", "ctl")


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


def _memfd(name: str, data: bytes) -> int:
    """A descriptor bwrap reads from the start: its arguments or the seccomp program.

    A memfd, not a pipe: a pipe holds 64 KiB before the writer blocks, and a
    command can be longer than that.
    """
    fd = os.memfd_create(name, 0)  # inheritable: bwrap must see it
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
def _descriptors(place: Placement) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    try:
        fds["workspace"] = os.open(place.workspace, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        if place.seccomp_bpf is not None:
            fds["seccomp"] = _memfd("sandboxd-seccomp", place.seccomp_bpf)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


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
        self._steps = round(test_wait_seconds / _POLL_STEP)
        self.quota_exceeded = False

    def kill(self) -> None:
        self.proc.kill()

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
            str(self._steps),
            str(fds["runner_stdout"]),
            str(fds["runner_stderr"]),
            str(fds["ctl"]),
            *self.place.toolchain.runner_argv,
        ]

    async def _watch_quota(self) -> None:
        while True:
            await asyncio.sleep(_QUOTA_CHECK_SECONDS)
            used = await asyncio.to_thread(disk_usage, self.place.workspace)
            if used > self.place.workspace_quota:
                self.quota_exceeded = True
                self.proc.kill()
                return

    async def run(self, timeout: float) -> ExecResult:
        place = self.place
        with _descriptors(place) as fds:
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
            )
            fds["args"] = _memfd("sandboxd-args", bwrap.encode_args(bwrap.bwrap_options(spec)))
            argv = bwrap.build_argv(spec, place.bwrap, args_fd=fds["args"])
            watcher = asyncio.create_task(self._watch_quota())
            try:
                outcome = await self.proc.run(argv, timeout, pass_fds=list(fds.values()))
            finally:
                watcher.cancel()
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
