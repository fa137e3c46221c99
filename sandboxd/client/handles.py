"""Handles on one sandbox: ``Sandbox`` (plain calls) and ``AsyncSandbox`` (asyncio).

Both are context managers that delete the sandbox on exit, so a test run
leaves nothing behind even when it fails half-way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from sandboxd.client.aio import (
    AsyncClient,
    OutputCallback,
    PhaseCallback,
    ProgressCallback,
    StrPath,
)
from sandboxd.client.errors import SandboxNotFound
from sandboxd.client.sync import Client
from sandboxd.models import ArchiveUploaded, ExecLimits, ExecResult, FileList, FileUploaded
from sandboxd.models import Sandbox as SandboxInfo


class Sandbox:
    """One sandbox. ``with Sandbox.create("python") as sb: ...`` deletes it on exit.

    ``Sandbox.attach(id)`` takes one that exists (and keeps it, unless deleted).
    """

    def __init__(self, client: Client, info: SandboxInfo) -> None:
        self.client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.language.value}>"

    @classmethod
    def create(
        cls,
        language: str = "python",
        *,
        labels: Mapping[str, str] | None = None,
        network: bool = False,
        socket: StrPath | None = None,
        client: Client | None = None,
    ) -> Sandbox:
        client = client or Client(socket)
        return cls(client, client.create(language, labels=labels, network=network))

    @classmethod
    def attach(
        cls, sandbox_id: str, *, socket: StrPath | None = None, client: Client | None = None
    ) -> Sandbox:
        client = client or Client(socket)
        return cls(client, client.get(sandbox_id))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.delete()

    def delete(self) -> None:
        """Delete the sandbox and its workspace (a sandbox already gone is fine)."""
        try:
            self.client.delete(self.id)
        except SandboxNotFound:
            pass

    def refresh(self) -> SandboxInfo:
        self.info = self.client.get(self.id)
        return self.info

    def put_file(
        self,
        source: StrPath | bytes,
        name: str | None = None,
        path: str | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> FileUploaded:
        """Put a local file (a path) or content (bytes, with ``name``) in the workspace."""
        return self.client.put_file(self.id, source, name, path=path, progress=progress)

    def upload_zip(
        self, source: StrPath | bytes, *, progress: ProgressCallback | None = None
    ) -> ArchiveUploaded:
        return self.client.upload_zip(self.id, source, progress=progress)

    def upload_dir(
        self, folder: StrPath, *, progress: ProgressCallback | None = None
    ) -> ArchiveUploaded:
        """Zip ``folder`` from inside itself (symlinks skipped) into the workspace root."""
        return self.client.upload_dir(self.id, folder, progress=progress)

    def exec(
        self,
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
        """Run a command (then the tests, with ``test``); see ``AsyncClient.exec``.

        ``on_output(stream, text)`` streams the output live; ``env``, ``cwd``,
        ``stdin``, ``timeout`` and ``limits`` apply to this command only.
        """
        return self.client.exec(
            self.id,
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

    def read_file(self, path: str) -> bytes:
        return self.client.read_file(self.id, path)

    def list_files(self, path: str = "", recursive: bool = False) -> FileList:
        return self.client.list_files(self.id, path, recursive)

    def delete_file(self, path: str) -> None:
        self.client.delete_file(self.id, path)

    def download_archive(self, dest: StrPath) -> Path:
        return self.client.download_archive(self.id, dest)


class AsyncSandbox:
    """One sandbox, for asyncio code.

        async with await AsyncSandbox.create("python") as sb:
            await sb.upload_dir("proj")
            result = await sb.exec("pytest", test=True)

    Leaving the ``async with`` deletes the sandbox.
    """

    def __init__(self, client: AsyncClient, info: SandboxInfo, *, owns_client: bool = False):
        self.client = client
        self.info = info
        self._owns_client = owns_client

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.info.language.value}>"

    @classmethod
    async def create(
        cls,
        language: str = "python",
        *,
        labels: Mapping[str, str] | None = None,
        network: bool = False,
        socket: StrPath | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox. Pass ``client`` to share a connection; else it has its own."""
        owns_client = client is None
        client = client or AsyncClient(socket)
        try:
            info = await client.create(language, labels=labels, network=network)
        except BaseException:
            if owns_client:
                await client.aclose()
            raise
        return cls(client, info, owns_client=owns_client)

    @classmethod
    async def attach(
        cls,
        sandbox_id: str,
        *,
        socket: StrPath | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """A handle on an existing sandbox (SandboxNotFound if there is none)."""
        owns_client = client is None
        client = client or AsyncClient(socket)
        try:
            info = await client.get(sandbox_id)
        except BaseException:
            if owns_client:
                await client.aclose()
            raise
        return cls(client, info, owns_client=owns_client)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.delete()

    async def aclose(self) -> None:
        """Let go of the connection (the sandbox stays)."""
        if self._owns_client:
            await self.client.aclose()

    async def delete(self) -> None:
        """Delete the sandbox and its workspace (a sandbox already gone is fine)."""
        try:
            await self.client.delete(self.id)
        except SandboxNotFound:
            pass
        finally:
            await self.aclose()

    async def refresh(self) -> SandboxInfo:
        self.info = await self.client.get(self.id)
        return self.info

    async def put_file(
        self,
        source: StrPath | bytes,
        name: str | None = None,
        path: str | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> FileUploaded:
        return await self.client.put_file(self.id, source, name, path=path, progress=progress)

    async def upload_zip(
        self, source: StrPath | bytes, *, progress: ProgressCallback | None = None
    ) -> ArchiveUploaded:
        return await self.client.upload_zip(self.id, source, progress=progress)

    async def upload_dir(
        self, folder: StrPath, *, progress: ProgressCallback | None = None
    ) -> ArchiveUploaded:
        return await self.client.upload_dir(self.id, folder, progress=progress)

    async def exec(
        self,
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
        return await self.client.exec(
            self.id,
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

    async def read_file(self, path: str) -> bytes:
        return await self.client.read_file(self.id, path)

    async def list_files(self, path: str = "", recursive: bool = False) -> FileList:
        return await self.client.list_files(self.id, path, recursive)

    async def delete_file(self, path: str) -> None:
        await self.client.delete_file(self.id, path)

    async def download_archive(self, dest: StrPath) -> Path:
        return await self.client.download_archive(self.id, dest)
