"""No descriptor of the daemon, of its parent or of another sandbox reaches sandboxed code.

Sandboxes are started with ``posix_spawn``, which closes nothing by itself:
it passes exactly the descriptors it is told to, and every other one must be
close-on-exec. These tests hold that from the outside: a descriptor leaked
to the daemon by its parent, another exec's memfds (its bwrap options, its
seccomp program, its stdin text) while it runs, and a daemon started with
no standard input.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from tests.conftest import Daemon
from tests.security.helpers import create_sandbox, run

SECRET = "leaked-descriptor-secret-7f3a"
# `ls /proc/self/fd` in the sandbox: 0-2 and the folder ls reads.
STANDARD = "0\n1\n2\n3\n"


def _init_fds(stdout: str) -> list[str]:
    own, _, init = stdout.partition(STANDARD)
    assert own == "", stdout
    return init.split()


async def test_a_descriptor_leaked_to_the_daemon_does_not_reach_a_sandbox(
    daemon_factory: Daemon, short_tmp: Path
) -> None:
    secret_file = short_tmp / "secret"
    secret_file.write_text(SECRET)
    leaked = os.open(secret_file, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        daemon_factory.start(pass_fds=[leaked])
    finally:
        os.close(leaked)
    held = os.listdir(f"/proc/{daemon_factory.proc.pid}/fd")  # type: ignore[union-attr]
    assert str(leaked) in held  # the daemon really holds it
    async with daemon_factory.session() as http:
        sandbox = await create_sandbox(http)
        result = await run(
            http,
            sandbox["id"],
            f"ls /proc/self/fd; ls /proc/1/fd; cat /proc/self/fd/{leaked} /proc/1/fd/{leaked}",
        )
    assert SECRET not in result["output"]
    assert _init_fds(result["stdout"]) in (["0", "1", "2", "4"], ["0", "1", "2"])


async def test_concurrent_execs_do_not_see_each_others_descriptors(
    daemon: Daemon,
) -> None:
    async with daemon.session() as http:
        first = await create_sandbox(http)
        second = await create_sandbox(http)
        # While this one runs, the daemon holds its memfds: options, seccomp
        # program and the stdin text.
        holder = asyncio.ensure_future(
            http.post(
                f"/v1/sandboxes/{first['id']}/exec",
                json={"command": "sleep 3; cat", "stdin": SECRET},
            )
        )
        await _until_daemon_holds(daemon, "sandboxd-stdin")
        results = await asyncio.gather(
            *(
                run(http, second["id"], "ls /proc/self/fd; ls /proc/1/fd; cat /proc/1/fd/*")
                for _ in range(4)
            )
        )
        answer = await holder
        held = await answer.json()
    assert held["stdout"] == SECRET
    for result in results:
        assert SECRET not in result["output"]
        assert _init_fds(result["stdout"].split("\n\n")[0] + "\n") in (
            ["0", "1", "2", "4"],
            ["0", "1", "2"],
        ), result


async def _until_daemon_holds(daemon: Daemon, memfd_name: str) -> None:
    pid = daemon.proc.pid  # type: ignore[union-attr]
    for _ in range(500):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if memfd_name in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    return
            except OSError:
                continue
        await asyncio.sleep(0.01)
    raise AssertionError(f"the daemon never held {memfd_name}")


async def test_a_daemon_started_without_stdin_still_feeds_stdin_and_output(
    daemon_factory: Daemon,
) -> None:
    daemon_factory.start(close_stdin=True)
    async with daemon_factory.session() as http:
        sandbox = await create_sandbox(http)
        r = await http.post(
            f"/v1/sandboxes/{sandbox['id']}/exec",
            json={"command": "cat; echo err >&2; ls /proc/self/fd", "stdin": "in\n"},
        )
        body: dict[str, Any] = await r.json()
    assert r.status == 200, body
    assert body["stdout"] == "in\n" + STANDARD, body
    assert body["stderr"] == "err\n", body


async def test_signals_start_at_their_defaults(daemon: Daemon) -> None:
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal survives exec, so
    # without a reset `yes | head` would never see SIGPIPE. (glibc's
    # posix_spawn leaves its own two internal real-time signals, 32 and 33,
    # ignored: glibc programs re-arm them when they need them; the standard
    # signals 1-31 are what programs rely on.)
    async with daemon.session() as http:
        sandbox = await create_sandbox(http)
        result = await run(
            http,
            sandbox["id"],
            "grep -E '^Sig(Ign|Blk)' /proc/self/status; yes | head -c 4; "
            "sh -c 'kill -PIPE $$'; echo $?",
        )
    assert result["exit_code"] == 0, result
    lines = result["stdout"].splitlines()
    assert lines[0].split() == ["SigBlk:", "0000000000000000"], result
    ignored = int(lines[1].split()[1], 16)
    assert ignored & 0x7FFFFFFF == 0, f"standard signals ignored: {ignored:#x}"
    assert lines[2:4] == ["y", "y"], result
    assert lines[4] == str(128 + signal.SIGPIPE), result
