"""Many sandboxes on disk: start-up, listing, create latency and memory, against an empty daemon.

The sandboxes are made through the API (16 clients at once), so what is on
disk is exactly what the daemon writes. Memory is read after a fresh start
(the records loaded from disk) and one listing, so it reflects the registry
rather than garbage left from making it.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from bench.context import Context
from bench.harness import (
    BenchDaemon,
    Row,
    Stats,
    create_sandbox,
    progress,
    rss_bytes,
)

MiB = 1024 * 1024


async def populate(daemon: BenchDaemon, upto: int, have: int) -> float:
    """Create sandboxes until the daemon has ``upto``; the creates per second."""
    started = time.perf_counter()
    todo = upto - have
    remaining = todo
    done = 0

    async def client() -> None:
        nonlocal remaining, done
        while remaining > 0:
            remaining -= 1
            await create_sandbox(http)
            done += 1
            if done % 2000 == 0:
                progress(f"  {have + done} sandboxes")

    async with daemon.session() as http:
        await asyncio.gather(*(client() for _ in range(16)))
    return todo / (time.perf_counter() - started)


async def _list_then_rss(daemon: BenchDaemon) -> tuple[int, int]:
    async with daemon.session() as http, http.get("/v1/sandboxes") as r:
        body = await r.read()
    return rss_bytes(daemon.pid), len(body)


def _mib(value: int) -> Stats:
    return Stats(value / MiB, value / MiB, value / MiB, 1)


async def run(ctx: Context, started: list[BenchDaemon]) -> tuple[list[Row], list[Row]]:
    plan = ctx.plan
    n, m = plan.scale_sandboxes, plan.memory_sandboxes
    big = BenchDaemon(ctx.root, "big", ctx.daemon.prelude)
    empty = BenchDaemon(ctx.root, "empty", ctx.daemon.prelude)
    started.extend([big, empty])
    big.start()
    empty.start()
    progress(f"scale: creating {m} sandboxes through the API")
    await populate(big, m, 0)
    big.stop()
    big.start()
    rss_m, _ = await _list_then_rss(big)
    progress(f"scale: creating {n} sandboxes through the API")
    rate = (await populate(big, n, m)) if n > m else 0.0

    progress(f"scale: start-up with {n} vs empty, {plan.startup_pairs} pairs")
    ours: list[float] = []
    ref: list[float] = []
    for i in range(plan.startup_pairs):
        big.stop()
        empty.stop()
        if i % 2:
            ours.append(big.start())
            ref.append(empty.start())
        else:
            ref.append(empty.start())
            ours.append(big.start())
    startup = Row(
        id="scale_startup",
        title=f"start-up (until the first answer), {n:,} sandboxes vs none",
        unit="ms",
        measured=Stats.of(ours).scaled(1000),
        reference=Stats.of(ref).scaled(1000),
        reference_name="empty daemon",
        note="includes the interpreter's start and the bwrap self-test",
    )
    rss_n, list_bytes = await _list_then_rss(big)
    rss_empty, _ = await _list_then_rss(empty)

    progress(f"scale: GET /v1/sandboxes, {plan.list_pairs} pairs")
    ours, ref = [], []
    async with big.session() as big_http, empty.session() as empty_http:

        async def list_on(http: aiohttp.ClientSession) -> float:
            t = time.perf_counter()
            async with http.get("/v1/sandboxes") as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"list answered {r.status}")
            return time.perf_counter() - t

        for i in range(plan.list_pairs):
            pair = (big_http, empty_http) if i % 2 else (empty_http, big_http)
            for http in pair:
                (ours if http is big_http else ref).append(await list_on(http))
        listing = Row(
            id="scale_list",
            title=f"GET /v1/sandboxes with {n:,} sandboxes vs none",
            unit="ms",
            measured=Stats.of(ours).scaled(1000),
            reference=Stats.of(ref).scaled(1000),
            reference_name="empty daemon",
            note=f"{list_bytes / 1e6:.1f} MB of JSON",
        )

        progress(f"scale: create with {n} vs empty, {plan.create_pairs} pairs")
        ours, ref = [], []
        for i in range(plan.create_pairs):
            pair = (big_http, empty_http) if i % 2 else (empty_http, big_http)
            for http in pair:
                t = time.perf_counter()
                await create_sandbox(http)
                (ours if http is big_http else ref).append(time.perf_counter() - t)
        create = Row(
            id="scale_create",
            title=f"create with {n:,} sandboxes vs none (must not grow)",
            unit="ms",
            measured=Stats.of(ours).scaled(1000),
            reference=Stats.of(ref).scaled(1000),
            reference_name="empty daemon",
            target=1.2,
            note=f"filled at {rate:.0f} creates/s with 16 clients" if rate else "",
        )
    memory = [
        Row(
            id="rss_sandboxes_m",
            title=f"daemon RSS with {m:,} sandboxes",
            unit="MiB",
            measured=_mib(rss_m),
            reference=_mib(rss_empty),
            reference_name="empty daemon, same treatment",
            note="fresh start, after one GET /v1/sandboxes",
        ),
        Row(
            id="rss_sandboxes_n",
            title=f"daemon RSS with {n:,} sandboxes",
            unit="MiB",
            measured=_mib(rss_n),
            reference=_mib(rss_empty),
            reference_name="empty daemon, same treatment",
            note="fresh start, after one GET /v1/sandboxes",
        ),
    ]
    return [startup, listing, create], memory
