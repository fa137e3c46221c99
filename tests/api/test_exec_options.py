"""Per-exec options beside command and test: env, cwd, stdin, limits."""

from __future__ import annotations

from pathlib import Path

import pytest


async def sandbox(client) -> dict:
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201
    return await r.json()


async def run(client, sid: str, **body) -> dict:
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json=body)
    payload = await r.json()
    assert r.status == 200, payload
    return payload


async def test_env_is_set_for_the_command(client):
    made = await sandbox(client)
    result = await run(
        client, made["id"], command='echo "$GREETING $WHO"', env={"GREETING": "hi", "WHO": "you"}
    )
    assert result["stdout"] == "hi you\n"


async def test_env_reaches_the_test_runner_too(client):
    made = await sandbox(client)
    ws = Path(made["workspace"])
    (ws / "tests").mkdir()
    (ws / "tests" / "test_env.py").write_text(
        "import os\n\ndef test_env():\n    assert os.environ['MODE'] == 'ci'\n"
    )
    result = await run(client, made["id"], command="true", test=True, env={"MODE": "ci"})
    assert result["tests"]["passed"] == 1, result["output"]


@pytest.mark.parametrize(
    "env", [{"1BAD": "x"}, {"A-B": "x"}, {"A": "nul\u0000byte"}, {"": "x"}, {"A": 5}]
)
async def test_bad_env_is_422(client, env):
    made = await sandbox(client)
    r = await client.post(f"/v1/sandboxes/{made['id']}/exec", json={"command": "true", "env": env})
    assert r.status == 422


async def test_cwd_inside_the_workspace(client):
    made = await sandbox(client)
    (Path(made["workspace"]) / "src" / "pkg").mkdir(parents=True)
    result = await run(client, made["id"], command="pwd", cwd="src/pkg")
    assert result["stdout"] == "/workspace/src/pkg\n"
    result = await run(client, made["id"], command="pwd", cwd="/workspace/src")
    assert result["stdout"] == "/workspace/src\n"


@pytest.mark.parametrize("cwd", ["../..", "/etc", "src/../../x", "/workspace/../etc"])
async def test_cwd_outside_is_refused(client, cwd):
    made = await sandbox(client)
    (Path(made["workspace"]) / "src").mkdir()
    r = await client.post(f"/v1/sandboxes/{made['id']}/exec", json={"command": "pwd", "cwd": cwd})
    assert r.status == 400
    assert (await r.json())["code"] == "unsafe_path"


async def test_cwd_missing_or_a_link_is_422(client):
    made = await sandbox(client)
    ws = Path(made["workspace"])
    (ws / "file.txt").write_text("x")
    (ws / "link").symlink_to("/etc")
    for cwd in ("nope", "file.txt", "link"):
        r = await client.post(
            f"/v1/sandboxes/{made['id']}/exec", json={"command": "pwd", "cwd": cwd}
        )
        assert r.status == 422, cwd
        assert (await r.json())["code"] == "not_a_folder"


async def test_stdin_is_fed_to_the_command(client):
    made = await sandbox(client)
    result = await run(client, made["id"], command="wc -l; cat", stdin="")
    assert result["stdout"] == "0\n"
    result = await run(client, made["id"], command="tr a-z A-Z", stdin="hello\nworld\n")
    assert result["stdout"] == "HELLO\nWORLD\n"
    big = "x" * 200_000 + "\n"
    result = await run(client, made["id"], command="wc -c", stdin=big)
    assert result["stdout"].strip() == str(len(big))


async def test_stdin_defaults_to_empty(client):
    made = await sandbox(client)
    result = await run(client, made["id"], command="cat; echo done")
    assert result["stdout"] == "done\n"


async def test_stdin_in_test_mode_goes_to_the_command(client):
    made = await sandbox(client)
    result = await run(client, made["id"], command="cat > got.txt", test=True, stdin="data")
    assert result["command"]["exit_code"] == 0
    result = await run(client, made["id"], command="cat got.txt")
    assert result["stdout"] == "data"


async def test_lower_limits_per_request(client):
    made = await sandbox(client)
    result = await run(
        client,
        made["id"],
        command="ulimit -n; ulimit -t",
        limits={"open_files": 64, "cpu_seconds": 5},
    )
    assert result["stdout"].split() == ["64", "5"]


async def test_higher_limits_than_configured_are_refused(client):
    made = await sandbox(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/exec",
        json={"command": "true", "limits": {"open_files": 10**7}},
    )
    assert r.status == 422
    assert "limits.open_files" in (await r.json())["detail"]
