"""Test mode on a one-test python project: what the daemon adds beyond the parts it runs.

The reference is the sum of the parts, each run in raw bwrap: the command,
the fixed wait where it applies, and pytest's own run (``python3 -m pytest
tests`` in a sandbox of its own). Two commands: ``true`` exits at once, so
the runner may start at once; ``sleep 30 &`` leaves a process running (as a
server would), so the full 2 s wait applies.
"""

from __future__ import annotations

import io
import os
import time
import zipfile

import aiohttp

from bench.context import Context
from bench.harness import Row, Stats, create_sandbox, exec_command, progress
from bench.reference import RawBwrap
from sandboxd.models import Language

TEST_FILE = "tests/test_one.py"
TEST_SOURCE = "def test_one():\n    assert 1 + 1 == 2\n"
CASES = (("true", False), ("sleep 30 &", True))


def project_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(TEST_FILE, TEST_SOURCE)
    return buf.getvalue()


async def run(ctx: Context) -> list[Row]:
    plan = ctx.plan
    progress(f"test mode: {len(CASES)} cases x {plan.test_pairs} pairs")
    sandbox_id = (await create_sandbox(ctx.http))["id"]
    form = aiohttp.FormData()
    form.add_field("file", project_zip(), filename="p.zip", content_type="application/zip")
    async with ctx.http.post(f"/v1/sandboxes/{sandbox_id}/upload", data=form) as r:
        if r.status != 201:
            raise RuntimeError(f"upload answered {r.status}: {await r.text()}")
    raw = RawBwrap.create(ctx.root / "ref-test", ctx.settings, ctx.owner, Language.python)
    (raw.workspace / "tests").mkdir()
    (raw.workspace / TEST_FILE).write_text(TEST_SOURCE)
    if ctx.owner:
        for path in (raw.workspace / "tests", raw.workspace / TEST_FILE):
            os.chown(path, ctx.owner.uid, ctx.owner.gid)
    runner = list(raw.toolchain.runner_argv)
    wait = ctx.settings.limits.test_wait_seconds
    rows = []
    for command, waits in CASES:
        errors = 0
        ours: list[float] = []
        ref: list[float] = []
        pytest_alone: list[float] = []

        async def daemon_once(command: str = command) -> float:
            nonlocal errors
            started = time.perf_counter()
            status, body = await exec_command(ctx.http, sandbox_id, command, test=True)
            elapsed = time.perf_counter() - started
            tests = body.get("tests") or {}
            if status != 200 or body.get("exit_code") != 0 or tests.get("passed") != 1:
                errors += 1
            return elapsed

        def raw_once(
            command: str = command, waits: bool = waits, pytest_alone: list[float] = pytest_alone
        ) -> float:
            t_command = raw.run(["/bin/sh", "-c", command])
            t_pytest = raw.run(runner)
            pytest_alone.append(t_pytest)
            return t_command + (wait if waits else 0.0) + t_pytest

        # Warm-up: pytest's cache and __pycache__ exist on both sides from here on.
        await daemon_once()
        raw_once()
        errors = 0
        pytest_alone.clear()
        # The waiting case costs 2 s more per run: half as many pairs.
        pairs = max(1, plan.test_pairs // 2) if waits else plan.test_pairs
        for i in range(pairs):
            if i % 2:
                ours.append(await daemon_once())
                ref.append(raw_once())
            else:
                ref.append(raw_once())
                ours.append(await daemon_once())
        measured = Stats.of(ours).scaled(1000)
        reference = Stats.of(ref).scaled(1000)
        rows.append(
            Row(
                id="test_mode_wait" if waits else "test_mode",
                title=f"test mode, one pytest test, command `{command}`",
                unit="ms",
                measured=measured,
                reference=reference,
                reference_name=(
                    f"raw bwrap command + {wait:g} s + raw bwrap pytest"
                    if waits
                    else "raw bwrap command + raw bwrap pytest"
                ),
                errors=errors,
                note=f"time beyond the parts {measured.median - reference.median:.0f} ms"
                f" at the median; pytest alone {Stats.of(pytest_alone).median * 1000:.0f} ms",
            )
        )
    return rows
