"""The workspace disk quota: a sandbox must not fill the host's disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sandboxd.config import MiB
from tests.conftest import form_with_file, make_zip
from tests.security.conftest import ClientFactory
from tests.security.helpers import create_sandbox, expect_problem, run


def _usage(workspace: str) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


async def test_upload_over_the_quota_is_refused(make_client: ClientFactory) -> None:
    client = await make_client(workspace_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=form_with_file(b"\0" * (2 * MiB), "big")
    )
    await expect_problem(r, 413, "quota_exceeded")
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(make_zip({"big": os.urandom(2 * MiB)}), "big.zip"),
    )
    await expect_problem(r, 413, "quota_exceeded")
    assert os.listdir(sandbox["workspace"]) == []


async def test_command_that_keeps_writing_is_stopped(make_client: ClientFactory) -> None:
    client = await make_client(workspace_bytes=4 * MiB)
    sandbox = await create_sandbox(client)
    result = await run(
        client,
        sandbox["id"],
        "i=0; while :; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); sleep 0.05; done",
        timeout=30,
    )
    assert result["quota_exceeded"] is True
    assert result["timed_out"] is False
    assert result["exit_code"] is None
    assert result["duration_ms"] < 10_000


QUOTA_POLL = (
    "BUG: the workspace quota is only polled once a second while a command runs, and not "
    "checked when an exec starts or ends: a command that writes fast and exits is never "
    "reported, and every later exec may add as much again, so the quota does not bound disk "
    "use (execution._watch_quota; check at exec start and after the run)"
)


async def test_command_that_passes_the_quota_and_exits_is_reported(
    make_client: ClientFactory,
) -> None:
    client = await make_client(workspace_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    result = await run(client, sandbox["id"], "head -c 3000000 /dev/zero > f0")
    assert _usage(sandbox["workspace"]) > 1 * MiB  # it did pass the quota
    assert result["quota_exceeded"] is True, result


async def test_exec_in_a_workspace_over_its_quota_is_refused(
    make_client: ClientFactory,
) -> None:
    client = await make_client(workspace_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    answers: list[Any] = []
    for i in range(3):
        r = await client.post(
            f"/v1/sandboxes/{sandbox['id']}/exec",
            json={"command": f"head -c 3000000 /dev/zero > f{i}"},
        )
        answers.append((r.status, await r.json(content_type=None)))
    # Whatever the first one did, the workspace is over its quota after it: the next
    # execs must be refused, not allowed to add 3 MB each.
    for status, body in answers[1:]:
        assert (status, body.get("code")) == (413, "quota_exceeded"), answers
    assert _usage(sandbox["workspace"]) < 4 * MiB, sorted(Path(sandbox["workspace"]).iterdir())
