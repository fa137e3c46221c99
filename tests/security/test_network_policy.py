"""Network policy: none by default; "network": true gives outbound access through
slirp4netns with the host's loopback (and so the daemon and local services) out of reach."""

from __future__ import annotations

import socket
from typing import Any

from sandboxd.server import create_app
from tests.conftest import make_settings

ROUTES = "cat /proc/net/route | awk 'NR>1 {print $1}' | sort -u; ls /sys/class/net 2>/dev/null"


async def _create(client: Any, **body: Any) -> dict[str, Any]:
    r = await client.post("/v1/sandboxes", json=body)
    payload = await r.json()
    assert r.status == 201, payload
    return payload


async def _exec(client: Any, sid: str, command: str) -> dict[str, Any]:
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": command})
    payload = await r.json()
    assert r.status == 200, payload
    return payload


async def test_no_network_by_default(client):
    made = await _create(client)
    assert made["network"] is False
    result = await _exec(
        client, made["id"], "cat /proc/net/route | wc -l; grep -c tap0 /proc/net/dev"
    )
    # Only the header line of the routing table, and no tap0.
    assert result["stdout"].split() == ["1", "0"]


async def test_network_true_gives_an_interface_and_a_default_route(client):
    made = await _create(client, network=True)
    assert made["network"] is True
    result = await _exec(client, made["id"], "cat /proc/net/route; cat /etc/resolv.conf")
    assert result["exit_code"] == 0, result["output"]
    routes = [line.split() for line in result["stdout"].splitlines() if line.startswith("tap0")]
    # A default route (destination 0) through slirp4netns's gateway 10.0.2.2.
    assert ["tap0", "00000000", "0202000A"] in [r[:3] for r in routes]
    assert "nameserver 10.0.2.3" in result["stdout"]


async def test_network_sandbox_cannot_reach_host_loopback(client):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        made = await _create(client, network=True)
        probe = (
            'python3 -c "import socket,sys; s=socket.socket(); s.settimeout(3); '
            f"print(s.connect_ex(('10.0.2.2', {port})))\""
        )
        result = await _exec(client, made["id"], probe)
        code = int(result["stdout"].strip())
        assert code != 0  # refused or unreachable, never connected
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            conn = None
        assert conn is None, "the host's loopback listener was reached from the sandbox"
        # And 127.0.0.1 inside is the sandbox's own loopback, not the host's.
        result = await _exec(
            client,
            made["id"],
            'python3 -c "import socket; s=socket.socket(); s.settimeout(2); '
            f"print(s.connect_ex(('127.0.0.1', {port})))\"",
        )
        assert int(result["stdout"].strip()) != 0
    finally:
        listener.close()


async def test_network_without_the_helper_is_refused_clearly(aiohttp_client, short_tmp):
    settings = make_settings(short_tmp).model_copy(update={"slirp4netns": "/nonexistent/slirp"})
    client = await aiohttp_client(create_app(settings))
    r = await client.post("/v1/sandboxes", json={"network": True})
    assert r.status == 503
    problem = await r.json()
    assert problem["code"] == "network_unavailable"
    assert "apt-get install slirp4netns" in problem["detail"]
    # Without network it still works.
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201


async def test_network_must_be_a_boolean(client):
    r = await client.post("/v1/sandboxes", json={"network": "yes"})
    assert r.status == 422
