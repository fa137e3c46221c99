"""Where TCP mode listens: parsing HOST:PORT, refusing non-loopback, binding.

Pure stdlib (no aiohttp), so config.py can validate ``listen.tcp`` with it.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass

log = logging.getLogger("sandboxd.listen")


@dataclass(frozen=True)
class ListenAddress:
    """Where TCP mode binds: an IP address (never a name to resolve) and a port."""

    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def family(self) -> socket.AddressFamily:
        return socket.AF_INET6 if self.ip.version == 6 else socket.AF_INET

    @property
    def is_loopback(self) -> bool:
        return self.ip.is_loopback

    @property
    def host_name(self) -> str:
        """The address as it appears in a Host header."""
        return f"[{self.ip}]" if self.ip.version == 6 else str(self.ip)

    def __str__(self) -> str:
        return f"{self.host_name}:{self.port}"


def parse_address(value: str) -> ListenAddress:
    """``127.0.0.1:8765``, ``[::1]:8765``, ``localhost:8765`` or a bare port (127.0.0.1)."""
    text = value.strip()
    if text.isdigit():
        host, port = "127.0.0.1", text
    elif text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError(f"{value!r}: write an IPv6 address as [ADDRESS]:PORT")
        host, port = text[1:end], text[end + 2 :]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{value!r}: give HOST:PORT, for example 127.0.0.1:8765")
        if ":" in host:
            raise ValueError(f"{value!r}: write an IPv6 address as [ADDRESS]:PORT")
    if host.lower() == "localhost":
        host = "127.0.0.1"  # not resolved: /etc/hosts must not move the listener
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"{value!r}: {host!r} is not an IP address; use 127.0.0.1, [::1] or localhost"
        ) from None
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 0 to 65535")
    return ListenAddress(ip, int(port))


class RemoteRefused(Exception):
    """A non-loopback TCP address without --allow-remote."""


def check_remote(address: ListenAddress, allow_remote: bool) -> None:
    if address.is_loopback:
        return
    if not allow_remote:
        raise RemoteRefused(
            f"{address} is not a loopback address: other machines could reach the daemon "
            "and run code on this one. Listen on 127.0.0.1 (or [::1]), or add "
            "--allow-remote if that is really what you want."
        )
    log.warning(
        "TCP mode listens on %s, which is NOT loopback: anyone who can reach it and holds "
        "the token runs code on this machine, and the token crosses the network in clear text",
        address,
    )


def bind_tcp(address: ListenAddress) -> socket.socket:
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if address.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((str(address.ip), address.port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def address_of(sock: socket.socket) -> ListenAddress:
    host, port = sock.getsockname()[:2]
    return ListenAddress(ipaddress.ip_address(host), port)
