"""No network: the host's loopback, the outside world and the daemon's socket are unreachable."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.security.helpers import create_sandbox, run

CONNECT = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A listening TCP socket on the host's 127.0.0.1, on a random port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


def _accepted_nothing(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


async def test_host_loopback_listener_is_unreachable(
    client: Any, sandbox: dict[str, Any], tcp_listener: socket.socket
) -> None:
    port = tcp_listener.getsockname()[1]
    # The host's own check that the listener works, so the refusal below means something.
    probe = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = tcp_listener.accept()
    conn.close()
    probe.close()

    result = await run(client, sandbox["id"], f"python3 -c '{CONNECT}' 127.0.0.1 {port}")
    assert result["exit_code"] == 0, result
    # The sandbox has its own loopback, where nothing listens.
    assert result["stdout"] == "ConnectionRefusedError 111\n"
    assert _accepted_nothing(tcp_listener)


async def test_host_loopback_udp_receives_nothing(client: Any, sandbox: dict[str, Any]) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.setblocking(False)
    port = receiver.getsockname()[1]
    try:
        send = (
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"[s.sendto(b'leak', ('127.0.0.1', {port})) for _ in range(5)]"
        )
        result = await run(client, sandbox["id"], f'python3 -c "{send}"')
        assert result["exit_code"] == 0, result
        with pytest.raises(BlockingIOError):
            receiver.recvfrom(100)
    finally:
        receiver.close()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.1", "OSError 101"),  # ENETUNREACH: no route, no interface but lo
        ("1.1.1.1", "OSError 101"),
        ("2606:4700:4700::1111", "OSError 101"),
    ],
)
async def test_outside_world_is_unreachable(
    client: Any, sandbox: dict[str, Any], address: str, expected: str
) -> None:
    result = await run(client, sandbox["id"], f"python3 -c '{CONNECT}' {address} 80")
    assert result["exit_code"] == 0, result
    assert result["stdout"] == expected + "\n"


async def test_only_loopback_interface_exists(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert result["exit_code"] == 0, result
    assert result["stdout"] == "lo\n"


async def test_names_do_not_resolve(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(
        client,
        sandbox["id"],
        "python3 -c \"import socket\ntry:\n socket.getaddrinfo('deb.debian.org', 80)\n"
        "except socket.gaierror as e: print('gaierror', e.errno)\"",
    )
    # No resolver is reachable: with no nsswitch.conf glibc asks DNS on 127.0.0.1
    # (refused: EAI_AGAIN); with "hosts: files" it answers EAI_NONAME.
    assert result["stdout"] in (
        f"gaierror {socket.EAI_AGAIN}\n",
        f"gaierror {socket.EAI_NONAME}\n",
    ), result


async def test_daemon_socket_is_unreachable_from_inside(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    sandbox = await create_sandbox(http)
    path = daemon.socket_path
    assert path.is_socket()
    connect = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as exc: print(type(exc).__name__, exc.errno)\n"
    )
    result = await run(
        http, sandbox["id"], f"python3 -c '{connect}' {path}; ls {path.parent}; ls {daemon.root}"
    )
    assert result["stdout"] == "FileNotFoundError 2\n"
    assert result["stderr"] == (
        f"ls: cannot access '{path.parent}': No such file or directory\n"
        f"ls: cannot access '{daemon.root}': No such file or directory\n"
    )
    # Nor through an abstract-namespace name: the network namespace has its own.
    result = await run(http, sandbox["id"], "cat /proc/net/unix | wc -l")
    assert result["stdout"] == "1\n"  # the header line only
