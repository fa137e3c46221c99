"""Streaming exec over Server-Sent Events (the HTTP side of it).

A client that sends ``Accept: text/event-stream`` to exec gets ``stdout`` and
``stderr`` events as the command writes (data: {"text": ...}), a ``phase``
event when a test runner starts, and a final ``result`` event whose data is
exactly the JSON body the plain call returns (or ``error`` with a problem).
A client that goes away kills the command.
"""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from sandboxd import errors
from sandboxd.execution import Event
from sandboxd.models import ExecRequest, ExecResult
from sandboxd.problems import status_for
from sandboxd.sandboxes import SandboxManager

log = logging.getLogger("sandboxd.sse")

_CHECK_SECONDS = 0.5  # how often a silent command's client is checked for


def wants_events(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


def _frame(event: str, data: str) -> bytes:
    return f"event: {event}\ndata: {data}\n\n".encode()


def _event_frame(event: Event) -> bytes:
    if event.kind == "phase":
        return _frame("phase", json.dumps({"phase": "tests", "runner": event.text}))
    return _frame(event.kind, json.dumps({"text": event.text}))


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def stream_exec(
    request: web.Request, manager: SandboxManager, sandbox_id: str, body: ExecRequest
) -> web.StreamResponse:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    task: asyncio.Task[ExecResult] = asyncio.create_task(
        manager.exec(sandbox_id, body, on_event=queue.put_nowait)
    )
    # Refusals (bad cwd, too many commands...) happen before the command starts:
    # let them answer as ordinary problems, with their own status.
    await asyncio.sleep(0)
    if task.done() and task.exception() is not None:
        task.result()
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        while not (task.done() and queue.empty()):
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                {getter, task}, timeout=_CHECK_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if getter in done:
                await response.write(_event_frame(getter.result()))
            else:
                getter.cancel()
            if _gone(request):
                raise ConnectionResetError("client went away")
        try:
            result = task.result()
            await response.write(_frame("result", result.model_dump_json()))
        except errors.SandboxdError as exc:
            problem = {
                "code": exc.code,
                "title": exc.title,
                "detail": exc.detail,
                "status": status_for(exc),
            }
            await response.write(_frame("error", json.dumps(problem)))
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        # The client is gone: the command must not run on for nobody.
        task.cancel()
        log.info("streaming client left; command killed")
        raise
    finally:
        if not task.done():
            task.cancel()
    return response
