"""workspace: upload names, installing files, merging trees, removing trees.

The workspace is writable by hostile code, so the tests plant symlinks in it
and check that nothing outside is ever written, moved or chmodded.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.errors import PathConflict, UnsafePath
from sandboxd.workspace import (
    INLINE_ENTRIES,
    disk_usage,
    install_file,
    merge_tree,
    remove_tree,
    validate_filename,
    workspace_usage,
)

REPO = Path(__file__).resolve().parents[2]

Snapshot = dict[str, tuple[object, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every entry below root (links not followed): kind, mode and content or target."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", Path(path).read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(workspace, staging, outside): three sibling folders."""
    made = tuple(tmp_path / name for name in ("workspace", "staging", "outside"))
    for path in made:
        path.mkdir()
    return made  # type: ignore[return-value]


# --------------------------------------------------------------------------- validate_filename


@pytest.mark.parametrize(
    "name",
    [
        None,
        "",
        ".",
        "..",
        "a/b",
        "../x",
        "/etc/x",
        "x/",
        "a\\b",
        "..\\x",
        "a\x00b",
        "\x00",
        "a" * 256,
        "é" * 128,  # 128 characters, 256 bytes
    ],
)
def test_validate_filename_refuses(name: str | None) -> None:
    with pytest.raises(UnsafePath):
        validate_filename(name)


@pytest.mark.parametrize(
    "name",
    [
        "main.py",
        "résumé 2024.pdf",
        "日本語.txt",
        "with spaces  .txt",
        " leading",
        ".env",
        ".gitignore",
        "...",
        "..hidden",
        "-rf",
        "a:b",
        "a" * 255,
        "é" * 127 + "a",  # 255 bytes
    ],
)
def test_validate_filename_accepts_unchanged(name: str) -> None:
    assert validate_filename(name) == name


# --------------------------------------------------------------------------- install_file


def _upload(tmp_path: Path, data: bytes) -> Path:
    incoming = tmp_path / "incoming"
    incoming.mkdir(exist_ok=True)
    src = incoming / "upload-1234"
    src.write_bytes(data)
    return src


def test_install_file_creates_and_replaces(tmp_path: Path, dirs: tuple[Path, Path, Path]) -> None:
    workspace = dirs[0]
    install_file(_upload(tmp_path, b"one"), workspace, "main.py")
    assert (workspace / "main.py").read_bytes() == b"one"
    src = _upload(tmp_path, b"two")
    install_file(src, workspace, "main.py")
    assert (workspace / "main.py").read_bytes() == b"two"
    assert not src.exists()
    assert sorted(os.listdir(workspace)) == ["main.py"]


def test_install_file_replaces_planted_symlink_to_file(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    workspace, _, outside = dirs
    secret = outside / "secret.txt"
    secret.write_text("do not touch")
    (workspace / "main.py").symlink_to(secret)
    install_file(_upload(tmp_path, b"payload"), workspace, "main.py")
    assert secret.read_text() == "do not touch"
    assert not (workspace / "main.py").is_symlink()
    assert (workspace / "main.py").read_bytes() == b"payload"


def test_install_file_replaces_planted_symlink_to_folder(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    workspace, _, outside = dirs
    write(outside, {"keep.txt": "keep"})
    before = snapshot(outside)
    (workspace / "data").symlink_to(outside)
    install_file(_upload(tmp_path, b"payload"), workspace, "data")
    assert snapshot(outside) == before
    assert (workspace / "data").is_file()
    assert not (workspace / "data").is_symlink()


def test_install_file_replaces_dangling_symlink(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    workspace, _, outside = dirs
    (workspace / "main.py").symlink_to(outside / "would-be-created")
    install_file(_upload(tmp_path, b"x"), workspace, "main.py")
    assert os.listdir(outside) == []
    assert (workspace / "main.py").read_bytes() == b"x"


def test_install_file_refuses_to_replace_a_folder(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    workspace = dirs[0]
    write(workspace, {"pkg/__init__.py": "init"})
    before = snapshot(workspace)
    src = _upload(tmp_path, b"x")
    with pytest.raises(PathConflict, match="pkg"):
        install_file(src, workspace, "pkg")
    assert snapshot(workspace) == before
    assert src.read_bytes() == b"x"


def test_install_file_into_symlinked_workspace_is_refused(
    tmp_path: Path, dirs: tuple[Path, Path, Path]
) -> None:
    """The workspace path itself must not be a link (opened with O_NOFOLLOW)."""
    _, _, outside = dirs
    link = tmp_path / "ws-link"
    link.symlink_to(outside)
    with pytest.raises(OSError):
        install_file(_upload(tmp_path, b"x"), link, "a.txt")
    assert os.listdir(outside) == []


# --------------------------------------------------------------------------- merge_tree


def test_merge_tree_merges_nested_folders_and_replaces_files(
    dirs: tuple[Path, Path, Path],
) -> None:
    workspace, staging, _ = dirs
    write(
        workspace,
        {"a/keep.txt": "keep", "a/b/old.txt": "old", "a/b/same.txt": "before", "top.txt": "t"},
    )
    write(
        staging,
        {"a/b/same.txt": "after", "a/b/new.txt": "new", "a/c/d.txt": "d", "new/": "", "z": "z"},
    )
    merge_tree(staging, workspace)
    got = {rel: entry[1] for rel, entry in snapshot(workspace).items() if entry[0] == "file"}
    assert got == {
        "a/keep.txt": b"keep",
        "a/b/old.txt": b"old",
        "a/b/same.txt": b"after",
        "a/b/new.txt": b"new",
        "a/c/d.txt": b"d",
        "top.txt": b"t",
        "z": b"z",
    }
    assert (workspace / "new").is_dir()


@pytest.mark.parametrize(
    ("workspace_files", "staging_files"),
    [
        # the archive has a file where the workspace has a folder
        ({"x/inner.txt": "in"}, {"x": "file"}),
        # the archive has a folder where the workspace has a file
        ({"x": "file"}, {"x/inner.txt": "in"}),
        ({"x": "file"}, {"x/": ""}),
        # the same, deep down, beside changes that would be fine on their own
        ({"d/e/f/g.txt": "g", "d/keep": "k"}, {"d/e/f": "file", "d/keep": "changed"}),
        ({"d/e/f": "file"}, {"d/e/f/g.txt": "g", "d/e/new.txt": "new"}),
    ],
)
def test_merge_tree_refuses_conflicts_before_moving_anything(
    dirs: tuple[Path, Path, Path],
    workspace_files: dict[str, str],
    staging_files: dict[str, str],
) -> None:
    workspace, staging, _ = dirs
    # Names that sort and list both before and after the conflict, so a check
    # done while moving would already have moved some of them.
    write(workspace, {"aaa.txt": "ws-a", "zzz.txt": "ws-z", **workspace_files})
    write(staging, {"aaa.txt": "st-a", "zzz.txt": "st-z", "0new/f": "n", **staging_files})
    before = snapshot(workspace)
    staged = snapshot(staging)
    with pytest.raises(PathConflict, match="nothing was changed"):
        merge_tree(staging, workspace)
    assert snapshot(workspace) == before
    assert snapshot(staging) == staged


def test_merge_tree_never_writes_through_a_symlinked_folder(
    dirs: tuple[Path, Path, Path],
) -> None:
    workspace, staging, outside = dirs
    write(outside, {"existing.txt": "outside"})
    outside_before = snapshot(outside)
    (workspace / "a").symlink_to(outside)
    write(staging, {"a/x": "payload", "a/existing.txt": "overwrite"})
    with pytest.raises(PathConflict):
        merge_tree(staging, workspace)
    assert snapshot(outside) == outside_before
    assert os.readlink(workspace / "a") == str(outside)


def test_merge_tree_never_writes_through_a_deep_symlinked_folder(
    dirs: tuple[Path, Path, Path],
) -> None:
    workspace, staging, outside = dirs
    write(workspace, {"src/ok.txt": "ok"})
    (workspace / "src" / "lib").symlink_to(outside)
    write(staging, {"src/lib/evil.py": "payload"})
    with pytest.raises(PathConflict):
        merge_tree(staging, workspace)
    assert os.listdir(outside) == []


def test_merge_tree_file_replaces_symlink_not_its_target(
    dirs: tuple[Path, Path, Path],
) -> None:
    workspace, staging, outside = dirs
    secret = outside / "secret"
    secret.write_text("do not touch")
    (workspace / "conf").symlink_to(secret)
    write(staging, {"conf": "from archive"})
    merge_tree(staging, workspace)
    assert secret.read_text() == "do not touch"
    assert not (workspace / "conf").is_symlink()
    assert (workspace / "conf").read_text() == "from archive"


# --------------------------------------------------------------------------- remove_tree


def _unprivileged(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run python code without the capabilities that let root ignore file modes.

    As root, a mode-000 folder is no obstacle, so the fallback in remove_tree
    would never run. Dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH makes
    root obey modes like any other user.
    """
    argv = [sys.executable, "-c", code, *args]
    if os.geteuid() == 0:
        caps = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *argv]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)


def _locked_tree(root: Path, outside: Path) -> Path:
    """A tree with mode-000 and read-only folders and a link to an outside folder."""
    tree = root / "sandbox"
    write(
        tree,
        {
            "workspace/a.txt": "a",
            "workspace/locked/inner/deeper/f.txt": "f",
            "workspace/readonly/g.txt": "g",
            "home/.cache/x": "x",
        },
    )
    (tree / "workspace" / "escape").symlink_to(outside)
    os.chmod(tree / "workspace/locked/inner/deeper", 0)
    os.chmod(tree / "workspace/locked/inner", 0)
    os.chmod(tree / "workspace/locked", 0)
    os.chmod(tree / "workspace/readonly", 0o500)
    return tree


def _outside_with_locked_folder(outside: Path) -> None:
    write(outside, {"precious.txt": "precious", "private/": ""})
    os.chmod(outside / "private", 0)


def _unlock(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)


def test_plain_rmtree_is_stopped_by_the_locked_tree(dirs: tuple[Path, Path, Path]) -> None:
    """The premise of the next test: without the fallback the removal fails."""
    _, staging, outside = dirs
    tree = _locked_tree(staging, outside)
    result = _unprivileged("import shutil, sys; shutil.rmtree(sys.argv[1])", str(tree))
    assert result.returncode != 0
    assert "PermissionError" in result.stderr


def test_remove_tree_removes_mode_000_folders_without_following_links(
    dirs: tuple[Path, Path, Path],
) -> None:
    _, staging, outside = dirs
    _outside_with_locked_folder(outside)
    outside_before = snapshot(outside)
    tree = _locked_tree(staging, outside)
    result = _unprivileged(
        "import sys; from sandboxd.workspace import remove_tree; remove_tree(sys.argv[1])",
        str(tree),
    )
    assert result.returncode == 0, result.stderr
    assert not os.path.lexists(tree)
    # The outside folder behind the link: same files, and its mode-000 folder
    # was not chmodded by the fallback.
    assert snapshot(outside) == outside_before
    assert stat.S_IMODE((outside / "private").stat().st_mode) == 0


def test_remove_tree_in_process(dirs: tuple[Path, Path, Path]) -> None:
    _, staging, outside = dirs
    _outside_with_locked_folder(outside)
    outside_before = snapshot(outside)
    tree = _locked_tree(staging, outside)
    remove_tree(tree)
    assert not os.path.lexists(tree)
    assert snapshot(outside) == outside_before


def test_remove_tree_of_missing_path_is_a_no_op(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never-created")
    assert os.listdir(tmp_path) == []


def test_remove_tree_leaves_sibling_alone(tmp_path: Path) -> None:
    write(tmp_path, {"gone/a/b.txt": "b", "stays/c.txt": "c"})
    remove_tree(tmp_path / "gone")
    assert sorted(os.listdir(tmp_path)) == ["stays"]
    assert (tmp_path / "stays/c.txt").read_text() == "c"


@pytest.fixture(autouse=True)
def _restore_modes(tmp_path: Path) -> Iterator[None]:
    """Let pytest clean tmp_path even when a test failed half-way."""
    yield
    if tmp_path.exists():
        _unlock(tmp_path)


# --------------------------------------------------------------------------- disk_usage


def test_disk_usage_counts_allocated_bytes(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "data").write_bytes(os.urandom(1024 * 1024))
    (tree / "small").write_bytes(os.urandom(100))
    used = disk_usage(tree)
    assert 1024 * 1024 <= used <= 1024 * 1024 + 256 * 1024


def test_disk_usage_does_not_follow_links(tmp_path: Path, dirs: tuple[Path, Path, Path]) -> None:
    _, staging, outside = dirs
    (outside / "big").write_bytes(os.urandom(4 * 1024 * 1024))
    (staging / "f").write_bytes(os.urandom(4096))
    without_link = disk_usage(staging)
    (staging / "escape").symlink_to(outside)
    (staging / "file-link").symlink_to(outside / "big")
    assert disk_usage(staging) - without_link < 64 * 1024
    # the tree itself given as a link: nothing is counted
    link = tmp_path / "link"
    link.symlink_to(outside)
    assert disk_usage(link) == 0


def test_disk_usage_gives_up_past_max_entries_and_closes_what_it_opened(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    for i in range(10):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "f").write_bytes(b"x" * 5000)
    full = disk_usage(tree)
    assert full is not None and full >= 10 * 4096
    assert disk_usage(tree, max_entries=20) == full  # 10 folders + 10 files
    before = len(os.listdir("/proc/self/fd"))
    assert disk_usage(tree, max_entries=19) is None
    assert disk_usage(tree, max_entries=3) is None
    assert len(os.listdir("/proc/self/fd")) == before


async def test_workspace_usage_measures_small_trees_in_place_and_big_ones_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir()
    (small / "f").write_bytes(b"x" * 5000)
    big.mkdir()
    for i in range(INLINE_ENTRIES + 1):
        (big / f"f{i}").write_bytes(b"x" * 5000)
    threaded: list[object] = []
    real_to_thread = asyncio.to_thread

    async def spy(func: Any, *args: Any) -> Any:
        threaded.append(args[0])
        return await real_to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    assert await workspace_usage(small) == disk_usage(small)
    assert threaded == []
    assert await workspace_usage(big) == disk_usage(big)
    assert threaded == [big]


def test_disk_usage_counts_blocks_not_sparse_size(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "sparse", "wb") as f:
        f.truncate(1024 * 1024 * 1024)
    assert disk_usage(tree) < 1024 * 1024


def test_disk_usage_of_missing_path_is_zero(tmp_path: Path) -> None:
    assert disk_usage(tmp_path / "absent") == 0
