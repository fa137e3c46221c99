"""The daemon's environment and open descriptors never reach sandboxed code."""

from __future__ import annotations

import secrets
from typing import Any

import aiohttp
import pytest

from tests.conftest import Daemon
from tests.security.helpers import create_sandbox, run

SECRET_VAR = "SANDBOXD_TEST_SECRET"

# Exactly what a python sandbox's shell sees: the daemon's fixed set, plus PWD from sh.
EXPECTED_ENV = {
    "HOME": "/home/sandbox",
    "LANG": "C.UTF-8",
    "LOGNAME": "sandbox",
    "PATH": "/opt/sandboxd/bin:/usr/local/bin:/usr/bin:/bin",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "PWD": "/workspace",
    "PYTHONUNBUFFERED": "1",
    "SHELL": "/bin/sh",
    "TERM": "dumb",
    "TMPDIR": "/tmp",
    "USER": "sandbox",
}

# env -0 so values cannot fake lines. Then PID 1's environ: bwrap's init, which has
# the environment the daemon started bwrap with (empty), not the command's.
ENV_PROBE = (
    "env -0 | tr '\\0' '\\n'; echo ---; cat /proc/1/environ | wc -c; "
    f"grep -l {SECRET_VAR} /proc/[0-9]*/environ; echo grep=$?"
)


async def _check_env(http: Any, secret: str) -> None:
    sandbox = await create_sandbox(http)
    result = await run(http, sandbox["id"], ENV_PROBE)
    assert result["exit_code"] == 0, result
    assert secret not in result["output"]
    env_part, _, rest = result["stdout"].partition("---\n")
    env = dict(line.split("=", 1) for line in env_part.splitlines())
    assert env == EXPECTED_ENV
    assert rest == "0\ngrep=1\n"
    assert result["stderr"] == ""


async def test_daemon_env_is_not_visible_in_process(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_VAR, secret)
    await _check_env(client, secret)


async def test_daemon_env_is_not_visible_in_real_daemon(
    daemon_factory: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_VAR, secret)
    daemon_factory.start()
    # The daemon process really has it, so its absence below is the sandbox's doing.
    assert daemon_factory.proc is not None
    with open(f"/proc/{daemon_factory.proc.pid}/environ", "rb") as f:
        assert f"{SECRET_VAR}={secret}".encode() in f.read().split(b"\0")
    async with daemon_factory.session() as http:
        await _check_env(http, secret)


async def test_env_in_test_mode_command(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_VAR, secret)
    sandbox = await create_sandbox(client)
    result = await run(client, sandbox["id"], "env; cat /proc/1/environ", test=True)
    assert secret not in result["output"]
    assert SECRET_VAR not in result["output"]
    assert result["command"]["exit_code"] == 0, result


async def test_only_standard_descriptors_are_open(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "ls /proc/self/fd")
    assert result["exit_code"] == 0, result
    # 0, 1, 2 and the descriptor ls opened to read the folder.
    assert result["stdout"] == "0\n1\n2\n3\n"


async def test_stdin_is_dev_null(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "readlink /proc/self/fd/0; cat | wc -c")
    assert result["stdout"] == "/dev/null\n0\n"


async def test_only_standard_descriptors_are_open_in_test_mode(
    client: Any, sandbox: dict[str, Any]
) -> None:
    # The supervisor holds the runner's pipes; the command must not inherit them.
    result = await run(client, sandbox["id"], "ls /proc/self/fd", test=True)
    assert result["command"]["exit_code"] == 0, result
    assert result["command"]["stdout"] == "0\n1\n2\n3\n"


async def test_only_standard_descriptors_are_open_in_real_daemon(
    daemon: Daemon, http: aiohttp.ClientSession
) -> None:
    # A real daemon holds a listening socket, connections and a log file.
    sandbox = await create_sandbox(http)
    result = await run(http, sandbox["id"], "ls /proc/self/fd; ls /proc/1/fd")
    assert result["exit_code"] == 0, result
    own, _, init = result["stdout"].partition("0\n1\n2\n3\n")
    assert own == ""
    # bwrap's init: stdio and its own internal eventfd, nothing of the daemon.
    assert init.split() in (["0", "1", "2", "4"], ["0", "1", "2"])
    test_mode = await run(http, sandbox["id"], "ls /proc/self/fd", test=True)
    assert test_mode["command"]["stdout"] == "0\n1\n2\n3\n"
