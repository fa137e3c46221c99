"""The two halves of the systemd protocol a service needs, in plain stdlib.

Socket activation (sd_listen_fds(3)): systemd binds the socket, starts us on
the first connection and hands the listening socket over as fd 3 (and up),
announced by LISTEN_FDS; LISTEN_PID says which process they are meant for,
so that a child that inherited the environment does not take them too.

Readiness (sd_notify(3)): with Type=notify systemd waits for READY=1 on the
datagram socket named by NOTIFY_SOCKET before it counts the service as
started, and STOPPING=1 tells it a stop is under way. A name starting with
"@" is an abstract socket. Without NOTIFY_SOCKET every notify is a no-op, so
the daemon behaves the same by hand, under `sandboxd start` and in tests.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("sandboxd.systemd")

SD_LISTEN_FDS_START = 3
_ACTIVATION_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(Exception):
    """The environment announces sockets that are not usable listening sockets."""


def listen_fds(environ: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The listening sockets systemd passed to this process, in order (maybe none).

    The activation variables are removed from the environment either way, so
    no child process (a toolchain probe, setpriv, bwrap) can see or claim them.
    """
    env = os.environ if environ is None else environ
    pid, count = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    for name in _ACTIVATION_VARS:
        env.pop(name, None)
    if pid is None or count is None:
        return []
    if not pid.isdigit() or int(pid) != os.getpid():
        # Meant for another process (we inherited them from our parent).
        return []
    if not count.isdigit():
        raise ActivationError(f"LISTEN_FDS={count!r} is not a number.")
    sockets: list[socket.socket] = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)):
        try:
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            raise ActivationError(
                f"LISTEN_FDS names fd {fd}, which is not a socket: {exc}"
            ) from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        ):
            sock.detach()
            raise ActivationError(
                f"fd {fd} is not a listening stream socket; use ListenStream= in the .socket unit."
            )
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


class Notifier:
    """Sends sd_notify(3) messages to systemd, or nothing when not run by it."""

    def __init__(self, address: str | None) -> None:
        if address and address.startswith("@"):
            address = "\0" + address[1:]  # abstract namespace
        self.address = address or None

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        """Take NOTIFY_SOCKET out of the environment (children must not write to it)."""
        env = os.environ if environ is None else environ
        return cls(env.pop("NOTIFY_SOCKET", None))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; True if it was sent."""
        if self.address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:
            # systemd being gone is no reason for the daemon to fail.
            log.warning("could not notify systemd on %s: %s", self.address.lstrip("\0"), exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str) -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")
