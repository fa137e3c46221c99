"""The command line: thin click wrappers over daemon.py and client.py.

The daemon's own commands are here; the client commands (create, exec, ...)
and the MCP server are in cli_client.py.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from sandboxd import __version__, cli_client, daemon, doctor, listen, logs, paths, toolchains
from sandboxd.client import ClientError, NotRunning, call
from sandboxd.config import ConfigError, Settings, load_settings


def _load(obj: dict[str, Any]) -> Settings:
    """The settings: defaults, the config file, then the command line. Raises ConfigError."""
    listen_overrides = {
        key: obj[key] for key in ("tcp", "allow_remote") if obj.get(key) not in (None, False)
    }
    return load_settings(
        obj["config"],
        socket_path=obj["socket"],
        data_dir=obj["data_dir"],
        listen=listen_overrides or None,
    )


def _settings(ctx: click.Context) -> Settings:
    try:
        return _load(ctx.obj)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sandboxd")
@click.option(
    "--socket",
    type=click.Path(path_type=Path),
    envvar="SANDBOXD_SOCKET",
    help="Unix socket path [default: $XDG_RUNTIME_DIR/sandboxd/sandboxd.sock].",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    envvar="SANDBOXD_DATA_DIR",
    help="Where sandboxes live [default: $XDG_DATA_HOME/sandboxd].",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    envvar="SANDBOXD_CONFIG",
    help="Config file [default: $XDG_CONFIG_HOME/sandboxd/config.toml].",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
@click.pass_context
def main(
    ctx: click.Context,
    socket: Path | None,
    data_dir: Path | None,
    config: Path | None,
    log_level: str,
) -> None:
    """sandboxd runs untrusted code in bubblewrap sandboxes, over HTTP on a Unix socket."""
    ctx.obj = {"socket": socket, "data_dir": data_dir, "config": config, "log_level": log_level}


F = TypeVar("F", bound=Callable[..., Any])


def _check_tcp(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            listen.parse_address(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _listen_options(command: F) -> F:
    command = click.option(
        "--allow-remote",
        is_flag=True,
        help="Let --tcp listen on an address other machines can reach (not recommended).",
    )(command)
    return click.option(
        "--tcp",
        metavar="HOST:PORT",
        callback=_check_tcp,
        help="Also listen on TCP, loopback only, every request needing the bearer token "
        "[default: listen.tcp in the config file, else off].",
    )(command)


@main.command()
@_listen_options
@click.pass_context
def serve(ctx: click.Context, tcp: str | None, allow_remote: bool) -> None:
    """Run the daemon in the foreground (logs go to stderr)."""
    logs.setup(ctx.obj["log_level"])
    ctx.obj.update(tcp=tcp, allow_remote=allow_remote)
    settings = _settings(ctx)
    obj = dict(ctx.obj)
    try:
        daemon.serve(settings, load=lambda: _load(obj))
    except daemon.DaemonStartError as exc:
        raise click.ClickException(str(exc)) from None


def _forwarded_args(ctx: click.Context) -> list[str]:
    args = []
    for key, flag in (("socket", "--socket"), ("data_dir", "--data-dir"), ("config", "--config")):
        if ctx.obj[key] is not None:
            args += [flag, str(Path(ctx.obj[key]).absolute())]
    args += ["--log-level", ctx.obj["log_level"]]
    return args


@main.command()
@_listen_options
@click.pass_context
def start(ctx: click.Context, tcp: str | None, allow_remote: bool) -> None:
    """Start the daemon in the background; return once it accepts connections."""
    ctx.obj.update(tcp=tcp, allow_remote=allow_remote)
    settings = _settings(ctx)
    serve_args = (["--tcp", tcp] if tcp else []) + (["--allow-remote"] if allow_remote else [])
    try:
        daemon.preflight(settings)
        pid = daemon.start_background(settings, _forwarded_args(ctx), serve_args)
    except daemon.DaemonStartError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"sandboxd started (pid {pid}), listening on {settings.socket_path}")
    if settings.listen.tcp:
        click.echo(
            f"  and on TCP {settings.listen.tcp}; the token is in {settings.listen.token_file}"
        )


@main.command()
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for it to exit.")
@click.pass_context
def stop(ctx: click.Context, timeout: float) -> None:
    """Stop the daemon and wait until it is gone."""
    settings = _settings(ctx)
    try:
        status = call(settings.socket_path, "GET", "/v1/status")
    except NotRunning:
        click.echo("sandboxd is not running")
        return
    pid = int(status["pid"])
    os.kill(pid, signal.SIGTERM)
    if not daemon.wait_for_exit(pid, timeout):
        raise click.ClickException(f"sandboxd (pid {pid}) did not exit within {timeout:g} s")
    click.echo(f"sandboxd stopped (pid {pid})")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Show whether the daemon runs, and what it is doing. Exit status 3 if it is not running."""
    settings = _settings(ctx)
    try:
        info = call(settings.socket_path, "GET", "/v1/status")
    except NotRunning as exc:
        click.echo(str(exc), err=True)
        ctx.exit(3)
    except ClientError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"sandboxd {info['version']} running (pid {info['pid']})")
    click.echo(f"  socket:     {info['socket']}")
    click.echo(f"  data dir:   {info['data_dir']}")
    click.echo(f"  uptime:     {info['uptime_seconds']:.0f} s")
    click.echo(f"  sandboxes:  {info['sandboxes']} ({info['running_commands']} commands running)")
    for key, value in info["isolation"].items():
        click.echo(f"  {key}: {value}")
    for key, value in info["limits"].items():
        click.echo(f"  limit {key}: {value}")


@main.command("doctor")
@click.pass_context
def doctor_cmd(ctx: click.Context) -> None:
    """Check what sandboxd needs from this machine. Exit status 1 if anything fails."""
    try:
        settings = _load(ctx.obj)
        config_ok = True
        config = ctx.obj["config"] or paths.default_config_file()
        shown = str(config) if config.exists() else f"defaults (there is no {config})"
        click.echo(f"ok    config: {shown}")
    except ConfigError as exc:
        click.echo(f"fail  config: {exc}")
        click.echo("      fix: correct the key named above (see CONFIGURATION in sandboxd(1))")
        # Go on with the defaults and the command line: the rest still says something.
        settings = _load({**ctx.obj, "config": Path("/dev/null")})
        config_ok = False
    failed = not config_ok
    for check in doctor.run(settings):
        for line in check.lines():
            click.echo(line)
        failed = failed or check.level is doctor.Level.fail
    if failed:
        ctx.exit(1)


@main.group("toolchains", invoke_without_command=True)
@click.pass_context
def toolchains_cmd(ctx: click.Context) -> None:
    """Show what each language uses and what is missing. Exit status 1 if anything is."""
    if ctx.invoked_subcommand is not None:
        return
    settings = _settings(ctx)
    problems = 0
    for language, chain in toolchains.detect(settings).items():
        version = toolchains.version_of(chain)
        click.echo(f"{language.value}: {chain.executable} ({version or 'does not run'})")
        click.echo(f"  runner: {chain.runner_display}")
        for issue in (chain.missing(), chain.runner_missing()):
            if issue:
                problems += 1
                click.echo(f"  missing: {issue}")
    if problems:
        ctx.exit(1)


@toolchains_cmd.command("install")
@click.pass_context
def toolchains_install(ctx: click.Context) -> None:
    """Install the test runners the host lacks (jest; pytest if needed), for offline use."""
    settings = _settings(ctx)
    try:
        for line in toolchains.install_runners(settings):
            click.echo(line)
    except toolchains.ProvisionError as exc:
        raise click.ClickException(f"could not install the test runners: {exc}") from None
    click.echo("A running daemon picks these up when restarted (sandboxd stop; sandboxd start).")


for _command in cli_client.COMMANDS:
    main.add_command(_command)
