"""Zipping a project folder the way the upload endpoint wants it: from inside.

Entry names are relative to the folder itself, so its contents land in the
workspace root (the spec's "zipped the folder itself" mistake would put them
one level down). Symlinks are skipped, not followed: following one could pack
files from outside the folder, and the daemon refuses links in a zip anyway.
Sockets, FIFOs and devices are skipped too.
"""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO


@dataclass
class ZipStats:
    files: int = 0
    folders: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # relative paths of links and specials


def zip_dir(folder: Path, out: BinaryIO) -> ZipStats:
    """Write ``folder``'s contents (not the folder) as a zip to ``out``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    stats = ZipStats()
    # strict_timestamps=False: files dated before 1980 get 1980, not an error.
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, strict_timestamps=False) as zf:
        for top, dirs, files in os.walk(folder, followlinks=False):
            rel_top = Path(top).relative_to(folder)
            kept_dirs = []
            for name in sorted(dirs):
                rel = rel_top / name
                if os.path.islink(os.path.join(top, name)):
                    stats.skipped.append(rel.as_posix())
                else:
                    kept_dirs.append(name)
            dirs[:] = kept_dirs  # os.walk descends only into these
            if not files and not kept_dirs and rel_top != Path("."):
                # An empty folder is kept as a folder entry.
                zf.write(top, rel_top.as_posix() + "/")
                stats.folders += 1
            for name in sorted(files):
                path = os.path.join(top, name)
                rel = rel_top / name
                mode = os.lstat(path).st_mode
                if not stat.S_ISREG(mode):
                    stats.skipped.append(rel.as_posix())
                    continue
                zf.write(path, rel.as_posix())
                stats.files += 1
                stats.bytes += os.path.getsize(path)
    return stats


# What sits at the root of a project: seeing it one folder down means the
# folder itself was zipped.
_PROJECT_ROOT = ("tests/", "test/", "pyproject.toml", "setup.py", "requirements.txt",
                 "package.json", "go.mod")  # fmt: skip


def wrapping_folder(zip_path: Path) -> str | None:
    """The folder a zip of a project folder wraps everything in, if it looks like one.

    That is what zipping the folder itself (``zip -r proj.zip proj``) gives:
    uploaded, the project would land in ``proj/`` rather than the workspace
    root. It looks like that when every entry is in one folder and that
    folder is named as the zip or holds what a project root holds (tests/,
    pyproject.toml, package.json, go.mod...); a zip of just tests/ is fine.
    """
    try:
        with zipfile.ZipFile(zip_path) as zf:
            names = [n.replace("\\", "/") for n in zf.namelist()]
    except (zipfile.BadZipFile, OSError):
        return None
    names = [n for n in names if n and not n.startswith("__MACOSX/")]
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1 or all("/" not in n for n in names):
        return None
    top = tops.pop()
    inside = {n.split("/", 1)[1] for n in names if "/" in n}
    named_as_zip = top == Path(zip_path).stem
    holds_a_project = any(n == m or n.startswith(m) for n in inside for m in _PROJECT_ROOT)
    return top + "/" if named_as_zip or holds_a_project else None
