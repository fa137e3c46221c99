"""Which inherited sockets the daemon accepts, and what it makes itself."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sandboxd import daemon
from sandboxd.config import Listen, Settings


def _settings(root: Path, **listen: object) -> Settings:
    return Settings(
        socket_path=root / "run" / "s.sock",
        data_dir=root / "data",
        listen=Listen(token_file=root / "token", **listen),  # type: ignore[arg-type]
    )


def _tcp(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(1)
    return sock


def test_an_inherited_unix_socket_is_served_and_not_ours_to_remove(short_tmp: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(short_tmp / "a.sock"))
    sock.listen(1)
    [listener] = daemon.adopt([sock], _settings(short_tmp))
    assert (listener.kind, listener.name, listener.owned_inode) == (
        "unix",
        str(short_tmp / "a.sock"),
        None,
    )
    daemon.close_listeners([listener])
    assert (short_tmp / "a.sock").exists()


def test_an_abstract_unix_socket_is_refused(short_tmp: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(f"\0sandboxd-test-{os.getpid()}")
    sock.listen(1)
    try:
        with pytest.raises(daemon.DaemonStartError, match="abstract"):
            daemon.adopt([sock], _settings(short_tmp))
    finally:
        sock.close()


def test_an_inherited_loopback_tcp_socket_becomes_a_guarded_listener(short_tmp: Path):
    sock = _tcp("127.0.0.1")
    try:
        listeners = daemon.open_listeners(_settings(short_tmp), [sock])
        kinds = [item.kind for item in listeners]
        assert kinds == ["unix", "tcp"]  # the Unix socket is made as well
        guard = daemon.tcp_guard_for(_settings(short_tmp), listeners)
        assert guard is not None
        assert (short_tmp / "token").exists()
    finally:
        daemon.close_listeners(listeners)
    assert not (short_tmp / "run" / "s.sock").exists()  # ours: removed


def test_an_inherited_wildcard_tcp_socket_needs_allow_remote(short_tmp: Path):
    sock = _tcp("0.0.0.0")
    try:
        with pytest.raises(daemon.DaemonStartError, match="allow-remote"):
            daemon.adopt([sock], _settings(short_tmp))
        [listener] = daemon.adopt([sock], _settings(short_tmp, allow_remote=True))
        assert listener.kind == "tcp"
    finally:
        sock.close()


def test_no_tcp_no_token(short_tmp: Path):
    listeners = daemon.open_listeners(_settings(short_tmp), [])
    try:
        assert daemon.tcp_guard_for(_settings(short_tmp), listeners) is None
        assert not (short_tmp / "token").exists()
    finally:
        daemon.close_listeners(listeners)


def test_a_port_in_use_is_a_start_error_that_leaves_no_socket(short_tmp: Path):
    busy = _tcp("127.0.0.1")
    port = busy.getsockname()[1]
    try:
        with pytest.raises(daemon.DaemonStartError, match="cannot listen"):
            daemon.open_listeners(_settings(short_tmp, tcp=f"127.0.0.1:{port}"), [])
    finally:
        busy.close()
    assert not (short_tmp / "run" / "s.sock").exists()
