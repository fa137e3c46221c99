"""`python -m bench --quick --json` runs end to end and fills every row.

No timing is asserted (timings never go into pass/fail tests): only that
each benchmark ran against a real daemon, produced numbers, saw no error,
and that the raw-bwrap reference still runs what the daemon runs.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

ROWS = {
    "exec_true",
    "create_delete",
    "throughput_1",
    "throughput_4",
    "throughput_16",
    "throughput_64",
    "test_mode",
    "test_mode_wait",
    "srt_true",
    "upload_zip",
    "scale_startup",
    "scale_list",
    "scale_create",
    "rss_idle",
    "rss_sandboxes_m",
    "rss_sandboxes_n",
    "rss_exec64",
}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def test_quick_bench_produces_every_row():
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    rows = {row["id"]: row for row in doc["rows"]}
    assert set(rows) == ROWS
    for row in rows.values():
        if row["skipped"]:
            # Only the npm peer may be missing (it is not installed by scripts/setup).
            assert row["optional"], row
            continue
        stats = row["measured"]
        assert stats is not None, row
        assert all(_is_number(stats[k]) for k in ("median", "min", "max")), row
        assert stats["min"] <= stats["median"] <= stats["max"], row
        if row["reference"] is not None:
            assert all(_is_number(row["reference"][k]) for k in ("median", "min", "max")), row
            assert _is_number(row["ratio"]), row
        assert row["errors"] == 0, row
    for row_id in ROWS - {"rss_idle"}:
        if not rows[row_id]["skipped"]:
            assert rows[row_id]["reference"] is not None, row_id
    check = doc["checks"]["reference_argv"]
    assert check["matches"], check["detail"]
    assert doc["plan"]["quick"] is True


def test_reference_check_waits_for_a_readable_argv(tmp_path: Path) -> None:
    """A bwrap child whose cmdline reads empty (mid-exec, or a zombie) is not taken.

    CI once read the argv of the daemon's bwrap in the instant the kernel had
    renamed the process but not yet filled in its arguments, and the check
    crashed on an empty list. Here a child named bwrap exits and stays a
    zombie (unreaped), the same empty cmdline.
    """
    reference = _bench_reference()
    child = _named_bwrap(tmp_path, "/bin/true", "x")
    try:
        deadline = time.monotonic() + 10
        while _state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(child.pid) == "Z"
        assert child.pid in reference._bwrap_children(os.getpid())
        assert reference._settled_bwrap_child(os.getpid()) is None
    finally:
        child.wait()


def test_reference_check_reads_a_live_bwrap_argv(tmp_path: Path) -> None:
    reference = _bench_reference()
    child = _named_bwrap(tmp_path, "/bin/sleep", "30")
    try:
        deadline = time.monotonic() + 10
        found = None
        while found is None and time.monotonic() < deadline:
            found = reference._settled_bwrap_child(os.getpid())
            time.sleep(0.01)
        assert found == (child.pid, [str(tmp_path / "bwrap"), "--", "30"])
    finally:
        child.kill()
        child.wait()


def _bench_reference() -> Any:
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("bench.reference")
    finally:
        sys.path.remove(str(ROOT))


def _named_bwrap(tmp_path: Path, program: str, arg: str) -> subprocess.Popen[bytes]:
    """``program`` run under the name bwrap (so its comm is "bwrap")."""
    fake = tmp_path / "bwrap"
    fake.symlink_to(program)
    return subprocess.Popen([str(fake), "--", arg])


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
