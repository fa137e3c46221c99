"""``python -m bench``: every benchmark against a real daemon, as a table (or ``--json``).

Run from the checkout with its virtualenv: ``.venv/bin/python -m bench``.
The daemon runs from the same source tree as this package; the figures are
paired with references measured in the same run, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from bench import latency, scale, srt, testmode, throughput, upload
from bench.context import Context
from bench.harness import (
    BenchDaemon,
    Plan,
    Row,
    Stats,
    create_sandbox,
    daemons,
    make_workdir,
    progress,
    remove_workdir,
    rss_bytes,
)
from bench.profile import recording, summary
from bench.reference import RawBwrap, check_matches_daemon
from bench.report import document, markdown, notes, pressure, table
from sandboxd.config import Settings
from sandboxd.models import Language
from sandboxd.workspace import Owner

MiB = 1024 * 1024

ALL = ("exec", "lifecycle", "throughput", "testmode", "srt", "upload", "scale")


async def run(
    plan: Plan,
    only: set[str],
    srt_path: str | None,
    keep: bool,
    profile_dir: Path | None = None,
    prelude: Path | None = None,
) -> dict[str, Any]:
    root = make_workdir()
    progress(f"work dir {root}")
    rows: list[Row] = []
    checks: dict[str, Any] = {"pressure_at_start": pressure(), "loadavg_at_start": os.getloadavg()}
    try:
        with daemons(root) as started:
            main = BenchDaemon(root, "main", prelude)
            started.append(main)
            checks["startup_seconds_main"] = main.start()
            async with main.session() as http:
                async with http.get("/v1/status") as r:
                    await r.json()
                idle_rss = rss_bytes(main.pid)
                made = await create_sandbox(http)
                workspace = Path(made["workspace"])
                # As root, each sandbox has a uid of its own: the reference gets
                # the uid of a sandbox made for it and never used otherwise.
                spare = Path((await create_sandbox(http))["workspace"]).stat()
                owner = Owner(spare.st_uid, spare.st_gid) if os.geteuid() == 0 else None
                settings = Settings(socket_path=main.socket_path, data_dir=main.data_dir)
                raw = RawBwrap.create(root / "ref", settings, owner, Language.python)
                ctx = Context(
                    root, plan, settings, main, http, made["id"], raw, owner, srt_path, profile_dir
                )

                sleeper = asyncio.ensure_future(
                    http.post(f"/v1/sandboxes/{made['id']}/exec", json={"command": "sleep 2"})
                )
                checks["reference_argv"] = await check_matches_daemon(
                    raw, main.pid, main.data_dir, workspace.parent, sleeper
                )
                (await sleeper).release()
                if not checks["reference_argv"]["matches"]:
                    progress(f"WARNING: reference differs: {checks['reference_argv']['detail']}")

                peak_rss = None
                for name in ("exec", "lifecycle", "throughput", "testmode", "srt", "upload"):
                    if name not in only:
                        continue
                    with recording(profile_dir, name, main.pid):
                        if name == "exec":
                            rows.append(await latency.exec_true(ctx))
                        elif name == "lifecycle":
                            rows.append(await latency.create_delete(ctx))
                        elif name == "throughput":
                            level_rows, peak_rss = await throughput.run(ctx)
                            rows.extend(level_rows)
                        elif name == "testmode":
                            rows.extend(await testmode.run(ctx))
                        elif name == "srt":
                            rows.append(await srt.run(ctx))
                        elif name == "upload":
                            rows.append(await upload.run(ctx))
            memory = [
                Row(
                    id="rss_idle",
                    title="daemon RSS, idle (no sandboxes)",
                    unit="MiB",
                    measured=Stats(idle_rss / MiB, idle_rss / MiB, idle_rss / MiB, 1),
                )
            ]
            if "scale" in only:
                scale_rows, memory_rows = await scale.run(ctx, started)
                rows.extend(scale_rows)
                memory.extend(memory_rows)
            if peak_rss:
                memory.append(
                    Row(
                        id="rss_exec64",
                        title="daemon RSS, peak during 64 concurrent execs",
                        unit="MiB",
                        measured=Stats(peak_rss / MiB, peak_rss / MiB, peak_rss / MiB, 1),
                        reference=memory[0].measured,
                        reference_name="idle",
                        note="sampled every 5 ms during the 64-client batches",
                    )
                )
            rows.extend(memory)
    finally:
        if keep:
            progress(f"kept {root}")
        else:
            remove_workdir(root)
    return document(rows, checks, dataclasses.asdict(plan)) | {"_rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument(
        "--quick", action="store_true", help="a short smoke run (figures not meaningful)"
    )
    parser.add_argument(
        "--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}"
    )
    parser.add_argument(
        "--srt",
        default=os.environ.get("SANDBOXD_BENCH_SRT") or shutil.which("srt"),
        help="path of @anthropic-ai/sandbox-runtime's srt (default: $SANDBOXD_BENCH_SRT or PATH)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir for inspection")
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="print the table of an earlier --json run instead of running anything",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record the main daemon with py-spy during each benchmark into DIR (slows it)",
    )
    parser.add_argument(
        "--daemon-prelude",
        type=Path,
        metavar="FILE",
        help="run this Python file in the daemons before sandboxd starts (to try a fix)",
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    unknown = only - set(ALL)
    if unknown:
        parser.error(f"unknown benchmarks: {', '.join(sorted(unknown))}")
    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        rows = [Row.from_dict(r) for r in doc["rows"]]
    else:
        plan = Plan.smoke() if args.quick else Plan.full()
        doc = asyncio.run(run(plan, only, args.srt, args.keep, args.py_spy, args.daemon_prelude))
        if args.daemon_prelude:
            doc["checks"]["daemon_prelude"] = args.daemon_prelude.read_text()
        rows = doc.pop("_rows")
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    m = doc["machine"]
    s = doc["sandboxd"]
    print(
        f"sandboxd {s['version']} ({s['commit']}{', modified' if s['sandboxd_modified'] else ''})"
        f" on {m['nproc']} x {m['cpu']}, Linux {m['kernel']}, {m['bwrap']},"
        f" euid {m['euid']}{' (quick run)' if doc['plan']['quick'] else ''}"
    )
    start, end = doc["checks"].get("pressure_at_start", {}), m.get("pressure_at_end", {})
    if start or end:
        print(
            f"CPU pressure (PSI some, avg60): {start.get('cpu_some_avg60')}% at the start,"
            f" {end.get('cpu_some_avg60')}% at the end (other load on the machine adds noise)"
        )
    ref = doc["checks"]["reference_argv"]
    print(f"reference argv matches the daemon's: {ref['matches']} ({ref['detail']})")
    if doc["checks"].get("daemon_prelude"):
        print("NOT A REAL RUN: the daemons ran with a --daemon-prelude")
    print()
    print(markdown(rows) if args.markdown else table(rows))
    print()
    print(notes(rows))
    if args.py_spy:
        for path in sorted(args.py_spy.glob("*.txt")):
            print()
            print(summary(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
