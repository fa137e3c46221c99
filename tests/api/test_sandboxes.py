"""The spec's endpoints through the real app (aiohttp test client, real bwrap behind exec)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import form_with_file, make_zip


async def create(client, **body) -> dict:
    r = await client.post("/v1/sandboxes", json=body)
    assert r.status == 201, await r.text()
    return await r.json()


async def test_create_defaults_to_python(client):
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201
    body = await r.json()
    assert body["language"] == "python"
    assert body["status"] == "created"
    assert body["id"].startswith("sb-")
    assert Path(body["workspace"]).is_dir()


async def test_create_with_no_body_at_all(client):
    r = await client.post("/v1/sandboxes")
    assert r.status == 201
    assert (await r.json())["language"] == "python"


@pytest.mark.parametrize("language", ["python", "node", "go"])
async def test_create_each_language(client, language):
    body = await create(client, language=language)
    assert body["language"] == language


async def test_java_is_refused_with_the_allowed_list(client):
    r = await client.post("/v1/sandboxes", json={"language": "java"})
    assert r.status == 422
    assert r.content_type == "application/problem+json"
    problem = await r.json()
    assert problem["code"] == "validation_failed"
    for allowed in ("python", "node", "go"):
        assert allowed in problem["detail"]
    assert "java" in problem["detail"]
    assert problem["errors"][0]["field"] == "language"


async def test_create_refuses_non_json_content_type(client):
    r = await client.post(
        "/v1/sandboxes", data="language=go", headers={"Content-Type": "text/plain"}
    )
    assert r.status == 415
    assert (await r.json())["code"] == "unsupported_media_type"


async def test_malformed_json_is_400(client):
    r = await client.post(
        "/v1/sandboxes", data="{nope", headers={"Content-Type": "application/json"}
    )
    assert r.status == 400
    problem = await r.json()
    assert problem["code"] == "malformed_body"
    assert problem["status"] == 400
    assert problem["type"].endswith("malformed_body")


async def test_labels_are_kept_and_listed(client):
    made = await create(client, labels={"plugin": "vim", "project": "demo"})
    r = await client.get("/v1/sandboxes")
    assert r.status == 200
    listed = {s["id"]: s for s in (await r.json())["sandboxes"]}
    assert listed[made["id"]]["labels"] == {"plugin": "vim", "project": "demo"}


async def test_get_and_delete(client):
    made = await create(client)
    r = await client.get(f"/v1/sandboxes/{made['id']}")
    assert r.status == 200
    assert (await r.json())["id"] == made["id"]
    workspace = Path(made["workspace"])
    (workspace / "f.txt").write_text("x")
    r = await client.delete(f"/v1/sandboxes/{made['id']}")
    assert r.status == 204
    assert await r.read() == b""
    assert not workspace.exists()
    assert not workspace.parent.exists()
    r = await client.get(f"/v1/sandboxes/{made['id']}")
    assert r.status == 404
    assert (await r.json())["code"] == "sandbox_not_found"
    r = await client.delete(f"/v1/sandboxes/{made['id']}")
    assert r.status == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sandboxes/sb-nope"),
        ("DELETE", "/v1/sandboxes/sb-nope"),
        ("POST", "/v1/sandboxes/sb-nope/exec"),
        ("POST", "/v1/sandboxes/sb-nope/files"),
        ("POST", "/v1/sandboxes/sb-nope/upload"),
    ],
)
async def test_unknown_sandbox_is_404_everywhere(client, method, path):
    r = await client.request(method, path, json={"command": "true"})
    assert r.status == 404
    assert (await r.json())["code"] == "sandbox_not_found"


async def test_unknown_route_and_method_are_problems(client):
    r = await client.get("/v2/nothing")
    assert r.status == 404
    assert (await r.json())["code"] == "not_found"
    r = await client.put("/v1/sandboxes")
    assert r.status == 405
    assert (await r.json())["code"] == "method_not_allowed"


async def test_version_and_status(client):
    r = await client.get("/v1/version")
    assert r.status == 200
    from sandboxd import __version__

    assert (await r.json())["version"] == __version__
    await create(client)
    r = await client.get("/v1/status")
    body = await r.json()
    assert body["sandboxes"] == 1
    assert body["running_commands"] == 0


# -- single-file upload ---------------------------------------------------------


async def test_upload_file_lands_in_workspace_root(client):
    made = await create(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"print(1)\n", "main.py")
    )
    assert r.status == 201
    assert await r.json() == {"filename": "main.py", "path": "main.py", "size": 9}
    assert (Path(made["workspace"]) / "main.py").read_bytes() == b"print(1)\n"


async def test_upload_file_replaces_existing(client):
    made = await create(client)
    for content in (b"one", b"two"):
        r = await client.post(
            f"/v1/sandboxes/{made['id']}/files", data=form_with_file(content, "f.txt")
        )
        assert r.status == 201
    assert (Path(made["workspace"]) / "f.txt").read_bytes() == b"two"


async def test_upload_file_without_the_file_field(client):
    made = await create(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"x", "a.txt", field="other")
    )
    assert r.status == 400
    assert (await r.json())["code"] == "missing_file"


async def test_upload_file_as_json_is_415(client):
    made = await create(client)
    r = await client.post(f"/v1/sandboxes/{made['id']}/files", json={"file": "x"})
    assert r.status == 415


async def test_upload_file_onto_a_folder_is_409(client):
    made = await create(client)
    (Path(made["workspace"]) / "src").mkdir()
    r = await client.post(f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"x", "src"))
    assert r.status == 409
    assert (await r.json())["code"] == "path_conflict"


async def test_upload_leaves_no_temporary_files(client):
    made = await create(client)
    await client.post(f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"x", "../x"))
    await client.post(f"/v1/sandboxes/{made['id']}/files", data=form_with_file(b"x", "ok"))
    root = Path(made["workspace"]).parent
    assert list((root / "tmp").iterdir()) == []
    assert sorted(p.name for p in Path(made["workspace"]).iterdir()) == ["ok"]


# -- zip upload ----------------------------------------------------------------------


async def test_zip_upload_preserves_structure(client):
    made = await create(client)
    archive = make_zip(
        {"app.py": "x = 1\n", "tests/test_app.py": "def test(): pass\n", "pkg/sub/": ""}
    )
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/upload", data=form_with_file(archive, "project.zip")
    )
    assert r.status == 201
    body = await r.json()
    assert body["status"] == "uploaded"
    assert body["files"] == 2
    ws = Path(made["workspace"])
    assert (ws / "tests" / "test_app.py").read_text() == "def test(): pass\n"
    assert (ws / "pkg" / "sub").is_dir()


async def test_zip_upload_merges_into_existing_workspace(client):
    made = await create(client)
    ws = Path(made["workspace"])
    (ws / "keep.txt").write_text("kept")
    (ws / "app.py").write_text("old")
    archive = make_zip({"app.py": "new"})
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/upload", data=form_with_file(archive, "p.zip")
    )
    assert r.status == 201
    assert (ws / "keep.txt").read_text() == "kept"
    assert (ws / "app.py").read_text() == "new"


async def test_not_a_zip_is_422_and_says_so(client):
    made = await create(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/upload", data=form_with_file(b"just text", "p.zip")
    )
    assert r.status == 422
    problem = await r.json()
    assert problem["code"] == "invalid_archive"
    assert "not a zip" in problem["detail"]


async def test_refused_zip_leaves_workspace_as_it_was(client):
    made = await create(client)
    ws = Path(made["workspace"])
    (ws / "a.txt").write_text("before")
    archive = make_zip({"a.txt": "after", "good/file": "x", "../escape": "x"})
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/upload", data=form_with_file(archive, "p.zip")
    )
    assert r.status == 400
    assert (await r.json())["code"] == "unsafe_path"
    assert (ws / "a.txt").read_text() == "before"
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]


async def test_a_deleted_sandboxes_uid_is_not_handed_out_again_at_once(client):
    import json
    import os

    if os.geteuid() != 0:
        return  # only root gives each sandbox a uid of its own
    first = await create(client)
    record = Path(first["workspace"]).parent / "sandbox.json"
    first_uid = json.loads(record.read_text())["uid"]
    r = await client.delete(f"/v1/sandboxes/{first['id']}")
    assert r.status == 204
    second = await create(client)
    second_uid = json.loads((Path(second["workspace"]).parent / "sandbox.json").read_text())["uid"]
    assert second_uid != first_uid
    assert Path(second["workspace"]).stat().st_uid == second_uid
