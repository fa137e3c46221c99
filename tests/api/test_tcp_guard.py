"""TCP mode's checks: Host (DNS rebinding), Origin / Sec-Fetch-Site (CSRF), the bearer token.

The aiohttp test client connects over TCP to 127.0.0.1, like a TCP-mode
client; the Host values are design.md's lists plus their obvious variants.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from sandboxd.netguard import TcpGuard
from sandboxd.server import create_app
from tests.conftest import form_with_file

TOKEN = "t0k3n-" + "x" * 40
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def tcp(aiohttp_client: Any, settings) -> Any:
    app = create_app(settings, tcp_guard=TcpGuard(token=TOKEN))

    async def leaky(request: web.Request) -> web.Response:
        # A handler that (wrongly) allows CORS: the middleware must strip it.
        return web.Response(
            text="x",
            headers={"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Credentials": "1"},
        )

    app.router.add_get("/test/leaky-cors", leaky)
    return await aiohttp_client(app)


def port_of(client: Any) -> int:
    return int(client.server.port)


async def get(client: Any, headers: dict[str, str], path: str = "/v1/version", **kw: Any):
    async with client.get(path, headers={**AUTH, **headers}, **kw) as r:
        return r.status, await r.json(content_type=None), r.headers


# -- Host ---------------------------------------------------------------------------

ACCEPTED_HOSTS = [
    "localhost:{port}",
    "127.0.0.1:{port}",
    "[::1]:{port}",
    "LOCALHOST:{port}",  # host names are case-insensitive
    "LocalHost:{port}",
]

REFUSED_HOSTS = [
    # design.md's list
    "evil.com",
    "evil.com:{port}",
    "localhost.evil.com:{port}",
    "127.0.0.1.nip.io:{port}",
    ":{port}",
    "localhost:{other}",
    "127.0.0.1:{other}",
    "[::1]:{other}",
    # variants
    "localhost",
    "127.0.0.1",
    "[::1]",
    "localhost.:{port}",
    "LOCALHOST.:{port}",
    "127.0.0.2:{port}",
    "0.0.0.0:{port}",
    "2130706433:{port}",
    "0x7f000001:{port}",
    "127.1:{port}",
    "017700000001:{port}",
    "[0:0:0:0:0:0:0:1]:{port}",
    "[::ffff:127.0.0.1]:{port}",
    "::1:{port}",
    "[::1]",
    "localhost:0{port}",
    "localhost:{port}:{port}",
    "localhost:{port}.",
    "user@localhost:{port}",
    "localhost:",
    "",
]


@pytest.mark.parametrize("host", ACCEPTED_HOSTS)
async def test_loopback_hosts_with_the_right_port_are_accepted(tcp, host):
    status, body, _ = await get(tcp, {"Host": host.format(port=port_of(tcp))})
    assert status == 200, body
    assert body["api"] == "v1"


@pytest.mark.parametrize("host", REFUSED_HOSTS)
async def test_other_hosts_are_refused(tcp, host):
    port = port_of(tcp)
    value = host.format(port=port, other=port + 1 if port < 65535 else port - 1)
    status, body, _ = await get(tcp, {"Host": value})
    assert status == 403
    assert body["code"] == "host_not_allowed"


async def _raw(client: Any, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port_of(client))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_two_host_headers_are_refused(tcp):
    port = port_of(tcp)
    answer = await _raw(
        tcp,
        (
            f"GET /v1/version HTTP/1.1\r\nHost: localhost:{port}\r\nHost: evil.com:{port}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        ).encode(),
    )
    status = answer.split(b" ", 2)[1]
    assert status in (b"400", b"403")  # aiohttp's parser or our check


async def test_missing_host_is_refused(tcp):
    request = f"GET /v1/version HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    answer = await _raw(tcp, request.encode())
    # aiohttp's parser refuses HTTP/1.1 without Host itself; HTTP/1.0 reaches our check.
    assert answer.split(b" ", 2)[1] in (b"400", b"403")


async def test_http_1_0_without_host_is_refused(tcp):
    answer = await _raw(
        tcp, f"GET /v1/version HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    assert answer.split(b" ", 2)[1] == b"403"


async def test_absolute_form_target_does_not_bypass_the_host_check(tcp):
    port = port_of(tcp)
    answer = await _raw(
        tcp,
        (
            f"GET http://localhost:{port}/v1/version HTTP/1.1\r\nHost: evil.com:{port}\r\n"
            f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        ).encode(),
    )
    assert answer.split(b" ", 2)[1] in (b"400", b"403")


# -- Origin and Sec-Fetch-Site --------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.com",
        "https://evil.com",
        "null",
        "http://localhost.evil.com:{port}",
        "http://localhost:{other}",
        "https://localhost:{port}",
        "http://localhost",
        "http://127.0.0.1:{port}.nip.io",
        "",
    ],
)
async def test_a_foreign_origin_is_refused_even_with_the_token(tcp, origin):
    port = port_of(tcp)
    status, body, _ = await get(tcp, {"Origin": origin.format(port=port, other=port + 1)})
    assert status == 403
    assert body["code"] == "cross_origin_refused"


@pytest.mark.parametrize("origin", ["http://localhost:{port}", "http://127.0.0.1:{port}"])
async def test_the_daemons_own_origin_is_accepted(tcp, origin):
    status, _, _ = await get(tcp, {"Origin": origin.format(port=port_of(tcp))})
    assert status == 200


@pytest.mark.parametrize("site", ["cross-site", "Cross-Site"])
async def test_sec_fetch_site_cross_site_is_refused(tcp, site):
    status, body, _ = await get(tcp, {"Sec-Fetch-Site": site})
    assert status == 403
    assert body["code"] == "cross_origin_refused"


@pytest.mark.parametrize("site", ["same-origin", "none"])
async def test_sec_fetch_site_same_origin_or_typed_url_is_accepted(tcp, site):
    status, _, _ = await get(tcp, {"Sec-Fetch-Site": site})
    assert status == 200


async def test_the_csrf_shapes_that_need_no_preflight_are_refused(tcp):
    """What a page on evil.com can send without CORS asking first: multipart and text/plain."""
    port = port_of(tcp)
    browser = {"Host": f"127.0.0.1:{port}", "Origin": "http://evil.com"}
    async with tcp.post(
        "/v1/sandboxes",
        data='{"language": "python"}',
        headers={**browser, "Content-Type": "text/plain"},
    ) as r:
        assert r.status == 403
    async with tcp.post(
        "/v1/sandboxes/sb-x/files", data=form_with_file(b"x", "x.py"), headers=browser
    ) as r:
        assert r.status == 403
    # And nothing was created.
    async with tcp.get("/v1/sandboxes", headers=AUTH) as r:
        assert (await r.json())["sandboxes"] == []


# -- the token ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Basic {TOKEN}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer x{TOKEN}",
        f"Token {TOKEN}",
        f"Bearer {TOKEN.upper()}",
        "Bearer tökén",
    ],
)
async def test_requests_without_the_right_token_are_401(tcp, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    async with tcp.get("/v1/version", headers=headers) as r:
        assert r.status == 401
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        body = await r.json(content_type=None)
    assert body["code"] == "unauthorized"
    assert TOKEN not in str(body)


async def test_bearer_scheme_is_case_insensitive(tcp):
    async with tcp.get("/v1/version", headers={"Authorization": f"bearer {TOKEN}"}) as r:
        assert r.status == 200


async def test_two_authorization_headers_are_refused(tcp):
    port = port_of(tcp)
    answer = await _raw(
        tcp,
        (
            f"GET /v1/version HTTP/1.1\r\nHost: localhost:{port}\r\n"
            f"Authorization: Bearer wrong\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Connection: close\r\n\r\n"
        ).encode(),
    )
    assert answer.split(b" ", 2)[1] in (b"400", b"401")


async def test_every_endpoint_is_guarded(tcp):
    for method, path in [
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/sb-x"),
        ("DELETE", "/v1/sandboxes/sb-x"),
        ("POST", "/v1/sandboxes/sb-x/files"),
        ("POST", "/v1/sandboxes/sb-x/upload"),
        ("POST", "/v1/sandboxes/sb-x/exec"),
        ("GET", "/v1/status"),
        ("GET", "/v1/version"),
        ("GET", "/no/such/endpoint"),
    ]:
        async with tcp.request(method, path) as r:
            assert r.status == 401, (method, path)


async def test_a_refused_request_closes_the_connection(tcp):
    async with tcp.get("/v1/version") as r:
        assert r.status == 401
        assert r.headers.get("Connection", "").lower() == "close"


# -- no CORS, ever ---------------------------------------------------------------------


async def test_a_preflight_gets_no_cors_headers(tcp):
    port = port_of(tcp)
    async with tcp.options(
        "/v1/sandboxes",
        headers={
            "Origin": f"http://localhost:{port}",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    ) as r:
        assert not any(h.lower().startswith("access-control-") for h in r.headers)


async def test_cors_headers_set_by_a_handler_are_stripped(tcp):
    async with tcp.get("/test/leaky-cors", headers=AUTH) as r:
        assert r.status == 200
        assert not any(h.lower().startswith("access-control-") for h in r.headers)


async def test_successful_answers_carry_no_cors_headers(tcp):
    _, _, headers = await get(tcp, {"Origin": f"http://localhost:{port_of(tcp)}"})
    assert not any(h.lower().startswith("access-control-") for h in headers)


# -- without a guard ----------------------------------------------------------------------


async def test_without_tcp_mode_the_app_asks_for_nothing(client):
    # The plain app (Unix socket only in real use) has no token and no Host rules.
    async with client.get("/v1/version", headers={"Host": "evil.com"}) as r:
        assert r.status == 200
