"""archive: entry-name checks, the whole-archive plan, and extraction into staging."""

from __future__ import annotations

import io
import os
import random
import stat
import struct
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.archive import ArchiveLimits, Extracted, extract, plan, safe_member_path
from sandboxd.errors import ArchiveTooLarge, InvalidArchive, UnsafePath
from sandboxd.workspace import Owner
from tests.conftest import make_zip

LIMITS = ArchiveLimits(unpacked_bytes=10 * 1024 * 1024, entries=1000, path_bytes=1024)
MB = 1_000_000

# --------------------------------------------------------------------------- helpers

_CDH = b"PK\x01\x02"  # central directory file header
_EOCD = b"PK\x05\x06"  # end of central directory record


def _central_headers(data: bytes | bytearray) -> Iterator[int]:
    """Offsets of each central directory header, walked by their lengths."""
    eocd = bytes(data).rindex(_EOCD)
    (offset,) = struct.unpack_from("<I", data, eocd + 16)
    while bytes(data[offset : offset + 4]) == _CDH:
        yield offset
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, offset + 28)
        offset += 46 + name_len + extra_len + comment_len


def patch_central(data: bytes, index: int = 0, **fields: int) -> bytes:
    """Rewrite fields of one entry's central directory header (what zipfile trusts)."""
    layout = {
        "extract_version": (6, "<B"),
        "flag_bits": (8, "<H"),
        "crc": (16, "<I"),
        "compress_size": (20, "<I"),
        "file_size": (24, "<I"),
        "external_attr": (38, "<I"),
    }
    out = bytearray(data)
    offset = list(_central_headers(out))[index]
    for name, value in fields.items():
        at, fmt = layout[name]
        struct.pack_into(fmt, out, offset + at, value)
    return bytes(out)


def zip_of(
    entries: list[tuple[str, bytes, int]],
    compression: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A zip with exact names and Unix modes (duplicates allowed)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name" is what some tests want
        with zipfile.ZipFile(buf, "w", compression) as zf:
            for name, data, mode in entries:
                info = zipfile.ZipInfo(name)
                info.create_system = 3
                info.external_attr = mode << 16
                info.compress_type = compression
                zf.writestr(info, data)
    return buf.getvalue()


def open_zip(data: bytes) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data))


def run_extract(
    tmp_path: Path, data: bytes, limits: ArchiveLimits = LIMITS, owner: Owner | None = None
) -> tuple[Extracted, Path]:
    path = tmp_path / "upload.zip"
    path.write_bytes(data)
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    return extract(path, staging, limits, owner), staging


def tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file())


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --------------------------------------------------------------------------- safe_member_path


@pytest.mark.parametrize(
    ("raw", "parts", "is_dir"),
    [
        ("a.txt", ("a.txt",), False),
        ("dir/", ("dir",), True),
        ("a/b/c.txt", ("a", "b", "c.txt"), False),
        ("a\\b.txt", ("a", "b.txt"), False),
        ("dir\\", ("dir",), True),
        ("é/ü 1.txt", ("é", "ü 1.txt"), False),
        (".hidden", (".hidden",), False),
        ("...", ("...",), False),
        ("..a/b..", ("..a", "b.."), False),
        ("ab:c", ("ab:c",), False),
        ("d/C:x", ("d", "C:x"), False),
    ],
)
def test_safe_member_path_accepts(raw: str, parts: tuple[str, ...], is_dir: bool) -> None:
    assert safe_member_path(raw, LIMITS) == (parts, is_dir)


@pytest.mark.parametrize(
    "raw",
    [
        "/etc/passwd",
        "\\etc\\passwd",
        "//server/share",
        "../x",
        "a/../b",
        "a/b/..",
        "..",
        "..\\x",
        "a\\..\\b",
        "C:x",
        "c:\\windows\\x",
        "C:/x",
        "a\x00b",
        "",
        "/",
        "a//b",
        ".",
        "./a",
        "a/./b",
        "a/.",
    ],
)
def test_safe_member_path_refuses(raw: str) -> None:
    with pytest.raises(UnsafePath):
        safe_member_path(raw, LIMITS)


def test_path_length_limit_is_in_bytes_and_inclusive() -> None:
    limits = ArchiveLimits(unpacked_bytes=MB, entries=10, path_bytes=100)
    assert safe_member_path("a" * 100, limits) == (("a" * 100,), False)
    assert safe_member_path("d/" + "a" * 98, limits) == (("d", "a" * 98), False)
    with pytest.raises(UnsafePath, match="longer than 100 bytes"):
        safe_member_path("a" * 101, limits)
    # 60 characters, 120 bytes
    with pytest.raises(UnsafePath):
        safe_member_path("é" * 60, limits)


def test_component_limit_is_255_bytes() -> None:
    assert safe_member_path("d/" + "a" * 255, LIMITS) == (("d", "a" * 255), False)
    with pytest.raises(UnsafePath, match="255"):
        safe_member_path("d/" + "a" * 256 + "/x", LIMITS)
    # 128 characters, 256 bytes
    with pytest.raises(UnsafePath, match="255"):
        safe_member_path("é" * 128, LIMITS)


# --------------------------------------------------------------------------- plan


def test_plan_returns_parts_and_kinds() -> None:
    data = zip_of(
        [
            ("top/", b"", 0o040755),
            ("top/a.txt", b"a", 0o100644),
            ("bydir", b"", 0o040755),  # a folder by mode bits only, no trailing slash
            ("nomode.txt", b"x", 0),  # no Unix mode recorded (a DOS zipper)
        ]
    )
    with open_zip(data) as zf:
        got = [(parts, is_dir) for _, parts, is_dir in plan(zf, LIMITS)]
    assert got == [
        (("top",), True),
        (("top", "a.txt"), False),
        (("bydir",), True),
        (("nomode.txt",), False),
    ]


def test_plan_refuses_symlink_entries() -> None:
    data = make_zip({"ok.txt": "fine"}, symlinks={"link": "/etc/passwd"})
    with open_zip(data) as zf, pytest.raises(UnsafePath, match="symbolic link"):
        plan(zf, LIMITS)


@pytest.mark.parametrize(
    "mode",
    [stat.S_IFIFO | 0o644, stat.S_IFCHR | 0o644, stat.S_IFBLK | 0o644, stat.S_IFSOCK | 0o644],
    ids=["fifo", "chardev", "blockdev", "socket"],
)
def test_plan_refuses_special_files(mode: int) -> None:
    data = zip_of([("ok.txt", b"x", 0o100644), ("special", b"", mode)])
    with open_zip(data) as zf, pytest.raises(UnsafePath, match="special file"):
        plan(zf, LIMITS)


def test_plan_refuses_encrypted_entries() -> None:
    data = zip_of([("a.txt", b"a", 0o100644), ("secret.txt", b"s", 0o100644)])
    data = patch_central(data, 1, flag_bits=0x1)
    with open_zip(data) as zf:
        assert zf.infolist()[1].flag_bits & 0x1  # the patch took
        with pytest.raises(InvalidArchive, match="encrypted"):
            plan(zf, LIMITS)


@pytest.mark.parametrize(
    "names",
    [["a.txt", "a.txt"], ["d/a.txt", "d\\a.txt"], ["x", "d/y", "x"]],
)
def test_plan_refuses_duplicate_files(names: list[str]) -> None:
    data = zip_of([(name, b"x", 0o100644) for name in names])
    with open_zip(data) as zf, pytest.raises(InvalidArchive, match="twice"):
        plan(zf, LIMITS)


def test_plan_allows_repeated_folder_entries() -> None:
    data = zip_of([("d/", b"", 0o040755), ("d/", b"", 0o040755), ("d/f", b"x", 0o100644)])
    with open_zip(data) as zf:
        assert len(plan(zf, LIMITS)) == 3


@pytest.mark.parametrize(
    "entries",
    [
        [("a", 0o100644), ("a/b", 0o100644)],
        [("a/b", 0o100644), ("a", 0o100644)],
        [("a", 0o100644), ("a/", 0o040755)],
        [("a/", 0o040755), ("a", 0o100644)],
        [("x/a", 0o100644), ("x/a/b/c", 0o100644)],
    ],
)
def test_plan_refuses_name_that_is_file_and_folder(entries: list[tuple[str, int]]) -> None:
    data = zip_of([(name, b"" if mode & stat.S_IFDIR else b"x", mode) for name, mode in entries])
    with open_zip(data) as zf, pytest.raises(InvalidArchive, match="both as a file"):
        plan(zf, LIMITS)


def test_plan_entry_count_limit() -> None:
    limits = ArchiveLimits(unpacked_bytes=MB, entries=3, path_bytes=100)
    three = zip_of([(f"f{i}", b"x", 0o100644) for i in range(3)])
    four = zip_of([(f"f{i}", b"x", 0o100644) for i in range(4)])
    with open_zip(three) as zf:
        assert len(plan(zf, limits)) == 3
    with open_zip(four) as zf, pytest.raises(ArchiveTooLarge, match="4 entries"):
        plan(zf, limits)


def test_plan_checks_names_of_every_entry() -> None:
    data = zip_of([("fine.txt", b"x", 0o100644), ("..\\evil", b"x", 0o100644)])
    with open_zip(data) as zf, pytest.raises(UnsafePath):
        plan(zf, LIMITS)


# --------------------------------------------------------------------------- extract


def test_extract_writes_files_and_folders(tmp_path: Path) -> None:
    data = zip_of(
        [
            ("empty/", b"", 0o040755),
            ("src/pkg/mod.py", b"print('hi')\n", 0o100644),
            ("src/run.sh", b"#!/bin/sh\necho run\n", 0o100755),
            ("README", b"read me", 0o100644),
        ]
    )
    result, staging = run_extract(tmp_path, data)
    assert result == Extracted(files=3, bytes=12 + 19 + 7)
    assert listing(staging) == [
        "README",
        "empty",
        "src",
        "src/pkg",
        "src/pkg/mod.py",
        "src/run.sh",
    ]
    assert (staging / "empty").is_dir()
    assert (staging / "src/pkg/mod.py").read_bytes() == b"print('hi')\n"
    assert (staging / "README").read_bytes() == b"read me"
    run_mode = (staging / "src/run.sh").stat().st_mode
    plain_mode = (staging / "README").stat().st_mode
    assert run_mode & 0o100, oct(run_mode)
    assert plain_mode & 0o111 == 0, oct(plain_mode)
    # nothing from the archive's mode bits beyond rwx/r-x: no setuid, no world-write
    assert run_mode & (stat.S_ISUID | stat.S_ISGID | 0o002) == 0


def test_extract_never_keeps_setuid_or_world_writable_bits(tmp_path: Path) -> None:
    data = zip_of([("suid", b"x", 0o104777), ("ww", b"y", 0o100666)])
    _, staging = run_extract(tmp_path, data)
    for name in ("suid", "ww"):
        mode = stat.S_IMODE((staging / name).stat().st_mode)
        assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o002) == 0, oct(mode)


def test_extract_with_make_zip_helper(tmp_path: Path) -> None:
    result, staging = run_extract(tmp_path, make_zip({"a/b.txt": "héllo", "c/": b""}))
    assert result == Extracted(files=1, bytes=len("héllo".encode()))
    assert (staging / "a/b.txt").read_text() == "héllo"
    assert (staging / "c").is_dir()


def test_extract_refuses_before_writing_anything(tmp_path: Path) -> None:
    data = zip_of([("first.txt", b"ok", 0o100644), ("a/../../escape", b"bad", 0o100644)])
    with pytest.raises(UnsafePath):
        run_extract(tmp_path, data)
    assert listing(tmp_path / "staging") == []
    assert not (tmp_path / "escape").exists()


def test_extract_refuses_symlink_without_creating_it(tmp_path: Path) -> None:
    data = make_zip({"a.txt": "x"}, symlinks={"link": "/etc/passwd"})
    with pytest.raises(UnsafePath):
        run_extract(tmp_path, data)
    assert listing(tmp_path / "staging") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_extract_gives_the_tree_to_the_owner(tmp_path: Path) -> None:
    data = zip_of([("d/", b"", 0o040755), ("d/e/f.txt", b"x", 0o100644)])
    _, staging = run_extract(tmp_path, data, owner=Owner(4242, 4343))
    for path in (staging / "d", staging / "d/e", staging / "d/e/f.txt"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (4242, 4343), path


# zip bombs


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """50 MB of zeros, deflated to about 50 KB, with honest headers."""
    return zip_of([("zeros.bin", bytes(50 * MB), 0o100644)])


def test_zip_bomb_is_small_on_the_wire(bomb: bytes) -> None:
    assert len(bomb) < 200_000


def test_zip_bomb_refused_at_the_limit(tmp_path: Path, bomb: bytes) -> None:
    limits = ArchiveLimits(unpacked_bytes=MB, entries=10, path_bytes=100)
    with pytest.raises(ArchiveTooLarge):
        run_extract(tmp_path, bomb, limits)
    assert tree_bytes(tmp_path / "staging") <= MB


def test_zip_bomb_refused_while_decompressing(
    tmp_path: Path, bomb: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit stops the decompression itself: far less than 50 MB is ever inflated."""
    inflated = 0
    real_read = zipfile.ZipExtFile.read

    def counting_read(self: zipfile.ZipExtFile, n: int = -1) -> bytes:
        nonlocal inflated
        data = real_read(self, n)
        inflated += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting_read)
    limits = ArchiveLimits(unpacked_bytes=MB, entries=10, path_bytes=100)
    with pytest.raises(ArchiveTooLarge):
        run_extract(tmp_path, bomb, limits)
    assert 0 < inflated <= 4 * MB


def test_zip_bomb_with_lying_central_directory(tmp_path: Path, bomb: bytes) -> None:
    """file_size in the central directory claims 1000 bytes; the entry inflates to 50 MB."""
    lying = patch_central(bomb, 0, file_size=1000)
    with open_zip(lying) as zf:
        assert zf.infolist()[0].file_size == 1000  # what a header-trusting check would see
    limits = ArchiveLimits(unpacked_bytes=MB, entries=10, path_bytes=100)
    with pytest.raises(InvalidArchive):
        run_extract(tmp_path, lying, limits)
    assert tree_bytes(tmp_path / "staging") <= MB


def test_limit_counts_total_over_all_entries(tmp_path: Path) -> None:
    """Every entry is under the limit; together they are over it."""
    entries = [(f"part{i}.bin", bytes(300_000), 0o100644) for i in range(5)]
    limits = ArchiveLimits(unpacked_bytes=MB, entries=10, path_bytes=100)
    with pytest.raises(ArchiveTooLarge):
        run_extract(tmp_path, zip_of(entries), limits)
    assert tree_bytes(tmp_path / "staging") <= MB


def test_limit_is_inclusive(tmp_path: Path) -> None:
    limits = ArchiveLimits(unpacked_bytes=1000, entries=10, path_bytes=100)
    data = zip_of([("a", bytes(600), 0o100644), ("b", bytes(400), 0o100644)])
    result, _ = run_extract(tmp_path, data, limits)
    assert result == Extracted(files=2, bytes=1000)
    over = zip_of([("a", bytes(600), 0o100644), ("b", bytes(401), 0o100644)])
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ArchiveTooLarge):
        run_extract(other, over, limits)


# not a zip, broken zips


@pytest.mark.parametrize("data", [b"this is plain text, not a zip", b"", b"PK\x03\x04junk"])
def test_not_a_zip(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(InvalidArchive, match="not a zip") as info:
        run_extract(tmp_path, data)
    assert not isinstance(info.value, ArchiveTooLarge)


def test_bad_crc_is_invalid_archive(tmp_path: Path) -> None:
    data = zip_of([("a.txt", b"hello world" * 10, 0o100644)], compression=zipfile.ZIP_STORED)
    data = patch_central(data, 0, crc=0xDEADBEEF)
    with pytest.raises(InvalidArchive, match=r"a\.txt"):
        run_extract(tmp_path, data)


def _corrupt_first_entry_data(data: bytes) -> bytes:
    """Flip 16 bytes early in the first entry's compressed data (past any stream header)."""
    out = bytearray(data)
    name_len, extra_len = struct.unpack_from("<HH", out, 26)
    start = 30 + name_len + extra_len + 16
    for i in range(start, start + 16):
        out[i] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize(
    "compression",
    [
        pytest.param(
            zipfile.ZIP_DEFLATED,
            id="deflate",
        ),
        pytest.param(
            zipfile.ZIP_BZIP2,
            id="bzip2",
        ),
        pytest.param(
            zipfile.ZIP_LZMA,
            id="lzma",
        ),
    ],
)
def test_corrupt_compressed_data_is_invalid_archive(tmp_path: Path, compression: int) -> None:
    content = random.Random(0).randbytes(4000) * 3
    data = zip_of([("a.txt", content, 0o100644)], compression=compression)
    with pytest.raises(InvalidArchive):
        run_extract(tmp_path, _corrupt_first_entry_data(data))


def test_unsupported_zip_version_is_invalid_archive(tmp_path: Path) -> None:
    data = patch_central(zip_of([("a.txt", b"a", 0o100644)]), 0, extract_version=100)
    with pytest.raises(InvalidArchive):
        run_extract(tmp_path, data)


def test_bad_utf8_name_is_invalid_archive(tmp_path: Path) -> None:
    data = zip_of([("aXb.txt", b"a", 0o100644)])
    data = patch_central(data, 0, flag_bits=0x800).replace(b"aXb.txt", b"a\xffb.txt")
    with pytest.raises(InvalidArchive):
        run_extract(tmp_path, data)


def test_corrupt_directory_offset_is_invalid_archive(tmp_path: Path) -> None:
    data = bytearray(zip_of([("a.txt", b"a" * 100, 0o100644)]))
    eocd = bytes(data).rindex(_EOCD)
    (offset,) = struct.unpack_from("<I", data, eocd + 16)
    struct.pack_into("<I", data, eocd + 16, offset + 1000)
    with pytest.raises(InvalidArchive):
        run_extract(tmp_path, bytes(data))


def test_many_folders_do_not_exhaust_descriptors(tmp_path: Path) -> None:
    # More folders than the daemon could keep open at once (RLIMIT_NOFILE is
    # often 1024): the staging folders' descriptors are reused, not piled up.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(1500):
            zf.writestr(f"d{i % 300}/sub{i}/f.txt", str(i))
    staging = tmp_path / "staging"
    staging.mkdir()
    archive = tmp_path / "a.zip"
    archive.write_bytes(buf.getvalue())
    before = len(os.listdir("/proc/self/fd"))
    result = extract(archive, staging, ArchiveLimits(10**9, 10**5, 1024), None)
    assert result.files == 1500
    assert (staging / "d7" / "sub1207" / "f.txt").read_text() == "1207"
    assert len(os.listdir("/proc/self/fd")) == before
