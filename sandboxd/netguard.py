"""TCP mode: the listen address, the bearer token, and the checks on every TCP request.

Theory of operation. On the Unix socket, file permissions (0600 in a 0700
folder) are the whole access control. A TCP port on 127.0.0.1 has none: any
local user can connect, and so can any web page in the user's browser. Three
checks, in this order, close that:

1. ``Host`` must be exactly ``localhost``, ``127.0.0.1`` or ``[::1]`` (the
   name case-insensitive) with the port the connection arrived on. A DNS
   rebinding attack makes ``evil.com`` resolve to 127.0.0.1, but the browser
   still sends ``Host: evil.com:PORT``. The list is exact on purpose: no
   trailing dot, no other spelling of an address (``2130706433``,
   ``[0:0:0:0:0:0:0:1]``, ``127.0.0.2``, ``0.0.0.0``), no missing port.
2. A browser's cross-site request is refused: an ``Origin`` header that is
   present and not the daemon's own origin, or ``Sec-Fetch-Site: cross-site``.
   Multipart and text/plain POSTs need no CORS preflight, so the browser
   sends them without asking; this is where they stop. No response ever
   carries an ``Access-Control-Allow-*`` header.
3. ``Authorization: Bearer <token>``, compared in constant time. The token
   is 32 random bytes, generated on first start into a 0600 file that only
   the owner can read, and never logged.

Requests on the Unix socket skip all three.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import socket
import stat
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from sandboxd.listen import ListenAddress
from sandboxd.models import Problem

log = logging.getLogger("sandboxd.netguard")

LOOPBACK_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")
TOKEN_MIN_LENGTH = 32


# -- the token -----------------------------------------------------------------------


class TokenError(Exception):
    """The token file is unsafe or unusable; the message says how to fix it."""


def read_token(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise TokenError(f"the token file {path} must be a regular file owned by you.")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise TokenError(
                f"the token file {path} can be read by others: delete it (a new token is "
                "made at the next start) or, if no one else has read it, chmod 600 it."
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    token = data.decode("ascii", errors="replace").strip()
    if len(token) < TOKEN_MIN_LENGTH or not token.isprintable() or " " in token:
        raise TokenError(
            f"the token in {path} is not usable (at least {TOKEN_MIN_LENGTH} printable "
            "characters, no spaces); delete the file to have a new one made."
        )
    return token


def load_or_create_token(path: Path) -> str:
    """The token in ``path``, made (0600, 32 random bytes) if the file does not exist yet."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.path.lexists(path):
        return read_token(path)
    token = secrets.token_urlsafe(32)
    # Written whole under another name, then linked into place: a reader (a
    # second daemon starting) sees either no file or the complete token.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return read_token(path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    log.info("made a new TCP token in %s", path)
    return token


# -- the checks on each request ----------------------------------------------------


@dataclass(frozen=True)
class TcpGuard:
    """What a TCP request must show: a loopback Host, no foreign origin, the token."""

    token: str
    # Further Host names (without port) accepted besides the loopback ones:
    # the bound address with --allow-remote, and listen.allowed_hosts.
    extra_hosts: frozenset[str] = frozenset()

    def host_names(self) -> set[str]:
        return {*LOOPBACK_HOST_NAMES, *(h.lower() for h in self.extra_hosts)}

    def host_allowed(self, values: list[str], port: int) -> bool:
        if len(values) != 1:
            return False  # none, or a second one a proxy might prefer
        name, sep, given_port = values[0].rpartition(":")
        if not sep or given_port != str(port):
            return False
        return name.lower() in self.host_names()

    def origin_allowed(self, values: list[str], port: int) -> bool:
        if not values:
            return True  # not sent: not a browser's cross-origin request
        if len(values) != 1:
            return False
        own = {f"http://{name}:{port}" for name in self.host_names()}
        return values[0].lower() in own

    def token_matches(self, values: list[str]) -> bool:
        if len(values) != 1:
            return False
        scheme, _, credentials = values[0].strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # Bytes, so that a non-ASCII header cannot make compare_digest raise.
        return hmac.compare_digest(credentials.strip().encode(), self.token.encode())


def extra_hosts_for(address: ListenAddress, allowed_hosts: Iterable[str]) -> frozenset[str]:
    extra = {h.strip().lower() for h in allowed_hosts if h.strip()}
    if not address.is_loopback and not address.ip.is_unspecified:
        extra.add(address.host_name.lower())
    return frozenset(extra)


@dataclass(frozen=True)
class Refusal:
    code: str
    response: web.Response


def _refusal(status: int, code: str, title: str, detail: str) -> Refusal:
    body = Problem(
        type=f"urn:sandboxd:problem:{code}", title=title, status=status, detail=detail, code=code
    )
    response = web.Response(
        status=status,
        text=body.model_dump_json(exclude_none=True),
        content_type="application/problem+json",
    )
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="sandboxd"'
    # The body was not read; do not let the client go on with this connection.
    response.force_close()
    return Refusal(code, response)


def _connection_port(request: web.Request) -> int | None:
    """The local port a TCP connection arrived on; None on a Unix socket."""
    transport = request.transport
    if transport is None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        return None
    sockname = transport.get_extra_info("sockname")
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return int(sockname[1])
    return -1  # TCP of some kind we cannot place: no Host will match


def check(guard: TcpGuard, request: web.Request, port: int) -> Refusal | None:
    """The refusal for a TCP request that fails a check, or None if it passes them all."""
    headers = request.headers
    if not guard.host_allowed(headers.getall("Host", []), port):
        return _refusal(
            403,
            "host_not_allowed",
            "Host not allowed",
            f"The Host header must be localhost:{port}, 127.0.0.1:{port} or [::1]:{port}.",
        )
    fetch_site = [v.strip().lower() for v in headers.getall("Sec-Fetch-Site", [])]
    if not guard.origin_allowed(headers.getall("Origin", []), port) or "cross-site" in fetch_site:
        return _refusal(
            403,
            "cross_origin_refused",
            "Cross-origin request refused",
            "sandboxd does not answer requests made by other web sites.",
        )
    if not guard.token_matches(headers.getall("Authorization", [])):
        return _refusal(
            401,
            "unauthorized",
            "Token required",
            "Send 'Authorization: Bearer TOKEN' with the token from the daemon's token file "
            "(see FILES in sandboxd(1)).",
        )
    return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(guard: TcpGuard | None) -> Middleware:
    """The aiohttp middleware: checks TCP requests (if there is a guard), strips CORS headers."""

    @web.middleware
    async def tcp_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        port = _connection_port(request)
        if guard is not None and port is not None:
            refused = check(guard, request, port)
            if refused is not None:
                # The Host is logged (repr: it is the attacker's), never the token.
                log.info(
                    "refused a TCP request (%s): Host %r, Origin %r",
                    refused.code,
                    request.headers.get("Host", "")[:200],
                    request.headers.get("Origin", "")[:200],
                )
                return refused.response
        response = await handler(request)
        # Never let a browser read an answer cross-origin, whatever set it.
        for name in [h for h in response.headers if h.lower().startswith("access-control-")]:
            del response.headers[name]
        return response

    return tcp_guard
