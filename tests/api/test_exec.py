"""exec through the real app: real bwrap, real pytest in test mode."""

from __future__ import annotations

import errno
import os

import pytest

from sandboxd.server import create_app
from tests.conftest import form_with_file, make_settings, make_zip


async def sandbox(client, language: str = "python") -> str:
    r = await client.post("/v1/sandboxes", json={"language": language})
    assert r.status == 201
    return (await r.json())["id"]


async def run(client, sid: str, **body) -> dict:
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json=body)
    payload = await r.json()
    assert r.status == 200, payload
    return payload


async def test_exec_result_fields(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="echo out; echo err >&2; exit 7")
    assert result["exit_code"] == 7
    assert result["stdout"] == "out\n"
    assert result["stderr"] == "err\n"
    assert result["output"] == "out\nerr\n"
    assert result["timed_out"] is False
    assert result["truncated"] is False
    assert result["duration_ms"] > 0
    assert result["tests"] is None


async def test_output_interleaves_in_arrival_order(client):
    sid = await sandbox(client)
    result = await run(
        client,
        sid,
        command="echo 1; sleep 0.1; echo 2 >&2; sleep 0.1; echo 3; sleep 0.1; echo 4 >&2",
    )
    assert result["output"] == "1\n2\n3\n4\n"


async def test_cwd_is_the_workspace_and_files_persist(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="pwd; echo data > made.txt")
    assert result["stdout"] == "/workspace\n"
    result = await run(client, sid, command="cat made.txt")
    assert result["stdout"] == "data\n"


@pytest.mark.parametrize(
    "tool", ["python --version", "python3 --version", "pip --version", "pytest --version"]
)
async def test_python_commands_work_as_typed(client, tool):
    sid = await sandbox(client)
    result = await run(client, sid, command=tool)
    assert result["exit_code"] == 0, result["output"]


async def test_daemon_packages_are_not_importable(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="python3 -c 'import aiohttp'")
    assert result["exit_code"] == 1
    assert "No module named 'aiohttp'" in result["stderr"]


async def test_missing_command_is_422(client):
    sid = await sandbox(client)
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"test": True})
    assert r.status == 422
    problem = await r.json()
    assert problem["errors"][0]["field"] == "command"


async def test_legacy_filename_field(client):
    sid = await sandbox(client)
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"filename": "main.py"})
    assert r.status == 422
    problem = await r.json()
    assert problem["code"] == "legacy_field"
    assert "v0.4.0" in problem["detail"]
    assert "command" in problem["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"command": 5},
        {"command": ["ls"]},
        {"command": ""},
        {"command": "ls", "test": "yes"},
        {"command": "ls", "timeout": "5"},
        {"command": "ls", "timeout": 0},
        {"command": "ls", "x": 1},
    ],
)
async def test_wrong_types_are_422(client, body):
    sid = await sandbox(client)
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status == 422
    assert (await r.json())["code"] == "validation_failed"


async def test_timeout_over_the_maximum_is_refused(client):
    sid = await sandbox(client)
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true", "timeout": 10_000})
    assert r.status == 422
    assert "maximum" in (await r.json())["detail"]


async def test_timeout_kills_and_reports(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="echo started; sleep 30", timeout=0.5)
    assert result["timed_out"] is True
    assert result["exit_code"] is None
    assert result["stdout"] == "started\n"


async def test_leftover_background_processes_die_with_the_command(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="(sleep 1; echo late > late.txt) & echo now")
    assert result["stdout"] == "now\n"
    result = await run(client, sid, command="sleep 1.5; ls")
    assert "late.txt" not in result["stdout"]


async def test_output_cap_keeps_the_end(aiohttp_client, short_tmp):
    client = await aiohttp_client(create_app(make_settings(short_tmp, output_bytes=1000)))
    sid = await sandbox(client)
    result = await run(client, sid, command="seq 1 5000")
    assert result["truncated"] is True
    assert len(result["stdout"]) == 1000
    assert result["stdout"].endswith("4999\n5000\n")


# -- test mode ----------------------------------------------------------------------

PROJECT = {
    "app.py": "def add(a, b):\n    return a + b\n",
    "tests/test_app.py": (
        "from app import add\n\n"
        "def test_ok():\n    assert add(1, 2) == 3\n\n"
        "def test_bad():\n    assert add(1, 1) == 3\n\n"
        "import pytest\n\n@pytest.mark.skip\ndef test_skipped():\n    pass\n"
    ),
}


async def upload(client, sid, files) -> None:
    r = await client.post(
        f"/v1/sandboxes/{sid}/upload", data=form_with_file(make_zip(files), "p.zip")
    )
    assert r.status == 201, await r.text()


async def test_test_mode_counts_and_exit_codes(client):
    sid = await sandbox(client)
    await upload(client, sid, PROJECT)
    result = await run(client, sid, command="echo building", test=True)
    tests = result["tests"]
    assert tests["runner"] == "pytest"
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (1, 1, 1)
    assert tests["exit_code"] == 1
    assert result["exit_code"] == 1  # the runner's, so failing tests are visible
    assert result["command"]["exit_code"] == 0
    assert result["command"]["stdout"] == "building\n"
    assert result["output"].startswith("building\n")
    assert "1 failed, 1 passed, 1 skipped" in result["output"]


async def test_test_mode_all_passing(client):
    sid = await sandbox(client)
    await upload(client, sid, {**PROJECT, "tests/test_app.py": "def test_ok():\n    pass\n"})
    result = await run(client, sid, command="true", test=True)
    assert result["exit_code"] == 0
    assert result["tests"]["passed"] == 1
    assert result["tests"]["failed"] == 0


async def test_test_mode_without_tests_says_so(client):
    sid = await sandbox(client)
    result = await run(client, sid, command="true", test=True)
    assert result["tests"]["no_tests"] is True
    assert "tests/" in result["tests"]["summary"]
    await upload(client, sid, {"tests/__init__.py": ""})
    result = await run(client, sid, command="true", test=True)
    assert result["tests"]["exit_code"] == 5
    assert result["tests"]["no_tests"] is True


async def test_test_mode_reaches_a_server_the_command_started(client):
    sid = await sandbox(client)
    await upload(
        client,
        sid,
        {
            "tests/test_server.py": (
                "import urllib.request\n\n"
                "def test_up():\n"
                "    assert urllib.request.urlopen('http://127.0.0.1:8765/').status == 200\n"
            )
        },
    )
    result = await run(client, sid, command="python3 -m http.server 8765", test=True)
    assert result["tests"]["passed"] == 1, result["output"]
    assert result["command"]["still_running"] is True
    assert result["command"]["exit_code"] is None
    # The server was killed after the tests: nothing is left running.
    assert result["timed_out"] is False


async def test_test_mode_command_failure_is_reported_beside_the_tests(client):
    sid = await sandbox(client)
    await upload(client, sid, {"tests/test_a.py": "def test_a():\n    pass\n"})
    result = await run(client, sid, command="echo broken >&2; exit 3", test=True)
    assert result["command"]["exit_code"] == 3
    assert result["command"]["stderr"] == "broken\n"
    assert result["exit_code"] == 0


async def test_exec_after_delete_is_404(client):
    sid = await sandbox(client)
    r = await client.delete(f"/v1/sandboxes/{sid}")
    assert r.status == 204
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status == 404


async def test_runner_waits_the_spec_two_seconds_while_the_command_runs(client):
    sid = await sandbox(client)
    await upload(
        client,
        sid,
        {
            "tests/test_wait.py": (
                "import time\n\n"
                "def test_waited():\n"
                "    started = float(open('started').read())\n"
                "    assert time.time() - started >= 1.95\n"
            )
        },
    )
    result = await run(client, sid, command="date +%s.%N > started; sleep 30", test=True)
    assert result["tests"]["passed"] == 1, result["output"]
    assert result["command"]["still_running"] is True


async def test_runner_does_not_wait_when_the_command_is_done(client):
    sid = await sandbox(client)
    await upload(
        client,
        sid,
        {
            # conftest.py is loaded first thing: its clock reading is when the runner began.
            "tests/conftest.py": "import time\n\nRUNNER_STARTED = time.time()\n",
            "tests/test_wait.py": (
                "from conftest import RUNNER_STARTED\n\n"
                "def test_no_wait():\n"
                "    started = float(open('started').read())\n"
                "    assert RUNNER_STARTED - started < 1.5\n"
            ),
        },
    )
    result = await run(client, sid, command="date +%s.%N > started", test=True)
    assert result["tests"]["passed"] == 1, result["output"]
    assert result["command"]["exit_code"] == 0


async def test_a_process_that_cannot_be_watched_is_killed_and_reaped(client, monkeypatch):
    """Out of descriptors right after the spawn: the answer says so, and the
    process is not left running or as a zombie (which would stop every later
    orphan reap)."""
    from sandboxd import runner

    sid = await sandbox(client)
    spawned: list[int] = []

    def no_pidfd(pid: int) -> int:
        spawned.append(pid)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(runner.os, "pidfd_open", no_pidfd)
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": "sleep 30"})
    body = await r.json()
    assert r.status == 500, body
    assert body["code"] == "sandbox_setup_failed", body
    assert "Too many open files" in body["detail"], body
    assert len(spawned) == 1
    assert not os.path.exists(f"/proc/{spawned[0]}")  # killed and reaped
    assert spawned[0] not in runner.SPAWNED
    monkeypatch.undo()
    assert (await run(client, sid, command="echo fine"))["stdout"] == "fine\n"
