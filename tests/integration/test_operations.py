"""Operating a real daemon: socket activation, readiness, signals, logs, doctor, status."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import Daemon, form_with_file

# Puts the listening socket on fd 3 and sets LISTEN_PID to its own pid, then
# execs the daemon (same pid): exactly what systemd does before exec.
ACTIVATE = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = "1"
os.execv(sys.executable, [sys.executable, "-m", "sandboxd", *sys.argv[2:]])
"""


def base_args(d: Daemon) -> list[str]:
    return [
        "--socket",
        str(d.socket_path),
        "--data-dir",
        str(d.data_dir),
        "--config",
        str(d.root / "config.toml"),
    ]


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


class Proc:
    """A `sandboxd ... serve` started by a test with its own arguments and environment."""

    def __init__(self, d: Daemon, argv: list[str], env: dict[str, str] | None = None, **kw):
        self.log_path = d.root / f"serve-{time.monotonic_ns()}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, **kw
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, socket_path: Path) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log()}")
            return answers(socket_path) and "ready" in self.log()

        wait_for(ready, what="the daemon to listen")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def serve(d: Daemon, procs: list[Proc], *serve_args: str, env=None, log_level="info") -> Proc:
    argv = [sys.executable, "-m", "sandboxd", *base_args(d), "--log-level", log_level, "serve"]
    p = Proc(d, [*argv, *serve_args], env=env)
    procs.append(p)
    p.wait_ready(d.socket_path)
    return p


def session(path: Path) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(path)), base_url="http://sandboxd"
    )


async def create(http: aiohttp.ClientSession) -> str:
    async with http.post("/v1/sandboxes", json={"language": "python"}) as r:
        assert r.status == 201
        return (await r.json())["id"]


async def wait_running(http: aiohttp.ClientSession, sid: str) -> None:
    for _ in range(200):
        async with http.get(f"/v1/sandboxes/{sid}") as r:
            if (await r.json())["status"] == "running":
                return
        await asyncio.sleep(0.05)
    raise AssertionError("the command never started")


# -- socket activation and readiness ------------------------------------------------


def test_socket_activation_and_readiness_the_way_systemd_does_it(daemon_factory: Daemon, procs):
    d = daemon_factory
    run = d.root / "sd"
    run.mkdir(mode=0o700)
    activated = run / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(activated))
    os.chmod(activated, 0o600)
    listener.listen(16)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(run / "notify"))
    notify.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(run / "notify")}
    fd = listener.fileno()
    p = Proc(
        d,
        [sys.executable, "-c", ACTIVATE, str(fd), *base_args(d), "serve"],
        env=env,
        pass_fds=(fd,),
    )
    procs.append(p)
    listener.close()  # the daemon holds the only copy now, as with systemd's own
    try:
        ready = notify.recv(4096).decode()
        assert "READY=1" in ready.splitlines()
        assert f"MAINPID={p.proc.pid}" in ready.splitlines()
        # It serves the inherited socket, and did not make its own.
        status = json.loads(
            subprocess.run(
                [sys.executable, "-m", "sandboxd", "--socket", str(activated), "status", "--json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert status["pid"] == p.proc.pid
        assert status["socket"] == str(activated)
        assert not d.socket_path.exists()
        # A reload is announced, and the socket given (not --socket) is no "change".
        p.proc.send_signal(signal.SIGHUP)
        assert "RELOADING=1" in notify.recv(4096).decode().splitlines()
        assert "READY=1" in notify.recv(4096).decode().splitlines()
        assert "next start" not in p.log()
        assert p.stop(signal.SIGTERM) == 0
        assert "STOPPING=1" in notify.recv(4096).decode().splitlines()
    finally:
        notify.close()
    # systemd owns the socket file: the daemon leaves it in place.
    assert activated.exists()


def test_activation_meant_for_another_pid_is_ignored(daemon_factory: Daemon, procs):
    d = daemon_factory
    dummy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dummy.bind(str(d.root / "other.sock"))
    dummy.listen(1)
    # LISTEN_PID names the test process, not the daemon: taking fd 3 anyway
    # would fail (it is not a socket there); the daemon must bind its own.
    env = {**os.environ, "LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1"}
    p = serve(d, procs, env=env)
    assert answers(d.socket_path)
    assert p.stop() == 0
    dummy.close()


def test_no_notify_socket_and_no_activation_is_plain_serve(daemon: Daemon):
    # The Daemon fixture started without either: it must just work.
    assert daemon.cli("status").returncode == 0


# -- graceful lifecycle --------------------------------------------------------------


async def test_sigterm_stops_accepting_and_lets_a_running_command_finish(
    daemon_factory: Daemon, procs
):
    d = daemon_factory
    (d.root / "config.toml").write_text("shutdown_grace_seconds = 20\n")
    p = serve(d, procs)
    async with session(d.socket_path) as http:
        sid = await create(http)

        async def run() -> tuple[int, dict]:
            async with http.post(
                f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 2; echo done"}
            ) as r:
                return r.status, await r.json()

        task = asyncio.create_task(run())
        await wait_running(http, sid)
        p.proc.send_signal(signal.SIGTERM)
        # New connections are refused at once, while the command still runs.
        await asyncio.to_thread(wait_for, lambda: not answers(d.socket_path), 5, "refusal")
        assert not task.done()
        status, body = await asyncio.wait_for(task, 30)
    assert status == 200
    assert body["exit_code"] == 0
    assert body["stdout"] == "done\n"
    assert p.proc.wait(timeout=30) == 0
    assert "waiting up to 20 s for 1 running command" in p.log()


async def test_sigterm_kills_what_outlives_the_grace_period_and_exits_zero(
    daemon_factory: Daemon, procs
):
    d = daemon_factory
    (d.root / "config.toml").write_text("shutdown_grace_seconds = 1\n")
    p = serve(d, procs)
    async with session(d.socket_path) as http:
        sid = await create(http)
        workspace = d.data_dir / "sandboxes" / sid / "workspace"

        async def run() -> int:
            async with http.post(
                f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 30; touch late"}
            ) as r:
                await r.read()
                return r.status

        task = asyncio.create_task(run())
        await wait_running(http, sid)
        started = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        # The request still gets an answer (not a dropped connection).
        status = await asyncio.wait_for(task, 20)
    assert status in (200, 503)
    assert await asyncio.to_thread(p.proc.wait, 20) == 0
    assert time.monotonic() - started < 10
    assert "killing 1 command" in p.log()
    assert not (workspace / "late").exists()


async def test_a_second_sigterm_does_not_wait_for_the_grace_period(daemon_factory: Daemon, procs):
    d = daemon_factory
    (d.root / "config.toml").write_text("shutdown_grace_seconds = 300\n")
    p = serve(d, procs)
    async with session(d.socket_path) as http:
        sid = await create(http)

        async def run() -> int:
            async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 60"}) as r:
                await r.read()
                return r.status

        task = asyncio.create_task(run())
        await wait_running(http, sid)
        p.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_for, lambda: "stopping" in p.log(), 10, "stopping")
        p.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(task, 20)
    assert await asyncio.to_thread(p.proc.wait, 20) == 0


async def test_sighup_reloads_the_limits(daemon_factory: Daemon, procs):
    d = daemon_factory
    config = d.root / "config.toml"
    config.write_text("[limits]\nexec_timeout_max = 5.0\n")
    p = serve(d, procs)
    async with session(d.socket_path) as http:
        sid = await create(http)
        body = {"command": "true", "timeout": 10}
        async with http.post(f"/v1/sandboxes/{sid}/exec", json=body) as r:
            assert r.status == 422
        config.write_text("[limits]\nexec_timeout_max = 20.0\n")
        p.proc.send_signal(signal.SIGHUP)
        await asyncio.to_thread(wait_for, lambda: "reload:" in p.log(), 10, "the reload")
        async with http.get("/v1/status") as r:
            assert (await r.json())["limits"]["exec_timeout_max"] == 20.0
        async with http.post(f"/v1/sandboxes/{sid}/exec", json=body) as r:
            assert r.status == 200
            assert (await r.json())["exit_code"] == 0
    assert "exec_timeout_max=20.0" in p.log()
    assert p.stop() == 0


async def test_sighup_with_a_broken_config_keeps_the_old_settings(daemon_factory: Daemon, procs):
    d = daemon_factory
    config = d.root / "config.toml"
    config.write_text("[limits]\nexec_timeout_max = 5.0\n")
    p = serve(d, procs)
    config.write_text("[limits]\nexec_timeout_mx = 20.0\n")
    p.proc.send_signal(signal.SIGHUP)
    await asyncio.to_thread(wait_for, lambda: "nothing changed" in p.log(), 10, "the refusal")
    assert "limits.exec_timeout_mx" in p.log()
    assert p.proc.poll() is None
    async with session(d.socket_path) as http, http.get("/v1/status") as r:
        assert (await r.json())["limits"]["exec_timeout_max"] == 5.0
    assert p.stop() == 0


async def test_sighup_says_which_changes_need_a_restart(daemon_factory: Daemon, procs):
    d = daemon_factory
    p = serve(d, procs)
    (d.root / "config.toml").write_text('bwrap = "/usr/bin/bwrap"\n[limits]\noutput_bytes = 7\n')
    p.proc.send_signal(signal.SIGHUP)
    await asyncio.to_thread(wait_for, lambda: "next start" in p.log(), 10, "the warning")
    assert "reload: changes to bwrap take effect only at the next start" in p.log()
    assert "output_bytes=7" in p.log()
    assert answers(d.socket_path)
    assert p.stop() == 0


# -- logs -----------------------------------------------------------------------------


async def test_one_access_line_per_request_without_secrets(daemon_factory: Daemon, procs):
    d = daemon_factory
    env = {**os.environ, "SANDBOXD_TEST_SECRET": "ENV-SECRET-4711"}
    p = serve(d, procs, env=env, log_level="debug")
    async with session(d.socket_path) as http:
        sid = await create(http)
        async with http.post(
            f"/v1/sandboxes/{sid}/files", data=form_with_file(b"FILE-SECRET-0815", "s.txt")
        ) as r:
            assert r.status == 201
        async with http.post(
            f"/v1/sandboxes/{sid}/exec", json={"command": "echo CMD-SECRET-42; cat s.txt"}
        ) as r:
            assert r.status == 200
        async with http.get("/v1/sandboxes/sb-nope") as r:
            assert r.status == 404
    assert p.stop() == 0
    log = p.log()
    access = [line for line in log.splitlines() if "sandboxd.access" in line]
    assert re.search(rf"POST /v1/sandboxes 201 [\d.]+ms sandbox={sid} via=unix$", access[0])
    assert re.search(rf"POST /v1/sandboxes/{sid}/files 201 [\d.]+ms sandbox={sid}", access[1])
    assert re.search(rf"POST /v1/sandboxes/{sid}/exec 200 [\d.]+ms sandbox={sid}", access[2])
    assert re.search(r"GET /v1/sandboxes/sb-nope 404 [\d.]+ms sandbox=sb-nope", access[3])
    assert len(access) == 4
    for secret in ("ENV-SECRET-4711", "FILE-SECRET-0815", "CMD-SECRET-42"):
        assert secret not in log


async def test_a_newline_in_the_path_cannot_forge_a_log_line(daemon_factory: Daemon, procs):
    d = daemon_factory
    p = serve(d, procs)
    async with session(d.socket_path) as http, http.get("/v1/sandboxes/x%0AFORGED%20line") as r:
        assert r.status == 404
    assert p.stop() == 0
    forged = [line for line in p.log().splitlines() if "FORGED" in line]
    assert len(forged) == 1
    assert "sandboxd.access: GET /v1/sandboxes/x%0AFORGED" in forged[0]
    assert "sandbox=?" in forged[0]


async def test_log_level_warning_drops_the_access_log(daemon_factory: Daemon, procs):
    d = daemon_factory
    p = Proc(
        d, [sys.executable, "-m", "sandboxd", *base_args(d), "--log-level", "warning", "serve"]
    )
    procs.append(p)
    wait_for(lambda: answers(d.socket_path), what="the socket")
    async with session(d.socket_path) as http, http.get("/v1/version") as r:
        assert r.status == 200
    assert p.stop() == 0
    assert "sandboxd.access" not in p.log()
    assert "listening on" not in p.log()


def test_under_journald_lines_carry_a_syslog_priority(daemon_factory: Daemon, procs):
    d = daemon_factory
    log_path = d.root / "journal.log"
    log_path.touch()
    st = log_path.stat()
    env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    argv = [sys.executable, "-m", "sandboxd", *base_args(d), "serve"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "ready" in log_path.read_text(), what="ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    lines = log_path.read_text().splitlines()
    assert lines
    assert all(re.match(r"<[0-7]>sandboxd", line) for line in lines), lines
    assert any(line.startswith("<6>sandboxd: listening on") for line in lines)


# -- status and doctor ---------------------------------------------------------------


async def test_status_shows_what_the_daemon_is_doing(daemon: Daemon):
    async with daemon.session() as http:
        sid = await create(http)

        async def run() -> None:
            async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 2"}) as r:
                await r.read()

        task = asyncio.create_task(run())
        await wait_running(http, sid)
        result = await asyncio.to_thread(daemon.cli, "status")
        await task
    out = result.stdout
    assert result.returncode == 0
    from sandboxd import __version__

    assert f"sandboxd {__version__} running (pid {daemon.proc.pid})" in out
    assert f"socket:     {daemon.socket_path}" in out
    assert "uptime:" in out
    assert "sandboxes:  1 (1 commands running)" in out
    assert "limit exec_timeout_max: 600.0" in out


def _doctor(d: Daemon) -> subprocess.CompletedProcess[str]:
    return d.cli("doctor", timeout=120)


def _checks(out: str) -> dict[str, str]:
    found = {}
    for line in out.splitlines():
        m = re.match(r"(ok|warn|fail)\s+([^:]+):", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found


def test_doctor_on_a_working_machine(daemon_factory: Daemon):
    result = _doctor(daemon_factory)
    checks = _checks(result.stdout)
    assert result.returncode == 0, result.stdout
    for name in ("config", "bwrap", "user namespaces", "seccomp", "sandbox", "socket", "data dir"):
        assert checks[name] == "ok", result.stdout
    for language in ("python", "node", "go"):
        assert f"toolchain {language}" in checks
    assert "cgroup v2" in checks
    # One line per check, plus a fix line under each one that is not ok.
    lines = result.stdout.splitlines()
    fixes = [line for line in lines if line.startswith("      fix: ")]
    assert len(lines) == len(checks) + len(fixes)
    assert "fail" not in checks.values()


def test_doctor_without_bwrap_fails_and_says_how_to_install_it(daemon_factory: Daemon):
    (daemon_factory.root / "config.toml").write_text('bwrap = "/nonexistent"\n')
    result = _doctor(daemon_factory)
    assert result.returncode == 1
    checks = _checks(result.stdout)
    assert checks["bwrap"] == "fail"
    assert checks["sandbox"] != "ok"
    assert checks["user namespaces"] != "ok"
    assert "fix: sudo apt-get install bubblewrap" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_doctor_reports_a_config_typo_and_checks_the_rest(daemon_factory: Daemon):
    (daemon_factory.root / "config.toml").write_text("[limits]\noutput_byte = 5\n")
    result = _doctor(daemon_factory)
    assert result.returncode == 1
    assert "limits.output_byte" in result.stdout
    assert _checks(result.stdout)["bwrap"] == "ok"


def test_doctor_sees_the_running_daemon(daemon: Daemon):
    result = _doctor(daemon)
    assert "a daemon answers" in result.stdout


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="systemd-socket-activate not installed"
)
def test_started_on_demand_by_systemd_socket_activate(daemon_factory: Daemon, procs):
    """systemd's own activation code: it listens, and starts the daemon on the first connection."""
    d = daemon_factory
    run = d.root / "sd"
    run.mkdir(mode=0o700)
    path = run / "on-demand.sock"
    p = Proc(
        d,
        [
            "systemd-socket-activate",
            "-l",
            str(path),
            sys.executable,
            "-m",
            "sandboxd",
            *base_args(d),
            "serve",
        ],
    )
    procs.append(p)
    wait_for(lambda: path.exists(), what="systemd-socket-activate to listen")
    assert "ready" not in p.log()  # nothing started yet
    # The first request waits in the socket's backlog while the daemon starts.
    result = subprocess.run(
        ["curl", "-s", "--max-time", "60", "--unix-socket", str(path), "http://x/v1/version"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert json.loads(result.stdout)["api"] == "v1", result.stderr + p.log()
    assert "ready" in p.log()
    assert not d.socket_path.exists()  # it used the socket it was given
    assert p.stop() == 0


# -- TCP mode on a real daemon --------------------------------------------------------------


def _tcp_port(p: Proc) -> int:
    found = re.search(r"listening on 127\.0\.0\.1:(\d+) \(token required\)", p.log())
    assert found, p.log()
    return int(found.group(1))


async def test_tcp_mode_end_to_end(daemon_factory: Daemon, procs):
    d = daemon_factory
    token_file = d.root / "cfg" / "token"
    (d.root / "config.toml").write_text(f'[listen]\ntoken_file = "{token_file}"\n')
    p = serve(d, procs, "--tcp", "127.0.0.1:0", log_level="debug")
    port = _tcp_port(p)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/status") as r:
            assert r.status == 401
        async with http.get(f"{base}/v1/status", headers={**auth, "Host": f"evil.com:{port}"}) as r:
            assert r.status == 403
        async with http.post(
            f"{base}/v1/sandboxes", json={}, headers={**auth, "Origin": "http://evil.com"}
        ) as r:
            assert r.status == 403
        async with http.post(f"{base}/v1/sandboxes", json={}, headers=auth) as r:
            assert r.status == 201
            sid = (await r.json())["id"]
        async with http.post(
            f"{base}/v1/sandboxes/{sid}/exec", json={"command": "echo over tcp"}, headers=auth
        ) as r:
            assert (await r.json())["stdout"] == "over tcp\n"
    # The Unix socket needs none of it.
    async with session(d.socket_path) as http, http.get("/v1/sandboxes") as r:
        assert [s["id"] for s in (await r.json())["sandboxes"]] == [sid]
    # A restart keeps the token.
    assert p.stop() == 0
    p = serve(d, procs, "--tcp", "127.0.0.1:0")
    assert token_file.read_text().strip() == token
    assert p.stop() == 0
    log = p.log() + "".join(x.log() for x in procs)
    assert token not in log
    assert "via=tcp" in log
    assert "refused a TCP request (host_not_allowed): Host 'evil.com:" in log


def test_tcp_refuses_a_remote_address_without_allow_remote(daemon_factory: Daemon):
    result = daemon_factory.cli("serve", "--tcp", "0.0.0.0:0", timeout=30)
    assert result.returncode == 1
    assert "--allow-remote" in result.stderr
    assert "Traceback" not in result.stderr
    assert not daemon_factory.socket_path.exists()


def test_tcp_address_that_is_not_host_port_is_a_usage_error(daemon_factory: Daemon):
    result = daemon_factory.cli("serve", "--tcp", "evil.com:80", timeout=30)
    assert result.returncode == 2
    assert "not an IP address" in result.stderr


def test_allow_remote_listens_with_a_warning(daemon_factory: Daemon, procs):
    d = daemon_factory
    (d.root / "config.toml").write_text(f'[listen]\ntoken_file = "{d.root / "token"}"\n')
    p = serve(d, procs, "--tcp", "0.0.0.0:0", "--allow-remote")
    assert "NOT loopback" in p.log()
    assert re.search(r"listening on 0\.0\.0\.0:\d+ \(token required\)", p.log())
    assert p.stop() == 0


def test_an_unsafe_token_file_stops_the_start(daemon_factory: Daemon):
    d = daemon_factory
    token = d.root / "token"
    token.write_text("x" * 64 + "\n")
    token.chmod(0o644)
    (d.root / "config.toml").write_text(f'[listen]\ntoken_file = "{token}"\n')
    result = d.cli("serve", "--tcp", "127.0.0.1:0", timeout=30)
    assert result.returncode == 1
    assert "can be read by others" in result.stderr
    assert "x" * 64 not in result.stderr


def test_start_with_tcp_says_where_the_token_is(daemon_factory: Daemon):
    d = daemon_factory
    token = d.root / "token"
    (d.root / "config.toml").write_text(f'[listen]\ntoken_file = "{token}"\n')
    result = d.cli("start", "--tcp", "127.0.0.1:0")
    try:
        assert result.returncode == 0, result.stderr
        assert f"the token is in {token}" in result.stdout
        assert token.exists()
    finally:
        assert d.cli("stop").returncode == 0
