"""Whatever a command starts dies with it: on timeout, on DELETE, and when the daemon dies."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.security.conftest import ClientFactory
from tests.security.helpers import (
    AS_ROOT,
    create_sandbox,
    exact_sleeps,
    expect_problem,
    pgrep,
    pids_matching,
    run,
    sleep_marker,
    wait_until,
)


def _escapers(marker: str) -> str:
    """Double-forked, setsid'd, nohup'd, stdio-detached and signal-ignoring sleeps."""
    return (
        f'setsid sh -c "sleep {marker} & sleep {marker}" & '
        f"nohup sleep {marker} >/dev/null 2>&1 </dev/null & "
        f"(trap '' TERM HUP INT; setsid sleep {marker} >/dev/null 2>&1 &) ; "
        f"sleep {marker}"
    )


async def _gone(marker: str) -> bool:
    # The kernel tears the PID namespace down asynchronously to our pipes' EOF; a
    # short grace, far below the sleeps' 300 s, tells "killed" from "left running".
    return await wait_until(lambda: not pids_matching(f"sleep {marker}"), 3)


async def test_timeout_kills_the_whole_tree(client: Any, sandbox: dict[str, Any]) -> None:
    marker = sleep_marker()
    result = await run(client, sandbox["id"], _escapers(marker), timeout=1)
    assert result["timed_out"] is True
    assert result["exit_code"] is None
    assert 1000 <= result["duration_ms"] < 10000
    assert await _gone(marker), pgrep(f"sleep {marker}")
    assert pgrep(f"sleep {marker}") == []


async def test_timeout_in_test_mode_kills_the_whole_tree(
    client: Any, sandbox: dict[str, Any]
) -> None:
    marker = sleep_marker()
    result = await run(client, sandbox["id"], _escapers(marker), test=True, timeout=1)
    assert result["timed_out"] is True
    assert result["exit_code"] is None
    assert await _gone(marker), pgrep(f"sleep {marker}")


async def test_background_processes_die_when_the_command_ends(
    client: Any, sandbox: dict[str, Any]
) -> None:
    # The command returns at once; what it left behind must not outlive the run.
    marker = sleep_marker()
    result = await run(
        client, sandbox["id"], f"setsid nohup sleep {marker} >/dev/null 2>&1 & echo started"
    )
    assert result["exit_code"] == 0
    assert result["stdout"] == "started\n"
    assert result["timed_out"] is False
    assert await _gone(marker), pgrep(f"sleep {marker}")


async def _started(marker: str, count: int) -> bool:
    return await wait_until(lambda: len(exact_sleeps(marker)) >= count, 10)


async def test_delete_during_exec_kills_the_tree(client: Any, sandbox: dict[str, Any]) -> None:
    marker = sleep_marker()
    running = asyncio.create_task(
        client.post(
            f"/v1/sandboxes/{sandbox['id']}/exec",
            json={"command": _escapers(marker), "timeout": 120},
        )
    )
    assert await _started(marker, 5), pgrep(f"sleep {marker}")
    r = await client.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert r.status == 204
    answer = await asyncio.wait_for(running, 15)
    await expect_problem(answer, 410, "sandbox_deleted")
    assert await _gone(marker), pgrep(f"sleep {marker}")
    assert not os.path.lexists(sandbox["workspace"])
    r = await client.get(f"/v1/sandboxes/{sandbox['id']}")
    await expect_problem(r, 404, "sandbox_not_found")


async def test_delete_in_real_daemon_kills_the_tree(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    sandbox = await create_sandbox(http)
    marker = sleep_marker()
    running = asyncio.create_task(
        http.post(
            f"/v1/sandboxes/{sandbox['id']}/exec",
            json={"command": _escapers(marker), "timeout": 120},
        )
    )
    assert await _started(marker, 5), pgrep(f"sleep {marker}")
    r = await http.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert r.status == 204
    answer = await asyncio.wait_for(running, 15)
    await expect_problem(answer, 410, "sandbox_deleted")
    assert await _gone(marker), pgrep(f"sleep {marker}")
    assert not os.path.lexists(sandbox["workspace"])


async def test_daemon_killed_takes_the_sandboxes_with_it(daemon: Daemon) -> None:
    # SIGKILL: no clean-up code runs; --die-with-parent must do it.
    marker = sleep_marker()
    async with daemon.session() as http:
        sandbox = await create_sandbox(http)
        running = asyncio.create_task(
            http.post(
                f"/v1/sandboxes/{sandbox['id']}/exec",
                json={"command": _escapers(marker), "timeout": 120},
            )
        )
        assert await _started(marker, 5), pgrep(f"sleep {marker}")
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(daemon.proc.wait, 10)
        await asyncio.gather(running, return_exceptions=True)
    assert await _gone(marker), pgrep(f"sleep {marker}")


def _kill_leftovers(marker: str) -> list[int]:
    """SIGKILL the processes this test started and leaked (found by its unique marker)."""
    leaked = pids_matching(f"sleep {marker}")
    for pid in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return leaked


async def test_tiny_timeout_during_setup_still_kills_everything(
    client: Any, sandbox: dict[str, Any]
) -> None:
    marker = sleep_marker()
    try:
        for attempt in range(40):
            timeout = (1 + attempt % 8) / 1000
            result = await run(client, sandbox["id"], f"sleep {marker}", timeout=timeout)
            assert result["timed_out"] is True
            assert result["exit_code"] is None
            assert result["duration_ms"] < 2000, (timeout, pgrep(f"sleep {marker}"))
            assert await _gone(marker), (timeout, pgrep(f"sleep {marker}"))
        assert await _gone(marker), pgrep(f"sleep {marker}")
    finally:
        _kill_leftovers(marker)


async def test_delete_right_after_exec_starts_kills_everything(client: Any) -> None:
    marker = sleep_marker()
    try:
        for attempt in range(100):
            sandbox = await create_sandbox(client)
            running = asyncio.create_task(
                client.post(
                    f"/v1/sandboxes/{sandbox['id']}/exec",
                    json={"command": f"sleep {marker}", "timeout": 120},
                )
            )
            # DELETE as soon as the daemon counts the command as running: the kill
            # then lands within the first milliseconds of bwrap's life.
            while not running.done():
                r = await client.get(f"/v1/sandboxes/{sandbox['id']}")
                if (await r.json())["running_commands"]:
                    break
            await asyncio.sleep((attempt % 8) / 1000)
            r = await client.delete(f"/v1/sandboxes/{sandbox['id']}")
            assert r.status == 204
            try:
                answer = await asyncio.wait_for(running, 6)
            except TimeoutError:
                pytest.fail(
                    f"attempt {attempt}: no answer 6 s after DELETE; left running: "
                    f"{pgrep(f'sleep {marker}')}"
                )
            await expect_problem(answer, 410, "sandbox_deleted")
            assert await _gone(marker), (attempt, pgrep(f"sleep {marker}"))
    finally:
        _kill_leftovers(marker)


@pytest.mark.skipif(
    not AS_ROOT, reason="RLIMIT_NPROC is only set where each sandbox has a uid of its own"
)
async def test_process_flood_is_bounded_and_killed(make_client: ClientFactory) -> None:
    # A uid range of its own: RLIMIT_NPROC counts every host process of the uid, and
    # other daemons (other tests) start their ranges at the same default.
    start = 1_000_000 + secrets.randbelow(1_000_000) * 8
    client = await make_client(settings_update={"sandbox_uid_start": start, "sandbox_uid_count": 8})
    sandbox = await create_sandbox(client)
    marker = sleep_marker()
    try:
        r = await client.post(
            f"/v1/sandboxes/{sandbox['id']}/exec",
            json={
                # The count is written by the shell itself (no fork) after each start.
                "command": f"i=0; while [ $i -lt 1000 ]; do sleep {marker} & i=$((i+1)); "
                "echo $i > count; done; wait",
                "timeout": 10,
                "limits": {"processes": 64},
            },
        )
        result = await r.json()
    finally:
        _kill_leftovers(marker)
    assert r.status == 200, result
    # dash gives up at the first fork the limit refuses; bwrap's init then ends the rest.
    assert (result["exit_code"], result["timed_out"]) == (2, False), result
    assert result["stderr"].endswith("Cannot fork\n"), result
    # 64 processes for the uid: the sleeps, bwrap and its PID 1, and the shell.
    started = int((Path(sandbox["workspace"]) / "count").read_text())
    assert started == 64 - 3, started
    assert await _gone(marker), pgrep(f"sleep {marker}")
