"""Reading the workspace back out: list, open, remove, zip.

Like workspace.py, nothing here follows a symlink: folders are walked by
descriptor with O_NOFOLLOW, files are opened with O_NOFOLLOW, and links are
listed as links, never read through or archived.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sandboxd.errors import FileNotInWorkspace, NotAFile, UnsafePath
from sandboxd.workspace import _DIR_FLAGS, walk_to

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True)
class Entry:
    path: str
    type: str  # file | dir | symlink | other
    size: int
    mtime: datetime


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def list_folder(
    workspace: Path, folder: tuple[str, ...], recursive: bool, limit: int
) -> tuple[list[Entry], bool]:
    """Entries under ``folder`` (paths relative to the workspace), at most ``limit``.

    Returns the entries and whether the listing was cut at the limit.
    """
    entries: list[Entry] = []
    stack = [(walk_to(workspace, folder), folder)]
    truncated = False
    try:
        while stack:
            fd, parts = stack.pop()
            try:
                with os.scandir(fd) as scan:
                    names = sorted(scan, key=lambda e: e.name)
                for item in names:
                    try:
                        st = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if len(entries) >= limit:
                        truncated = True
                        break
                    kind = _kind(st.st_mode)
                    entries.append(
                        Entry(
                            path="/".join((*parts, item.name)),
                            type=kind,
                            size=st.st_size if kind != "dir" else 0,
                            mtime=datetime.fromtimestamp(st.st_mtime, UTC),
                        )
                    )
                    if recursive and kind == "dir":
                        with contextlib.suppress(OSError):
                            sub = os.open(item.name, _DIR_FLAGS, dir_fd=fd)
                            stack.append((sub, (*parts, item.name)))
            finally:
                os.close(fd)
            if truncated:
                break
    finally:
        for fd, _ in stack:
            os.close(fd)
    return entries, truncated


def _parent_and_name(workspace: Path, parts: tuple[str, ...]) -> tuple[int, str]:
    if not parts:
        raise UnsafePath("Name a file inside the workspace, not the workspace itself.")
    return walk_to(workspace, parts[:-1]), parts[-1]


def open_file(workspace: Path, parts: tuple[str, ...]) -> tuple[int, int]:
    """An O_RDONLY descriptor of a regular file in the workspace, and its size."""
    parent, name = _parent_and_name(workspace, parts)
    where = "/".join(parts)
    try:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            raise FileNotInWorkspace(f"There is no file {where!r} in the workspace.") from None
        except OSError as exc:  # ELOOP: a symlink
            raise NotAFile(f"{where!r} is a symbolic link; links are not followed.") from exc
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotAFile(f"{where!r} is a {_kind(st.st_mode)}, not a regular file.")
    os.set_blocking(fd, True)
    return fd, st.st_size


def remove(workspace: Path, parts: tuple[str, ...]) -> None:
    """Remove a file, a link (not what it points to) or a whole folder."""
    parent, name = _parent_and_name(workspace, parts)
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            where = "/".join(parts)
            raise FileNotInWorkspace(f"There is no {where!r} in the workspace.") from None
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def _files(workspace: Path) -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, open fd, stat) for every regular file; links and specials skipped."""
    for dirpath, _dirs, filenames, dir_fd in os.fwalk(workspace, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, workspace)
        for name in sorted(filenames):
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # a link (ELOOP) or gone
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                continue
            yield os.path.normpath(os.path.join(rel_dir, name)), fd, st


def zip_workspace(workspace: Path, out: Path) -> int:
    """Write the workspace's regular files and folders into a zip at ``out``; count files."""
    count = 0
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for rel, fd, st in _files(workspace):
            try:
                stamp = max(datetime.fromtimestamp(st.st_mtime).timetuple()[:6], _ZIP_EPOCH)
                info = zipfile.ZipInfo(rel, stamp)
                info.external_attr = (stat.S_IFREG | stat.S_IMODE(st.st_mode)) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                os.set_blocking(fd, True)
                with zf.open(info, "w") as dst, os.fdopen(os.dup(fd), "rb") as src:
                    shutil.copyfileobj(src, dst, 1024 * 1024)
                count += 1
            finally:
                os.close(fd)
    return count
