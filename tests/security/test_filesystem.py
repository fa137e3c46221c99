"""The host's files, the daemon's files and other sandboxes' files are invisible; the system is
read-only."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from sandboxd.config import Settings
from tests.security.helpers import create_sandbox, exact_sleeps, run, sleep_marker, wait_until


async def test_etc_shadow_is_not_there(client: Any, sandbox: dict[str, Any]) -> None:
    assert Path("/etc/shadow").exists()  # on the host it is
    result = await run(client, sandbox["id"], "cat /etc/shadow")
    assert result["exit_code"] == 1
    assert result["stdout"] == ""
    assert result["stderr"] == "cat: /etc/shadow: No such file or directory\n"


async def test_root_home_is_not_there(client: Any, sandbox: dict[str, Any]) -> None:
    assert Path("/root").is_dir()
    result = await run(client, sandbox["id"], "ls /root")
    assert result["exit_code"] == 2
    assert result["stderr"] == "ls: cannot access '/root': No such file or directory\n"


async def test_only_the_sandbox_home_is_under_home(client: Any, sandbox: dict[str, Any]) -> None:
    result = await run(client, sandbox["id"], "ls -A /home")
    assert result["exit_code"] == 0
    assert result["stdout"] == "sandbox\n"


async def test_etc_holds_only_what_the_daemon_put_there(
    client: Any, sandbox: dict[str, Any]
) -> None:
    result = await run(client, sandbox["id"], "ls -A /etc; cat /etc/passwd")
    assert result["exit_code"] == 0
    names, _, passwd = result["stdout"].partition("root:")
    assert names.split() == ["alternatives", "group", "hosts", "passwd", "ssl"]
    # The sandbox's own passwd, not the host's.
    assert ("root:" + passwd) == (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        "sandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )


async def test_daemon_data_dir_is_not_reachable(
    client: Any, sandbox: dict[str, Any], settings: Settings
) -> None:
    data_dir = settings.data_dir
    record = data_dir / "sandboxes" / sandbox["id"] / "sandbox.json"
    assert record.is_file()
    result = await run(client, sandbox["id"], f"ls {data_dir}; cat {record}")
    assert result["exit_code"] == 1
    assert result["stdout"] == ""
    assert result["stderr"] == (
        f"ls: cannot access '{data_dir}': No such file or directory\n"
        f"cat: {record}: No such file or directory\n"
    )


async def test_tests_own_files_are_not_reachable(client: Any, sandbox: dict[str, Any]) -> None:
    here = Path(__file__).resolve()
    result = await run(client, sandbox["id"], f"cat {here}")
    assert result["exit_code"] == 1
    assert result["stderr"] == f"cat: {here}: No such file or directory\n"


async def test_another_sandbox_workspace_is_invisible_by_host_path(client: Any) -> None:
    owner = await create_sandbox(client)
    other = await create_sandbox(client)
    secret = secrets.token_hex(16)
    done = await run(client, owner["id"], f"echo {secret} > secret.txt")
    assert done["exit_code"] == 0
    host_file = Path(owner["workspace"]) / "secret.txt"
    assert host_file.read_text() == f"{secret}\n"

    result = await run(
        client, other["id"], f"cat {host_file}; ls {owner['workspace']}; cat /workspace/secret.txt"
    )
    assert result["exit_code"] == 1
    assert secret not in result["output"]
    assert result["stderr"] == (
        f"cat: {host_file}: No such file or directory\n"
        f"ls: cannot access '{owner['workspace']}': No such file or directory\n"
        "cat: /workspace/secret.txt: No such file or directory\n"
    )


async def test_another_sandbox_workspace_is_invisible_through_proc(client: Any) -> None:
    owner = await create_sandbox(client)
    other = await create_sandbox(client)
    secret = secrets.token_hex(16)
    marker = sleep_marker()
    # A process of the first sandbox sits in its workspace with the secret open.
    running = asyncio.create_task(
        run(client, owner["id"], f"echo {secret} > secret.txt; exec 7<secret.txt; sleep {marker}")
    )
    try:
        assert await wait_until(lambda: exact_sleeps(marker), 5)
        (host_pid,) = exact_sleeps(marker)
        assert Path(f"/proc/{host_pid}/cwd/secret.txt").read_text() == f"{secret}\n"

        probe = (
            f"cat /proc/{host_pid}/cwd/secret.txt /proc/{host_pid}/root/workspace/secret.txt"
            f" /proc/{host_pid}/fd/7; "
            "python3 -c \"import os; print(sorted(int(p) for p in os.listdir('/proc')"
            ' if p.isdigit()))"; '
            "grep -rs " + secret + " /proc/[0-9]*/cwd/ /proc/[0-9]*/root/workspace/; echo grep=$?"
        )
        result = await run(client, other["id"], probe)
    finally:
        await client.delete(f"/v1/sandboxes/{owner['id']}")
        await asyncio.gather(running, return_exceptions=True)
    assert secret not in result["stdout"]
    assert result["stderr"] == (
        f"cat: /proc/{host_pid}/cwd/secret.txt: No such file or directory\n"
        f"cat: /proc/{host_pid}/root/workspace/secret.txt: No such file or directory\n"
        f"cat: /proc/{host_pid}/fd/7: No such file or directory\n"
    )
    lines = result["stdout"].splitlines()
    # Only this sandbox's own few processes exist in its PID namespace.
    pids = [int(p) for p in lines[0].strip("[]").split(", ")]
    assert max(pids) < 20, pids
    assert host_pid not in pids
    assert lines[1] == "grep=1"


# New names fail with EROFS; existing files (owned by host root, so by the
# overflow uid inside) fail the permission check first, with EACCES.
@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("touch /usr/evil", "touch: cannot touch '/usr/evil': Read-only file system"),
        ("touch /usr/bin/evil", "touch: cannot touch '/usr/bin/evil': Read-only file system"),
        (
            "touch /etc/ssl/certs/evil",
            "touch: cannot touch '/etc/ssl/certs/evil': Read-only file system",
        ),
        ("rm -f /usr/bin/python3", "rm: cannot remove '/usr/bin/python3': Read-only file system"),
        (
            "echo x >> /usr/bin/python3",
            "/bin/sh: 1: cannot create /usr/bin/python3: Permission denied",
        ),
        ("echo x >> /etc/passwd", "/bin/sh: 1: cannot create /etc/passwd: Permission denied"),
        ("echo x >> /etc/hosts", "/bin/sh: 1: cannot create /etc/hosts: Permission denied"),
    ],
)
async def test_system_paths_are_read_only(
    client: Any, sandbox: dict[str, Any], command: str, message: str
) -> None:
    result = await run(client, sandbox["id"], command)
    assert result["exit_code"] in (1, 2)
    assert result["stderr"] == message + "\n"
    assert not Path("/usr/evil").exists()
    assert not Path("/usr/bin/evil").exists()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("touch /evil", "touch: cannot touch '/evil': Read-only file system"),
        ("touch /etc/evil", "touch: cannot touch '/etc/evil': Read-only file system"),
        ("mkdir /opt/evil", "mkdir: cannot create directory '/opt/evil': Read-only file system"),
        (
            "echo /tmp/x.so > /etc/ld.so.preload",
            "/bin/sh: 1: cannot create /etc/ld.so.preload: Read-only file system",
        ),
    ],
)
async def test_root_and_etc_are_read_only(
    client: Any, sandbox: dict[str, Any], command: str, message: str
) -> None:
    result = await run(client, sandbox["id"], command)
    # coreutils quotes with U+2018/U+2019 under a UTF-8 locale, ASCII otherwise.
    assert result["stderr"].replace("\u2018", "'").replace("\u2019", "'") == message + "\n"
    assert result["exit_code"] in (1, 2)


async def test_writes_to_root_never_reach_the_host(client: Any, sandbox: dict[str, Any]) -> None:
    name = f"sandboxd-sec-{secrets.token_hex(6)}"
    await run(client, sandbox["id"], f"touch /{name} /etc/{name} /tmp/{name}")
    for where in ("/", "/etc", "/tmp"):
        assert not os.path.lexists(os.path.join(where, name)), where
    # And nothing of the run is left for the next one, except the workspace and home.
    again = await run(client, sandbox["id"], f"ls /{name} /etc/{name} /tmp/{name}")
    assert again["exit_code"] == 2
