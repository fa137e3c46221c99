"""The client's pure parts: the event-stream parser, zipping a folder, finding the socket."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from sandboxd import paths
from sandboxd.client import Client, command_line, find_socket
from sandboxd.client.aio import _SSEParser
from sandboxd.zipdir import wrapping_folder, zip_dir

STREAM = (
    b'event: stdout\ndata: {"text": "one\\n"}\n\n'
    b": a comment\n"
    b'event: phase\r\ndata: {"phase": "tests", "runner": "pytest"}\r\n\r\n'
    b"event: result\ndata: line one\ndata: line two\n\n"
)
EVENTS = [
    ("stdout", '{"text": "one\\n"}'),
    ("phase", '{"phase": "tests", "runner": "pytest"}'),
    ("result", "line one\nline two"),
]


def test_events_are_parsed_whole():
    assert _SSEParser().feed(STREAM) == EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50])
def test_events_split_anywhere_come_out_the_same(size):
    parser = _SSEParser()
    events = []
    for start in range(0, len(STREAM), size):
        events += parser.feed(STREAM[start : start + size])
    assert events == EVENTS


def test_a_line_of_megabytes_is_fine():
    # aiohttp's readline would refuse a line this long; the final result event can be one.
    text = "x" * (3 * 1024 * 1024)
    raw = f"event: result\ndata: {json.dumps({'output': text})}\n\n".encode()
    parser = _SSEParser()
    events = []
    for start in range(0, len(raw), 65536):
        events += parser.feed(raw[start : start + 65536])
    assert len(events) == 1
    assert json.loads(events[0][1])["output"] == text


def test_an_event_is_not_given_before_its_blank_line():
    parser = _SSEParser()
    assert parser.feed(b'event: stdout\ndata: {"text": "a"}\n') == []
    assert parser.feed(b"\n") == [("stdout", '{"text": "a"}')]


def _tree(root: Path) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (root / "main.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").mkdir()
    (root / "old.txt").write_text("from 1970")
    os.utime(root / "old.txt", (0, 0))


def test_a_folder_is_zipped_from_inside_itself(tmp_path):
    _tree(tmp_path / "proj")
    buf = io.BytesIO()
    stats = zip_dir(tmp_path / "proj", buf)
    with zipfile.ZipFile(buf) as zf:
        names = sorted(zf.namelist())
        mode = zf.getinfo("run.sh").external_attr >> 16
    assert names == ["empty/", "main.py", "old.txt", "run.sh", "tests/test_a.py"]
    assert not any(n.startswith("proj") for n in names)
    assert mode & 0o111, "the executable bit is kept"
    assert (stats.files, stats.folders, stats.skipped) == (4, 1, [])


def test_symlinks_and_special_files_are_skipped_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("do not upload")
    proj = tmp_path / "proj"
    _tree(proj)
    (proj / "key").symlink_to(secret / "key")
    (proj / "outside").symlink_to(secret)
    (proj / "tests" / "loop").symlink_to(proj)
    os.mkfifo(proj / "fifo")
    buf = io.BytesIO()
    stats = zip_dir(proj, buf)
    with zipfile.ZipFile(buf) as zf:
        names = zf.namelist()
        content = b"".join(zf.read(n) for n in names if not n.endswith("/"))
    assert b"do not upload" not in content
    assert not {"key", "outside/key", "fifo"} & set(names)
    assert not any(n.startswith("tests/loop") for n in names)
    assert sorted(stats.skipped) == ["fifo", "key", "outside", "tests/loop"]


def test_zipping_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        zip_dir(tmp_path / "f", io.BytesIO())


def _zip(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name in names:
            zf.writestr(name, "" if name.endswith("/") else "x")
    return path


def test_a_zip_of_the_folder_itself_is_recognised(tmp_path):
    wrapped = _zip(tmp_path / "a.zip", ["proj/", "proj/main.py", "proj/tests/test_a.py"])
    assert wrapping_folder(wrapped) == "proj/"
    named = _zip(tmp_path / "app.zip", ["app/main.py"])
    assert wrapping_folder(named) == "app/"
    node = _zip(tmp_path / "n.zip", ["web/package.json", "web/index.js"])
    assert wrapping_folder(node) == "web/"
    flat = _zip(tmp_path / "b.zip", ["main.py", "tests/test_a.py"])
    assert wrapping_folder(flat) is None
    just_tests = _zip(tmp_path / "t.zip", ["tests/test_a.py", "tests/conftest.py"])
    assert wrapping_folder(just_tests) is None
    one_file = _zip(tmp_path / "c.zip", ["main.py"])
    assert wrapping_folder(one_file) is None
    (tmp_path / "d.zip").write_bytes(b"not a zip")
    assert wrapping_folder(tmp_path / "d.zip") is None


def test_an_argv_list_is_quoted_word_by_word_and_a_string_kept():
    assert command_line("make && ./a.out") == "make && ./a.out"
    assert command_line(["printf", "%s|", "a b", "it's"]) == "printf '%s|' 'a b' 'it'\"'\"'s'"


def test_the_socket_is_found_as_the_cli_finds_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SANDBOXD_SOCKET", raising=False)
    config = tmp_path / "config.toml"
    config.write_text(f'socket_path = "{tmp_path / "from-config.sock"}"\n')
    monkeypatch.setenv("SANDBOXD_CONFIG", str(config))
    assert find_socket() == tmp_path / "from-config.sock"
    monkeypatch.setenv("SANDBOXD_SOCKET", str(tmp_path / "from-env.sock"))
    assert find_socket() == tmp_path / "from-env.sock"
    assert find_socket(tmp_path / "given.sock") == tmp_path / "given.sock"
    monkeypatch.delenv("SANDBOXD_SOCKET")
    config.write_text("no_such_key = 1\n")  # a broken config file: the default, not an error
    assert find_socket() == paths.default_socket_path()


async def test_the_sync_client_says_to_use_the_async_one_inside_a_loop(tmp_path):
    with pytest.raises(RuntimeError, match="AsyncClient"):
        Client(tmp_path / "s.sock").list()
