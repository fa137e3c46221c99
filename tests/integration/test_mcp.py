"""`sandboxd mcp` driven by the MCP SDK's own client over stdio, against a real daemon."""

from __future__ import annotations

import base64
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import Daemon

TOOLS = {
    "create_sandbox",
    "write_file",
    "upload_folder",
    "run_command",
    "run_tests",
    "read_file",
    "list_files",
    "delete_sandbox",
}
WAIT_FOR_GO = "echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished"


@asynccontextmanager
async def mcp_session(socket: Path, cwd: Path, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandboxd", "--socket", str(socket), "mcp", *args],
        cwd=str(cwd),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def error_of(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    return " ".join(getattr(block, "text", "") for block in result.content)


def make_project(root: Path) -> Path:
    proj = root / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "tests" / "test_calc.py").write_text(
        "def test_add():\n"
        "    open('report.txt', 'w').write('written by the tests')\n"
        "    assert 2 + 3 == 5\n"
    )
    return proj


async def test_the_tools_are_listed_with_descriptions(daemon: Daemon, short_tmp: Path):
    async with mcp_session(daemon.socket_path, short_tmp) as session:
        tools = (await session.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.description, tool.name
        assert tool.input_schema["type"] == "object"
    by_name = {t.name: t for t in tools}
    assert by_name["read_file"].annotations.read_only_hint is True
    assert by_name["delete_sandbox"].annotations.destructive_hint is True
    assert "sandbox_id" in by_name["run_command"].input_schema["required"]


async def test_create_upload_test_read_and_delete(daemon: Daemon, short_tmp: Path):
    make_project(short_tmp)
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with mcp_session(daemon.socket_path, short_tmp) as session:
        made = await call(session, "create_sandbox", language="python")
        sandbox_id = made["id"]
        assert made["labels"] == {"client": "mcp"}
        uploaded = await call(session, "upload_folder", sandbox_id=sandbox_id, folder="proj")
        assert uploaded["files"] == 1
        result = await session.call_tool(
            "run_tests", {"sandbox_id": sandbox_id}, progress_callback=on_progress
        )
        assert not result.is_error
        tests = result.structured_content
        assert tests["exit_code"] == 0 and tests["tests"]["passed"] == 1
        assert "1 passed" in tests["output"]
        assert "[sandboxd: running the tests (pytest)]\n" in progress
        assert "1 passed" in "".join(progress)
        report = await call(session, "read_file", sandbox_id=sandbox_id, path="report.txt")
        assert report == {
            "path": "report.txt",
            "size": 20,
            "encoding": "utf-8",
            "content": "written by the tests",
            "truncated": False,
        }
        listing = await call(session, "list_files", sandbox_id=sandbox_id, recursive=True)
        assert "tests/test_calc.py" in {e["path"] for e in listing["entries"]}
        deleted = await session.call_tool("delete_sandbox", {"sandbox_id": sandbox_id})
        assert not deleted.is_error
        gone = await error_of(session, "read_file", sandbox_id=sandbox_id, path="report.txt")
        assert "sandbox_not_found" in gone


async def test_run_command_streams_progress_while_it_runs(daemon: Daemon, short_tmp: Path):
    async with mcp_session(daemon.socket_path, short_tmp) as session:
        made = await call(session, "create_sandbox")
        workspace = Path(made["workspace"])
        messages: list[str] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")
            if "started" in (message or ""):
                # Only a notification sent during the run can let the command finish.
                (workspace / "go").touch()

        result = await session.call_tool(
            "run_command",
            {"sandbox_id": made["id"], "command": WAIT_FOR_GO, "timeout": 60},
            progress_callback=on_progress,
        )
        outcome = result.structured_content
        assert outcome["exit_code"] == 0 and outcome["timed_out"] is False
        assert outcome["output"] == "started\nfinished\n"
        assert "".join(messages) == "started\nfinished\n"


async def test_commands_files_and_failures(daemon: Daemon, short_tmp: Path):
    async with mcp_session(daemon.socket_path, short_tmp) as session:
        sandbox_id = (await call(session, "create_sandbox"))["id"]
        written = await call(
            session, "write_file", sandbox_id=sandbox_id, path="src/app.py", content="print(6*7)\n"
        )
        assert written["path"] == "src/app.py"
        # Across stdout and stderr, `output` is in the order the daemon read
        # them: the pause keeps that order certain on a loaded machine.
        ran = await call(
            session,
            "run_command",
            sandbox_id=sandbox_id,
            command='python3 app.py; echo "$X" >&2; sleep 0.2; cat; exit 3',
            cwd="src",
            env={"X": "set"},
            stdin="fed\n",
        )
        assert ran["exit_code"] == 3  # a failing command is a result, not a tool error
        assert ran["output"] == "42\nset\nfed\n"
        raw = bytes([0, 255, 1, 254])
        await call(
            session,
            "write_file",
            sandbox_id=sandbox_id,
            path="blob.bin",
            content=base64.b64encode(raw).decode(),
            is_base64=True,
        )
        blob = await call(session, "read_file", sandbox_id=sandbox_id, path="blob.bin")
        assert blob["encoding"] == "base64" and base64.b64decode(blob["content"]) == raw
        slow = await call(session, "run_command", sandbox_id=sandbox_id, command="sleep 30",
                          timeout=1)  # fmt: skip
        assert slow["timed_out"] is True and slow["exit_code"] is None
        unsafe = await error_of(session, "write_file", sandbox_id=sandbox_id, path="../x",
                                content="x")  # fmt: skip
        assert "unsafe_path" in unsafe
        bad = await error_of(session, "create_sandbox", language="java")
        assert "language" in bad


async def test_long_output_and_large_files_are_cut_to_size(daemon: Daemon, short_tmp: Path):
    async with mcp_session(daemon.socket_path, short_tmp) as session:
        sandbox_id = (await call(session, "create_sandbox"))["id"]
        noisy = await call(
            session,
            "run_command",
            sandbox_id=sandbox_id,
            command="python3 -c \"print('x' * 150000 + 'END')\"",
        )
        assert noisy["truncated"] is True and noisy["exit_code"] == 0
        assert noisy["output"].startswith("[... the first ")
        assert noisy["output"].endswith("xEND\n")
        assert len(noisy["output"]) < 100_100
        await call(
            session,
            "run_command",
            sandbox_id=sandbox_id,
            command="python3 -c \"open('big.txt', 'w').write('y' * 1500000)\"",
        )
        big = await call(session, "read_file", sandbox_id=sandbox_id, path="big.txt")
        assert big["truncated"] is True and big["size"] == 1_500_000
        assert big["content"] == "y" * (1024 * 1024)


async def test_upload_folder_reads_only_under_its_roots(daemon: Daemon, short_tmp: Path):
    work = short_tmp / "work"
    work.mkdir()
    make_project(work)
    outside = short_tmp / "private"
    outside.mkdir()
    (outside / "key").write_text("secret")
    (work / "sneaky").symlink_to(outside)
    async with mcp_session(daemon.socket_path, work) as session:
        sandbox_id = (await call(session, "create_sandbox"))["id"]
        refused = await error_of(session, "upload_folder", sandbox_id=sandbox_id,
                                 folder=str(outside))  # fmt: skip
        assert "outside the folders this server may read" in refused
        via_link = await error_of(session, "upload_folder", sandbox_id=sandbox_id,
                                  folder="sneaky")  # fmt: skip
        assert "outside" in via_link
        inside = await call(session, "upload_folder", sandbox_id=sandbox_id,
                            folder=str(work / "proj"))  # fmt: skip
        assert inside["files"] == 1
        listing = await call(session, "list_files", sandbox_id=sandbox_id)
        assert "key" not in {e["path"] for e in listing["entries"]}
    async with mcp_session(daemon.socket_path, work, "--root", str(outside)) as session:
        sandbox_id = (await call(session, "create_sandbox"))["id"]
        allowed = await call(session, "upload_folder", sandbox_id=sandbox_id, folder=str(outside))
        assert allowed["files"] == 1


async def test_started_in_the_root_folder_it_reads_no_folder(daemon: Daemon, short_tmp: Path):
    make_project(short_tmp)
    async with mcp_session(daemon.socket_path, Path("/")) as session:
        sandbox_id = (await call(session, "create_sandbox"))["id"]
        refused = await error_of(session, "upload_folder", sandbox_id=sandbox_id,
                                 folder=str(short_tmp / "proj"))  # fmt: skip
    assert "may read no folder" in refused and "--root" in refused


async def test_a_daemon_that_is_not_running_is_a_readable_tool_error(short_tmp: Path):
    async with mcp_session(short_tmp / "none.sock", short_tmp) as session:
        message = await error_of(session, "create_sandbox")
    assert "sandboxd is not running" in message and "sandboxd start" in message
