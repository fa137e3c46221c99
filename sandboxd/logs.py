"""Logging: one line per event on stderr, in a form journald keeps, and the access log.

Under systemd (JOURNAL_STREAM names our stderr) each line starts with a
syslog priority, ``<6>``, which journald turns into the entry's level and
strips; it stamps the time itself. Elsewhere (a terminal, the log file of
`sandboxd start`) lines carry a timestamp and the level's name.

The access log has one line per request: method, path, status, duration,
sandbox id and listener. It is built from the request line and the route
only: never a body, a header (the TCP token is one) or an environment.
The path is logged percent-encoded as it arrived, so a ``%0A`` in it cannot
forge a second log line.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from typing import Any, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

ACCESS = "sandboxd.access"

# logging levels -> syslog priorities (sd-daemon(3) prefixes).
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        # A multi-line message (a traceback) stays one journal entry per line,
        # each at the record's priority.
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines() or [""])


def stderr_is_journal(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """True when stream is the journald connection systemd gave us (JOURNAL_STREAM=dev:ino)."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def setup(level: str, stream: TextIO | None = None) -> None:
    """Send every sandboxd log line to stderr at ``level`` (debug, info, warning, error)."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    if stderr_is_journal(out):
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
            )
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's own loggers say little of use at debug and could echo a bad
    # request's bytes: keep them at warning unless asked for debug explicitly.
    if level.lower() != "debug":
        logging.getLogger("aiohttp").setLevel(max(logging.WARNING, root.level))


def listener_of(request: web.BaseRequest) -> str:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    family = getattr(sock, "family", None)
    if family is None:
        return "-"
    return "unix" if family == socket.AF_UNIX else "tcp"


# Set by handlers that learn a sandbox id the path does not hold (create).
# A typed key where aiohttp has them (3.13+), a plain string before.
_RequestKey = getattr(web, "RequestKey", None)
SANDBOX_ID: Any = _RequestKey("sandbox_id", str) if _RequestKey else "sandboxd.sandbox_id"
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,80}")


def sandbox_of(request: web.BaseRequest) -> str:
    match_info = getattr(request, "match_info", None) or {}
    value = request.get(SANDBOX_ID) or match_info.get("id")
    if not value:
        return "-"
    # The path's id is decoded client input: log it only when it is plain.
    return str(value) if _SAFE_ID.fullmatch(str(value)) else "?"


class AccessLogger(AbstractAccessLogger):
    """``GET /v1/sandboxes/sb-1 200 1.2ms sandbox=sb-1 via=unix``"""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %d %.1fms sandbox=%s via=%s",
            request.method,
            request.rel_url.raw_path,
            response.status,
            time * 1000,
            sandbox_of(request),
            listener_of(request),
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
