"""Every path that comes from outside is resolved here (and in archive.py).

The workspace is writable by hostile code, which may plant symlinks in it at
any moment. So nothing here walks the workspace by path: each step opens the
next directory relative to the previous one's descriptor with O_NOFOLLOW,
and entries are replaced with rename(2), which never follows the target.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import NotAFolder, PathConflict, UnsafePath

NAME_MAX = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Owner:
    """Who owns workspace files on the host (set when the daemon is root)."""

    uid: int
    gid: int

    def apply(self, fd: int) -> None:
        os.fchown(fd, self.uid, self.gid)


def validate_filename(name: str | None) -> str:
    """A single-file upload's name: a plain base name, refused (never rewritten) otherwise."""
    if name is None or name == "":
        raise UnsafePath("The uploaded file has no name; send it with a filename.")
    if name in (".", ".."):
        raise UnsafePath(f"The file name {name!r} is not allowed.")
    if "/" in name or "\\" in name:
        raise UnsafePath(
            f"The file name {name!r} contains a path separator; "
            "single-file uploads go to the workspace root under a plain name."
        )
    if "\x00" in name:
        raise UnsafePath("The file name contains a NUL byte.")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise UnsafePath(f"The file name is longer than {NAME_MAX} bytes.")
    return name


@contextlib.contextmanager
def open_dir(path: Path | str, dir_fd: int | None = None) -> Iterator[int]:
    """Open a directory without following a symlink in its last component."""
    fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def split_path(path: str) -> tuple[str, ...]:
    """A workspace path from outside, as checked parts.

    Accepted relative to the workspace or under ``/workspace``; ``.`` and empty
    parts are dropped; ``..``, NUL and any other absolute path are refused.
    """
    if "\x00" in path:
        raise UnsafePath("The path contains a NUL byte.")
    if path == "/workspace" or path.startswith("/workspace/"):
        rel = path[len("/workspace") :]
    elif path.startswith("/"):
        raise UnsafePath(f"{path!r} is outside the workspace; give a path inside it.")
    else:
        rel = path
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafePath(f"{path!r} contains '..'; give a path inside the workspace.")
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        raise UnsafePath(f"{path!r} has a name longer than {NAME_MAX} bytes.")
    return parts


def walk_to(
    workspace: Path, parts: tuple[str, ...], create: bool = False, owner: Owner | None = None
) -> int:
    """A descriptor of the folder ``parts`` inside the workspace; the caller closes it.

    Every step is opened with O_NOFOLLOW relative to the previous one, so a
    symlink anywhere on the way is refused, never followed. With ``create``,
    missing folders are made (owned by ``owner``).
    """
    fd = os.open(workspace, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise NotAFolder(
                        f"{'/'.join(parts[: i + 1])!r} is not a folder in the workspace."
                    ) from None
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if owner is not None:
                    owner.apply(nxt)
            except OSError as exc:  # ELOOP (a link), ENOTDIR (a file)
                raise NotAFolder(
                    f"{'/'.join(parts[: i + 1])!r} is not a folder in the workspace."
                ) from exc
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def resolve_folder(workspace: Path, path: str) -> tuple[str, ...]:
    """Check that ``path`` names an existing folder inside the workspace; return its parts."""
    parts = split_path(path)
    os.close(walk_to(workspace, parts))
    return parts


def install_file(
    src: Path,
    workspace: Path,
    name: str,
    folder: tuple[str, ...] = (),
    owner: Owner | None = None,
) -> None:
    """Move an already written file into the workspace (root or ``folder``) under ``name``.

    rename(2) replaces a planted symlink instead of writing through it.
    """
    dst_fd = walk_to(workspace, folder, create=True, owner=owner)
    try:
        with open_dir(src.parent) as src_fd:
            try:
                st = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                where = "/".join((*folder, name))
                raise PathConflict(
                    f"{where!r} is a folder in the workspace; a file cannot replace it."
                )
            os.rename(src.name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    finally:
        os.close(dst_fd)


def _is_dir(name: str, dir_fd: int) -> bool | None:
    """True for a real directory, False for anything else, None if absent."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return stat.S_ISDIR(st.st_mode)


def _check_merge(src_fd: int, dst_fd: int, prefix: str) -> None:
    for name in os.listdir(src_fd):
        src_is_dir = _is_dir(name, src_fd)
        dst_is_dir = _is_dir(name, dst_fd)
        if dst_is_dir is None:
            continue
        if src_is_dir and dst_is_dir:
            with open_dir(name, src_fd) as s, open_dir(name, dst_fd) as d:
                _check_merge(s, d, f"{prefix}{name}/")
        elif src_is_dir or dst_is_dir:
            what = "a folder" if dst_is_dir else "a file or link"
            raise PathConflict(
                f"The archive has {prefix}{name} where the workspace has {what}; "
                "nothing was changed. Delete it first or rename it in the archive."
            )


def _do_merge(src_fd: int, dst_fd: int) -> None:
    for name in os.listdir(src_fd):
        if _is_dir(name, src_fd) and _is_dir(name, dst_fd):
            with open_dir(name, src_fd) as s, open_dir(name, dst_fd) as d:
                _do_merge(s, d)
        else:
            os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def merge_tree(
    staging: Path, workspace: Path, folder: tuple[str, ...] = (), owner: Owner | None = None
) -> None:
    """Move a fully validated tree into the workspace (or ``folder`` in it), files
    replacing files.

    All conflicts (a folder against a file) are found before anything moves,
    so a refused merge leaves the workspace as it was. A missing ``folder`` is
    made (nothing can conflict inside a new folder).
    """
    with open_dir(staging) as src_fd:
        try:
            dst_fd = walk_to(workspace, folder)
        except NotAFolder:
            dst_fd = walk_to(workspace, folder, create=True, owner=owner)
        try:
            _check_merge(src_fd, dst_fd, "/".join(folder) + "/" if folder else "")
            _do_merge(src_fd, dst_fd)
        finally:
            os.close(dst_fd)


def disk_usage(path: Path, max_entries: int | None = None) -> int | None:
    """Bytes a tree takes on disk, walked by descriptor without following links.

    With ``max_entries``, gives up (None) after looking at that many entries:
    a small workspace is then measured in the event loop, faster than a hop
    to a thread, and a big one is left to a thread.
    """
    total = 0
    seen = 0
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return 0
    stack = [fd]
    try:
        while stack:
            dir_fd = stack.pop()
            try:
                with os.scandir(dir_fd) as entries:
                    for entry in entries:
                        seen += 1
                        if max_entries is not None and seen > max_entries:
                            return None
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        total += st.st_blocks * 512
                        if stat.S_ISDIR(st.st_mode):
                            with contextlib.suppress(OSError):
                                stack.append(os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd))
            except OSError:
                pass
            finally:
                os.close(dir_fd)
    finally:
        for left in stack:
            os.close(left)
    return total


async def workspace_usage(path: Path) -> int:
    """``disk_usage`` without blocking the event loop for long: up to
    INLINE_ENTRIES entries are counted in place, more in a thread."""
    used = disk_usage(path, INLINE_ENTRIES)
    if used is None:
        used = await asyncio.to_thread(disk_usage, path)
    assert used is not None
    return used


# About 0.1 ms of walking, less than handing the walk to a thread and back.
INLINE_ENTRIES = 32


def _make_removable(dir_fd: int) -> None:
    for entry in os.scandir(dir_fd):
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.name, 0o700, dir_fd=dir_fd)
            with open_dir(entry.name, dir_fd) as sub:
                _make_removable(sub)


def remove_tree(path: Path) -> None:
    """Remove a tree the sandbox may have made hard to remove (mode 000 folders).

    shutil.rmtree works by descriptor on Linux and never follows symlinks.
    A folder the sandboxed code made unreadable stops it; then every folder
    is made owner-accessible and the removal runs again.
    """
    if not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
    except PermissionError:
        os.chmod(path, 0o700)
        with open_dir(path) as fd:
            _make_removable(fd)
        shutil.rmtree(path)
