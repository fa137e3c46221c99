"""Links and locked folders the sandboxed code plants never make the daemon act outside."""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.config import Settings
from tests.conftest import form_with_file, make_zip
from tests.security.helpers import expect_problem, file_digest, run, snapshot, wait_until


@pytest.fixture
def victim() -> Iterator[Path]:
    """A host folder outside every sandbox, with content that must survive."""
    path = Path("/tmp") / f"sandboxd-victim-{secrets.token_hex(6)}"
    path.mkdir(mode=0o755)
    (path / "precious.txt").write_text("precious\n")
    (path / "sub").mkdir()
    (path / "sub" / "deep.txt").write_text("deep\n")
    yield path
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            os.rmdir(os.path.join(root, name))
    os.rmdir(path)


async def _plant(client: Any, sandbox: dict[str, Any], victim: Path) -> None:
    result = await run(
        client,
        sandbox["id"],
        f"ln -s /etc/passwd link && ln -s / rootlink && ln -s {victim} vlink && "
        f"ln -s {victim}/precious.txt plink && mkdir -p d && ln -s {victim} d/inner",
    )
    assert result["exit_code"] == 0, result
    ws = Path(sandbox["workspace"])
    assert os.readlink(ws / "link") == "/etc/passwd"
    assert os.readlink(ws / "rootlink") == "/"


async def test_single_file_upload_replaces_a_planted_link(
    client: Any, sandbox: dict[str, Any], victim: Path
) -> None:
    passwd = file_digest("/etc/passwd")
    await _plant(client, sandbox, victim)
    ws = Path(sandbox["workspace"])
    for name in ("link", "plink"):
        r = await client.post(
            f"/v1/sandboxes/{sandbox['id']}/files", data=form_with_file(b"replaced\n", name)
        )
        assert r.status == 201, await r.text()
        st = os.lstat(ws / name)
        assert stat.S_ISREG(st.st_mode), name
        assert (ws / name).read_bytes() == b"replaced\n"
    assert file_digest("/etc/passwd") == passwd
    assert (victim / "precious.txt").read_text() == "precious\n"
    # The sandbox sees its own file, not the host's passwd.
    result = await run(client, sandbox["id"], "cat link")
    assert result["stdout"] == "replaced\n"


async def test_single_file_upload_onto_a_link_to_a_folder(
    client: Any, sandbox: dict[str, Any], victim: Path
) -> None:
    await _plant(client, sandbox, victim)
    before = snapshot(victim)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=form_with_file(b"mine\n", "vlink")
    )
    assert r.status == 201, await r.text()
    assert stat.S_ISREG(os.lstat(Path(sandbox["workspace"]) / "vlink").st_mode)
    assert snapshot(victim) == before


@pytest.mark.parametrize(
    "entry",
    ["rootlink/NAME", "rootlink/tmp/NAME", "vlink/precious.txt", "vlink/NAME", "d/inner/NAME"],
)
async def test_archive_through_a_planted_link_is_refused(
    client: Any, sandbox: dict[str, Any], victim: Path, entry: str
) -> None:
    await _plant(client, sandbox, victim)
    ws = Path(sandbox["workspace"])
    before_ws = snapshot(ws)
    before_victim = snapshot(victim)
    name = f"sandboxd-sec-{secrets.token_hex(6)}"
    entry = entry.replace("NAME", name)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(make_zip({"ok.txt": "fine\n", entry: "evil\n"}), "evil.zip"),
    )
    body = await expect_problem(r, 409, "path_conflict")
    link = entry.rsplit("/", 1)[0] if entry.startswith("d/") else entry.split("/")[0]
    assert f"The archive has {link} where the workspace has a file or link" in body["detail"]
    assert snapshot(ws) == before_ws
    assert snapshot(victim) == before_victim
    for outside in (Path("/") / name, Path("/tmp") / name, victim / name, Path("/inner") / name):
        assert not os.path.lexists(outside), outside


async def test_archive_file_replaces_a_planted_link(
    client: Any, sandbox: dict[str, Any], victim: Path
) -> None:
    passwd = file_digest("/etc/passwd")
    await _plant(client, sandbox, victim)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(make_zip({"link": "mine\n", "plink": "mine too\n"}), "a.zip"),
    )
    assert r.status == 201, await r.text()
    ws = Path(sandbox["workspace"])
    assert stat.S_ISREG(os.lstat(ws / "link").st_mode)
    assert (ws / "link").read_text() == "mine\n"
    assert file_digest("/etc/passwd") == passwd
    assert (victim / "precious.txt").read_text() == "precious\n"


async def test_delete_leaves_link_targets_intact(
    client: Any, sandbox: dict[str, Any], victim: Path, settings: Settings
) -> None:
    passwd = file_digest("/etc/passwd")
    await _plant(client, sandbox, victim)
    # Links in the sandbox's home too, and a hard-to-remove tree around them.
    result = await run(
        client,
        sandbox["id"],
        f"ln -s {victim} $HOME/vlink && mkdir -p deep/a/b && ln -s {victim} deep/a/b/v && "
        "chmod 000 deep/a/b deep/a",
    )
    assert result["exit_code"] == 0, result
    before = snapshot(victim)
    r = await client.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert r.status == 204
    assert not os.path.lexists(Path(sandbox["workspace"]).parent)
    assert snapshot(victim) == before
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o755
    assert file_digest("/etc/passwd") == passwd
    # The files are removed just after the answer, in the background.
    assert await wait_until(lambda: not os.listdir(settings.data_dir / "trash"), 10)
    for top in ("/etc", "/usr", "/tmp"):
        assert os.path.isdir(top)


async def test_delete_removes_a_folder_the_code_made_mode_000(
    client: Any, sandbox: dict[str, Any], settings: Settings
) -> None:
    result = await run(
        client,
        sandbox["id"],
        "mkdir -p locked/inner/deeper && echo x > locked/inner/deeper/f && "
        "echo y > locked/f && chmod 000 locked/inner/deeper locked/inner locked && "
        "mkdir -p $HOME/locked && chmod 000 $HOME/locked && ls locked",
    )
    assert result["exit_code"] == 2  # the code itself can no longer read it
    ws = Path(sandbox["workspace"])
    assert stat.S_IMODE(os.lstat(ws / "locked").st_mode) == 0
    r = await client.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert r.status == 204
    assert not os.path.lexists(ws.parent)
    # The files are removed just after the answer, in the background.
    assert await wait_until(lambda: not os.listdir(settings.data_dir / "trash"), 10)
    assert os.listdir(settings.data_dir / "sandboxes") == []


@pytest.mark.parametrize(
    ("cwd", "status", "code"),
    [
        ("..", 400, "unsafe_path"),
        ("sub/../..", 400, "unsafe_path"),
        ("/workspace/..", 400, "unsafe_path"),
        ("/etc", 400, "unsafe_path"),
        ("rootlink", 422, "not_a_folder"),
        ("vlink", 422, "not_a_folder"),
        ("d/inner", 422, "not_a_folder"),
        ("link", 422, "not_a_folder"),
    ],
)
async def test_exec_cwd_cannot_leave_the_workspace(
    client: Any, sandbox: dict[str, Any], victim: Path, cwd: str, status: int, code: str
) -> None:
    await _plant(client, sandbox, victim)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec", json={"command": "pwd; ls", "cwd": cwd}
    )
    await expect_problem(r, status, code)
