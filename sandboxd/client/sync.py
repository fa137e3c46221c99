"""The synchronous client: ``Client``, the whole API as plain calls over the asyncio one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sandboxd.client.aio import (
    AsyncClient,
    OutputCallback,
    PhaseCallback,
    ProgressCallback,
    StrPath,
    find_socket,
)
from sandboxd.models import (
    ArchiveUploaded,
    DaemonStatus,
    ExecLimits,
    ExecResult,
    FileList,
    FileUploaded,
    Version,
)
from sandboxd.models import Sandbox as SandboxInfo
from sandboxd.zipdir import ZipStats

T = TypeVar("T")


class Client:
    """The daemon's API as plain calls.

    Each call runs on an event loop and a connection of its own, both gone
    when it returns: nothing to close, and a Client may be used from any
    thread. Not for use inside a running event loop: await ``AsyncClient`` there.
    """

    def __init__(self, socket: StrPath | None = None, *, timeout: float = 120.0) -> None:
        self.socket_path = find_socket(socket)
        self.timeout = timeout

    def _run(self, call: Callable[[AsyncClient], Coroutine[Any, Any, T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "sandboxd.client.Client was called inside a running event loop; "
                "use sandboxd.client.AsyncClient (await it) there"
            )

        async def once() -> T:
            async with AsyncClient(self.socket_path, timeout=self.timeout) as aio:
                return await call(aio)

        # asyncio.run turns Ctrl-C into a cancelled request: a streaming exec's
        # connection then closes, and the daemon kills the command.
        return asyncio.run(once())

    def close(self) -> None:
        """Nothing to release (each call closes its connection); kept for symmetry."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def status(self) -> DaemonStatus:
        return self._run(lambda aio: aio.status())

    def version(self) -> Version:
        return self._run(lambda aio: aio.version())

    def create(
        self,
        language: str = "python",
        *,
        labels: Mapping[str, str] | None = None,
        network: bool = False,
    ) -> SandboxInfo:
        return self._run(lambda aio: aio.create(language, labels=labels, network=network))

    def list(self) -> list[SandboxInfo]:
        return self._run(lambda aio: aio.list())

    def get(self, sandbox_id: str) -> SandboxInfo:
        return self._run(lambda aio: aio.get(sandbox_id))

    def delete(self, sandbox_id: str) -> None:
        self._run(lambda aio: aio.delete(sandbox_id))

    def put_file(
        self,
        sandbox_id: str,
        source: StrPath | bytes,
        name: str | None = None,
        *,
        path: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> FileUploaded:
        return self._run(
            lambda aio: aio.put_file(sandbox_id, source, name, path=path, progress=progress)
        )

    def upload_zip(
        self, sandbox_id: str, source: StrPath | bytes, *, progress: ProgressCallback | None = None
    ) -> ArchiveUploaded:
        return self._run(lambda aio: aio.upload_zip(sandbox_id, source, progress=progress))

    def upload_dir(
        self,
        sandbox_id: str,
        folder: StrPath,
        *,
        progress: ProgressCallback | None = None,
        on_zipped: Callable[[ZipStats, int], None] | None = None,
    ) -> ArchiveUploaded:
        return self._run(
            lambda aio: aio.upload_dir(sandbox_id, folder, progress=progress, on_zipped=on_zipped)
        )

    def exec(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        test: bool = False,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
        limits: ExecLimits | Mapping[str, int] | None = None,
        on_output: OutputCallback | None = None,
        on_phase: PhaseCallback | None = None,
    ) -> ExecResult:
        """Run a command (then the tests, with ``test``); see ``AsyncClient.exec``."""
        return self._run(
            lambda aio: aio.exec(
                sandbox_id,
                command,
                test,
                env=env,
                cwd=cwd,
                stdin=stdin,
                timeout=timeout,
                limits=limits,
                on_output=on_output,
                on_phase=on_phase,
            )
        )

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        return self._run(lambda aio: aio.read_file(sandbox_id, path))

    def list_files(self, sandbox_id: str, path: str = "", recursive: bool = False) -> FileList:
        return self._run(lambda aio: aio.list_files(sandbox_id, path, recursive))

    def delete_file(self, sandbox_id: str, path: str) -> None:
        self._run(lambda aio: aio.delete_file(sandbox_id, path))

    def download_archive(self, sandbox_id: str, dest: StrPath) -> Path:
        return self._run(lambda aio: aio.download_archive(sandbox_id, dest))
