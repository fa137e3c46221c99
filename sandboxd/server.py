"""The HTTP adapter: the app factory, thin handlers, and the one error boundary.

Handlers parse the request into a pydantic model, call the core
(sandboxes.SandboxManager), and return the model. Every failure becomes an
RFC 9457 problem in ``error_middleware``, which holds the only table from
error class to HTTP status.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ValidationError

from sandboxd import __version__, errors, logs, netguard, openapi, sse, toolchains
from sandboxd.config import Settings
from sandboxd.models import (
    ALLOWED_LANGUAGES,
    CreateSandboxRequest,
    DaemonStatus,
    ExecRequest,
    Problem,
    SandboxList,
    Version,
)
from sandboxd.problems import HTTP_CODES, status_for
from sandboxd.sandboxes import SandboxManager

log = logging.getLogger("sandboxd.server")

MANAGER = web.AppKey("manager", SandboxManager)
SETTINGS = web.AppKey("settings", Settings)
STARTED = web.AppKey("started", float)


class LiveSettings:
    """The settings in force. SIGHUP swaps them; a running app's own state is frozen."""

    def __init__(self, settings: Settings) -> None:
        self.current = settings


LIVE_SETTINGS = web.AppKey("live_settings", LiveSettings)


def settings_of(app: web.Application) -> Settings:
    return app[LIVE_SETTINGS].current


_CHUNK = 256 * 1024


def problem_response(
    status: int, code: str, title: str, detail: str, extra: dict[str, Any] | None = None
) -> web.Response:
    body = Problem(
        type=f"urn:sandboxd:problem:{code}",
        title=title,
        status=status,
        detail=detail,
        code=code,
        **(extra or {}),
    )
    response = web.Response(
        status=status,
        text=body.model_dump_json(exclude_none=True),
        content_type="application/problem+json",
    )
    if status == 413:
        # The rest of the body was never read: do not try to reuse the connection.
        response.force_close()
    return response


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.SandboxdError as exc:
        response = problem_response(status_for(exc), exc.code, exc.title, exc.detail, exc.extra)
        if isinstance(exc, errors.TooManyRequests):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, title = HTTP_CODES.get(exc.status, ("http_error", exc.reason))
        detail = {
            404: f"There is no endpoint at {request.path}.",
            405: f"{request.method} is not allowed on {request.path}.",
        }.get(exc.status, exc.text or exc.reason)
        return problem_response(exc.status, code, title, detail)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return problem_response(
            500,
            "internal_error",
            "Internal error",
            "sandboxd hit an unexpected error; the daemon's log has the details.",
        )


# -- request parsing ------------------------------------------------------------

M = TypeVar("M", bound=BaseModel)


def _field_errors(exc: ValidationError, model: type[BaseModel]) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(body)"
        message = err["msg"]
        if err["loc"] == ("language",) and err["type"] == "enum":
            message = (
                f"unknown language {err['input']!r}; allowed: {', '.join(ALLOWED_LANGUAGES)}"
                + (
                    " (java is listed in the spec's runner table but is not a sandbox language)"
                    if err["input"] == "java"
                    else ""
                )
            )
        elif err["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            message = f"unknown field; the fields are: {allowed}"
        out.append({"field": field, "message": message})
    return out


async def parse_json(request: web.Request, model: type[M], allow_empty: bool = False) -> M:
    body = await request.read()
    if not body.strip() and allow_empty:
        body = b"{}"
    elif request.content_type != "application/json":
        raise errors.UnsupportedMediaType(
            f"Send the body as JSON with 'Content-Type: application/json' "
            f"(got {request.content_type!r})."
        )
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if "json_invalid" in kinds:
            raise errors.MalformedBody("The body is not valid JSON.") from None
        if any(e["loc"] == ("filename",) and e["type"] == "extra_forbidden" for e in exc.errors()):
            raise errors.LegacyField(
                "The field 'filename' was replaced by 'command' in v0.4.0: "
                'send the full command to run, for example {"command": "python main.py"}.',
                errors=[{"field": "filename", "message": "replaced by 'command' in v0.4.0"}],
            ) from None
        field_errors = _field_errors(exc, model)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in field_errors)
        raise errors.InvalidRequest(detail, errors=field_errors) from None


_FIELD_BYTES = 4096  # a text form field beside the file (path)


async def _text_field(part: BodyPartReader) -> str:
    data = b""
    while chunk := await part.read_chunk(_FIELD_BYTES + 1):
        data += chunk
        if len(data) > _FIELD_BYTES:
            raise errors.PayloadTooLarge(
                f"The form field {part.name!r} is longer than {_FIELD_BYTES} bytes."
            )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.MalformedBody(f"The form field {part.name!r} is not UTF-8.") from None


async def _drain(part: Any, budget: int) -> int:
    """Read and drop a form part, refusing it once it passes ``budget`` bytes."""
    size = 0
    while chunk := await part.read_chunk(_CHUNK):
        size += len(chunk)
        if size > budget:
            raise errors.PayloadTooLarge(
                "The form fields besides 'file' are larger than the upload limit."
            )
    return size


async def file_part(request: web.Request) -> tuple[BodyPartReader, dict[str, str]]:
    """The multipart part named 'file', after checking type and declared size,
    and the text fields sent before it (``path``)."""
    fields: dict[str, str] = {}
    skipped = 0
    if request.content_type != "multipart/form-data":
        raise errors.UnsupportedMediaType(
            "Send the file as a multipart form upload (curl -F file=@path), "
            f"not {request.content_type!r}."
        )
    limit = settings_of(request.app).limits.upload_bytes
    if request.content_length is not None and request.content_length > limit + 64 * 1024:
        raise errors.PayloadTooLarge(
            f"The upload declares {request.content_length} bytes; the limit is {limit} bytes."
        )
    try:
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                break
            if isinstance(part, BodyPartReader) and part.name == "file":
                return part, fields
            if isinstance(part, BodyPartReader) and part.name == "path":
                fields["path"] = await _text_field(part)
                continue
            # Other fields are read and dropped, and count against the limit.
            skipped += await _drain(part, limit - skipped)
    except (ValueError, AssertionError, HttpProcessingError) as exc:
        raise errors.MalformedBody(f"The multipart body could not be parsed: {exc}") from None
    raise errors.MissingFile("Put the file in the form field named 'file' (curl -F file=@path).")


async def chunks_of(part: BodyPartReader) -> AsyncIterator[bytes]:
    while True:
        chunk = await part.read_chunk(_CHUNK)
        if not chunk:
            return
        yield chunk


def json_response(model: BaseModel, status: int = 200) -> web.Response:
    return web.Response(
        status=status, text=model.model_dump_json(), content_type="application/json"
    )


# -- handlers -----------------------------------------------------------------------

routes = web.RouteTableDef()


@routes.post("/v1/sandboxes")
async def create_sandbox(request: web.Request) -> web.Response:
    body = await parse_json(request, CreateSandboxRequest, allow_empty=True)
    sandbox = request.app[MANAGER].create(body)
    request[logs.SANDBOX_ID] = sandbox.id
    return json_response(sandbox, 201)


@routes.get("/v1/sandboxes")
async def list_sandboxes(request: web.Request) -> web.Response:
    return json_response(SandboxList(sandboxes=request.app[MANAGER].list()))


@routes.get("/v1/sandboxes/{id}")
async def get_sandbox(request: web.Request) -> web.Response:
    return json_response(request.app[MANAGER].get(request.match_info["id"]))


@routes.delete("/v1/sandboxes/{id}")
async def delete_sandbox(request: web.Request) -> web.Response:
    await request.app[MANAGER].delete(request.match_info["id"])
    return web.Response(status=204)


@routes.post("/v1/sandboxes/{id}/files")
async def upload_file(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    sandbox_id = request.match_info["id"]
    manager.get(sandbox_id)  # 404 before reading any of the body
    part, fields = await file_part(request)
    result = await manager.put_file(
        sandbox_id, part.filename, chunks_of(part), folder=fields.get("path")
    )
    return json_response(result, 201)


@routes.get("/v1/sandboxes/{id}/files")
async def list_files(request: web.Request) -> web.Response:
    recursive = request.query.get("recursive", "false").lower()
    if recursive not in ("true", "false", "1", "0"):
        raise errors.InvalidRequest(
            "recursive must be true or false.",
            errors=[{"field": "recursive", "message": "true or false"}],
        )
    listing = await request.app[MANAGER].list_files(
        request.match_info["id"], request.query.get("path", ""), recursive in ("true", "1")
    )
    return json_response(listing)


async def _stream_fd(
    request: web.Request, fd: int, size: int, content_type: str, filename: str
) -> web.StreamResponse:
    """Send an open file, chunk by chunk, then close it."""
    loop = asyncio.get_running_loop()
    try:
        response = web.StreamResponse(
            headers={
                "Content-Type": content_type,
                "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}",
            }
        )
        response.content_length = size
        await response.prepare(request)
        while chunk := await loop.run_in_executor(None, os.read, fd, _CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        os.close(fd)


@routes.get("/v1/sandboxes/{id}/files/{path:.+}")
async def download_file(request: web.Request) -> web.StreamResponse:
    fd, size, name = request.app[MANAGER].open_file(
        request.match_info["id"], request.match_info["path"]
    )
    content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return await _stream_fd(request, fd, size, content_type, name)


@routes.delete("/v1/sandboxes/{id}/files/{path:.+}")
async def delete_file(request: web.Request) -> web.Response:
    await request.app[MANAGER].delete_file(request.match_info["id"], request.match_info["path"])
    return web.Response(status=204)


@routes.get("/v1/sandboxes/{id}/archive")
async def download_archive(request: web.Request) -> web.StreamResponse:
    sandbox_id = request.match_info["id"]
    fd, size = await request.app[MANAGER].archive(sandbox_id)
    return await _stream_fd(request, fd, size, "application/zip", f"{sandbox_id}.zip")


@routes.post("/v1/sandboxes/{id}/upload")
async def upload_archive(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    sandbox_id = request.match_info["id"]
    manager.get(sandbox_id)
    part, fields = await file_part(request)
    result = await manager.put_archive(sandbox_id, chunks_of(part), folder=fields.get("path"))
    return json_response(result, 201)


@routes.post("/v1/sandboxes/{id}/exec")
async def exec_command(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER]
    sandbox_id = request.match_info["id"]
    manager.get(sandbox_id)
    body = await parse_json(request, ExecRequest)
    if sse.wants_events(request):
        return await sse.stream_exec(request, manager, sandbox_id, body)
    return json_response(await manager.exec(sandbox_id, body))


@routes.get("/v1/openapi.json")
async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


@routes.get("/v1/version")
async def version(request: web.Request) -> web.Response:
    return json_response(Version(version=__version__))


@routes.get("/v1/status")
async def status(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    settings = settings_of(request.app)
    return json_response(
        DaemonStatus(
            version=__version__,
            pid=os.getpid(),
            uptime_seconds=round(time.monotonic() - request.app[STARTED], 3),
            socket=str(settings.socket_path),
            data_dir=str(settings.data_dir),
            sandboxes=manager.count,
            running_commands=manager.running_commands,
            isolation=manager.isolation(),
            limits=settings.limits.model_dump(),
        )
    )


def create_app(
    settings: Settings,
    manager: SandboxManager | None = None,
    *,
    tcp_guard: netguard.TcpGuard | None = None,
) -> web.Application:
    """The app. With ``tcp_guard``, requests that arrive over TCP must pass its checks."""
    app = web.Application(
        middlewares=[netguard.middleware(tcp_guard), error_middleware],
        client_max_size=settings.limits.json_body_bytes,
    )
    app[SETTINGS] = settings
    app[LIVE_SETTINGS] = LiveSettings(settings)
    app[MANAGER] = manager or SandboxManager(settings, toolchains.detect(settings))
    app[STARTED] = time.monotonic()

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        app[MANAGER].open()
        yield
        await app[MANAGER].close()

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(routes)
    return app
