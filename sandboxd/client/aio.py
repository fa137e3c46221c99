"""The asyncio client: ``AsyncClient``, the HTTP API of the daemon as coroutines.

Every problem the daemon answers becomes the exception class of its
``code`` in one place, ``_raise_for`` (and, for a stream, the ``error``
event, through the same ``error_from_problem``); a daemon that is not there
becomes ``NotRunning``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel

from sandboxd import paths
from sandboxd.client.errors import (
    ConnectionLost,
    NotRunning,
    error_from_problem,
)
from sandboxd.config import ConfigError, load_settings
from sandboxd.models import (
    ArchiveUploaded,
    DaemonStatus,
    ExecLimits,
    ExecResult,
    FileList,
    FileUploaded,
    SandboxList,
    Version,
)
from sandboxd.models import Sandbox as SandboxInfo
from sandboxd.zipdir import ZipStats, zip_dir

StrPath = str | os.PathLike[str]
# (stream, text): stream is "stdout" or "stderr". May be a coroutine function.
OutputCallback = Callable[[str, str], Awaitable[None] | None]
PhaseCallback = Callable[[str], Awaitable[None] | None]  # the runner's name
ProgressCallback = Callable[[int], None]  # bytes sent since the last call

_CHUNK = 256 * 1024
_HOST = "http://sandboxd"


def find_socket(socket: StrPath | None = None) -> Path:
    """The daemon's socket, found as the CLI finds it."""
    if socket:
        return Path(socket)
    if env := os.environ.get("SANDBOXD_SOCKET"):
        return Path(env)
    config = os.environ.get("SANDBOXD_CONFIG")
    try:
        return load_settings(Path(config) if config else None).socket_path
    except ConfigError:
        # A broken config file is the daemon's problem to report; connect anyway.
        return paths.default_socket_path()


def command_line(command: str | Sequence[str]) -> str:
    """A shell command from a string (as is) or an argv list (each item one word)."""
    if isinstance(command, str):
        return command
    return shlex.join(command)


async def _raise_for(response: aiohttp.ClientResponse) -> None:
    """The one boundary where an HTTP failure becomes a typed exception."""
    if response.status < 400:
        return
    raw = await response.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = {"detail": raw.decode("utf-8", "replace").strip() or response.reason}
    raise error_from_problem(response.status, body, response.headers, response.reason or "")


class _SSEParser:
    """Incremental text/event-stream parsing (a line may be megabytes long)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        self._buffer += chunk
        events = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            line = self._buffer[start:end].rstrip(b"\r").decode("utf-8", "replace")
            start = end + 1
            if not line:
                if self._data:
                    events.append((self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif line.startswith(":"):
                continue
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
        del self._buffer[:start]
        return events


async def _maybe_await(value: Awaitable[None] | None) -> None:
    if inspect.isawaitable(value):
        await value


M = TypeVar("M", bound=BaseModel)


class AsyncClient:
    """The daemon's API as coroutines. Use ``async with AsyncClient() as client:``."""

    def __init__(self, socket: StrPath | None = None, *, timeout: float = 120.0) -> None:
        self.socket_path = find_socket(socket)
        self.timeout = timeout  # for everything but exec, uploads and downloads
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.socket_path)),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._session

    async def _send(
        self,
        method: str,
        path: str,
        *,
        timeout: float | None = -1.0,
        **kwargs: Any,
    ) -> aiohttp.ClientResponse:
        """Send a request; the caller owns the response (and must release it)."""
        if timeout is not None and timeout < 0:
            timeout = self.timeout
        try:
            response = await self._http().request(
                method,
                _HOST + path,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=30),
                **kwargs,
            )
        except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise NotRunning(self.socket_path) from exc
        except aiohttp.ClientError as exc:
            raise ConnectionLost(f"the connection to sandboxd broke: {exc}") from exc
        try:
            await _raise_for(response)
        except BaseException:
            response.release()
            raise
        return response

    async def request(self, method: str, path: str, *, json: Any = None, **kwargs: Any) -> Any:
        """One call of the HTTP API: the JSON answer (None for 204)."""
        response = await self._send(method, path, json=json, **kwargs)
        try:
            if response.status == 204:
                return None
            return await response.json(content_type=None)
        except aiohttp.ClientError as exc:
            raise ConnectionLost(f"the connection to sandboxd broke: {exc}") from exc
        finally:
            response.release()

    async def _model(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        return model.model_validate(await self.request(method, path, **kwargs))

    # -- the daemon -----------------------------------------------------------------

    async def status(self) -> DaemonStatus:
        return await self._model(DaemonStatus, "GET", "/v1/status")

    async def version(self) -> Version:
        return await self._model(Version, "GET", "/v1/version")

    # -- sandboxes ------------------------------------------------------------------

    async def create(
        self,
        language: str = "python",
        *,
        labels: Mapping[str, str] | None = None,
        network: bool = False,
    ) -> SandboxInfo:
        body = {"language": language, "labels": dict(labels or {}), "network": network}
        return await self._model(SandboxInfo, "POST", "/v1/sandboxes", json=body)

    async def list(self) -> list[SandboxInfo]:
        listing = await self._model(SandboxList, "GET", "/v1/sandboxes")
        return listing.sandboxes

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await self._model(SandboxInfo, "GET", _sandbox_path(sandbox_id))

    async def delete(self, sandbox_id: str) -> None:
        await self.request("DELETE", _sandbox_path(sandbox_id))

    # -- files in -------------------------------------------------------------------

    async def put_file(
        self,
        sandbox_id: str,
        source: StrPath | bytes,
        name: str | None = None,
        *,
        path: str | None = None,
        progress: ProgressCallback | None = None,
    ) -> FileUploaded:
        """Put one file in the workspace: ``source`` is a local file or the content.

        ``name`` defaults to the local file's name; a name with slashes
        ("tests/test_a.py") is split into the folder and the name. ``path`` is
        the folder in the workspace (default: its root).
        """
        if isinstance(source, bytes | bytearray):
            if not name:
                raise ValueError("put_file needs a name when it is given bytes")
        else:
            name = name or Path(source).name
        subfolder, _, base = name.rpartition("/")
        folder = "/".join(p for p in (path or "", subfolder) if p)
        form = aiohttp.FormData(quote_fields=False)
        if folder:
            form.add_field("path", folder)  # before the file: the daemon reads it first
        form.add_field(
            "file",
            _body(source, progress),
            filename=base,
            content_type="application/octet-stream",
        )
        return await self._upload(FileUploaded, f"{_sandbox_path(sandbox_id)}/files", form)

    async def upload_zip(
        self,
        sandbox_id: str,
        source: StrPath | bytes,
        *,
        progress: ProgressCallback | None = None,
    ) -> ArchiveUploaded:
        """Extract a zip (a local file or its bytes) into the workspace root."""
        form = aiohttp.FormData(quote_fields=False)
        form.add_field(
            "file", _body(source, progress), filename="upload.zip", content_type="application/zip"
        )
        return await self._upload(ArchiveUploaded, f"{_sandbox_path(sandbox_id)}/upload", form)

    async def upload_dir(
        self,
        sandbox_id: str,
        folder: StrPath,
        *,
        progress: ProgressCallback | None = None,
        on_zipped: Callable[[ZipStats, int], None] | None = None,
    ) -> ArchiveUploaded:
        """Zip a local folder from inside itself (symlinks skipped) and extract it
        into the workspace root: ``proj/tests/x.py`` lands at ``tests/x.py``.

        ``on_zipped(stats, zip_size)`` is called once the zip is made, before it is sent.
        """
        folder = Path(folder)
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a folder")
        with tempfile.TemporaryDirectory(prefix="sandboxd-upload-") as tmp:
            archive = Path(tmp) / "upload.zip"

            def make() -> ZipStats:
                with open(archive, "wb") as out:
                    return zip_dir(folder, out)

            stats = await asyncio.to_thread(make)
            if on_zipped is not None:
                on_zipped(stats, archive.stat().st_size)
            return await self.upload_zip(sandbox_id, archive, progress=progress)

    async def _upload(self, model: type[M], path: str, form: aiohttp.FormData) -> M:
        return await self._model(model, "POST", path, data=form, timeout=None)

    # -- exec -----------------------------------------------------------------------

    async def exec(
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
        """Run ``sh -c COMMAND`` in the workspace (then the tests, with ``test``).

        A command that fails is a result, not an exception: look at
        ``exit_code`` (the runner's in test mode) and ``timed_out``. With
        ``on_output`` (or ``on_phase``) the output streams while the command
        runs: ``on_output("stdout" | "stderr", text)`` per chunk, ``on_phase(runner)``
        when the test runner starts.
        """
        body: dict[str, Any] = {"command": command_line(command), "test": test}
        if env:
            body["env"] = dict(env)
        for key, value in (("cwd", cwd), ("stdin", stdin), ("timeout", timeout)):
            if value is not None:
                body[key] = value
        if limits is not None:
            body["limits"] = (
                limits.model_dump(exclude_none=True)
                if isinstance(limits, ExecLimits)
                else dict(limits)
            )
        path = f"{_sandbox_path(sandbox_id)}/exec"
        if on_output is None and on_phase is None:
            return await self._model(ExecResult, "POST", path, json=body, timeout=None)
        response = await self._send(
            "POST", path, json=body, timeout=None, headers={"Accept": "text/event-stream"}
        )
        try:
            return await _consume_events(response, on_output, on_phase)
        except aiohttp.ClientError as exc:
            raise ConnectionLost(f"the stream from sandboxd broke: {exc}") from exc
        finally:
            response.release()

    # -- files out ------------------------------------------------------------------

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        """The content of one workspace file."""
        response = await self._send("GET", _file_path(sandbox_id, path), timeout=None)
        try:
            return await response.read()
        finally:
            response.release()

    async def list_files(
        self, sandbox_id: str, path: str = "", recursive: bool = False
    ) -> FileList:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        return await self._model(
            FileList, "GET", f"{_sandbox_path(sandbox_id)}/files", params=params
        )

    async def delete_file(self, sandbox_id: str, path: str) -> None:
        await self.request("DELETE", _file_path(sandbox_id, path))

    async def download_archive(self, sandbox_id: str, dest: StrPath) -> Path:
        """Save the whole workspace as a zip at ``dest``; return that path."""
        dest = Path(dest)
        response = await self._send("GET", f"{_sandbox_path(sandbox_id)}/archive", timeout=None)
        try:
            out = await asyncio.to_thread(open, dest, "wb")
            try:
                async for chunk in response.content.iter_chunked(_CHUNK):
                    await asyncio.to_thread(out.write, chunk)
            finally:
                out.close()
        except aiohttp.ClientError as exc:
            raise ConnectionLost(f"the download from sandboxd broke: {exc}") from exc
        finally:
            response.release()
        return dest


async def _consume_events(
    response: aiohttp.ClientResponse,
    on_output: OutputCallback | None,
    on_phase: PhaseCallback | None,
) -> ExecResult:
    parser = _SSEParser()
    async for chunk in response.content.iter_any():
        for event, data in parser.feed(chunk):
            payload = json.loads(data)
            if event in ("stdout", "stderr"):
                if on_output is not None:
                    await _maybe_await(on_output(event, payload["text"]))
            elif event == "phase":
                if on_phase is not None:
                    await _maybe_await(on_phase(str(payload.get("runner", ""))))
            elif event == "result":
                return ExecResult.model_validate(payload)
            elif event == "error":
                raise error_from_problem(int(payload.get("status", 200)), payload)
    raise ConnectionLost("the stream from sandboxd ended without a result")


def _sandbox_path(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}"


def _file_path(sandbox_id: str, path: str) -> str:
    return f"{_sandbox_path(sandbox_id)}/files/{quote(path.strip('/'), safe='/')}"


def _body(source: StrPath | bytes, progress: ProgressCallback | None) -> Any:
    """What aiohttp sends as a file: bytes as they are, a local file read in chunks."""
    if isinstance(source, bytes | bytearray) and progress is None:
        return bytes(source)
    return _chunks(source, progress)


async def _chunks(
    source: StrPath | bytes, progress: ProgressCallback | None
) -> AsyncIterator[bytes]:
    if isinstance(source, bytes | bytearray):
        for start in range(0, len(source), _CHUNK):
            chunk = bytes(source[start : start + _CHUNK])
            yield chunk
            if progress is not None:
                progress(len(chunk))
        return
    handle: IO[bytes] = await asyncio.to_thread(open, source, "rb")
    try:
        while chunk := await asyncio.to_thread(handle.read, _CHUNK):
            yield chunk
            if progress is not None:
                progress(len(chunk))
    finally:
        handle.close()


# -- the functions the CLI's daemon commands use ------------------------------------------


async def request(
    socket_path: Path,
    method: str,
    path: str,
    *,
    json: Any = None,
    timeout: float = 30.0,
) -> Any:
    """One call on a fresh connection: the JSON answer, None for 204."""
    async with AsyncClient(socket_path, timeout=timeout) as client:
        return await client.request(method, path, json=json)


def call(socket_path: Path, method: str, path: str, **kwargs: Any) -> Any:
    """The synchronous form of ``request``."""
    return asyncio.run(request(socket_path, method, path, **kwargs))
