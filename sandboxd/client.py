"""A small HTTP client for the daemon over its Unix socket.

HTTP failures become ``DaemonError`` here and nowhere else (docker-py's
single error boundary); a daemon that is not there becomes ``NotRunning``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp


class ClientError(Exception):
    """Base for everything the client raises."""


class NotRunning(ClientError):
    def __init__(self, socket_path: Path) -> None:
        super().__init__(f"sandboxd is not running (no daemon answers on {socket_path}).")
        self.socket_path = socket_path


class DaemonError(ClientError):
    """The daemon answered with an RFC 9457 problem."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any]) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body


async def request(
    socket_path: Path,
    method: str,
    path: str,
    *,
    json: Any = None,
    timeout: float = 30.0,
) -> Any:
    connector = aiohttp.UnixConnector(path=str(socket_path))
    try:
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as session,
            session.request(method, f"http://sandboxd{path}", json=json) as response,
        ):
            if response.status == 204:
                return None
            body = await response.json(content_type=None)
            if response.status >= 400:
                body = body if isinstance(body, dict) else {}
                raise DaemonError(
                    response.status,
                    str(body.get("code", "unknown")),
                    str(body.get("detail", response.reason)),
                    body,
                )
            return body
    except (aiohttp.ClientConnectorError, FileNotFoundError, ConnectionRefusedError) as exc:
        raise NotRunning(socket_path) from exc


def call(socket_path: Path, method: str, path: str, **kwargs: Any) -> Any:
    """The synchronous form of ``request``."""
    return asyncio.run(request(socket_path, method, path, **kwargs))
