"""Zip validation and extraction into a staging folder.

Nothing from the archive touches the workspace until every entry has been
checked and written out: workspace.merge_tree moves the result into place.
Limits on bytes are counted while decompressing, never trusted from the
headers, so a zip bomb stops at the limit.
"""

from __future__ import annotations

import errno
import lzma
import os
import re
import stat
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import ArchiveTooLarge, InvalidArchive, UnsafePath
from sandboxd.workspace import NAME_MAX, Owner

_CHUNK = 1024 * 1024
_OPEN_FOLDERS = 64
_DIR_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ArchiveLimits:
    unpacked_bytes: int
    entries: int
    path_bytes: int


@dataclass(frozen=True)
class Extracted:
    files: int
    bytes: int


def safe_member_path(raw: str, limits: ArchiveLimits) -> tuple[tuple[str, ...], bool]:
    """Split an entry name into checked components; also say whether it is a folder.

    Backslashes count as separators (old Windows zippers write them), so
    ``..\\x`` is caught like ``../x``.
    """
    if "\x00" in raw:
        raise UnsafePath(f"Archive entry {raw!r} has a NUL byte in its name.")
    name = raw.replace("\\", "/")
    if len(name.encode("utf-8", "surrogateescape")) > limits.path_bytes:
        raise UnsafePath(f"Archive entry {raw[:80]!r}... is longer than {limits.path_bytes} bytes.")
    if name.startswith("/"):
        raise UnsafePath(f"Archive entry {raw!r} is an absolute path.")
    if _DRIVE.match(name):
        raise UnsafePath(f"Archive entry {raw!r} starts with a drive letter.")
    is_dir = name.endswith("/")
    parts = tuple(name.rstrip("/").split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(f"Archive entry {raw!r} has an empty, '.' or '..' path component.")
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise UnsafePath(f"Archive entry {raw!r} has a component longer than {NAME_MAX} bytes.")
    return parts, is_dir


def _entry_type(info: zipfile.ZipInfo) -> int:
    """The file type bits a Unix zipper recorded (0 when none were)."""
    return stat.S_IFMT(info.external_attr >> 16)


Entry = tuple[zipfile.ZipInfo, tuple[str, ...], bool]


def plan(zf: zipfile.ZipFile, limits: ArchiveLimits) -> list[Entry]:
    """Check every entry before anything is written; return (info, parts, is_dir)."""
    infos = zf.infolist()
    if len(infos) > limits.entries:
        raise ArchiveTooLarge(
            f"The archive has {len(infos)} entries; the limit is {limits.entries}."
        )
    entries: list[Entry] = []
    files: set[tuple[str, ...]] = set()
    dirs: set[tuple[str, ...]] = set()
    for info in infos:
        parts, is_dir = safe_member_path(info.filename, limits)
        kind = _entry_type(info)
        if kind == stat.S_IFLNK:
            raise UnsafePath(
                f"Archive entry {info.filename!r} is a symbolic link; links are refused."
            )
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise UnsafePath(f"Archive entry {info.filename!r} is a special file; it is refused.")
        is_dir = is_dir or kind == stat.S_IFDIR
        if info.flag_bits & 0x1:
            raise InvalidArchive(
                f"Archive entry {info.filename!r} is encrypted; encrypted zips are refused."
            )
        if is_dir:
            dirs.add(parts)
        else:
            if parts in files:
                raise InvalidArchive(f"The archive holds {info.filename!r} twice.")
            files.add(parts)
        for i in range(1, len(parts)):
            dirs.add(parts[:i])
        entries.append((info, parts, is_dir))
    clash = files & dirs
    if clash:
        name = "/".join(sorted(clash)[0])
        raise InvalidArchive(f"The archive has {name!r} both as a file and as a folder.")
    return entries


# What a damaged or exotic archive raises while it is read (never while we write).
_READ_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,
    RuntimeError,
    EOFError,
    ValueError,
    UnicodeDecodeError,
    zlib.error,
    lzma.LZMAError,
    OSError,
)


def _open(archive: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise InvalidArchive(
            "The upload is not a zip archive. Zip the project from inside its folder "
            "(cd project && zip -r ../project.zip .) and send that file."
        ) from exc
    except _READ_ERRORS as exc:
        raise InvalidArchive(f"The zip archive is damaged or unsupported: {exc}") from exc


def _chunks(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """An entry's decompressed bytes; any failure to read it is the archive's fault."""
    try:
        with zf.open(info) as src:
            while chunk := src.read(_CHUNK):
                yield chunk
    except _READ_ERRORS as exc:
        raise InvalidArchive(f"Archive entry {info.filename!r} could not be read: {exc}") from exc


def extract(archive: Path, staging: Path, limits: ArchiveLimits, owner: Owner | None) -> Extracted:
    """Validate ``archive`` and write it out below ``staging`` (an empty folder of ours)."""
    with _open(archive) as zf, _Folders(staging) as folders:
        entries = plan(zf, limits)
        total = 0
        count = 0
        for info, parts, is_dir in entries:
            if is_dir:
                folders.fd(parts)
                continue
            executable = bool((info.external_attr >> 16) & 0o111)
            fd = os.open(
                parts[-1], _CREATE_FLAGS, 0o755 if executable else 0o644,
                dir_fd=folders.fd(parts[:-1]),
            )  # fmt: skip
            try:
                for chunk in _chunks(zf, info):
                    total += len(chunk)
                    if total > limits.unpacked_bytes:
                        raise ArchiveTooLarge(
                            "The archive unpacks to more than "
                            f"{limits.unpacked_bytes} bytes; nothing was extracted."
                        )
                    _write_all(fd, chunk)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ArchiveTooLarge("The disk is full; nothing was extracted.") from exc
                raise
            finally:
                os.close(fd)
            count += 1
        if owner is not None:
            _chown_tree(staging, owner)
    return Extracted(files=count, bytes=total)


class _Folders:
    """Descriptors of the staging folders, each made on first use.

    Files are created relative to their folder's descriptor, so no path is
    walked again per file. At most _OPEN_FOLDERS stay open (the least
    recently used are closed and reopened when needed again), so an archive
    with thousands of folders cannot run the daemon out of descriptors.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._fds: OrderedDict[tuple[str, ...], int] = OrderedDict()

    def fd(self, parts: tuple[str, ...]) -> int:
        found = self._fds.get(parts)
        if found is not None:
            self._fds.move_to_end(parts)
            return found
        if parts:
            parent = self.fd(parts[:-1])
            try:
                os.mkdir(parts[-1], 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(parts[-1], _DIR_OPEN_FLAGS, dir_fd=parent)
        else:
            fd = os.open(self._root, _DIR_OPEN_FLAGS)
        self._fds[parts] = fd
        while len(self._fds) > _OPEN_FOLDERS:
            _, oldest = self._fds.popitem(last=False)
            os.close(oldest)
        return fd

    def __enter__(self) -> _Folders:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _chown_tree(root: Path, owner: Owner) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), owner.uid, owner.gid)
