"""Getting files back out: list, download, delete, whole-workspace zip; path on upload."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest


async def sandbox(client) -> dict:
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201
    return await r.json()


async def run(client, sid: str, command: str) -> dict:
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": command})
    body = await r.json()
    assert r.status == 200, body
    return body


async def test_list_download_delete_files_a_command_wrote(client):
    made = await sandbox(client)
    sid = made["id"]
    await run(client, sid, "mkdir -p out/sub && echo report > out/report.txt && echo x > out/sub/y")
    r = await client.get(f"/v1/sandboxes/{sid}/files")
    listing = await r.json()
    assert r.status == 200
    assert [(e["path"], e["type"]) for e in listing["entries"]] == [("out", "dir")]
    r = await client.get(f"/v1/sandboxes/{sid}/files", params={"path": "out", "recursive": "true"})
    entries = {e["path"]: e for e in (await r.json())["entries"]}
    assert set(entries) == {"out/report.txt", "out/sub", "out/sub/y"}
    assert entries["out/report.txt"]["size"] == 7
    assert entries["out/report.txt"]["type"] == "file"
    r = await client.get(f"/v1/sandboxes/{sid}/files/out/report.txt")
    assert r.status == 200
    assert await r.read() == b"report\n"
    assert r.content_type == "text/plain"
    r = await client.delete(f"/v1/sandboxes/{sid}/files/out/sub")
    assert r.status == 204
    assert not (Path(made["workspace"]) / "out" / "sub").exists()
    r = await client.get(f"/v1/sandboxes/{sid}/files/out/sub/y")
    assert r.status == 422  # out/sub is no longer a folder
    r = await client.get(f"/v1/sandboxes/{sid}/files/out/missing.txt")
    assert r.status == 404
    assert (await r.json())["code"] == "file_not_found"


async def test_download_is_binary_safe(client):
    made = await sandbox(client)
    data = bytes(range(256)) * 4096
    (Path(made["workspace"]) / "blob.bin").write_bytes(data)
    r = await client.get(f"/v1/sandboxes/{made['id']}/files/blob.bin")
    assert r.headers["Content-Length"] == str(len(data))
    assert await r.read() == data


async def test_planted_links_are_listed_not_followed(client):
    made = await sandbox(client)
    sid = made["id"]
    await run(client, sid, "ln -s /etc/passwd passwd-link && ln -s / root-link")
    r = await client.get(f"/v1/sandboxes/{sid}/files")
    types = {e["path"]: e["type"] for e in (await r.json())["entries"]}
    assert types == {"passwd-link": "symlink", "root-link": "symlink"}
    r = await client.get(f"/v1/sandboxes/{sid}/files/passwd-link")
    assert r.status == 422
    assert (await r.json())["code"] == "not_a_file"
    r = await client.get(f"/v1/sandboxes/{sid}/files/root-link/etc/passwd")
    assert r.status == 422
    r = await client.get(f"/v1/sandboxes/{sid}/files", params={"path": "root-link"})
    assert r.status == 422
    # Deleting the link removes the link, not its target.
    r = await client.delete(f"/v1/sandboxes/{sid}/files/passwd-link")
    assert r.status == 204
    assert Path("/etc/passwd").exists()
    r = await client.get(f"/v1/sandboxes/{sid}/archive")
    with zipfile.ZipFile(io.BytesIO(await r.read())) as zf:
        assert zf.namelist() == []


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "a/../../b"])
async def test_paths_outside_are_refused(client, path):
    made = await sandbox(client)
    r = await client.get(f"/v1/sandboxes/{made['id']}/files", params={"path": path})
    assert r.status == 400
    assert (await r.json())["code"] == "unsafe_path"


async def test_encoded_traversal_in_the_url_is_refused(client):
    made = await sandbox(client)
    r = await client.get(f"/v1/sandboxes/{made['id']}/files/..%2F..%2Fetc%2Fpasswd")
    assert r.status in (400, 404)
    assert b"root:" not in await r.read()


async def test_deleting_the_workspace_itself_is_refused(client):
    made = await sandbox(client)
    for path in (".", "./", "/workspace"):
        r = await client.delete(f"/v1/sandboxes/{made['id']}/files/{path}")
        assert r.status in (400, 404), path  # the client may normalise "." away
        assert Path(made["workspace"]).is_dir()
    r = await client.delete(f"/v1/sandboxes/{made['id']}/files/%2Fworkspace")
    assert r.status == 400
    assert (await r.json())["code"] == "unsafe_path"
    assert Path(made["workspace"]).is_dir()


async def test_archive_round_trips_the_workspace(client):
    made = await sandbox(client)
    sid = made["id"]
    await run(client, sid, "mkdir -p src && echo a > src/a.py && printf '#!/bin/sh\\n' > run.sh")
    await run(client, sid, "chmod +x run.sh")
    r = await client.get(f"/v1/sandboxes/{sid}/archive")
    assert r.status == 200
    assert r.content_type == "application/zip"
    with zipfile.ZipFile(io.BytesIO(await r.read())) as zf:
        assert sorted(zf.namelist()) == ["run.sh", "src/a.py"]
        assert zf.read("src/a.py") == b"a\n"
        assert (zf.getinfo("run.sh").external_attr >> 16) & 0o111
    assert list((Path(made["workspace"]).parent / "tmp").iterdir()) == []


async def test_upload_into_a_subfolder(client):
    made = await sandbox(client)
    # The path field goes before the file, the way curl -F sends them in order.
    form = _form(path="src/app", name="main.py", data=b"print(1)\n")
    r = await client.post(f"/v1/sandboxes/{made['id']}/files", data=form)
    body = await r.json()
    assert r.status == 201, body
    assert body["path"] == "src/app/main.py"
    target = Path(made["workspace"]) / "src" / "app" / "main.py"
    assert target.read_bytes() == b"print(1)\n"
    if os.geteuid() == 0:
        ws_owner = Path(made["workspace"]).stat().st_uid
        assert target.parent.stat().st_uid == ws_owner


async def test_upload_path_refuses_escapes_and_links(client):
    made = await sandbox(client)
    await run(client, made["id"], "ln -s /tmp link")
    for path, code in (("../x", "unsafe_path"), ("/etc", "unsafe_path"), ("link", "not_a_folder")):
        r = await client.post(
            f"/v1/sandboxes/{made['id']}/files", data=_form(path=path, name="f", data=b"x")
        )
        assert r.status in (400, 422), path
        assert (await r.json())["code"] == code


def _form(path: str, name: str, data: bytes):
    import aiohttp

    form = aiohttp.FormData(quote_fields=False)
    form.add_field("path", path)
    form.add_field("file", data, filename=name, content_type="application/octet-stream")
    return form


async def test_zip_upload_into_a_subfolder(client):
    import io
    import zipfile as zf_mod

    made = await sandbox(client)
    buf = io.BytesIO()
    with zf_mod.ZipFile(buf, "w") as zf:
        zf.writestr("a/b.txt", "b")
    form = _form(path="vendor/lib", name="lib.zip", data=buf.getvalue())
    r = await client.post(f"/v1/sandboxes/{made['id']}/upload", data=form)
    assert r.status == 201, await r.text()
    assert (Path(made["workspace"]) / "vendor" / "lib" / "a" / "b.txt").read_text() == "b"
    # Through a planted link: refused, nothing written.
    await run(client, made["id"], "ln -s /tmp link")
    form = _form(path="link/x", name="lib.zip", data=buf.getvalue())
    r = await client.post(f"/v1/sandboxes/{made['id']}/upload", data=form)
    assert r.status == 422
    assert (await r.json())["code"] == "not_a_folder"
