"""`sandboxd mcp`: the daemon's sandboxes as MCP tools, over stdio.

Built on the official MCP Python SDK (the optional extra ``sandboxd[mcp]``;
the CLI imports this module only for the ``mcp`` command). Every tool is a
call of the Python client, so the MCP server holds no state of its own and
the daemon stays the one place that enforces anything.

Two choices for agents:
- ``upload_folder`` reads host folders, so it is limited to the folders
  given with ``--root`` (by default the folder the server started in,
  unless that is / or the home folder): a model told by a web page to
  "upload ~/.ssh" gets a refusal.
- Command output streams while it runs as progress notifications (to a
  client that asks for progress); the result keeps at most the last
  ``MAX_OUTPUT_CHARS`` characters, so a noisy build does not flood the
  model's context.
"""

import base64
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from sandboxd import __version__
from sandboxd.client import AsyncClient, ClientError, DaemonError, NotRunning
from sandboxd.models import ArchiveUploaded, ExecResult, FileList, FileUploaded
from sandboxd.models import Sandbox as SandboxInfo

MAX_OUTPUT_CHARS = 100_000
MAX_READ_BYTES = 1024 * 1024

T = TypeVar("T")

SandboxId = Annotated[str, Field(description="the id create_sandbox returned (sb-...)")]
Timeout = Annotated[
    float | None, Field(description="seconds before it is killed (default 60, at most 600)")
]


class TestCounts(BaseModel):
    runner: str
    exit_code: int | None
    passed: int
    failed: int
    skipped: int
    errors: int
    no_tests: bool
    summary: str | None


class CommandOutcome(BaseModel):
    exit_code: int | None = Field(description="null when it was killed by the timeout")
    timed_out: bool
    output: str = Field(description="stdout and stderr interleaved, as a terminal shows them")
    truncated: bool = Field(description="only the end of the output is here")
    duration_ms: float
    command_exit_code: int | None = Field(
        None, description="in run_tests: the exit code of the command run before the tests"
    )
    tests: TestCounts | None = None


class FileContent(BaseModel):
    path: str
    size: int
    encoding: Literal["utf-8", "base64"]
    content: str
    truncated: bool = Field(description="the file is larger; only its start is here")


class FolderUploaded(ArchiveUploaded):
    skipped: list[str] = Field(description="symlinks and special files, which are never uploaded")


def _outcome(result: ExecResult) -> CommandOutcome:
    output, truncated = result.output, result.truncated
    if len(output) > MAX_OUTPUT_CHARS:
        cut = len(output) - MAX_OUTPUT_CHARS
        output = f"[... the first {cut} characters are left out ...]\n" + output[cut:]
        truncated = True
    tests = None
    if result.tests is not None:
        tests = TestCounts.model_validate(result.tests.model_dump())
    return CommandOutcome(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        output=output,
        truncated=truncated,
        duration_ms=result.duration_ms,
        command_exit_code=result.command.exit_code if result.command else None,
        tests=tests,
    )


def allowed_folder(folder: str, roots: list[Path]) -> Path:
    """``folder`` as a path, if it is a folder and (symlinks resolved) one of ``roots``
    or inside one; otherwise a ToolError that says why."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ToolError(f"{folder} is not a folder on this machine")
    if not roots:
        raise ToolError(
            "this server may read no folder (it was started in / or the home folder): "
            "start it as `sandboxd mcp --root DIR` to let upload_folder read DIR"
        )
    real = Path(os.path.realpath(path))
    if not any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        raise ToolError(
            f"{folder} is outside the folders this server may read "
            f"({', '.join(str(r) for r in roots)}); start `sandboxd mcp --root DIR` to allow it"
        )
    return path


def build(socket_path: Path, roots: list[Path]) -> MCPServer[None]:
    client = AsyncClient(socket_path)

    @asynccontextmanager
    async def lifespan(server: MCPServer[None]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    server: MCPServer[None] = MCPServer(
        "sandboxd",
        version=__version__,
        instructions=(
            "Run untrusted code in throw-away bubblewrap sandboxes (no network unless asked). "
            "create_sandbox, then write_file or upload_folder, then run_command or run_tests; "
            "read_file and list_files to look at results; delete_sandbox when done."
        ),
        lifespan=lifespan,
        log_level="WARNING",  # a failed tool is the model's to read, not the log's
    )

    async def call(step: Awaitable[T]) -> T:
        """Await a client call; its errors become tool errors the model can read."""
        try:
            return await step
        except NotRunning:
            raise ToolError(
                f"sandboxd is not running (no daemon on {socket_path}); "
                "the user can start it with `sandboxd start`."
            ) from None
        except DaemonError as exc:
            raise ToolError(f"{exc.detail} ({exc.code})") from None
        except ClientError as exc:
            raise ToolError(str(exc)) from None

    async def run(
        ctx: Context,
        sandbox_id: str,
        command: str,
        test: bool,
        **options: object,
    ) -> CommandOutcome:
        # MCP wants progress to grow with every notification: count them.
        count = 0

        async def report(message: str) -> None:
            nonlocal count
            count += 1
            await ctx.report_progress(count, message=message)

        async def on_output(stream: str, text: str) -> None:
            await report(text)

        async def on_phase(runner: str) -> None:
            await report(f"[sandboxd: running the tests ({runner})]\n")

        result = await call(
            client.exec(
                sandbox_id,
                command,
                test,
                on_output=on_output,
                on_phase=on_phase,
                **options,  # type: ignore[arg-type]
            )
        )
        return _outcome(result)

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def create_sandbox(
        language: Annotated[
            Literal["python", "node", "go"], Field(description="its toolchain and test runner")
        ] = "python",
        network: Annotated[bool, Field(description="let its commands reach the network")] = False,
        labels: Annotated[
            dict[str, str] | None, Field(description="labels to find it by later")
        ] = None,
    ) -> SandboxInfo:
        """Create a sandbox: an empty workspace folder where commands run isolated.

        Returns its id, which every other tool takes."""
        return await call(
            client.create(language, labels={"client": "mcp", **(labels or {})}, network=network)
        )

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def write_file(
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="where in the workspace, e.g. src/app.py")],
        content: Annotated[str, Field(description="the file's text (or base64 with is_base64)")],
        is_base64: Annotated[bool, Field(description="content is base64-encoded bytes")] = False,
    ) -> FileUploaded:
        """Write one file into the sandbox's workspace (folders are made as needed)."""
        try:
            data = base64.b64decode(content, validate=True) if is_base64 else content.encode()
        except ValueError:
            raise ToolError("content is not valid base64") from None
        return await call(client.put_file(sandbox_id, data, path.strip("/")))

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def upload_folder(
        sandbox_id: SandboxId,
        folder: Annotated[
            str, Field(description="a folder on this machine, e.g. the project being worked on")
        ],
    ) -> FolderUploaded:
        """Copy a local folder's contents into the workspace root (proj/tests/x.py lands at
        tests/x.py). Symlinks are skipped. Only folders under the server's roots may be read."""
        path = allowed_folder(folder, roots)
        skipped: list[str] = []
        done = await call(
            client.upload_dir(
                sandbox_id, path, on_zipped=lambda stats, size: skipped.extend(stats.skipped)
            )
        )
        return FolderUploaded(**done.model_dump(), skipped=skipped)

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def run_command(
        ctx: Context,
        sandbox_id: SandboxId,
        command: Annotated[str, Field(description="a shell command, run with sh -c")],
        timeout: Timeout = None,
        cwd: Annotated[str | None, Field(description="a folder in the workspace")] = None,
        env: Annotated[dict[str, str] | None, Field(description="variables to set")] = None,
        stdin: Annotated[str | None, Field(description="text fed to its standard input")] = None,
    ) -> CommandOutcome:
        """Run a shell command in the sandbox's workspace and return its exit code and output.

        A failing command is a result (look at exit_code), not an error."""
        return await run(
            ctx, sandbox_id, command, False, timeout=timeout, cwd=cwd, env=env, stdin=stdin
        )

    @server.tool(annotations=ToolAnnotations(open_world_hint=False))
    async def run_tests(
        ctx: Context,
        sandbox_id: SandboxId,
        command: Annotated[
            str,
            Field(description="run first, e.g. to install dependencies or start a server"),
        ] = "true",
        timeout: Timeout = None,
    ) -> CommandOutcome:
        """Run the language's test suite in the workspace: pytest on tests/ (python), jest
        (node) or go test ./... (go). Returns the runner's exit code, the counts of passed,
        failed and skipped tests, and the output."""
        return await run(ctx, sandbox_id, command, True, timeout=timeout)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def read_file(
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="a file in the workspace, e.g. out/report.txt")],
    ) -> FileContent:
        """Read one file of the workspace: its text, or base64 if it is not UTF-8."""
        data = await call(client.read_file(sandbox_id, path))
        size, truncated = len(data), len(data) > MAX_READ_BYTES
        data = data[:MAX_READ_BYTES]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if truncated and exc.start >= len(data) - 3:  # cut inside a character
                text = data[: exc.start].decode("utf-8")
            else:
                return FileContent(
                    path=path,
                    size=size,
                    encoding="base64",
                    content=base64.b64encode(data).decode("ascii"),
                    truncated=truncated,
                )
        return FileContent(
            path=path, size=size, encoding="utf-8", content=text, truncated=truncated
        )

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def list_files(
        sandbox_id: SandboxId,
        path: Annotated[str, Field(description="a folder in the workspace; '' for its root")] = "",
        recursive: Annotated[bool, Field(description="list subfolders too")] = False,
    ) -> FileList:
        """List the files and folders of the workspace (path, type, size, mtime)."""
        return await call(client.list_files(sandbox_id, path, recursive))

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False))
    async def delete_sandbox(sandbox_id: SandboxId) -> str:
        """Delete the sandbox: its running commands are killed and its files are gone."""
        await call(client.delete(sandbox_id))
        return f"deleted {sandbox_id}"

    return server


def serve(socket_path: Path, roots: list[Path]) -> None:
    """Serve on stdin and stdout until the client closes them."""
    build(socket_path, roots).run("stdio")
