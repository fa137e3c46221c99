"""Each doctor check, on the real host and on hosts faked to be broken in one way."""

from __future__ import annotations

import errno
import os
import shutil
import socket
from collections import namedtuple
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandboxd import doctor
from sandboxd.cli import main
from sandboxd.config import Settings, ToolchainConfig
from sandboxd.models import Language
from tests.conftest import make_settings

Level = doctor.Level


def fake_bwrap(root: Path, script: str) -> str:
    path = root / "fake-bwrap"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def with_bwrap(settings: Settings, bwrap: str) -> Settings:
    return settings.model_copy(update={"bwrap": bwrap})


# -- bwrap ----------------------------------------------------------------------------


def test_real_bwrap_is_ok(settings):
    check = doctor.check_bwrap(settings)
    assert check.level is Level.ok
    assert "bubblewrap" in check.message


def test_missing_bwrap_fails_with_the_install_command(settings):
    check = doctor.check_bwrap(with_bwrap(settings, "/nonexistent"))
    assert check.level is Level.fail
    assert "apt-get install bubblewrap" in (check.fix or "")


def test_old_bwrap_fails(short_tmp, settings):
    bwrap = fake_bwrap(short_tmp, "echo 'bubblewrap 0.4.1'\n")
    check = doctor.check_bwrap(with_bwrap(settings, bwrap))
    assert check.level is Level.fail
    assert "0.8.0 or later" in check.message


def test_bwrap_that_does_not_run_fails(short_tmp, settings):
    bwrap = fake_bwrap(short_tmp, "exit 1\n")
    assert doctor.check_bwrap(with_bwrap(settings, bwrap)).level is Level.fail


# -- user namespaces ---------------------------------------------------------------------


def test_userns_ok_on_this_host(settings):
    assert doctor.check_userns(settings).level is Level.ok


def test_blocked_userns_under_apparmor_gives_the_apparmor_fix(short_tmp, settings, monkeypatch):
    bwrap = fake_bwrap(
        short_tmp, "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
    )
    sysctl = short_tmp / "apparmor_restrict_unprivileged_userns"
    sysctl.write_text("1\n")
    monkeypatch.setattr(doctor, "APPARMOR_SYSCTL", sysctl)
    check = doctor.check_userns(with_bwrap(settings, bwrap))
    assert check.level is Level.fail
    assert "setting up uid map: Permission denied" in check.message
    assert "bwrap-userns-restrict" in (check.fix or "")
    assert "apparmor_restrict_unprivileged_userns=0" in (check.fix or "")


def test_blocked_userns_without_apparmor_gives_the_other_fixes(short_tmp, settings, monkeypatch):
    bwrap = fake_bwrap(
        short_tmp, "echo 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    monkeypatch.setattr(doctor, "APPARMOR_SYSCTL", short_tmp / "absent")
    check = doctor.check_userns(with_bwrap(settings, bwrap))
    assert check.level is Level.fail
    assert "container" in (check.fix or "")


@pytest.mark.parametrize(
    ("sysctl", "fix"),
    [
        ("/proc/sys/user/max_user_namespaces", "user.max_user_namespaces"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "unprivileged_userns_clone=1"),
    ],
)
def test_userns_turned_off_by_sysctl(settings, monkeypatch, sysctl, fix):
    real = doctor._read
    monkeypatch.setattr(doctor, "_read", lambda p: "0" if str(p) == sysctl else real(p))
    check = doctor.check_userns(settings)
    assert check.level is Level.fail
    assert fix in (check.fix or "")


# -- seccomp, the sandbox, cgroups -----------------------------------------------------------


def test_seccomp_ok_on_this_host(settings):
    check = doctor.check_seccomp(settings)
    assert check.level is Level.ok


def test_kernel_without_seccomp_fails(settings, monkeypatch):
    real = doctor._read
    monkeypatch.setattr(
        doctor,
        "_read",
        lambda p: "Name:\tx\nNoNewPrivs:\t0\n" if str(p) == "/proc/self/status" else real(p),
    )
    check = doctor.check_seccomp(settings)
    assert check.level is Level.fail
    assert "Seccomp" in check.message


def test_seccomp_turned_off_in_the_config_warns(settings):
    check = doctor.check_seccomp(settings.model_copy(update={"seccomp": False}))
    assert check.level is Level.warn


def test_pidfd_ok_on_this_host():
    check = doctor.check_pidfd()
    assert check.level is doctor.Level.ok, check


def test_kernel_without_pidfds_fails_with_the_kernel_to_use(monkeypatch):
    def no_pidfd(pid: int) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(doctor.os, "pidfd_open", no_pidfd)
    check = doctor.check_pidfd()
    assert check.level is doctor.Level.fail
    assert "Function not implemented" in check.message
    assert check.fix is not None and "5.3" in check.fix


def test_sandbox_selftest_passes_here_and_leaves_nothing_behind(settings):
    before = set(os.listdir("/tmp"))
    check = doctor.check_sandbox(settings)
    assert check.level is Level.ok, check.message
    assert not settings.data_dir.exists()  # the daemon's data dir is not touched
    assert {n for n in set(os.listdir("/tmp")) - before if n.startswith("sandboxd-doctor")} == set()


def test_sandbox_selftest_failure_is_reported(short_tmp, settings):
    bwrap = fake_bwrap(short_tmp, "echo 'bwrap: Creating new namespace failed' >&2\nexit 1\n")
    check = doctor.check_sandbox(with_bwrap(settings, bwrap))
    assert check.level is Level.fail
    assert "Creating new namespace failed" in check.message


def test_cgroup_check_never_fails():
    # Delegation is an improvement, not a requirement: ok or warn, with a reason.
    check = doctor.check_cgroups()
    assert check.level in (Level.ok, Level.warn)
    assert check.message


# -- toolchains ---------------------------------------------------------------------------


def test_every_toolchain_is_checked(settings):
    checks = list(doctor.check_toolchains(settings))
    assert [c.name for c in checks] == ["toolchain python", "toolchain node", "toolchain go"]


def test_a_missing_toolchain_warns_with_its_install_hint(settings):
    go = ToolchainConfig(executable=Path("/nonexistent/go"))
    broken = settings.model_copy(update={"toolchains": {Language.go: go}})
    checks = {c.name: c for c in doctor.check_toolchains(broken)}
    check = checks["toolchain go"]
    assert check.level is Level.warn
    assert "/nonexistent/go" in check.message
    assert check.fix


# -- files --------------------------------------------------------------------------------


def test_socket_dir_not_there_yet_is_ok(short_tmp):
    settings = Settings(socket_path=short_tmp / "run" / "s.sock", data_dir=short_tmp / "data")
    check = doctor.check_socket_dir(settings)
    assert check.level is Level.ok
    assert "made 0700 at start" in check.message


def test_socket_dir_with_a_loose_mode_warns(short_tmp):
    settings = make_settings(short_tmp)
    settings.socket_path.parent.chmod(0o755)  # short_tmp is the socket's folder here
    check = doctor.check_socket_dir(settings)
    assert check.level is Level.warn
    assert "chmod 700" in (check.fix or "")


def test_socket_dir_of_someone_else_fails(short_tmp):
    folder = short_tmp / "run"
    folder.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(folder, 65534, 65534)
    settings = Settings(socket_path=folder / "s.sock", data_dir=short_tmp / "data")
    check = doctor.check_socket_dir(settings)
    if os.geteuid() == 0:
        assert check.level is Level.fail
        assert "not to you" in check.message


def test_a_socket_others_can_reach_fails(short_tmp):
    folder = short_tmp / "run"
    folder.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "s.sock"))
    try:
        os.chmod(folder / "s.sock", 0o666)
        settings = Settings(socket_path=folder / "s.sock", data_dir=short_tmp / "data")
        check = doctor.check_socket_dir(settings)
    finally:
        sock.close()
    assert check.level is Level.fail
    assert "666" in check.message


def test_a_socket_path_too_long_fails(short_tmp):
    settings = Settings(socket_path=short_tmp / ("x" * 120), data_dir=short_tmp / "data")
    assert doctor.check_socket_dir(settings).level is Level.fail


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize(
    ("free", "level"),
    [(50 * doctor.MiB, Level.fail), (500 * doctor.MiB, Level.warn), (50 * 1024**3, Level.ok)],
)
def test_free_space_in_the_data_dir(settings, monkeypatch, free, level):
    monkeypatch.setattr(shutil, "disk_usage", lambda _: Usage(10**12, 0, free))
    check = doctor.check_data_dir(settings)
    assert check.level is level
    assert str(settings.data_dir) in check.message


def test_token_check_only_in_tcp_mode(short_tmp, settings):
    assert doctor.check_token(settings) is None
    tcp = settings.model_copy(
        update={"listen": settings.listen.model_copy(update={"token_file": short_tmp / "tok"})}
    )
    (short_tmp / "tok").write_text("short\n")
    os.chmod(short_tmp / "tok", 0o644)
    check = doctor.check_token(tcp)
    assert check is not None
    assert check.level is Level.fail


# -- the command ---------------------------------------------------------------------------


def test_check_lines_show_the_fix_only_when_not_ok():
    assert doctor.Check("x", Level.ok, "fine", "unused").lines() == ["ok    x: fine"]
    assert doctor.Check("x", Level.fail, "bad", "do this").lines() == [
        "fail  x: bad",
        "      fix: do this",
    ]


def test_doctor_command_exit_status(short_tmp):
    config = short_tmp / "config.toml"
    config.write_text('bwrap = "/nonexistent"\n')
    args = ["--socket", str(short_tmp / "run" / "s.sock"), "--data-dir", str(short_tmp / "d")]
    result = CliRunner().invoke(main, [*args, "--config", str(config), "doctor"])
    assert result.exit_code == 1
    assert "fail  bwrap:" in result.output
    config.write_text("")
    result = CliRunner().invoke(main, [*args, "--config", str(config), "doctor"])
    assert result.exit_code == 0, result.output
