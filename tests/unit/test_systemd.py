"""The systemd protocol halves (socket activation, sd_notify) and the shipped unit files."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxd import systemd

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "contrib" / "systemd"


# -- LISTEN_FDS ---------------------------------------------------------------------


def test_no_activation_variables_means_no_sockets():
    env: dict[str, str] = {}
    assert systemd.listen_fds(env) == []


def test_sockets_meant_for_another_process_are_not_taken_and_variables_go():
    env = {"LISTEN_PID": str(os.getppid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    assert systemd.listen_fds(env) == []
    # A child must not see them either.
    assert env == {}


def test_garbage_pid_is_ignored():
    env = {"LISTEN_PID": "not-a-pid", "LISTEN_FDS": "1"}
    assert systemd.listen_fds(env) == []
    assert env == {}


def test_garbage_count_is_an_error():
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "many"}
    with pytest.raises(systemd.ActivationError):
        systemd.listen_fds(env)


def test_zero_fds_is_no_sockets():
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}
    assert systemd.listen_fds(env) == []


# Taking fd 3 for real happens in a subprocess, the way systemd does it, in
# tests/integration/test_operations.py; fd 3 of the test process is pytest's.


# -- NOTIFY_SOCKET ------------------------------------------------------------------


@pytest.fixture
def notify_socket(short_tmp: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = short_tmp / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    yield path, sock
    sock.close()


def _fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().splitlines())


def test_ready_and_stopping_reach_the_notify_socket(notify_socket):
    path, sock = notify_socket
    notifier = systemd.Notifier(str(path))
    assert notifier.ready("listening")
    ready = _fields(sock.recv(4096))
    assert ready["READY"] == "1"
    assert ready["MAINPID"] == str(os.getpid())
    assert ready["STATUS"] == "listening"
    assert notifier.stopping("bye")
    assert _fields(sock.recv(4096))["STOPPING"] == "1"


def test_reloading_carries_a_monotonic_timestamp(notify_socket):
    path, sock = notify_socket
    systemd.Notifier(str(path)).reloading()
    fields = _fields(sock.recv(4096))
    assert fields["RELOADING"] == "1"
    assert int(fields["MONOTONIC_USEC"]) > 0


def test_abstract_notify_socket():
    name = f"sandboxd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        assert systemd.Notifier("@" + name).ready("x")
        assert b"READY=1" in sock.recv(4096)
    finally:
        sock.close()


def test_without_notify_socket_nothing_is_sent():
    env: dict[str, str] = {}
    notifier = systemd.Notifier.from_environ(env)
    assert not notifier.enabled
    assert notifier.ready("x") is False


def test_notify_socket_is_taken_out_of_the_environment(notify_socket):
    path, _ = notify_socket
    env = {"NOTIFY_SOCKET": str(path)}
    notifier = systemd.Notifier.from_environ(env)
    assert notifier.enabled
    assert "NOTIFY_SOCKET" not in env


def test_a_vanished_notify_socket_is_not_fatal(short_tmp: Path):
    assert systemd.Notifier(str(short_tmp / "gone")).ready("x") is False


# -- the unit files -----------------------------------------------------------------


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((UNITS / name).read_text())
    return parser


def test_socket_unit_listens_where_the_daemon_expects_with_private_modes():
    unit = _unit("sandboxd.socket")
    assert unit["Socket"]["ListenStream"] == "%t/sandboxd/sandboxd.sock"
    assert unit["Socket"]["SocketMode"] == "0600"
    assert unit["Socket"]["DirectoryMode"] == "0700"
    assert unit["Install"]["WantedBy"] == "sockets.target"


def test_service_unit_is_type_notify_and_signals_only_the_daemon():
    service = _unit("sandboxd.service")["Service"]
    assert service["Type"] == "notify"
    assert service["ExecStart"].endswith("sandboxd serve")
    assert "kill -HUP $MAINPID" in service["ExecReload"]
    # control-group would SIGTERM the sandboxes too, defeating the grace period.
    assert service["KillMode"] == "mixed"
    assert float(service["TimeoutStopSec"]) > 10  # the default grace period
    assert service["NoNewPrivileges"] == "yes"


def test_service_unit_has_no_directive_that_breaks_bwrap():
    text = (UNITS / "sandboxd.service").read_text()
    directives = {
        line.split("=", 1)[0].strip()
        for line in text.splitlines()
        if "=" in line and not line.lstrip().startswith("#")
    }
    # Each of these blocks user namespaces, or (in a user unit) implies PrivateUsers=.
    forbidden = {
        "PrivateUsers",
        "RestrictNamespaces",
        "SystemCallFilter",
        "MemoryDenyWriteExecute",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "ReadWritePaths",
        "CapabilityBoundingSet",
    }
    assert directives & forbidden == set()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("mode", ["--user", "--system"])
def test_units_pass_systemd_analyze_verify(short_tmp: Path, mode: str):
    # ExecStart must name a program that exists: this checkout's sandboxd.
    sandboxd = Path(sys.executable).parent / "sandboxd"
    service = (UNITS / "sandboxd.service").read_text()
    service = re.sub(r"^ExecStart=\S+", f"ExecStart={sandboxd}", service, flags=re.M)
    (short_tmp / "sandboxd.service").write_text(service)
    shutil.copy(UNITS / "sandboxd.socket", short_tmp / "sandboxd.socket")
    runtime = short_tmp / "xdg"
    runtime.mkdir(mode=0o700)
    result = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            mode,
            "--man=no",
            str(short_tmp / "sandboxd.socket"),
            str(short_tmp / "sandboxd.service"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        timeout=60,
    )
    # verify exits 0 on unknown keys too; they show on stderr.
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
