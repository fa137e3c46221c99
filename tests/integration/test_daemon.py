"""A real `sandboxd serve` process on a real Unix socket, real bubblewrap."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.conftest import Daemon, form_with_file, make_zip


async def create(http: aiohttp.ClientSession, language: str = "python") -> dict:
    async with http.post("/v1/sandboxes", json={"language": language}) as r:
        assert r.status == 201
        return await r.json()


async def test_walk_every_endpoint_over_the_socket(daemon: Daemon, http):
    made = await create(http)
    sid = made["id"]
    async with http.post(
        f"/v1/sandboxes/{sid}/files", data=form_with_file(b"print('hi')\n", "hello.py")
    ) as r:
        assert r.status == 201
        assert (await r.json())["filename"] == "hello.py"
    archive = make_zip({"tests/test_x.py": "def test_x():\n    assert True\n", "lib/util.py": ""})
    async with http.post(f"/v1/sandboxes/{sid}/upload", data=form_with_file(archive, "p.zip")) as r:
        assert r.status == 201
        assert (await r.json())["status"] == "uploaded"
    async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "python hello.py"}) as r:
        assert r.status == 200
        body = await r.json()
        assert body["output"] == "hi\n"
        assert body["exit_code"] == 0
    async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true", "test": True}) as r:
        body = await r.json()
        assert body["tests"]["passed"] == 1
        assert body["exit_code"] == 0
    async with http.get("/v1/sandboxes") as r:
        assert [s["id"] for s in (await r.json())["sandboxes"]] == [sid]
    async with http.get(f"/v1/sandboxes/{sid}") as r:
        assert (await r.json())["status"] == "idle"
    async with http.delete(f"/v1/sandboxes/{sid}") as r:
        assert r.status == 204
    assert not Path(made["workspace"]).exists()


def test_socket_is_private(daemon: Daemon):
    st = daemon.socket_path.stat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(daemon.socket_path.parent.stat().st_mode) == 0o700


def test_second_serve_says_one_is_running(daemon: Daemon):
    result = daemon.cli("serve", timeout=30)
    assert result.returncode == 1
    assert "already running" in result.stderr
    assert "Traceback" not in result.stderr


def test_stale_socket_does_not_block_start(daemon_factory: Daemon):
    daemon_factory.socket_path.parent.mkdir(mode=0o700, parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(daemon_factory.socket_path))
    stale.close()  # bound but nobody listens: what a crashed daemon leaves
    daemon_factory.start()
    assert daemon_factory.cli("status").returncode == 0


async def test_restart_keeps_sandboxes_and_files(daemon: Daemon):
    async with daemon.session() as http:
        made = await create(http, "go")
        sid = made["id"]
        async with http.post(
            f"/v1/sandboxes/{sid}/files", data=form_with_file(b"kept", "data.txt")
        ) as r:
            assert r.status == 201
    assert daemon.stop() == 0
    daemon.start()
    async with daemon.session() as http:
        async with http.get(f"/v1/sandboxes/{sid}") as r:
            assert r.status == 200
            assert (await r.json())["language"] == "go"
        async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "cat data.txt"}) as r:
            assert (await r.json())["stdout"] == "kept"


async def test_kill_9_loses_nothing_and_interrupted_work_is_finished(daemon: Daemon):
    async with daemon.session() as http:
        made = await create(http)
        async with http.post(
            f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"x", "x.txt")
        ) as r:
            assert r.status == 201
    daemon.stop(signal.SIGKILL)
    data = daemon.data_dir
    # What a crash can leave: a half-made sandbox, a half-deleted one, a half-received upload.
    (data / "sandboxes" / ".new-sb-0000000000000000" / "workspace").mkdir(parents=True)
    (data / "trash" / "sb-1111111111111111" / "workspace").mkdir(parents=True)
    (data / "trash" / "sb-1111111111111111" / "workspace" / "big").write_bytes(b"0" * 1000)
    (data / "sandboxes" / made["id"] / "tmp" / "upload-dead").write_bytes(b"partial")
    daemon.start()
    async with daemon.session() as http, http.get("/v1/sandboxes") as r:
        ids = [s["id"] for s in (await r.json())["sandboxes"]]
    assert ids == [made["id"]]
    assert (Path(made["workspace"]) / "x.txt").read_bytes() == b"x"
    assert list((data / "trash").iterdir()) == []
    assert not (data / "sandboxes" / ".new-sb-0000000000000000").exists()
    assert list((data / "sandboxes" / made["id"] / "tmp").iterdir()) == []


async def test_delete_while_running_kills_the_command(daemon: Daemon, http):
    made = await create(http)
    sid = made["id"]

    async def long_exec() -> tuple[int, dict]:
        async with http.post(
            f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 30; touch /workspace/late"}
        ) as r:
            return r.status, await r.json()

    task = asyncio.create_task(long_exec())
    for _ in range(100):
        async with http.get(f"/v1/sandboxes/{sid}") as r:
            if (await r.json())["status"] == "running":
                break
        await asyncio.sleep(0.05)
    async with http.delete(f"/v1/sandboxes/{sid}") as r:
        assert r.status == 204
    status, body = await asyncio.wait_for(task, 10)
    assert status == 410
    assert body["code"] == "sandbox_deleted"
    assert not Path(made["workspace"]).exists()


async def test_a_slow_command_does_not_block_other_requests(daemon: Daemon, http):
    slow = await create(http)
    other = await create(http)

    async def exec_in(sid: str, command: str) -> dict:
        async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": command}) as r:
            return await r.json()

    slow_task = asyncio.create_task(exec_in(slow["id"], "sleep 3"))
    await asyncio.sleep(0.2)
    fast = await exec_in(other["id"], "echo quick")
    async with http.get("/v1/sandboxes") as r:
        assert r.status == 200
    assert fast["stdout"] == "quick\n"
    assert not slow_task.done()
    assert (await slow_task)["exit_code"] == 0


def test_sigterm_exits_zero_and_removes_the_socket(daemon: Daemon):
    assert daemon.stop(signal.SIGTERM) == 0
    assert not daemon.socket_path.exists()


def test_cli_start_status_stop(daemon_factory: Daemon):
    d = daemon_factory
    result = d.cli("start")
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout
    try:
        again = d.cli("start")
        assert again.returncode == 1
        assert "already running" in again.stderr
        status = d.cli("status", "--json")
        assert status.returncode == 0
        info = json.loads(status.stdout)
        assert info["socket"] == str(d.socket_path)
        pid = info["pid"]
        human = d.cli("status")
        assert f"pid {pid}" in human.stdout
    finally:
        stopped = d.cli("stop")
    assert stopped.returncode == 0
    assert "stopped" in stopped.stdout
    # stop returned only once the process was gone.
    assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
    down = d.cli("status")
    assert down.returncode == 3
    assert "not running" in down.stderr


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_missing_bwrap_gives_a_paragraph_not_a_traceback(daemon_factory: Daemon):
    (daemon_factory.root / "config.toml").write_text('bwrap = "/nonexistent/bwrap"\n')
    result = daemon_factory.cli("serve", timeout=30)
    assert result.returncode == 1
    assert "bubblewrap" in result.stderr
    assert "apt-get install bubblewrap" in result.stderr
    assert "Traceback" not in result.stderr


def test_blocked_user_namespaces_give_the_fix(daemon_factory: Daemon):
    # A bwrap that fails the way it does when AppArmor blocks user namespaces.
    fake = daemon_factory.root / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    (daemon_factory.root / "config.toml").write_text(f'bwrap = "{fake}"\n')
    result = daemon_factory.cli("serve", timeout=30)
    assert result.returncode == 1
    assert "setting up uid map: Permission denied" in result.stderr
    assert "apparmor_restrict_unprivileged_userns" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_typo_names_the_key_and_file(daemon_factory: Daemon):
    config = daemon_factory.root / "config.toml"
    config.write_text("[limits]\noutput_byte = 5\n")
    result = daemon_factory.cli("serve", timeout=30)
    assert result.returncode == 1
    assert str(config) in result.stderr
    assert "limits.output_byte" in result.stderr


def test_module_entry_point_and_version():
    out = subprocess.run(
        [sys.executable, "-m", "sandboxd", "--version"], capture_output=True, text=True, check=True
    )
    from sandboxd import __version__

    assert out.stdout.strip() == f"sandboxd, version {__version__}"
    assert os.access(sys.executable, os.X_OK)


def _pids_of(uid: int) -> set[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.add(entry.name)
            except OSError:
                pass
    return found


async def test_no_zombies_pile_up_under_the_sandbox_uid(daemon: Daemon, http):
    """bwrap leaves one process per run behind; the daemon adopts and reaps them
    (a PID 1 that does not reap would let them count against RLIMIT_NPROC)."""
    made = await create(http)
    sid = made["id"]
    uid = Path(made["workspace"]).stat().st_uid
    if uid == os.getuid():
        return  # not root: the sandbox shares our uid, nothing to count apart
    # Left by earlier daemons of this test session that had the same uid.
    before = _pids_of(uid)
    for _ in range(6):
        async with http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"}) as r:
            assert r.status == 200
    # Zombies left to a PID 1 that does not reap would stay forever; adopted
    # ones are reaped within moments.
    for _ in range(100):
        if not _pids_of(uid) - before:
            break
        await asyncio.sleep(0.05)
    assert _pids_of(uid) - before == set()


def test_unreachable_data_dir_is_explained(daemon_factory: Daemon):
    if os.geteuid() != 0:
        return  # only root runs sandboxes as another uid
    hidden = daemon_factory.root / "private"
    hidden.mkdir(mode=0o700)
    daemon_factory.data_dir = hidden / "data"
    result = daemon_factory.cli("serve", timeout=60)
    assert result.returncode == 1
    assert "chmod o+x" in result.stderr
    assert "apparmor" not in result.stderr.lower()
