"""The client's one error boundary, against a fake daemon that misbehaves on purpose."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from sandboxd.client import (
    AsyncClient,
    ConnectionLost,
    DaemonError,
    SandboxDeleted,
    TooManyRequests,
)


def _frame(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _exec(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_frame("stdout", {"text": "partial\n"}))
    match request.match_info["id"]:
        case "sb-deleted":
            problem = {"code": "sandbox_deleted", "title": "t", "detail": "It was deleted."}
            await response.write(_frame("error", problem))
        case "sb-deleted-410":
            problem = {"code": "sandbox_deleted", "detail": "It was deleted.", "status": 410}
            await response.write(_frame("error", problem))
        case _:
            pass  # the stream just ends: no result
    await response.write_eof()
    return response


async def _busy(request: web.Request) -> web.Response:
    return web.json_response(
        {"code": "too_many_requests", "detail": "Too many commands run.", "status": 429},
        status=429,
        headers={"Retry-After": "7"},
        content_type="application/problem+json",
    )


async def _proxy_page(request: web.Request) -> web.Response:
    return web.Response(status=502, text="<h1>Bad gateway</h1>", content_type="text/html")


@pytest.fixture
async def fake_daemon(short_tmp: Path) -> AsyncIterator[Path]:
    app = web.Application()
    app.router.add_post("/v1/sandboxes/{id}/exec", _exec)
    app.router.add_get("/v1/sandboxes/sb-busy", _busy)
    app.router.add_get("/v1/sandboxes/sb-proxy", _proxy_page)
    runner = web.AppRunner(app)
    await runner.setup()
    socket = short_tmp / "fake.sock"
    await web.UnixSite(runner, str(socket)).start()
    yield socket
    await runner.cleanup()


async def test_an_error_event_raises_its_class(fake_daemon: Path):
    seen: list[str] = []
    async with AsyncClient(fake_daemon) as client:
        with pytest.raises(SandboxDeleted) as caught:
            await client.exec("sb-deleted", "x", on_output=lambda s, t: seen.append(t))
        assert seen == ["partial\n"]
        assert caught.value.detail == "It was deleted."
        assert caught.value.status == 200  # the stream's own status: the event named none
        with pytest.raises(SandboxDeleted) as with_status:
            await client.exec("sb-deleted-410", "x", on_output=lambda s, t: None)
        assert with_status.value.status == 410


async def test_a_stream_that_ends_without_a_result_is_a_lost_connection(fake_daemon: Path):
    async with AsyncClient(fake_daemon) as client:
        with pytest.raises(ConnectionLost, match="without a result"):
            await client.exec("sb-cut", "x", on_output=lambda s, t: None)


async def test_a_callback_that_raises_stops_the_call(fake_daemon: Path):
    def explode(stream: str, text: str) -> None:
        raise KeyError("from the callback")

    async with AsyncClient(fake_daemon) as client:
        with pytest.raises(KeyError, match="from the callback"):
            await client.exec("sb-cut", "x", on_output=explode)


async def test_retry_after_comes_from_the_header(fake_daemon: Path):
    async with AsyncClient(fake_daemon) as client:
        with pytest.raises(TooManyRequests) as caught:
            await client.get("sb-busy")
    assert caught.value.retry_after == 7.0
    assert caught.value.status == 429


async def test_a_body_that_is_no_problem_still_raises_with_its_text(fake_daemon: Path):
    async with AsyncClient(fake_daemon) as client:
        with pytest.raises(DaemonError) as caught:
            await client.get("sb-proxy")
    assert type(caught.value) is DaemonError
    assert (caught.value.status, caught.value.code) == (502, "unknown")
    assert caught.value.detail == "<h1>Bad gateway</h1>"
