"""The client commands of the CLI: thin click wrappers over sandboxd.client.

Each opens an AsyncClient on the socket the global options name, calls it,
and prints the answer for people or, with ``--json``, for scripts. Exit
status: 0, 1 for a refusal from the daemon (the problem goes to stderr, or
to stdout as JSON with ``--json``), 3 when no daemon runs; ``exec`` exits
with the command's own status (the runner's in test mode), 124 on time-out.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.shell_completion import CompletionItem
from pydantic import BaseModel

from sandboxd.client import AsyncClient, ClientError, DaemonError, NotRunning, find_socket
from sandboxd.config import ConfigError, load_settings
from sandboxd.models import ALLOWED_LANGUAGES, ExecResult
from sandboxd.zipdir import ZipStats, wrapping_folder

T = TypeVar("T")

# Uploads at least this big get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 4 * 1024 * 1024
EXIT_NOT_RUNNING = 3
EXIT_TIMED_OUT = 124  # as timeout(1)
EXIT_INTERRUPTED = 130


def _socket(ctx: click.Context) -> Path:
    obj = ctx.find_root().obj or {}
    try:
        return load_settings(
            obj.get("config"), socket_path=obj.get("socket"), data_dir=obj.get("data_dir")
        ).socket_path
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


def _run(ctx: click.Context, call: Callable[[AsyncClient], Awaitable[T]], as_json: bool) -> T:
    """Run one client call; turn its errors into messages and exit statuses."""
    socket = _socket(ctx)

    async def go() -> T:
        async with AsyncClient(socket) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except NotRunning as exc:
        click.echo(f"{exc} Start it with: sandboxd start", err=True)
        ctx.exit(EXIT_NOT_RUNNING)
    except DaemonError as exc:
        if as_json:
            click.echo(json.dumps(exc.body or {"code": exc.code, "detail": exc.detail}, indent=2))
        _fail(ctx, f"{exc.detail} ({exc.code})", 1)
    except ClientError as exc:
        _fail(ctx, str(exc), 1)


def _fail(ctx: click.Context, message: str, status: int) -> NoReturn:
    click.echo(f"sandboxd: {message}", err=True)
    ctx.exit(status)


def _print_json(value: BaseModel | dict[str, Any]) -> None:
    if isinstance(value, BaseModel):
        click.echo(value.model_dump_json(indent=2))
    else:
        click.echo(json.dumps(value, indent=2))


def _pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE")
        out[key] = value
    return out


def complete_sandbox_id(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Shell completion: the ids of the sandboxes the daemon has."""
    root = ctx.find_root().params
    try:
        socket = root.get("socket") or find_socket()
        config = root.get("config")
        if not root.get("socket") and config:
            socket = load_settings(config).socket_path

        async def ids() -> list[CompletionItem]:
            async with AsyncClient(socket, timeout=3) as client:
                return [
                    CompletionItem(sb.id, help=f"{sb.language.value} {_labels(sb.labels)}".strip())
                    for sb in await client.list()
                    if sb.id.startswith(incomplete)
                ]

        return asyncio.run(ids())
    except Exception:
        return []  # completion must never print a traceback into the shell


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
_id_argument = click.argument("sandbox_id", metavar="ID", shell_complete=complete_sandbox_id)


@click.command()
@click.option(
    "--language",
    "-l",
    type=click.Choice(ALLOWED_LANGUAGES),
    default="python",
    show_default=True,
    help="The sandbox's toolchain and test runner.",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_pairs,
    help="A label to find it by (repeatable).",
)
@click.option("--network", is_flag=True, help="Give its commands outbound network access.")
@_json_option
@click.pass_context
def create(
    ctx: click.Context, language: str, labels: dict[str, str], network: bool, as_json: bool
) -> None:
    """Create a sandbox and print its id."""
    info = _run(ctx, lambda c: c.create(language, labels=labels, network=network), as_json)
    if as_json:
        _print_json(info)
    else:
        click.echo(info.id)


@click.command("ls")
@_json_option
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List the sandboxes."""
    sandboxes = _run(ctx, lambda c: c.list(), as_json)
    if as_json:
        _print_json({"sandboxes": [sb.model_dump(mode="json") for sb in sandboxes]})
        return
    if not sandboxes:
        return
    rows = [("ID", "LANGUAGE", "STATUS", "CREATED", "LABELS")] + [
        (sb.id, sb.language.value, sb.status.value, _when(sb.created_at), _labels(sb.labels))
        for sb in sandboxes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[4]]).rstrip())


@click.command()
@_id_argument
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--path", "folder", metavar="DIR", help="The folder in the workspace [default: root]."
)
@_json_option
@click.pass_context
def put(ctx: click.Context, sandbox_id: str, file: Path, folder: str | None, as_json: bool) -> None:
    """Put one local FILE in the workspace, under its own name."""
    done = _run(ctx, lambda c: c.put_file(sandbox_id, file, path=folder), as_json)
    if as_json:
        _print_json(done)
    else:
        click.echo(f"{done.path} ({done.size} bytes)")


class _Progress:
    """A click progress bar on stderr for uploads of PROGRESS_BYTES or more, on a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None

    def start(self, total: int) -> None:
        if total >= PROGRESS_BYTES and sys.stderr.isatty():
            self.bar = click.progressbar(
                length=total, label=self.label, file=sys.stderr, show_pos=False
            )
            self.bar.__enter__()

    def update(self, sent: int) -> None:
        if self.bar is not None:
            self.bar.update(sent)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@click.command()
@_id_argument
@click.argument("source", metavar="DIR|ZIP", type=click.Path(exists=True, path_type=Path))
@_json_option
@click.pass_context
def upload(ctx: click.Context, sandbox_id: str, source: Path, as_json: bool) -> None:
    """Put a project in the workspace: a folder (zipped from inside itself, symlinks
    skipped, so its contents land in the workspace root) or a zip file."""
    progress = _Progress(f"Uploading {source.name}")
    zipped: list[ZipStats] = []

    def on_zipped(stats: ZipStats, size: int) -> None:
        zipped.append(stats)
        progress.start(size)

    if source.is_dir():

        def call(c: AsyncClient) -> Any:
            return c.upload_dir(sandbox_id, source, progress=progress.update, on_zipped=on_zipped)
    else:
        if top := wrapping_folder(source):
            click.echo(
                f"sandboxd: warning: everything in {source.name} is inside {top}, so it lands in "
                f"{top} in the workspace, not at its root; to avoid that, zip from inside the "
                "folder (cd proj && zip -r ../proj.zip .) or upload the folder itself",
                err=True,
            )
        progress.start(source.stat().st_size)

        def call(c: AsyncClient) -> Any:
            return c.upload_zip(sandbox_id, source, progress=progress.update)

    try:
        done = _run(ctx, call, as_json)
    finally:
        progress.finish()
    skipped = zipped[0].skipped if zipped else []
    if as_json:
        _print_json({**done.model_dump(mode="json"), "skipped": skipped})
        return
    for path in skipped:
        click.echo(f"sandboxd: skipped {path} (a symlink or special file)", err=True)
    click.echo(f"uploaded {done.files} file{'' if done.files == 1 else 's'} ({done.bytes} bytes)")


def _exit_status(result: ExecResult) -> int:
    if result.exit_code is not None:
        return result.exit_code
    return EXIT_TIMED_OUT if result.timed_out else 1


@click.command("exec")
@_id_argument
@click.argument("command", nargs=-1, required=True)
@click.option("--test", is_flag=True, help="Then run the language's test suite.")
@click.option("--timeout", type=float, help="Seconds before the command is killed [default: 60].")
@click.option("--cwd", metavar="DIR", help="The folder in the workspace to run in.")
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_pairs,
    help="Set a variable (repeatable).",
)
@_json_option
@click.pass_context
def exec_cmd(
    ctx: click.Context,
    sandbox_id: str,
    command: tuple[str, ...],
    test: bool,
    timeout: float | None,
    cwd: str | None,
    env: dict[str, str],
    as_json: bool,
) -> None:
    """Run a command in the workspace, streaming its output.

    Put -- before the command: sandboxd exec ID -- pytest -q. One argument is
    a shell command as it is ('make && ./a.out'); several are quoted word by
    word. The exit status is the command's (the test runner's with --test),
    124 if it timed out.
    """
    line = command[0] if len(command) == 1 else command

    def out(stream: str, text: str) -> None:
        click.echo(text, nl=False, err=stream == "stderr")

    def phase(runner: str) -> None:
        click.echo(f"sandboxd: running the tests ({runner})", err=True)

    options: dict[str, Any] = {"env": env, "cwd": cwd, "timeout": timeout}
    if not as_json:
        options.update(on_output=out, on_phase=phase)
    try:
        result = _run(ctx, lambda c: c.exec(sandbox_id, line, test, **options), as_json)
    except KeyboardInterrupt:
        # The connection closed with the loop, so the daemon killed the command.
        click.echo("sandboxd: interrupted; the command was killed", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    if as_json:
        _print_json(result)
    else:
        _exec_notes(result)
    ctx.exit(_exit_status(result))


def _exec_notes(result: ExecResult) -> None:
    notes = []
    if result.tests is not None:
        t = result.tests
        counts = f"{t.passed} passed, {t.failed} failed, {t.skipped} skipped, {t.errors} errors"
        notes.append(f"tests: {'no tests found' if t.no_tests else counts} ({t.runner})")
    if result.timed_out:
        notes.append("timed out: the command was killed")
    if result.truncated:
        notes.append("output truncated: only the end of it was kept")
    if result.quota_exceeded:
        notes.append("stopped: the workspace is over its disk quota")
    for note in notes:
        click.echo(f"sandboxd: {note}", err=True)


@click.command()
@_id_argument
@click.argument("path")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write it to FILE [default: standard output].",
)
@_json_option
@click.pass_context
def get(ctx: click.Context, sandbox_id: str, path: str, output: Path | None, as_json: bool) -> None:
    """Fetch one file of the workspace."""
    data = _run(ctx, lambda c: c.read_file(sandbox_id, path), as_json)
    if output is not None:
        output.write_bytes(data)
    if as_json:
        doc: dict[str, Any] = {"path": path, "size": len(data)}
        if output is not None:
            doc["output"] = str(output)
        else:
            try:
                doc["content"] = data.decode("utf-8")
            except UnicodeDecodeError:
                doc["content_base64"] = base64.b64encode(data).decode("ascii")
        _print_json(doc)
    elif output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


@click.command()
@_id_argument
@click.argument("path", default="")
@click.option("-r", "--recursive", is_flag=True, help="List subfolders too.")
@_json_option
@click.pass_context
def files(ctx: click.Context, sandbox_id: str, path: str, recursive: bool, as_json: bool) -> None:
    """List the workspace, or the folder PATH in it."""
    listing = _run(ctx, lambda c: c.list_files(sandbox_id, path, recursive), as_json)
    if as_json:
        _print_json(listing)
        return
    for entry in listing.entries:
        name = entry.path + ("/" if entry.type == "dir" else "")
        size = str(entry.size) if entry.type == "file" else "-"
        click.echo(f"{entry.type:<7} {size:>10}  {_when(entry.mtime)}  {name}")
    if listing.truncated:
        click.echo("sandboxd: more entries exist than were listed", err=True)


@click.command()
@click.argument("sandbox_ids", metavar="ID...", nargs=-1, required=True,
                shell_complete=complete_sandbox_id)  # fmt: skip
@_json_option
@click.pass_context
def rm(ctx: click.Context, sandbox_ids: tuple[str, ...], as_json: bool) -> None:
    """Delete sandboxes, their running commands and their workspaces."""
    deleted: list[str] = []

    async def delete_all(c: AsyncClient) -> None:
        for sandbox_id in sandbox_ids:
            await c.delete(sandbox_id)
            deleted.append(sandbox_id)
            if not as_json:
                click.echo(f"deleted {sandbox_id}")

    _run(ctx, delete_all, as_json)
    if as_json:
        _print_json({"deleted": deleted})


@click.command("mcp")
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder upload_folder may read (repeatable) "
    "[default: the current folder, unless it is / or the home folder].",
)
@click.pass_context
def mcp_cmd(ctx: click.Context, roots: tuple[Path, ...]) -> None:
    """Serve the MCP tools on stdin/stdout, for coding agents (needs sandboxd[mcp])."""
    try:
        from sandboxd import mcp_server
    except ImportError as exc:
        if not (exc.name or "").startswith("mcp"):
            raise
        raise click.ClickException(
            "the MCP server needs the official MCP SDK: pip install 'sandboxd[mcp]' "
            "(in a checkout: .venv/bin/pip install -e '.[mcp]')"
        ) from None
    mcp_server.serve(_socket(ctx), list(roots) or default_roots())


def default_roots() -> list[Path]:
    """The folder the agent started the server in, as its project; but not / or the
    home folder (a client that starts servers anywhere), which would open everything."""
    here = Path.cwd().resolve()
    if here == Path("/") or here == Path.home().resolve():
        return []
    return [here]


COMMANDS = [create, ls, put, upload, exec_cmd, get, files, rm, mcp_cmd]
