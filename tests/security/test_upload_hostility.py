"""Hostile uploads over HTTP: refused with the right problem, and nothing written anywhere."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import struct
import warnings
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sandboxd.config import MiB, Settings
from tests.conftest import Daemon, form_with_file, make_zip
from tests.security.conftest import ClientFactory
from tests.security.helpers import create_sandbox, expect_problem, raw_multipart, run, snapshot


async def _seed(client: Any, sandbox: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Put known content in the workspace and return its snapshot."""
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(make_zip({"keep.txt": "keep\n", "src/mod.py": "x = 1\n"}), "p.zip"),
    )
    assert r.status == 201, await r.text()
    before = snapshot(Path(sandbox["workspace"]))
    assert set(before) == {"keep.txt", "src", "src/mod.py"}
    return before


def _sandbox_root(sandbox: dict[str, Any]) -> Path:
    return Path(sandbox["workspace"]).parent


def _assert_untouched(sandbox: dict[str, Any], before: dict[str, tuple[Any, ...]]) -> None:
    root = _sandbox_root(sandbox)
    assert snapshot(Path(sandbox["workspace"])) == before
    # Next to the workspace: only what the daemon made; its private tmp is empty again.
    assert sorted(os.listdir(root)) == ["home", "sandbox.json", "tmp", "workspace"]
    assert os.listdir(root / "tmp") == []
    assert os.listdir(root / "home") == []


# -- single files -------------------------------------------------------------------


@pytest.mark.parametrize(
    "disposition",
    [
        'form-data; name="file"; filename="../x"',
        'form-data; name="file"; filename="../../../../../../tmp/sandboxd-sec-x"',
        'form-data; name="file"; filename="/etc/x"',
        'form-data; name="file"; filename=".."',
        'form-data; name="file"; filename="."',
        'form-data; name="file"; filename=""',
        'form-data; name="file"',
        'form-data; name="file"; filename="a\\\\b"',  # on the wire a\\b: the name a\b
        'form-data; name="file"; filename="..\\\\x"',
        'form-data; name="file"; filename="sub/x"',
        "form-data; name=\"file\"; filename*=UTF-8''..%2Fx",
        "form-data; name=\"file\"; filename*=UTF-8''%2Fetc%2Fx",
        f'form-data; name="file"; filename="{"n" * 256}"',
    ],
)
async def test_single_file_unsafe_names_are_refused(
    client: Any, sandbox: dict[str, Any], disposition: str
) -> None:
    before = await _seed(client, sandbox)
    body, content_type = raw_multipart(disposition, b"evil\n")
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=body, headers={"Content-Type": content_type}
    )
    await expect_problem(r, 400, "unsafe_path")
    _assert_untouched(sandbox, before)
    root = _sandbox_root(sandbox)
    for where in (root / "x", root.parent / "x", Path("/etc/x"), Path("/tmp/sandboxd-sec-x")):
        assert not os.path.lexists(where), where


async def test_single_file_plain_name_is_accepted(client: Any, sandbox: dict[str, Any]) -> None:
    # The control for the refusals above: the same request with a plain name works.
    body, content_type = raw_multipart('form-data; name="file"; filename="ok.txt"', b"fine\n")
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=body, headers={"Content-Type": content_type}
    )
    assert r.status == 201, await r.text()
    body = await r.json()
    assert (body["filename"], body["size"], body.get("path", "ok.txt")) == ("ok.txt", 5, "ok.txt")
    assert (Path(sandbox["workspace"]) / "ok.txt").read_bytes() == b"fine\n"


# -- archives -----------------------------------------------------------------------


def _zip_with_entries(entries: list[tuple[str, bytes, int]]) -> bytes:
    """A zip with entries written exactly as given: (name, data, external_attr)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name" is the point of one case
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data, attr in entries:
                info = zipfile.ZipInfo(name)
                info.external_attr = attr
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
    return buf.getvalue()


FILE = 0o100644 << 16
LINK = 0o120777 << 16
FIFO = 0o010644 << 16
GOOD = ("good.txt", b"good\n", FILE)


@pytest.mark.parametrize(
    ("entries", "status", "code"),
    [
        pytest.param([GOOD, ("../evil", b"x", FILE)], 400, "unsafe_path", id="dotdot"),
        pytest.param([GOOD, ("/abs", b"x", FILE)], 400, "unsafe_path", id="absolute"),
        pytest.param([GOOD, ("/tmp/sandboxd-sec-x", b"x", FILE)], 400, "unsafe_path", id="abs2"),
        pytest.param([GOOD, ("C:evil", b"x", FILE)], 400, "unsafe_path", id="drive"),
        pytest.param([GOOD, ("C:\\evil", b"x", FILE)], 400, "unsafe_path", id="drive-bs"),
        pytest.param([GOOD, ("a/../../x", b"x", FILE)], 400, "unsafe_path", id="inner-dotdot"),
        pytest.param([GOOD, ("..\\evil", b"x", FILE)], 400, "unsafe_path", id="backslash"),
        pytest.param([GOOD, ("a/./b", b"x", FILE)], 400, "unsafe_path", id="dot"),
        pytest.param([GOOD, ("a//b", b"x", FILE)], 400, "unsafe_path", id="empty-part"),
        pytest.param([GOOD, ("link", b"/etc/passwd", LINK)], 400, "unsafe_path", id="symlink"),
        pytest.param([GOOD, ("dirlink", b"/", LINK)], 400, "unsafe_path", id="symlink-dir"),
        pytest.param([GOOD, ("fifo", b"", FIFO)], 400, "unsafe_path", id="fifo"),
        pytest.param([GOOD, ("a" * 300, b"x", FILE)], 400, "unsafe_path", id="long-name"),
        pytest.param(
            [GOOD, ("dup.txt", b"one", FILE), ("dup.txt", b"two", FILE)],
            422,
            "invalid_archive",
            id="duplicate",
        ),
        pytest.param(
            [GOOD, ("both", b"file", FILE), ("both/inner", b"x", FILE)],
            422,
            "invalid_archive",
            id="file-and-folder",
        ),
        pytest.param(
            [GOOD, ("keep.txt/x", b"x", FILE)], 409, "path_conflict", id="file-in-workspace"
        ),
        pytest.param([GOOD, ("src", b"x", FILE)], 409, "path_conflict", id="folder-in-workspace"),
    ],
)
async def test_hostile_archive_is_refused_and_changes_nothing(
    client: Any,
    sandbox: dict[str, Any],
    entries: list[tuple[str, bytes, int]],
    status: int,
    code: str,
) -> None:
    before = await _seed(client, sandbox)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(_zip_with_entries(entries), "evil.zip"),
    )
    await expect_problem(r, status, code)
    _assert_untouched(sandbox, before)
    root = _sandbox_root(sandbox)
    for where in (root / "evil", root.parent / "evil", Path("/abs"), Path("/tmp/sandboxd-sec-x")):
        assert not os.path.lexists(where), where


async def test_good_archive_is_accepted(client: Any, sandbox: dict[str, Any]) -> None:
    # The control: the same helpers with harmless entries succeed.
    before = await _seed(client, sandbox)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload",
        data=form_with_file(_zip_with_entries([GOOD, ("src/b.py", b"y\n", FILE)]), "ok.zip"),
    )
    assert r.status == 201, await r.text()
    after = snapshot(Path(sandbox["workspace"]))
    assert set(after) == set(before) | {"good.txt", "src/b.py"}


async def test_zip_bomb_stops_at_the_limit(make_client: ClientFactory) -> None:
    client = await make_client(archive_unpacked_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    before = await _seed(client, sandbox)
    bomb = _zip_with_entries([GOOD, ("zeros.bin", b"\0" * (64 * MiB), FILE)])
    assert len(bomb) < 200_000
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(bomb, "bomb.zip")
    )
    await expect_problem(r, 413, "archive_too_large")
    _assert_untouched(sandbox, before)


async def test_zip_bomb_spread_over_many_small_entries(make_client: ClientFactory) -> None:
    client = await make_client(archive_unpacked_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    before = await _seed(client, sandbox)
    bomb = _zip_with_entries([(f"z{i}.bin", b"\0" * (256 * 1024), FILE) for i in range(8)])
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(bomb, "bomb.zip")
    )
    await expect_problem(r, 413, "archive_too_large")
    _assert_untouched(sandbox, before)


async def test_too_many_entries(make_client: ClientFactory) -> None:
    client = await make_client(archive_entries=10)
    sandbox = await create_sandbox(client)
    before = await _seed(client, sandbox)
    many = _zip_with_entries([(f"f{i}", b"", FILE) for i in range(11)])
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(many, "many.zip")
    )
    await expect_problem(r, 413, "archive_too_large")
    _assert_untouched(sandbox, before)


def _lie_about_size(data: bytes, claimed: int) -> bytes:
    """Rewrite every uncompressed-size field (local and central headers) to ``claimed``."""
    out = bytearray(data)
    pos = 0
    while (pos := out.find(b"PK\x03\x04", pos)) != -1:
        struct.pack_into("<I", out, pos + 22, claimed)
        pos += 4
    pos = 0
    while (pos := out.find(b"PK\x01\x02", pos)) != -1:
        struct.pack_into("<I", out, pos + 24, claimed)
        pos += 4
    return bytes(out)


async def test_zip_whose_headers_understate_the_size(make_client: ClientFactory) -> None:
    # Limits are counted while decompressing, never taken from the headers.
    client = await make_client(archive_unpacked_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    before = await _seed(client, sandbox)
    liar = _lie_about_size(_zip_with_entries([("zeros.bin", b"\0" * (64 * MiB), FILE)]), 10)
    assert zipfile.ZipFile(io.BytesIO(liar)).infolist()[0].file_size == 10
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(liar, "liar.zip")
    )
    # zipfile stops at the declared size, and the CRC then fails: an invalid archive.
    await expect_problem(r, 422, "invalid_archive")
    _assert_untouched(sandbox, before)


@pytest.mark.parametrize(
    "payload",
    [
        b"not a zip at all",
        b"",
        b"PK\x03\x04" + b"\0" * 100,
        make_zip({"a.txt": os.urandom(4000)})[:2000],  # truncated
    ],
    ids=["text", "empty", "bad-header", "truncated"],
)
async def test_not_a_zip(client: Any, sandbox: dict[str, Any], payload: bytes) -> None:
    before = await _seed(client, sandbox)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(payload, "x.zip")
    )
    await expect_problem(r, 422, "invalid_archive")
    _assert_untouched(sandbox, before)


async def test_encrypted_zip_is_refused(client: Any, sandbox: dict[str, Any]) -> None:
    before = await _seed(client, sandbox)
    data = bytearray(_zip_with_entries([GOOD]))
    # Set the "encrypted" flag bit in both headers.
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        pos = data.find(sig)
        struct.pack_into("<H", data, pos + off, struct.unpack_from("<H", data, pos + off)[0] | 1)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/upload", data=form_with_file(bytes(data), "enc.zip")
    )
    await expect_problem(r, 422, "invalid_archive")
    _assert_untouched(sandbox, before)


# -- request bodies over the limits -------------------------------------------------

BOUNDARY = "sandboxd-sec-boundary"


class Sender:
    """A chunked multipart body of ``total`` bytes of file data, counting what was taken."""

    def __init__(self, total: int, chunk: int = 256 * 1024, junk_field: int = 0) -> None:
        self.total = total
        self.chunk = chunk
        self.junk_field = junk_field
        self.sent = 0
        self.finished = False

    async def body(self) -> AsyncIterator[bytes]:
        if self.junk_field:
            yield (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="junk"\r\n\r\n').encode()
            left = self.junk_field
            while left > 0:
                n = min(self.chunk, left)
                left -= n
                self.sent += n
                yield b"j" * n
            yield b"\r\n"
        yield (
            f"--{BOUNDARY}\r\n"
            'Content-Disposition: form-data; name="file"; filename="big.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        left = self.total
        while left > 0:
            n = min(self.chunk, left)
            left -= n
            self.sent += n
            yield b"\0" * n
            await asyncio.sleep(0)
        yield f"\r\n--{BOUNDARY}--\r\n".encode()
        self.finished = True

    headers: ClassVar[dict[str, str]] = {
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"
    }


async def _post_streaming(http: Any, url: str, sender: Sender) -> tuple[int, dict[str, Any]]:
    r = await http.post(url, data=sender.body(), headers=Sender.headers)
    body = await r.json(content_type=None)
    return r.status, body


@pytest.mark.parametrize("endpoint", ["files", "upload"])
async def test_chunked_upload_over_the_limit_is_cut_off_early(
    daemon_factory: Daemon, endpoint: str
) -> None:
    (daemon_factory.root / "config.toml").write_text("[limits]\nupload_bytes = 1048576\n")
    daemon_factory.start()
    async with daemon_factory.session() as http:
        sandbox = await create_sandbox(http)
        before = snapshot(Path(sandbox["workspace"]))
        sender = Sender(50 * MiB)
        status, body = await asyncio.wait_for(
            _post_streaming(http, f"/v1/sandboxes/{sandbox['id']}/{endpoint}", sender), 30
        )
        assert (status, body["code"]) == (413, "payload_too_large"), body
        # The daemon stopped reading near the limit, long before the 50 MB were sent.
        assert not sender.finished
        assert sender.sent < 10 * MiB, sender.sent
        _assert_untouched(sandbox, before)
        # And it still serves.
        assert (await run(http, sandbox["id"], "echo alive"))["stdout"] == "alive\n"


async def test_chunked_upload_over_the_limit_in_process(make_client: ClientFactory) -> None:
    client = await make_client(upload_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    before = snapshot(Path(sandbox["workspace"]))
    sender = Sender(50 * MiB)
    status, body = await asyncio.wait_for(
        _post_streaming(client, f"/v1/sandboxes/{sandbox['id']}/files", sender), 30
    )
    assert (status, body["code"]) == (413, "payload_too_large"), body
    assert not sender.finished
    assert sender.sent < 10 * MiB, sender.sent
    _assert_untouched(sandbox, before)


async def test_declared_length_over_the_limit_is_refused_before_reading(
    make_client: ClientFactory,
) -> None:
    client = await make_client(upload_bytes=1 * MiB)
    sandbox = await create_sandbox(client)
    payload = b"\0" * (3 * MiB)
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=form_with_file(payload, "big.bin")
    )
    await expect_problem(r, 413, "payload_too_large")
    assert os.listdir(sandbox["workspace"]) == []


async def test_huge_leading_field_is_cut_off_early(daemon_factory: Daemon) -> None:
    (daemon_factory.root / "config.toml").write_text("[limits]\nupload_bytes = 1048576\n")
    daemon_factory.start()
    async with daemon_factory.session() as http:
        sandbox = await create_sandbox(http)
        sender = Sender(10, junk_field=50 * MiB)
        status, body = await asyncio.wait_for(
            _post_streaming(http, f"/v1/sandboxes/{sandbox['id']}/files", sender), 60
        )
        assert not sender.finished, (status, body)
        assert (status, body["code"]) == (413, "payload_too_large"), body


async def test_json_body_over_the_limit(client: Any, sandbox: dict[str, Any]) -> None:
    huge = {"command": "echo " + "a" * (2 * MiB)}
    r = await client.post(f"/v1/sandboxes/{sandbox['id']}/exec", json=huge)
    await expect_problem(r, 413, "payload_too_large")
    r = await client.post("/v1/sandboxes", json={"labels": {"k": "v" * (2 * MiB)}})
    await expect_problem(r, 413, "payload_too_large")


async def test_chunked_json_body_over_the_limit(client: Any, sandbox: dict[str, Any]) -> None:
    taken = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal taken
        yield b'{"command": "echo '
        for _ in range(200):  # 50 MB
            taken += 256 * 1024
            yield b"a" * (256 * 1024)
            await asyncio.sleep(0)
        yield b'"}'

    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec",
        data=body(),
        headers={"Content-Type": "application/json"},
    )
    await expect_problem(r, 413, "payload_too_large")
    assert taken < 10 * MiB, taken


# -- content types ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content_type", "data"),
    [
        ("files", "application/json", b'{"file": "x"}'),
        ("files", "application/octet-stream", b"raw bytes"),
        ("upload", "application/zip", make_zip({"a": "b"})),
        ("upload", "text/plain", b"hello"),
        ("exec", "text/plain", b'{"command": "true"}'),
        ("exec", "application/x-www-form-urlencoded", b"command=true"),
        ("exec", "multipart/form-data; boundary=x", b"--x--\r\n"),
    ],
)
async def test_wrong_content_type(
    client: Any, sandbox: dict[str, Any], path: str, content_type: str, data: bytes
) -> None:
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/{path}", data=data, headers={"Content-Type": content_type}
    )
    await expect_problem(r, 415, "unsupported_media_type")
    assert os.listdir(sandbox["workspace"]) == []


async def test_create_with_wrong_content_type(client: Any, settings: Settings) -> None:
    r = await client.post(
        "/v1/sandboxes", data=b'{"language": "python"}', headers={"Content-Type": "text/plain"}
    )
    await expect_problem(r, 415, "unsupported_media_type")
    assert os.listdir(settings.data_dir / "sandboxes") == []


async def test_multipart_without_file_field(client: Any, sandbox: dict[str, Any]) -> None:
    body, content_type = raw_multipart('form-data; name="other"; filename="a.txt"', b"x")
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/files", data=body, headers={"Content-Type": content_type}
    )
    await expect_problem(r, 400, "missing_file")
    assert os.listdir(sandbox["workspace"]) == []


async def test_upload_to_unknown_sandbox_reads_nothing(client: Any) -> None:
    name = f"sb-{secrets.token_hex(8)}"
    r = await client.post(f"/v1/sandboxes/{name}/files", data=form_with_file(b"x", "a.txt"))
    await expect_problem(r, 404, "sandbox_not_found")
    r = await client.post("/v1/sandboxes/..%2F..%2Fetc/upload", data=form_with_file(b"x", "a"))
    await expect_problem(r, 404, "sandbox_not_found")
