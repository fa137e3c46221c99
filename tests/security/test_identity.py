"""Sandboxed code is never host root and holds no privilege it could use."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sandboxd.config import Settings
from tests.security.conftest import ClientFactory
from tests.security.helpers import (
    AS_ROOT,
    create_sandbox,
    exact_sleeps,
    pids_matching,
    run,
    sandbox_owner,
    sleep_marker,
    wait_until,
)


def _check_uid_range(settings: Settings, uid: int) -> None:
    if AS_ROOT:
        # Never root, never a uid of the host's own users or nobody: one of the
        # daemon's range, the last of which is the start-up self-test's.
        start, count = settings.sandbox_uid_start, settings.sandbox_uid_count
        assert start <= uid < start + count - 1, uid
    else:
        assert uid == os.geteuid()


async def test_files_made_in_workspace_belong_to_the_sandbox_uid(
    client: Any, sandbox: dict[str, Any], settings: Settings
) -> None:
    result = await run(client, sandbox["id"], "echo hi > made.txt && mkdir made.d && id -u")
    assert result["exit_code"] == 0, result
    # Inside, the code sees its own namespace's uid, never 0.
    assert result["stdout"] == "1000\n"
    uid, gid = sandbox_owner(settings.data_dir, sandbox)
    assert uid != 0
    _check_uid_range(settings, uid)
    workspace = Path(sandbox["workspace"])
    for name in ("made.txt", "made.d"):
        st = os.lstat(workspace / name)
        assert (st.st_uid, st.st_gid) == (uid, gid), name


async def test_each_sandbox_has_a_uid_of_its_own(client: Any, settings: Settings) -> None:
    first = await create_sandbox(client)
    second = await create_sandbox(client)
    for sandbox in (first, second):
        assert (await run(client, sandbox["id"], "touch mine"))["exit_code"] == 0
    owners = [os.lstat(Path(s["workspace"]) / "mine").st_uid for s in (first, second)]
    assert owners == [sandbox_owner(settings.data_dir, s)[0] for s in (first, second)]
    if AS_ROOT:
        assert owners[0] != owners[1]
        # Each workspace is closed to the other sandbox's uid on the host too.
        for sandbox in (first, second):
            st = os.stat(sandbox["workspace"])
            assert st.st_mode & 0o777 == 0o700


async def test_no_capabilities_and_no_new_privileges(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(
        client, sandbox["id"], "grep -E '^(Cap|NoNewPrivs|Seccomp|Uid|Gid)' /proc/self/status"
    )
    assert result["exit_code"] == 0, result
    fields = dict(line.split(":\t", 1) for line in result["stdout"].splitlines())
    assert fields == {
        "Uid": "1000\t1000\t1000\t1000",
        "Gid": "1000\t1000\t1000\t1000",
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
        "Seccomp_filters": "1",
    }


async def test_uid_map_inside_is_a_single_uid(client: Any, sandbox: dict[str, Any]) -> None:
    # bwrap's --disable-userns puts the code in a second, nested user namespace,
    # so the "outside" column seen from inside is the intermediate namespace's 0,
    # not the host uid (which the next test reads from the host).
    result = await run(client, sandbox["id"], "cat /proc/self/uid_map /proc/self/gid_map")
    assert result["exit_code"] == 0, result
    rows = [line.split() for line in result["stdout"].splitlines()]
    assert rows == [["1000", "0", "1"], ["1000", "0", "1"]]


async def test_host_sees_the_sandboxed_process_as_the_sandbox_uid(
    client: Any, sandbox: dict[str, Any], settings: Settings
) -> None:
    uid, gid = sandbox_owner(settings.data_dir, sandbox)
    marker = sleep_marker()
    task = asyncio.create_task(run(client, sandbox["id"], f"sleep {marker}", timeout=3))
    try:
        found = await wait_until(lambda: exact_sleeps(marker), 2.5)
        assert found, "the sandboxed sleep never showed up on the host"
        (pid,) = exact_sleeps(marker)
        assert Path(f"/proc/{pid}/uid_map").read_text().split() == ["1000", str(uid), "1"]
        assert Path(f"/proc/{pid}/gid_map").read_text().split() == ["1000", str(gid), "1"]
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        assert status["Uid"].split() == [str(uid)] * 4
        assert status["Gid"].split() == [str(gid)] * 4
        assert status["Groups"].split() == []
        assert status["CapEff"].strip() == "0000000000000000"
        # Every process of that sandbox, bwrap included, runs as that uid.
        for other in pids_matching(f"sleep {marker}"):
            st = os.stat(f"/proc/{other}")
            assert (st.st_uid, st.st_gid) == (uid, gid), other
    finally:
        result = await task
    assert result["timed_out"] is True
    assert result["exit_code"] is None


async def test_cannot_create_a_user_namespace(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "unshare -Ur id -u")
    assert result["exit_code"] == 1, result
    # The seccomp filter refuses unshare(2) first.
    assert result["stderr"] == "unshare: unshare failed: Operation not permitted\n"
    assert result["stdout"] == ""


async def test_cannot_create_a_user_namespace_even_without_seccomp(
    make_client: ClientFactory,
) -> None:
    # The second layer: bwrap's --disable-userns (user.max_user_namespaces = 1).
    client = await make_client(settings_update={"seccomp": False})
    sandbox = await create_sandbox(client)
    result = await run(client, sandbox["id"], "unshare -Ur id -u")
    assert result["exit_code"] == 1, result
    assert result["stderr"] == "unshare: unshare failed: No space left on device\n"


async def test_setuid_programs_do_not_elevate(client: Any, sandbox: dict[str, Any]) -> None:
    # /usr/bin/su is setuid root on the host; inside it cannot become root.
    result = await run(
        client,
        sandbox["id"],
        "test -u /usr/bin/su && echo setuid; su -c 'id -u' root </dev/null; echo rc=$?",
    )
    assert result["stdout"] == "setuid\nrc=1\n", result
    assert result["stderr"] == "su: Critical error - immediate abort\n"
