"""The sandbox registry and lifecycle: create, look up, upload, exec, delete.

On disk, under the data directory::

    sandboxes/<id>/sandbox.json   the record (written to a temp file, then renamed)
    sandboxes/<id>/workspace/     bound read-write at /workspace
    sandboxes/<id>/home/          bound at /home/sandbox: pip --user, go caches
    sandboxes/<id>/tmp/           uploads being received and archives being staged
    trash/<id>-*/                 a sandbox being deleted
    etc/                          passwd, group, hosts bound into every sandbox

A sandbox appears by renaming a complete ``.new-<id>`` folder into place and
disappears by renaming it into ``trash/`` first, so a crash at any moment
leaves either the whole sandbox or none; ``open()`` finishes what a crash
interrupted. Records are immutable after create, so nothing on the exec
path writes to disk.

Run as root, each sandbox gets a host uid of its own (from
``sandbox_uid_start``): its files are owned by it and its commands run as
it, so RLIMIT_NPROC bounds each sandbox separately and no sandbox can touch
another's files even outside its mount namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sandboxd import archive, bwrap, files, runner, seccomp
from sandboxd.config import Settings
from sandboxd.errors import (
    InvalidRequest,
    NetworkUnavailable,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxDeleted,
    SandboxNotFound,
    SandboxSetupFailed,
    ShuttingDown,
    ToolchainMissing,
    TooManyRequests,
)
from sandboxd.execution import Event, Execution, Placement
from sandboxd.models import (
    ArchiveUploaded,
    CreateSandboxRequest,
    ExecLimits,
    ExecRequest,
    ExecResult,
    FileEntry,
    FileList,
    FileUploaded,
    Language,
    Sandbox,
    SandboxStatus,
)
from sandboxd.toolchains import Toolchain
from sandboxd.workspace import (
    Owner,
    install_file,
    merge_tree,
    remove_tree,
    split_path,
    validate_filename,
    workspace_usage,
)

log = logging.getLogger("sandboxd.sandboxes")

RECORD = "sandbox.json"
_REAP_SECONDS = 1.0
_LIST_LIMIT = 100_000  # entries in one listing; more is reported as truncated


@dataclass
class _Live:
    """A sandbox as the daemon holds it: the persisted record plus runtime state."""

    id: str
    language: Language
    created_at: datetime
    labels: dict[str, str]
    root: Path
    owner: Owner | None
    network: bool = False
    running: set[Execution] = field(default_factory=set)
    last_exec_at: datetime | None = None
    deleted: bool = False
    # The last command left the workspace over its quota: checked again (a
    # walk of the workspace) before the next one runs.
    over_quota: bool = False
    _workspace_text: str | None = None  # cached: listing 10,000 sandboxes is hot

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
        if self._workspace_text is None:
            self._workspace_text = str(self.workspace)
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
            network=self.network,
            workspace=self._workspace_text,
            running_commands=len(self.running),
            last_exec_at=self.last_exec_at,
        )

    def record(self) -> dict[str, object]:
        data: dict[str, object] = {
            "id": self.id,
            "language": self.language.value,
            "created_at": self.created_at.isoformat(),
            "labels": self.labels,
            "network": self.network,
        }
        if self.owner is not None:
            data["uid"] = self.owner.uid
        return data


def _write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _chown_tree(root: Path, owner: Owner) -> None:
    os.lchown(root, owner.uid, owner.gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), owner.uid, owner.gid)


class SandboxManager:
    def __init__(self, settings: Settings, toolchains: dict[Language, Toolchain]) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.toolchains = toolchains
        self.data_dir = settings.data_dir
        self.sandboxes_dir = self.data_dir / "sandboxes"
        self.trash_dir = self.data_dir / "trash"
        self.etc_dir = self.data_dir / "etc"
        # Root never runs sandboxed code as itself.
        self.as_root = os.geteuid() == 0
        self._dir_mode = 0o711 if self.as_root else 0o700
        self._sandboxes: dict[str, _Live] = {}
        self._uids_in_use: set[int] = set()
        self._burials: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._next_uid_offset = 0
        self._running = 0
        self._closing = False
        # Built once: the same program serves every exec.
        self.seccomp_bpf = seccomp.compile_bpf() if settings.seccomp else None

    # -- start-up and shut-down ------------------------------------------------

    def open(self) -> None:
        """Create the layout, finish interrupted creates and deletes, load records."""
        runner.become_subreaper()
        runner.leave_session_keyring()
        runner.seal_descriptors()
        with contextlib.suppress(RuntimeError):  # no event loop: nothing runs yet
            self._reaper = asyncio.get_running_loop().create_task(self._reap_periodically())
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
        if self._uids_in_use:
            start = self.settings.sandbox_uid_start
            usable = self.settings.sandbox_uid_count - 1
            self._next_uid_offset = (max(self._uids_in_use) - start + 1) % usable

    def _write_etc(self) -> None:
        self.etc_dir.mkdir(mode=0o755, exist_ok=True)
        os.chmod(self.etc_dir, 0o755)
        for name, text in bwrap.etc_file_contents().items():
            _write_atomic(self.etc_dir / name, text.encode(), 0o644)

    def _load(self, root: Path) -> _Live | None:
        try:
            raw = json.loads((root / RECORD).read_text(encoding="utf-8"))
            uid = raw.get("uid")
            live = _Live(
                id=raw["id"],
                language=Language(raw["language"]),
                created_at=datetime.fromisoformat(raw["created_at"]),
                labels=dict(raw.get("labels", {})),
                root=root,
                owner=Owner(int(uid), int(uid)) if uid is not None else None,
                network=bool(raw.get("network", False)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            # Not ours or damaged: leave it for a person to look at, do not guess.
            return None
        if live.id != root.name:
            return None
        if self.as_root and (live.owner is None or live.owner.uid in self._uids_in_use):
            # Made by a daemon that was not root (or a clash): give it a uid of its own.
            owner = self._allocate_owner()
            assert owner is not None  # as root it always is
            live.owner = owner
            for sub in (live.workspace, live.home):
                _chown_tree(sub, owner)
            _write_atomic(root / RECORD, json.dumps(live.record()).encode())
        if live.owner is not None:
            self._uids_in_use.add(live.owner.uid)
        # Uploads that were being received when the daemon stopped (usually
        # none: then the folder is left as it is, which keeps start-up fast).
        try:
            with os.scandir(live.tmp) as leftovers:
                dirty = next(leftovers, None) is not None
        except FileNotFoundError:
            dirty = True
        if dirty:
            remove_tree(live.tmp)
            live.tmp.mkdir(mode=0o700)
        return live

    def _allocate_owner(self) -> Owner | None:
        if not self.as_root:
            return None
        start, count = self.settings.sandbox_uid_start, self.settings.sandbox_uid_count
        usable = count - 1  # the last uid of the range is the start-up self-test's
        # Start after the last uid handed out, so a create does not walk past
        # every sandbox that exists (and a freed uid is not reused at once).
        for step in range(usable):
            uid = start + (self._next_uid_offset + step) % usable
            if uid not in self._uids_in_use:
                self._uids_in_use.add(uid)
                self._next_uid_offset = (uid - start + 1) % usable
                return Owner(uid, uid)
        raise TooManyRequests(
            f"All {count - 1} sandbox uids are in use; delete sandboxes or widen "
            "sandbox_uid_count in the config file.",
            retry_after=60,
        )

    async def selftest(self) -> None:
        """Run ``true`` under the full isolation once; raise SandboxSetupFailed if bwrap cannot."""
        probe = self.data_dir / "probe"
        remove_tree(probe)
        probe.mkdir(mode=self._dir_mode)
        last = self.settings.sandbox_uid_start + self.settings.sandbox_uid_count - 1
        owner = Owner(last, last) if self.as_root else None
        try:
            for sub in ("workspace", "home"):
                (probe / sub).mkdir(mode=0o700)
                if owner:
                    os.chown(probe / sub, owner.uid, owner.gid)
            place = self._placement_for(
                probe / "workspace", probe / "home", self.toolchains[Language.python], owner
            )
            run = Execution(
                place, ExecRequest(command="true"), self._rlimits(owner, None), 64 * 1024, 0
            )
            result = await run.run(timeout=30)
            if result.exit_code != 0:
                raise SandboxSetupFailed(
                    f"`true` exited {result.exit_code} in the sandbox: {result.output.strip()}"
                )
        finally:
            remove_tree(probe)

    async def _reap_periodically(self) -> None:
        # Orphans of bwrap may exit after the reap that follows each exec.
        while True:
            await asyncio.sleep(_REAP_SECONDS)
            runner.reap_orphans()

    async def close(self) -> None:
        """Refuse new work, kill every running command, finish removing deleted sandboxes."""
        self._closing = True
        for live in self._sandboxes.values():
            for run in list(live.running):
                run.kill()
        if self._burials:
            await asyncio.gather(*self._burials, return_exceptions=True)
        if self._reaper is not None:
            self._reaper.cancel()
        # Zombies left unreaped now would go to PID 1, which may never reap
        # them, and count against their uid's process limit for good.
        for _ in range(20):
            runner.reap_orphans()
            await asyncio.sleep(0.025)

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
        return self._running

    def isolation(self) -> dict[str, str]:
        """What protects the host, for `sandboxd status`."""
        start, count = self.settings.sandbox_uid_start, self.settings.sandbox_uid_count
        return {
            "identity": f"a host uid per sandbox from {start} ({count} uids)"
            if self.as_root
            else "your own uid (mapped to 1000 inside)",
            "resource_limits": "rlimits per process (cgroup v2 is not used)",
            "process_limit": "RLIMIT_NPROC per sandbox uid"
            if self.as_root
            else "none (RLIMIT_NPROC would count your own processes; run as root)",
            "seccomp": "on" if self.seccomp_bpf is not None else "OFF (seccomp = false)",
            "network": "none, or outbound-only through slirp4netns for sandboxes "
            'created with "network": true',
        }

    def _check_open(self) -> None:
        if self._closing:
            raise ShuttingDown("The daemon is shutting down; try again once it is back.")

    def create(self, request: CreateSandboxRequest) -> Sandbox:
        self._check_open()
        if len(self._sandboxes) >= self.limits.sandboxes:
            raise TooManyRequests(
                f"There are already {len(self._sandboxes)} sandboxes (limits.sandboxes); "
                "delete some first.",
                retry_after=60,
            )
        if request.network and shutil.which(self.settings.slirp4netns) is None:
            raise NetworkUnavailable(
                f"A sandbox with network access needs {self.settings.slirp4netns}, which is "
                "not installed: sudo apt-get install slirp4netns (or create it without network)."
            )
        owner = self._allocate_owner()
        sandbox_id = f"sb-{secrets.token_hex(8)}"
        live = _Live(
            sandbox_id,
            request.language,
            datetime.now(UTC),
            dict(request.labels),
            self.sandboxes_dir / sandbox_id,
            owner,
            request.network,
        )
        staging = self.sandboxes_dir / f".new-{sandbox_id}"
        try:
            staging.mkdir(mode=self._dir_mode)
            for sub in ("workspace", "home"):
                (staging / sub).mkdir(mode=0o700)
                if owner:
                    os.chown(staging / sub, owner.uid, owner.gid)
            (staging / "tmp").mkdir(mode=0o700)
            _write_atomic(staging / RECORD, json.dumps(live.record()).encode())
            os.rename(staging, live.root)
        except BaseException:
            remove_tree(staging)
            if owner:
                self._uids_in_use.discard(owner.uid)
            raise
        self._sandboxes[sandbox_id] = live
        return live.to_model()

    async def delete(self, sandbox_id: str) -> None:
        live = self._get(sandbox_id)
        live.deleted = True
        for run in list(live.running):
            run.kill()
        del self._sandboxes[sandbox_id]
        grave = self.trash_dir / f"{sandbox_id}-{secrets.token_hex(4)}"
        # Once renamed into trash/ the sandbox is gone for every client (and a
        # crash from here on is finished at the next start): the files are
        # removed after the answer, and the uid is free once they are.
        os.rename(live.root, grave)
        task = asyncio.create_task(self._bury(grave, live.owner))
        self._burials.add(task)
        task.add_done_callback(self._burials.discard)

    async def _bury(self, grave: Path, owner: Owner | None) -> None:
        try:
            await asyncio.to_thread(remove_tree, grave)
        except OSError:
            log.exception("could not remove %s; it is retried at the next start", grave)
        finally:
            if owner:
                self._uids_in_use.discard(owner.uid)

    # -- uploads ----------------------------------------------------------------

    async def _receive(self, live: _Live, chunks: AsyncIterator[bytes]) -> Path:
        """Stream an upload body into the sandbox's private tmp folder, within the limit."""
        limit = self.limits.upload_bytes
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
                if live.owner:
                    live.owner.apply(out.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        return path

    async def _check_quota(self, live: _Live, adding: int) -> None:
        used = await workspace_usage(live.workspace)
        quota = self.limits.workspace_bytes
        if used + adding > quota:
            raise QuotaExceeded(
                f"The workspace uses {used} bytes; adding {adding} would pass its quota of "
                f"{quota} bytes (limits.workspace_bytes). Delete files first."
            )

    def _ensure_present(self, live: _Live) -> None:
        if live.deleted:
            raise SandboxNotFound(f"The sandbox {live.id!r} was deleted during the upload.")

    async def put_file(
        self,
        sandbox_id: str,
        filename: str | None,
        chunks: AsyncIterator[bytes],
        folder: str | None = None,
    ) -> FileUploaded:
        self._check_open()
        live = self._get(sandbox_id)
        name = validate_filename(filename)
        parts = split_path(folder) if folder else ()
        path = await self._receive(live, chunks)
        try:
            self._ensure_present(live)
            size = path.stat().st_size
            await self._check_quota(live, size)
            os.chmod(path, 0o644)
            install_file(path, live.workspace, name, parts, live.owner)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        return FileUploaded(filename=name, path="/".join((*parts, name)), size=size)

    # -- reading back out --------------------------------------------------------

    async def list_files(self, sandbox_id: str, folder: str, recursive: bool) -> FileList:
        live = self._get(sandbox_id)
        parts = split_path(folder)
        entries, truncated = await asyncio.to_thread(
            files.list_folder, live.workspace, parts, recursive, _LIST_LIMIT
        )
        return FileList(
            path="/".join(parts),
            entries=[FileEntry(**vars(e)) for e in entries],
            truncated=truncated,
        )

    def open_file(self, sandbox_id: str, path: str) -> tuple[int, int, str]:
        """An open descriptor of a workspace file, its size and its name."""
        live = self._get(sandbox_id)
        parts = split_path(path)
        fd, size = files.open_file(live.workspace, parts)
        return fd, size, parts[-1]

    async def delete_file(self, sandbox_id: str, path: str) -> None:
        live = self._get(sandbox_id)
        await asyncio.to_thread(files.remove, live.workspace, split_path(path))

    async def archive(self, sandbox_id: str) -> tuple[int, int]:
        """The workspace as a zip: an open descriptor of an already unlinked file, its size."""
        live = self._get(sandbox_id)
        out = live.tmp / f"archive-{secrets.token_hex(8)}.zip"
        try:
            await asyncio.to_thread(files.zip_workspace, live.workspace, out)
            fd = os.open(out, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            with contextlib.suppress(OSError):
                out.unlink()
        return fd, os.fstat(fd).st_size

    async def put_archive(
        self, sandbox_id: str, chunks: AsyncIterator[bytes], folder: str | None = None
    ) -> ArchiveUploaded:
        self._check_open()
        live = self._get(sandbox_id)
        parts = split_path(folder) if folder else ()
        path = await self._receive(live, chunks)
        self._ensure_present(live)
        staging = live.tmp / f"staging-{secrets.token_hex(8)}"
        limits = self.limits
        try:
            staging.mkdir(mode=0o700)
            extracted = await asyncio.to_thread(
                archive.extract,
                path,
                staging,
                archive.ArchiveLimits(
                    limits.archive_unpacked_bytes, limits.archive_entries, limits.archive_path_bytes
                ),
                live.owner,
            )
            self._ensure_present(live)
            await self._check_quota(live, extracted.bytes)
            await asyncio.to_thread(merge_tree, staging, live.workspace, parts, live.owner)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
            await asyncio.to_thread(remove_tree, staging)
        return ArchiveUploaded(files=extracted.files, bytes=extracted.bytes)

    # -- exec -------------------------------------------------------------------

    def _timeout(self, requested: float | None) -> float:
        if requested is None:
            return self.limits.exec_timeout_default
        if requested > self.limits.exec_timeout_max:
            raise InvalidRequest(
                f"timeout {requested:g} s is over the maximum of "
                f"{self.limits.exec_timeout_max:g} s.",
                errors=[
                    {"field": "timeout", "message": f"at most {self.limits.exec_timeout_max:g}"}
                ],
            )
        return requested

    def _rlimits(self, owner: Owner | None, asked: ExecLimits | None) -> bwrap.Rlimits:
        configured = self.limits
        values = {
            "memory_bytes": configured.memory_bytes,
            "processes": configured.processes,
            "open_files": configured.open_files,
            "file_bytes": configured.file_bytes,
            "cpu_seconds": configured.cpu_seconds,
        }
        if asked is not None:
            for key, value in asked.model_dump(exclude_none=True).items():
                if value > values[key]:
                    raise InvalidRequest(
                        f"limits.{key} {value} is over the configured {values[key]}; "
                        "a command may only ask for less.",
                        errors=[{"field": f"limits.{key}", "message": f"at most {values[key]}"}],
                    )
                values[key] = value
        return bwrap.Rlimits(
            data_bytes=values["memory_bytes"],
            open_files=values["open_files"],
            file_bytes=values["file_bytes"],
            cpu_seconds=values["cpu_seconds"],
            # Never set for a shared uid: it would count processes outside the sandbox.
            processes=values["processes"] if owner is not None else None,
        )

    def _placement_for(
        self, workspace: Path, home: Path, toolchain: Toolchain, owner: Owner | None
    ) -> Placement:
        return Placement(
            workspace=workspace,
            home=home,
            etc_dir=self.etc_dir,
            toolchain=toolchain,
            owner=owner,
            bwrap=self.settings.bwrap,
            seccomp_bpf=self.seccomp_bpf,
            tmp_bytes=self.limits.tmp_bytes,
            workspace_quota=self.limits.workspace_bytes,
        )

    def _toolchain(self, language: Language) -> Toolchain:
        toolchain = self.toolchains[language]
        why = toolchain.missing()
        if why:
            raise ToolchainMissing(f"The {language.value} toolchain cannot run: {why}.")
        return toolchain

    async def exec(
        self,
        sandbox_id: str,
        request: ExecRequest,
        on_event: Callable[[Event], None] | None = None,
    ) -> ExecResult:
        """Run a command; with ``on_event``, its output is also handed over as it arrives."""
        self._check_open()
        live = self._get(sandbox_id)
        toolchain = self._toolchain(live.language)
        timeout = self._timeout(request.timeout)
        rlimits = self._rlimits(live.owner, request.limits)
        if live.over_quota:
            await self._check_quota(live, 0)  # still over: refused with 413
            live.over_quota = False
        if self._running >= self.limits.concurrent_execs:
            raise TooManyRequests(
                f"{self._running} commands are already running (limits.concurrent_execs); "
                "retry in a moment."
            )
        place = self._placement_for(live.workspace, live.home, toolchain, live.owner)
        if live.network:
            place = dataclasses.replace(place, network=True, slirp4netns=self.settings.slirp4netns)
        run = Execution(
            place, request, rlimits, self.limits.output_bytes, self.limits.test_wait_seconds
        )
        if on_event is not None:
            run.stream_to(on_event)
        live.running.add(run)
        live.last_exec_at = datetime.now(UTC)
        self._running += 1
        try:
            result = await run.run(timeout)
        finally:
            self._running -= 1
            live.running.discard(run)
        live.over_quota = run.quota_exceeded
        # bwrap's last process may exit a moment after the answer: adopt it then.
        asyncio.get_running_loop().call_later(0.5, runner.reap_orphans)
        if live.deleted:
            raise SandboxDeleted(f"The sandbox {live.id!r} was deleted while the command ran.")
        return result
