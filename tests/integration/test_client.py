"""The Python client against a real daemon: sync and async, handles, streaming, errors."""

from __future__ import annotations

import asyncio
import io
import zipfile
from pathlib import Path

import pytest

from sandboxd.client import (
    AsyncClient,
    AsyncSandbox,
    Client,
    NotRunning,
    Sandbox,
    SandboxDeleted,
    SandboxNotFound,
    UnsafePath,
    ValidationFailed,
)
from sandboxd.models import ExecResult, FileList
from sandboxd.models import Sandbox as SandboxInfo
from tests.conftest import Daemon

# Waits until the test creates /workspace/go: output that arrives before that
# can only have been streamed while the command ran.
WAIT_FOR_GO = "echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished"


def make_project(root: Path) -> Path:
    proj = root / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n"
        "def test_add():\n"
        "    open('report.txt', 'w').write('add works')\n"
        "    assert add(2, 3) == 5\n"
    )
    (proj / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (proj / "data").mkdir()
    (root / "secret.txt").write_text("host secret")
    (proj / "secret.txt").symlink_to(root / "secret.txt")
    return proj


def test_the_context_manager_creates_and_deletes(daemon: Daemon):
    client = Client(daemon.socket_path)
    with Sandbox.create("python", labels={"who": "test"}, socket=daemon.socket_path) as sb:
        assert isinstance(sb.info, SandboxInfo)
        assert sb.id in {s.id for s in client.list()}
        assert client.get(sb.id).labels == {"who": "test"}
    with pytest.raises(SandboxNotFound):
        client.get(sb.id)


def test_the_context_manager_deletes_when_the_body_fails(daemon: Daemon):
    with (
        pytest.raises(ZeroDivisionError),
        Sandbox.create(socket=daemon.socket_path) as sb,
    ):
        1 / 0  # noqa: B018
    with pytest.raises(SandboxNotFound):
        Sandbox.attach(sb.id, socket=daemon.socket_path)


def test_upload_dir_then_tests_then_the_file_they_wrote(daemon: Daemon, short_tmp: Path):
    proj = make_project(short_tmp)
    with Sandbox.create("python", socket=daemon.socket_path) as sb:
        done = sb.upload_dir(proj)
        assert done.files == 2
        listing = sb.list_files(recursive=True)
        assert isinstance(listing, FileList)
        paths = {e.path for e in listing.entries}
        # From inside the folder: no proj/ level; the symlink stayed behind.
        assert {"calc.py", "tests", "tests/test_calc.py", "data"} <= paths
        assert "secret.txt" not in paths
        assert not any(p.startswith("proj") for p in paths)
        result = sb.exec("pytest", test=True)
        assert isinstance(result, ExecResult)
        assert result.exit_code == 0
        assert result.tests is not None and result.tests.passed == 1
        assert sb.read_file("report.txt") == b"add works"


def test_streaming_calls_back_while_the_command_runs(daemon: Daemon):
    seen: list[tuple[str, str]] = []
    with Sandbox.create(socket=daemon.socket_path) as sb:
        workspace = Path(sb.info.workspace)

        def on_output(stream: str, text: str) -> None:
            seen.append((stream, text))
            if "started" in text:
                # Only a callback made during the run can let the command finish.
                (workspace / "go").touch()

        result = sb.exec(WAIT_FOR_GO, on_output=on_output, timeout=60)
    assert not result.timed_out
    assert result.exit_code == 0
    assert "".join(t for s, t in seen if s == "stdout") == "started\nfinished\n"
    assert result.stdout == "started\nfinished\n"


def test_streaming_keeps_the_streams_apart_and_reports_the_test_phase(daemon: Daemon):
    seen: list[tuple[str, str]] = []
    phases: list[str] = []
    with Sandbox.create(socket=daemon.socket_path) as sb:
        sb.put_file(b"def test_a():\n    print('in test')\n", "tests/test_a.py")
        result = sb.exec(
            "echo out; echo err >&2",
            test=True,
            on_output=lambda stream, text: seen.append((stream, text)),
            on_phase=lambda runner: (phases.append(runner), seen.append(("phase", runner))),
        )
    assert phases == ["pytest"]
    before = seen[: seen.index(("phase", "pytest"))]
    assert ("stdout", "out\n") in before and ("stderr", "err\n") in before
    after = "".join(t for s, t in seen[seen.index(("phase", "pytest")) + 1 :])
    assert "1 passed" in after
    assert result.tests is not None and result.tests.passed == 1
    assert result.command is not None and result.command.stdout == "out\n"


def test_exec_options_reach_the_command(daemon: Daemon):
    with Sandbox.create(socket=daemon.socket_path) as sb:
        sb.put_file(b"", "sub/keep")
        result = sb.exec(
            'echo "$GREETING from $(pwd)"; cat',
            env={"GREETING": "hello"},
            cwd="sub",
            stdin="fed in\n",
        )
        assert result.stdout == "hello from /workspace/sub\nfed in\n"
        slow = sb.exec("sleep 30", timeout=1)
        assert slow.timed_out and slow.exit_code is None
        argv = sb.exec(["printf", "%s|", "a b", "it's"])
        assert argv.stdout == "a b|it's|"
        failing = sb.exec("exit 3")
        assert failing.exit_code == 3  # a failing command is a result, not an exception


def test_files_in_and_out(daemon: Daemon, short_tmp: Path):
    local = short_tmp / "local.bin"
    payload = bytes(range(256)) * 1000
    local.write_bytes(payload)
    with Sandbox.create(socket=daemon.socket_path) as sb:
        first = sb.put_file(local, path="bin")
        assert (first.filename, first.path, first.size) == ("local.bin", "bin/local.bin", 256000)
        second = sb.put_file(b"x = 1\n", "pkg/mod.py", path="src")
        assert second.path == "src/pkg/mod.py"
        assert sb.read_file("bin/local.bin") == payload
        assert [e.path for e in sb.list_files("src/pkg").entries] == ["src/pkg/mod.py"]
        archive = sb.download_archive(short_tmp / "ws.zip")
        with zipfile.ZipFile(archive) as zf:
            assert zf.read("src/pkg/mod.py") == b"x = 1\n"
        zipped = io.BytesIO()
        with zipfile.ZipFile(zipped, "w") as zf:
            zf.writestr("from_zip.txt", "zipped")
        assert sb.upload_zip(zipped.getvalue()).files == 1
        assert sb.read_file("from_zip.txt") == b"zipped"
        sb.delete_file("from_zip.txt")
        with pytest.raises(Exception, match="file_not_found"):
            sb.read_file("from_zip.txt")


def test_problems_raise_the_class_of_their_code(daemon: Daemon, short_tmp: Path):
    client = Client(daemon.socket_path)
    with pytest.raises(SandboxNotFound) as caught:
        client.get("sb-nope")
    assert caught.value.status == 404
    with pytest.raises(ValidationFailed) as invalid:
        client.create("java")
    assert invalid.value.errors[0]["field"] == "language"
    with Sandbox.create(socket=daemon.socket_path) as sb, pytest.raises(UnsafePath):
        sb.put_file(b"x", "..")
    with pytest.raises(NotRunning):
        Client(short_tmp / "nobody.sock").list()


def test_attach_and_delete_twice(daemon: Daemon):
    made = Sandbox.create(socket=daemon.socket_path)
    again = Sandbox.attach(made.id, socket=daemon.socket_path)
    assert again.info.id == made.id
    again.delete()
    made.delete()  # already gone: not an error
    with pytest.raises(SandboxNotFound):
        made.refresh()


async def test_the_async_client_and_handle(daemon: Daemon, short_tmp: Path):
    proj = make_project(short_tmp)
    async with AsyncClient(daemon.socket_path) as client:
        async with await AsyncSandbox.create("python", client=client) as sb:
            await sb.upload_dir(proj)
            chunks: list[str] = []

            async def on_output(stream: str, text: str) -> None:
                chunks.append(text)

            results = await asyncio.gather(
                sb.exec("echo one"), sb.exec("echo two"), sb.exec("true", True, on_output=on_output)
            )
            assert [r.stdout for r in results[:2]] == ["one\n", "two\n"]
            assert results[2].tests is not None and results[2].tests.passed == 1
            assert "1 passed" in "".join(chunks)
            assert await sb.read_file("report.txt") == b"add works"
        with pytest.raises(SandboxNotFound):
            await client.get(sb.id)
        assert sb.id not in {s.id for s in await client.list()}


async def test_a_sandbox_deleted_mid_stream_raises_sandbox_deleted(daemon: Daemon):
    async with AsyncClient(daemon.socket_path) as client, AsyncClient(daemon.socket_path) as other:
        info = await client.create()
        started = asyncio.Event()

        async def on_output(stream: str, text: str) -> None:
            if "started" in text:
                started.set()

        run = asyncio.ensure_future(
            client.exec(info.id, "echo started; sleep 60", on_output=on_output)
        )
        await asyncio.wait({run, asyncio.ensure_future(started.wait())}, timeout=60,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        await other.delete(info.id)
        with pytest.raises(SandboxDeleted):
            await run
