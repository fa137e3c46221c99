"""exec ``true`` from N concurrent clients against raw bwrap spawned N at a time.

Each level runs a fixed number of execs per batch; a round runs every
level once for the daemon and once for the reference (in alternating
order), and the figure is the median over rounds of execs per second.
Each daemon client has its own sandbox, as separate agents would. The
daemon's RSS is sampled during its 64-client batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench.context import Context
from bench.harness import (
    CpuAccount,
    Row,
    RssSampler,
    Stats,
    cpu_note,
    cpu_seconds,
    create_sandbox,
    exec_command,
    progress,
)
from bench.latency import TRUE


async def _daemon_batch(ctx: Context, sandboxes: list[str], count: int) -> tuple[float, int]:
    remaining = count
    errors = 0

    async def client(sandbox_id: str) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            try:
                status, body = await exec_command(ctx.http, sandbox_id, "true")
                if status != 200 or body.get("exit_code") != 0:
                    errors += 1
            except Exception:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(s) for s in sandboxes))
    return count / (time.perf_counter() - started), errors


def _raw_batch(ctx: Context, pool: ThreadPoolExecutor, level: int, count: int) -> tuple[float, int]:
    lock = threading.Lock()
    remaining = count
    errors = 0

    def worker() -> None:
        nonlocal remaining, errors
        while True:
            with lock:
                if remaining <= 0:
                    return
                remaining -= 1
            try:
                ctx.raw.run(TRUE)
            except Exception:
                with lock:
                    errors += 1

    started = time.perf_counter()
    futures = [pool.submit(worker) for _ in range(level)]
    for f in futures:
        f.result()
    return count / (time.perf_counter() - started), errors


async def run(ctx: Context) -> tuple[list[Row], int]:
    """The rows, one per level, and the daemon's peak RSS during 64 concurrent execs."""
    plan = ctx.plan
    levels = plan.throughput_levels
    progress(f"throughput at {levels} clients: {plan.throughput_rounds} rounds")
    sandboxes = [(await create_sandbox(ctx.http))["id"] for _ in range(max(levels))]
    ours: dict[int, list[float]] = {c: [] for c in levels}
    ref: dict[int, list[float]] = {c: [] for c in levels}
    errors: dict[int, int] = dict.fromkeys(levels, 0)
    cpu_ours = {c: CpuAccount() for c in levels}
    cpu_ref = {c: CpuAccount() for c in levels}
    ref_errors: dict[int, int] = dict.fromkeys(levels, 0)
    peak_rss = 0
    with ThreadPoolExecutor(max_workers=max(levels)) as pool:
        # Warm-up: start the pool's threads and the daemon's connections.
        await _daemon_batch(ctx, sandboxes, max(levels))
        await asyncio.to_thread(_raw_batch, ctx, pool, max(levels), max(levels))
        for r in range(plan.throughput_rounds):
            for level in levels:
                count = plan.throughput_batch[level]

                async def daemon_side(level: int = level, count: int = count) -> None:
                    nonlocal peak_rss
                    sampler = RssSampler(ctx.daemon.pid)
                    before = cpu_seconds(ctx.daemon.pid)
                    with sampler if level == 64 else contextlib.nullcontext():
                        rate, errs = await _daemon_batch(ctx, sandboxes[:level], count)
                    cpu_ours[level].add(before, cpu_seconds(ctx.daemon.pid), count)
                    if level == 64:
                        peak_rss = max(peak_rss, sampler.peak)
                    ours[level].append(rate)
                    errors[level] += errs

                async def raw_side(level: int = level, count: int = count) -> None:
                    before = cpu_seconds(ctx.daemon.pid)
                    rate, errs = await asyncio.to_thread(_raw_batch, ctx, pool, level, count)
                    cpu_ref[level].add(before, cpu_seconds(ctx.daemon.pid), count)
                    ref[level].append(rate)
                    ref_errors[level] += errs

                first, second = (daemon_side, raw_side) if r % 2 == 0 else (raw_side, daemon_side)
                await first()
                await second()
    rows = [
        Row(
            id=f"throughput_{level}",
            title=f"exec `true` throughput, {level} concurrent client{'s' if level > 1 else ''}",
            unit="exec/s",
            measured=Stats.of(ours[level]),
            reference=Stats.of(ref[level]),
            reference_name=f"raw bwrap, {level} at a time",
            better="higher",
            target=0.85,
            errors=errors[level],
            note=f"{plan.throughput_batch[level]} execs per batch; "
            + cpu_note(cpu_ours[level], cpu_ref[level])
            + (f"; reference errors {ref_errors[level]}" if ref_errors[level] else ""),
            extra={
                "cpu_ms_per_exec": cpu_ours[level].per_op_ms(),
                "reference_cpu_ms_per_exec": cpu_ref[level].per_op_ms(),
            },
        )
        for level in levels
    ]
    return rows, peak_rss
