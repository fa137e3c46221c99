"""A command that prints without end gets a bounded answer: the end of its output."""

from __future__ import annotations

from typing import Any

from sandboxd.config import MiB
from tests.security.conftest import ClientFactory
from tests.security.helpers import create_sandbox, run


async def test_stdout_bomb_keeps_the_last_mebibyte(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "yes | head -c 20000000; echo END")
    assert result["exit_code"] == 0
    assert result["timed_out"] is False
    assert result["truncated"] is True
    stdout = result["stdout"]
    assert len(stdout) == 1 * MiB
    # The end is kept: 20 MB of "y\n", then END.
    assert stdout == "y\n" * ((MiB - 4) // 2) + "END\n"
    assert result["stderr"] == ""
    # The interleaved view is bounded too, and is the same tail.
    assert len(result["output"]) <= 2 * MiB
    assert result["output"].endswith(stdout)


async def test_small_cap_keeps_exactly_the_end(make_client: ClientFactory) -> None:
    cap = 4096
    client = await make_client(output_bytes=cap)
    sandbox = await create_sandbox(client)
    result = await run(
        client, sandbox["id"], "yes | head -c 20000000; seq 1 100000 | tail -n 3; printf LAST"
    )
    assert result["exit_code"] == 0
    assert result["truncated"] is True
    tail = "99998\n99999\n100000\nLAST"
    assert len(result["stdout"]) == cap
    assert result["stdout"] == ("y\n" * cap)[-(cap - len(tail)) :] + tail
    assert len(result["output"]) == 2 * cap
    assert result["output"].endswith(result["stdout"])


async def test_stderr_bomb_is_capped_separately(make_client: ClientFactory) -> None:
    cap = 8192
    client = await make_client(output_bytes=cap)
    sandbox = await create_sandbox(client)
    result = await run(
        client, sandbox["id"], "yes e | head -c 5000000 >&2; echo err-end >&2; echo out"
    )
    assert result["exit_code"] == 0
    assert result["truncated"] is True
    assert result["stdout"] == "out\n"
    assert len(result["stderr"]) == cap
    assert result["stderr"].endswith("e\ne\nerr-end\n")


async def test_unbroken_line_bomb_is_capped(make_client: ClientFactory) -> None:
    # One endless line, no newline at all: the cap is on bytes, not on lines.
    cap = 65536
    client = await make_client(output_bytes=cap)
    sandbox = await create_sandbox(client)
    result = await run(client, sandbox["id"], "head -c 30000000 /dev/zero | tr '\\0' x; printf Z")
    assert result["exit_code"] == 0
    assert result["truncated"] is True
    assert result["stdout"] == "x" * (cap - 1) + "Z"


async def test_output_under_the_cap_is_not_truncated(make_client: ClientFactory) -> None:
    cap = 4096
    client = await make_client(output_bytes=cap)
    sandbox = await create_sandbox(client)
    result = await run(client, sandbox["id"], f"head -c {cap} /dev/zero | tr '\\0' a")
    assert result["truncated"] is False
    assert result["stdout"] == "a" * cap
