"""One request at a time: exec of ``true`` against raw bwrap; create + delete against a GET."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from bench.context import Context
from bench.harness import (
    CpuAccount,
    Row,
    Stats,
    cpu_note,
    cpu_seconds,
    create_sandbox,
    delete_sandbox,
    exec_command,
    progress,
)

TRUE = ["/bin/sh", "-c", "true"]  # what the daemon runs for the command "true"


async def timed(step: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await step()
    return time.perf_counter() - started


async def exec_true(ctx: Context) -> Row:
    """exec ``true`` over the socket, interleaved with raw bwrap running the same."""
    n = ctx.plan.exec_pairs
    progress(f"exec true vs raw bwrap: {n} pairs")
    errors = 0

    async def daemon_once() -> None:
        nonlocal errors
        status, body = await exec_command(ctx.http, ctx.sandbox_id, "true")
        if status != 200 or body.get("exit_code") != 0:
            errors += 1

    async def raw_once() -> None:
        ctx.raw.run(TRUE)

    for _ in range(5):  # warm-up: page cache, the daemon's first-request paths
        await daemon_once()
        await raw_once()
    errors = 0
    ours: list[float] = []
    ref: list[float] = []
    cpu_ours, cpu_ref = CpuAccount(), CpuAccount()

    async def measure(
        step: Callable[[], Awaitable[object]], into: list[float], cpu: CpuAccount
    ) -> None:
        before = cpu_seconds(ctx.daemon.pid)
        into.append(await timed(step))
        cpu.add(before, cpu_seconds(ctx.daemon.pid), 1)

    for i in range(n):
        # Alternate which goes first, so neither always follows the other.
        if i % 2:
            await measure(daemon_once, ours, cpu_ours)
            await measure(raw_once, ref, cpu_ref)
        else:
            await measure(raw_once, ref, cpu_ref)
            await measure(daemon_once, ours, cpu_ours)
    return Row(
        id="exec_true",
        title="exec `true` over the socket vs raw bwrap, same argv",
        unit="ms",
        measured=Stats.of(ours).scaled(1000),
        reference=Stats.of(ref).scaled(1000),
        reference_name="raw bwrap: same prlimit+setpriv+bwrap argv, options, seccomp",
        target=1.15,
        errors=errors,
        note="overhead "
        f"{(Stats.of(ours).median - Stats.of(ref).median) * 1000:.2f} ms at the median; "
        + cpu_note(cpu_ours, cpu_ref),
        extra={
            "cpu_ms_per_exec": cpu_ours.per_op_ms(),
            "reference_cpu_ms_per_exec": cpu_ref.per_op_ms(),
        },
    )


async def create_delete(ctx: Context) -> Row:
    """POST + DELETE of a sandbox against a GET of one (the daemon's own no-op)."""
    n = ctx.plan.lifecycle_pairs
    progress(f"create+delete vs GET: {n} pairs")

    async def lifecycle() -> None:
        made = await create_sandbox(ctx.http)
        await delete_sandbox(ctx.http, made["id"])

    async def get() -> None:
        async with ctx.http.get(f"/v1/sandboxes/{ctx.sandbox_id}") as r:
            await r.json()
            if r.status != 200:
                raise RuntimeError(f"GET answered {r.status}")

    for _ in range(5):
        await lifecycle()
        await get()
    ours: list[float] = []
    ref: list[float] = []
    for i in range(n):
        if i % 2:
            ours.append(await timed(lifecycle))
            ref.append(await timed(get))
        else:
            ref.append(await timed(get))
            ours.append(await timed(lifecycle))
    return Row(
        id="create_delete",
        title="create + delete of a sandbox vs GET of one",
        unit="ms",
        measured=Stats.of(ours).scaled(1000),
        reference=Stats.of(ref).scaled(1000),
        reference_name="GET /v1/sandboxes/{id}",
        target=3.0,
    )
