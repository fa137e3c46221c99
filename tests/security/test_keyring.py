"""Kernel keyrings: the daemon's session keyring must not be reachable from a sandbox.

Namespaces do not cover keyrings. A process started from a login session (ssh,
a terminal: pam_keyinit) has a session keyring that may hold credentials
(Kerberos KEYRING caches, ecryptfs or fscrypt keys). Everything the daemon
starts inherits it, and "possessor" permissions ignore uids, so unless each
sandbox gets its own session keyring (or keyctl is filtered), sandboxed code
can read and write it, and two sandboxes share it.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.security.helpers import create_sandbox, run

# keyctl(2) from inside the sandbox, with nothing but the standard library.
KEYCTL = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key, SYS_keyctl = 248, 250
SESSION = ctypes.c_int(-3)
def err():
    return "errno %d" % ctypes.get_errno()
action, name = sys.argv[1], sys.argv[2].encode()
if action == "add":
    data = sys.argv[3].encode()
    key = libc.syscall(SYS_add_key, b"user", name, data, len(data), SESSION)
    print("added" if key > 0 else err())
else:
    key = libc.syscall(SYS_keyctl, 10, SESSION, b"user", name, 0)  # KEYCTL_SEARCH
    if key < 0:
        print(err())
    else:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(SYS_keyctl, 11, key, buf, 256)  # KEYCTL_READ
        print(buf.raw[:n].decode() if n >= 0 else err())
"""

# Started instead of `python -m sandboxd`: join a new session keyring, put a
# secret key in it, then become the daemon (exec keeps the keyring).
LAUNCHER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(250, 1, b"sandboxd-test-session") < 0:  # KEYCTL_JOIN_SESSION_KEYRING
    sys.exit("join failed: %d" % ctypes.get_errno())
secret = os.environ.pop("SANDBOXD_KEY_SECRET").encode()
if libc.syscall(248, b"user", b"daemon-secret", secret, len(secret), ctypes.c_int(-3)) < 0:
    sys.exit("add_key failed: %d" % ctypes.get_errno())
os.execv(sys.executable, [sys.executable, "-m", "sandboxd", *sys.argv[1:]])
"""

EPERM = 1
ENOKEY = 126


@pytest.fixture
def keyring_daemon(short_tmp: Path) -> Iterator[tuple[Path, str]]:
    """A real daemon whose session keyring holds a secret key; yields (socket, secret)."""
    yield from _keyring_daemon(short_tmp, seccomp=True)


@pytest.fixture
def keyring_daemon_no_seccomp(short_tmp: Path) -> Iterator[tuple[Path, str]]:
    yield from _keyring_daemon(short_tmp, seccomp=False)


def _keyring_daemon(short_tmp: Path, seccomp: bool) -> Iterator[tuple[Path, str]]:
    if not seccomp:
        (short_tmp / "config.toml").write_text("seccomp = false\n")
    secret = f"TOPSECRET-{secrets.token_hex(8)}"
    sock = short_tmp / "run" / "s.sock"
    log = open(short_tmp / "daemon.log", "ab")  # noqa: SIM115 - the child's log
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            "--socket",
            str(sock),
            "--data-dir",
            str(short_tmp / "data"),
            "--config",
            str(short_tmp / "config.toml"),
            "serve",
        ],
        env={**os.environ, "SANDBOXD_KEY_SECRET": secret},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    log.close()
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError((short_tmp / "daemon.log").read_text())
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(sock))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            finally:
                probe.close()
        yield sock, secret
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _session(sock: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(sock)), base_url="http://sandboxd"
    )


async def _keyctl(http: Any, sandbox_id: str, *args: str) -> str:
    assert "'" not in KEYCTL
    quoted = " ".join(f"'{a}'" for a in args)
    result = await run(http, sandbox_id, f"python3 -c '{KEYCTL}' {quoted}")
    assert result["exit_code"] == 0, result
    return str(result["stdout"]).strip()


async def test_daemon_session_key_is_not_readable(keyring_daemon: tuple[Path, str]) -> None:
    sock, secret = keyring_daemon
    async with _session(sock) as http:
        sandbox = await create_sandbox(http)
        found = await _keyctl(http, sandbox["id"], "read", "daemon-secret")
    assert secret not in found
    # The seccomp filter refuses keyctl(2) outright.
    assert found == f"errno {EPERM}"


async def test_sandboxes_do_not_share_a_keyring(keyring_daemon: tuple[Path, str]) -> None:
    sock, _ = keyring_daemon
    message = secrets.token_hex(8)
    async with _session(sock) as http:
        writer = await create_sandbox(http)
        reader = await create_sandbox(http)
        assert await _keyctl(http, writer["id"], "add", "note", message) == f"errno {EPERM}"
        assert await _keyctl(http, reader["id"], "read", "note") == f"errno {EPERM}"


async def test_keyctl_is_refused_in_process(client: Any, sandbox: dict[str, Any]) -> None:
    assert await _keyctl(client, sandbox["id"], "read", "anything") == f"errno {EPERM}"
    assert await _keyctl(client, sandbox["id"], "add", "k", "v") == f"errno {EPERM}"


async def test_without_seccomp_the_daemon_key_is_still_hidden(
    keyring_daemon_no_seccomp: tuple[Path, str],
) -> None:
    sock, secret = keyring_daemon_no_seccomp
    async with _session(sock) as http:
        sandbox = await create_sandbox(http)
        found = await _keyctl(http, sandbox["id"], "read", "daemon-secret")
    assert secret not in found
    assert found == f"errno {ENOKEY}"
