"""The sandbox registry and lifecycle: create, look up, upload, exec, delete.

On disk, under the data directory::

    sandboxes/<id>/sandbox.json   the record (written to a temp file, then renamed)
    sandboxes/<id>/workspace/     bound read-write at /workspace
    sandboxes/<id>/home/          bound at /home/sandbox: pip --user, go caches
    sandboxes/<id>/tmp/           uploads being received and archives being staged
    trash/<id>/                   a sandbox being deleted
    etc/                          passwd, group, hosts... bound into every sandbox

A sandbox appears by renaming a complete ``.new-<id>`` folder into place and
disappears by renaming it into ``trash/`` first, so a crash at any moment
leaves either the whole sandbox or none; ``open()`` finishes what a crash
interrupted. Records are immutable after create, so nothing on the exec
path writes to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sandboxd import archive, bwrap, testsuite
from sandboxd.config import Settings
from sandboxd.errors import (
    InvalidRequest,
    PayloadTooLarge,
    SandboxDeleted,
    SandboxNotFound,
    SandboxSetupFailed,
    ShuttingDown,
    ToolchainMissing,
)
from sandboxd.models import (
    ArchiveUploaded,
    CommandResult,
    CreateSandboxRequest,
    ExecRequest,
    ExecResult,
    FileUploaded,
    Language,
    Sandbox,
    SandboxStatus,
    TestsResult,
)
from sandboxd.runner import Capture, SandboxProcess
from sandboxd.toolchains import Toolchain
from sandboxd.workspace import Owner, install_file, merge_tree, remove_tree, validate_filename

RECORD = "sandbox.json"
_POLL_STEP = 0.05  # the supervisor's wait granularity, in seconds


@dataclass
class _Live:
    """A sandbox as the daemon holds it: the persisted record plus runtime state."""

    id: str
    language: Language
    created_at: datetime
    labels: dict[str, str]
    root: Path
    running: set[SandboxProcess] = field(default_factory=set)
    last_exec_at: datetime | None = None
    deleted: bool = False

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def to_model(self) -> Sandbox:
        if self.running:
            status = SandboxStatus.running
        elif self.last_exec_at is None:
            status = SandboxStatus.created
        else:
            status = SandboxStatus.idle
        return Sandbox(
            id=self.id,
            language=self.language,
            status=status,
            created_at=self.created_at,
            labels=self.labels,
            workspace=str(self.workspace),
            running_commands=len(self.running),
            last_exec_at=self.last_exec_at,
        )


def _write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class SandboxManager:
    def __init__(self, settings: Settings, toolchains: dict[Language, Toolchain]) -> None:
        self.settings = settings
        self.toolchains = toolchains
        self.data_dir = settings.data_dir
        self.sandboxes_dir = self.data_dir / "sandboxes"
        self.trash_dir = self.data_dir / "trash"
        self.etc_dir = self.data_dir / "etc"
        # Root never runs sandboxed code as itself: it drops to an unprivileged uid.
        self.owner: Owner | None = (
            Owner(settings.sandbox_uid, settings.sandbox_gid) if os.geteuid() == 0 else None
        )
        self._dir_mode = 0o711 if self.owner else 0o700
        self._sandboxes: dict[str, _Live] = {}
        self._closing = False

    # -- start-up and shut-down ------------------------------------------------

    def open(self) -> None:
        """Create the layout, finish interrupted creates and deletes, load records."""
        for d in (self.data_dir, self.sandboxes_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, self._dir_mode)
        self.trash_dir.mkdir(mode=0o700, exist_ok=True)
        self._write_etc()
        for leftover in self.trash_dir.iterdir():
            remove_tree(leftover)
        for entry in self.sandboxes_dir.iterdir():
            if entry.name.startswith("."):
                remove_tree(entry)  # a create that did not finish
                continue
            live = self._load(entry)
            if live is not None:
                self._sandboxes[live.id] = live

    def _write_etc(self) -> None:
        self.etc_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.etc_dir, 0o755)
        for name, text in bwrap.etc_file_contents().items():
            _write_atomic(self.etc_dir / name, text.encode(), 0o644)

    def _load(self, root: Path) -> _Live | None:
        try:
            raw = json.loads((root / RECORD).read_text(encoding="utf-8"))
            live = _Live(
                id=raw["id"],
                language=Language(raw["language"]),
                created_at=datetime.fromisoformat(raw["created_at"]),
                labels=dict(raw.get("labels", {})),
                root=root,
            )
        except (OSError, ValueError, KeyError, TypeError):
            # Not ours or damaged: leave it for a person to look at, do not guess.
            return None
        if live.id != root.name:
            return None
        # Uploads that were being received when the daemon stopped.
        remove_tree(live.tmp)
        live.tmp.mkdir(mode=0o700)
        return live

    async def selftest(self) -> None:
        """Run ``true`` under the full isolation once; raise SandboxSetupFailed if bwrap cannot."""
        probe = self.data_dir / "probe"
        remove_tree(probe)
        probe.mkdir(mode=self._dir_mode)
        try:
            for sub in ("workspace", "home"):
                (probe / sub).mkdir(mode=0o700)
                if self.owner:
                    os.chown(probe / sub, self.owner.uid, self.owner.gid)
            capture = Capture(64 * 1024, {"stdout": "command", "stderr": "command"})
            proc = SandboxProcess(capture)
            spec = bwrap.SandboxSpec(
                workspace=probe / "workspace",
                home=probe / "home",
                etc_dir=self.etc_dir,
                toolchain=self.toolchains[Language.python],
                command=["/bin/true"],
                drop_to=self.owner,
                status_fd=proc.status_fd,
            )
            outcome = await proc.run(bwrap.build_argv(spec, self.settings.bwrap), timeout=30)
            if outcome.exit_code != 0:
                raise SandboxSetupFailed(
                    f"/bin/true exited {outcome.exit_code} in the sandbox: "
                    + capture.streams["stderr"].text()
                )
        finally:
            remove_tree(probe)

    async def close(self) -> None:
        """Refuse new work and kill every running command."""
        self._closing = True
        for live in self._sandboxes.values():
            for proc in list(live.running):
                proc.kill()

    # -- registry ---------------------------------------------------------------

    def _get(self, sandbox_id: str) -> _Live:
        live = self._sandboxes.get(sandbox_id)
        if live is None:
            raise SandboxNotFound(f"No sandbox has the id {sandbox_id!r}.")
        return live

    def get(self, sandbox_id: str) -> Sandbox:
        return self._get(sandbox_id).to_model()

    def list(self) -> list[Sandbox]:
        return [s.to_model() for s in sorted(self._sandboxes.values(), key=lambda s: s.created_at)]

    @property
    def count(self) -> int:
        return len(self._sandboxes)

    @property
    def running_commands(self) -> int:
        return sum(len(s.running) for s in self._sandboxes.values())

    def _check_open(self) -> None:
        if self._closing:
            raise ShuttingDown("The daemon is shutting down; try again once it is back.")

    def create(self, request: CreateSandboxRequest) -> Sandbox:
        self._check_open()
        sandbox_id = f"sb-{secrets.token_hex(8)}"
        created_at = datetime.now(UTC)
        staging = self.sandboxes_dir / f".new-{sandbox_id}"
        staging.mkdir(mode=self._dir_mode)
        try:
            for sub in ("workspace", "home"):
                (staging / sub).mkdir(mode=0o700)
                if self.owner:
                    os.chown(staging / sub, self.owner.uid, self.owner.gid)
            (staging / "tmp").mkdir(mode=0o700)
            record = {
                "id": sandbox_id,
                "language": request.language.value,
                "created_at": created_at.isoformat(),
                "labels": request.labels,
            }
            _write_atomic(staging / RECORD, json.dumps(record).encode())
            root = self.sandboxes_dir / sandbox_id
            os.rename(staging, root)
        except BaseException:
            remove_tree(staging)
            raise
        live = _Live(sandbox_id, request.language, created_at, dict(request.labels), root)
        self._sandboxes[sandbox_id] = live
        return live.to_model()

    async def delete(self, sandbox_id: str) -> None:
        live = self._get(sandbox_id)
        live.deleted = True
        for proc in list(live.running):
            proc.kill()
        del self._sandboxes[sandbox_id]
        grave = self.trash_dir / f"{sandbox_id}-{secrets.token_hex(4)}"
        os.rename(live.root, grave)
        await asyncio.to_thread(remove_tree, grave)

    # -- uploads ----------------------------------------------------------------

    async def _receive(self, live: _Live, chunks: AsyncIterator[bytes], limit: int) -> Path:
        """Stream an upload body into the sandbox's private tmp folder, within ``limit``."""
        path = live.tmp / f"upload-{secrets.token_hex(8)}"
        size = 0
        try:
            # Page-cache writes of 256 KiB chunks: a thread hop per chunk costs more.
            with open(path, "xb") as out:  # noqa: ASYNC230
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(
                            f"The upload is larger than the limit of {limit} bytes "
                            "(limits.upload_bytes in the config file)."
                        )
                    out.write(chunk)
                if self.owner:
                    os.fchown(out.fileno(), self.owner.uid, self.owner.gid)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return path

    def _ensure_present(self, live: _Live) -> None:
        if live.deleted:
            raise SandboxNotFound(f"The sandbox {live.id!r} was deleted during the upload.")

    async def put_file(
        self, sandbox_id: str, filename: str | None, chunks: AsyncIterator[bytes]
    ) -> FileUploaded:
        self._check_open()
        live = self._get(sandbox_id)
        name = validate_filename(filename)
        path = await self._receive(live, chunks, self.settings.limits.upload_bytes)
        try:
            self._ensure_present(live)
            size = path.stat().st_size
            os.chmod(path, 0o644)
            install_file(path, live.workspace, name)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        return FileUploaded(filename=name, size=size)

    async def put_archive(self, sandbox_id: str, chunks: AsyncIterator[bytes]) -> ArchiveUploaded:
        self._check_open()
        live = self._get(sandbox_id)
        path = await self._receive(live, chunks, self.settings.limits.upload_bytes)
        staging = live.tmp / f"staging-{secrets.token_hex(8)}"
        limits = self.settings.limits
        try:
            staging.mkdir(mode=0o700)
            extracted = await asyncio.to_thread(
                archive.extract,
                path,
                staging,
                archive.ArchiveLimits(
                    limits.archive_unpacked_bytes, limits.archive_entries, limits.archive_path_bytes
                ),
                self.owner,
            )
            self._ensure_present(live)
            await asyncio.to_thread(merge_tree, staging, live.workspace)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
            await asyncio.to_thread(remove_tree, staging)
        return ArchiveUploaded(files=extracted.files, bytes=extracted.bytes)

    # -- exec -------------------------------------------------------------------

    def _timeout(self, requested: float | None) -> float:
        limits = self.settings.limits
        if requested is None:
            return limits.exec_timeout_default
        if requested > limits.exec_timeout_max:
            raise InvalidRequest(
                f"timeout {requested:g} s is over the maximum of {limits.exec_timeout_max:g} s.",
                errors=[{"field": "timeout", "message": f"at most {limits.exec_timeout_max:g}"}],
            )
        return requested

    def _toolchain(self, language: Language) -> Toolchain:
        toolchain = self.toolchains[language]
        why = toolchain.missing()
        if why:
            raise ToolchainMissing(f"The {language.value} toolchain cannot run: {why}.")
        return toolchain

    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        self._check_open()
        live = self._get(sandbox_id)
        toolchain = self._toolchain(live.language)
        timeout = self._timeout(request.timeout)
        limit = self.settings.limits.output_bytes
        if request.test:
            capture = Capture(
                limit,
                {
                    "stdout": "command",
                    "stderr": "command",
                    "runner_stdout": "runner",
                    "runner_stderr": "runner",
                    "ctl": None,
                },
            )
            proc = SandboxProcess(capture, ("runner_stdout", "runner_stderr", "ctl"))
            steps = round(self.settings.limits.test_wait_seconds / _POLL_STEP)
            fds = proc.fds
            command = [
                "/bin/bash",
                "-c",
                testsuite.SUPERVISOR,
                "sandboxd-test",
                request.command,
                str(steps),
                str(fds["runner_stdout"]),
                str(fds["runner_stderr"]),
                str(fds["ctl"]),
                *toolchain.runner_argv,
            ]
        else:
            capture = Capture(limit, {"stdout": "command", "stderr": "command"})
            proc = SandboxProcess(capture)
            command = ["/bin/sh", "-c", request.command]
        spec = bwrap.SandboxSpec(
            workspace=live.workspace,
            home=live.home,
            etc_dir=self.etc_dir,
            toolchain=toolchain,
            command=command,
            drop_to=self.owner,
            status_fd=proc.status_fd,
        )
        argv = bwrap.build_argv(spec, self.settings.bwrap)
        live.running.add(proc)
        live.last_exec_at = datetime.now(UTC)
        try:
            outcome = await proc.run(argv, timeout)
        finally:
            live.running.discard(proc)
        if live.deleted:
            raise SandboxDeleted(f"The sandbox {live.id!r} was deleted while the command ran.")
        streams = capture.streams
        result = ExecResult(
            output=capture.groups["command"].text(),
            exit_code=outcome.exit_code,
            stdout=streams["stdout"].text(),
            stderr=streams["stderr"].text(),
            duration_ms=round(outcome.duration * 1000, 3),
            timed_out=outcome.timed_out,
            truncated=capture.truncated,
        )
        if request.test:
            result = _with_tests(result, capture, toolchain, outcome.timed_out)
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
