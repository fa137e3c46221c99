"""``@anthropic-ai/sandbox-runtime`` (srt, a bwrap-based peer) on the same ``true``.

srt is a command-line tool: each run starts node, its network proxies and
bwrap. It runs in the same loop as raw bwrap and sandboxd's exec, so the
three figures share one stretch of machine time. It needs ripgrep and socat
on Linux; install it with ``npm install --prefix DIR @anthropic-ai/sandbox-runtime``
and pass ``--srt DIR/node_modules/.bin/srt``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from bench.context import Context
from bench.harness import Row, Stats, exec_command, progress
from bench.latency import TRUE

SETTINGS = {
    "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []},
    "network": {"allowedDomains": [], "deniedDomains": []},
}


def _version(srt: str) -> str:
    try:
        out = subprocess.run([srt, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


async def run(ctx: Context) -> Row:
    title = "srt (@anthropic-ai/sandbox-runtime) `true` vs raw bwrap"
    row = Row(id="srt_true", title=title, unit="ms", optional=True)
    if not ctx.srt:
        row.skipped = (
            "srt not found; npm install --prefix DIR @anthropic-ai/sandbox-runtime "
            "and pass --srt DIR/node_modules/.bin/srt"
        )
        return row
    folder = ctx.root / "srt"
    (folder / "work").mkdir(parents=True)
    settings = folder / "settings.json"
    settings.write_text(json.dumps(SETTINGS))
    argv = [ctx.srt, "--settings", str(settings), "-c", "true"]
    # srt needs PATH (bwrap, rg, socat) and HOME; it gets the caller's environment.
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}

    def srt_once() -> float:
        started = time.perf_counter()
        out = subprocess.run(
            argv, cwd=folder / "work", env=env, stdin=subprocess.DEVNULL, capture_output=True
        )
        elapsed = time.perf_counter() - started
        if out.returncode != 0:
            raise RuntimeError(out.stderr.decode(errors="replace").strip()[-300:])
        return elapsed

    try:
        srt_once()
    except (OSError, RuntimeError) as exc:
        row.skipped = f"srt cannot run `true` here: {exc}"
        return row
    progress(f"srt vs raw bwrap vs sandboxd: {ctx.plan.srt_runs} runs")
    theirs: list[float] = []
    ref: list[float] = []
    ours: list[float] = []
    for i in range(ctx.plan.srt_runs):
        for step in range(3):
            which = (i + step) % 3
            if which == 0:
                theirs.append(srt_once())
            elif which == 1:
                ref.append(ctx.raw.run(TRUE))
            else:
                started = time.perf_counter()
                status, body = await exec_command(ctx.http, ctx.sandbox_id, "true")
                ours.append(time.perf_counter() - started)
                if status != 200 or body.get("exit_code") != 0:
                    row.errors += 1
    row.measured = Stats.of(theirs).scaled(1000)
    row.reference = Stats.of(ref).scaled(1000)
    row.reference_name = "raw bwrap (same loop)"
    daemon = Stats.of(ours).scaled(1000)
    row.title = f"srt {_version(ctx.srt)} `true` vs raw bwrap"
    row.note = (
        f"sandboxd exec in the same loop {daemon.median:.2f} ms "
        f"(ratio {daemon.median / row.reference.median:.2f}); srt runs node, its proxies and bwrap"
    )
    row.extra = {"sandboxd": daemon.as_dict()}
    return row
