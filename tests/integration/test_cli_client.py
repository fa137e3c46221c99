"""The CLI's client commands as a user runs them: real daemon, real subprocesses."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from sandboxd.client import Client
from tests.conftest import Daemon

WAIT_FOR_GO = "echo started; while [ ! -e go ]; do sleep 0.05; done; echo finished"


def sbx(daemon: Daemon, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """`python -m sandboxd --socket S ARGS...` (the socket alone: no config or data dir)."""
    return subprocess.run(
        [sys.executable, "-m", "sandboxd", "--socket", str(daemon.socket_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def create(daemon: Daemon, *args: str) -> str:
    made = sbx(daemon, "create", *args)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def make_project(root: Path) -> Path:
    proj = root / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "tests" / "test_calc.py").write_text(
        "def test_add():\n    open('report.txt', 'w').write('tested')\n    assert 2 + 3 == 5\n"
    )
    (proj / "tests" / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    (root / "secret.txt").write_text("host secret")
    (proj / "link.txt").symlink_to(root / "secret.txt")
    return proj


def test_create_prints_the_id_and_ls_lists_it(daemon: Daemon):
    sandbox_id = create(daemon, "--language", "node", "--label", "who=cli")
    assert sandbox_id.startswith("sb-")
    listed = sbx(daemon, "ls")
    assert listed.returncode == 0
    line = next(line for line in listed.stdout.splitlines() if line.startswith(sandbox_id))
    assert "node" in line and "who=cli" in line
    as_json = json.loads(sbx(daemon, "ls", "--json").stdout)
    (entry,) = [s for s in as_json["sandboxes"] if s["id"] == sandbox_id]
    assert entry["language"] == "node" and entry["labels"] == {"who": "cli"}


def test_create_json_is_the_sandbox(daemon: Daemon):
    made = sbx(daemon, "create", "--json", "--label", "a=1")
    doc = json.loads(made.stdout)
    assert doc["id"].startswith("sb-") and doc["labels"] == {"a": "1"}
    assert doc["language"] == "python" and doc["network"] is False


def test_upload_a_folder_run_its_tests_get_a_file_and_remove(daemon: Daemon, short_tmp: Path):
    sandbox_id = create(daemon)
    up = sbx(daemon, "upload", sandbox_id, str(make_project(short_tmp)))
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip().startswith("uploaded 2 files")
    assert "skipped link.txt" in up.stderr
    names = sbx(daemon, "files", sandbox_id, "-r").stdout
    assert "tests/test_calc.py" in names and "proj" not in names and "link.txt" not in names

    ran = sbx(daemon, "exec", sandbox_id, "--test", "--", "echo setting up")
    assert ran.stdout.startswith("setting up\n")
    assert "1 failed, 1 passed" in ran.stdout
    assert "running the tests (pytest)" in ran.stderr
    assert "tests: 1 passed, 1 failed" in ran.stderr
    assert ran.returncode == 1  # the runner's: a test failed, though the command succeeded

    got = sbx(daemon, "get", sandbox_id, "report.txt")
    assert (got.returncode, got.stdout) == (0, "tested")
    out = short_tmp / "report-copy.txt"
    assert sbx(daemon, "get", sandbox_id, "report.txt", "-o", str(out)).returncode == 0
    assert out.read_text() == "tested"

    gone = sbx(daemon, "rm", sandbox_id)
    assert (gone.returncode, gone.stdout) == (0, f"deleted {sandbox_id}\n")
    assert sandbox_id not in sbx(daemon, "ls").stdout
    others = [create(daemon), create(daemon)]
    both = sbx(daemon, "rm", *others, "--json")
    assert (both.returncode, json.loads(both.stdout)) == (0, {"deleted": others})
    assert sbx(daemon, "ls", "--json").stdout.count('"id"') == 0


def test_exec_exits_with_the_commands_status(daemon: Daemon):
    sandbox_id = create(daemon)
    assert sbx(daemon, "exec", sandbox_id, "--", "exit 7").returncode == 7
    assert sbx(daemon, "exec", sandbox_id, "--", "true").returncode == 0
    timed_out = sbx(daemon, "exec", sandbox_id, "--timeout", "1", "--", "sleep 30")
    assert timed_out.returncode == 124
    assert "timed out" in timed_out.stderr


def test_exec_options_and_argv(daemon: Daemon):
    sandbox_id = create(daemon)
    assert sbx(daemon, "exec", sandbox_id, "--", "mkdir -p sub").returncode == 0
    ran = sbx(daemon, "exec", sandbox_id, "--env", "A=1", "--env", "B=two", "--cwd", "sub", "--",
              'echo "$A $B $(pwd)"')  # fmt: skip
    assert ran.stdout == "1 two /workspace/sub\n"
    # Several words are quoted one by one, as docker exec would pass them.
    words = sbx(daemon, "exec", sandbox_id, "--", "printf", "%s|", "a b", "$HOME")
    assert words.stdout == "a b|$HOME|"


def test_exec_streams_stdout_and_stderr_in_order(daemon: Daemon):
    sandbox_id = create(daemon)
    command = "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three"
    both = subprocess.run(
        [sys.executable, "-m", "sandboxd", "--socket", str(daemon.socket_path),
         "exec", sandbox_id, "--", command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
    )  # fmt: skip
    assert both.stdout == "one\ntwo\nthree\n"
    apart = sbx(daemon, "exec", sandbox_id, "--", command)
    assert (apart.stdout, apart.stderr) == ("one\nthree\n", "two\n")


def test_exec_output_arrives_while_the_command_runs(daemon: Daemon):
    sandbox_id = create(daemon)
    workspace = Path(json.loads(sbx(daemon, "ls", "--json").stdout)["sandboxes"][0]["workspace"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "--socket", str(daemon.socket_path),
         "exec", sandbox_id, "--timeout", "60", "--", WAIT_FOR_GO],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        # The command cannot finish until this test sees its first line.
        assert proc.stdout.readline() == "started\n"
        (workspace / "go").touch()
        assert proc.stdout.read() == "finished\n"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_exits_130_and_the_daemon_kills_the_command(daemon: Daemon):
    sandbox_id = create(daemon)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "--socket", str(daemon.socket_path),
         "exec", sandbox_id, "--timeout", "300", "--", "echo started; sleep 300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert "interrupted" in err
    client = Client(daemon.socket_path)
    deadline = time.monotonic() + 30
    while client.get(sandbox_id).running_commands:
        assert time.monotonic() < deadline, "the command still runs after the client left"
        time.sleep(0.1)


def test_exec_json_is_the_result_and_keeps_the_exit_status(daemon: Daemon):
    sandbox_id = create(daemon)
    ran = sbx(daemon, "exec", sandbox_id, "--json", "--", "echo hi; exit 4")
    assert ran.returncode == 4
    doc = json.loads(ran.stdout)
    assert doc["exit_code"] == 4 and doc["stdout"] == "hi\n" and doc["timed_out"] is False


def test_put_files_and_get_json(daemon: Daemon, short_tmp: Path):
    sandbox_id = create(daemon)
    local = short_tmp / "hello.py"
    local.write_text("print('hello')\n")
    put = sbx(daemon, "put", sandbox_id, str(local), "--path", "src/app")
    assert (put.returncode, put.stdout) == (0, "src/app/hello.py (15 bytes)\n")
    put_json = json.loads(sbx(daemon, "put", sandbox_id, str(local), "--json").stdout)
    assert put_json == {"filename": "hello.py", "path": "hello.py", "size": 15}
    listing = sbx(daemon, "files", sandbox_id, "src")
    assert listing.stdout.split()[-1] == "src/app/"
    listing_json = json.loads(sbx(daemon, "files", sandbox_id, "-r", "--json").stdout)
    assert {e["path"] for e in listing_json["entries"]} == {
        "hello.py", "src", "src/app", "src/app/hello.py"
    }  # fmt: skip
    got = json.loads(sbx(daemon, "get", sandbox_id, "src/app/hello.py", "--json").stdout)
    assert got == {"path": "src/app/hello.py", "size": 15, "content": "print('hello')\n"}
    sbx(daemon, "exec", sandbox_id, "--", "printf '\\377\\376' > bin.dat")
    binary = json.loads(sbx(daemon, "get", sandbox_id, "bin.dat", "--json").stdout)
    assert binary["content_base64"] == "//4="


def test_refusals_exit_1_with_the_problem(daemon: Daemon):
    missing = sbx(daemon, "get", "sb-nope", "x")
    assert missing.returncode == 1
    assert missing.stderr == "sandboxd: No sandbox has the id 'sb-nope'. (sandbox_not_found)\n"
    as_json = sbx(daemon, "rm", "sb-nope", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["code"] == "sandbox_not_found"
    sandbox_id = create(daemon)
    no_file = sbx(daemon, "get", sandbox_id, "nothing.txt")
    assert no_file.returncode == 1 and "(file_not_found)" in no_file.stderr


def test_no_daemon_exits_3(daemon: Daemon, short_tmp: Path):
    ran = subprocess.run(
        [sys.executable, "-m", "sandboxd", "--socket", str(short_tmp / "none.sock"), "ls"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 3
    assert "sandboxd is not running" in ran.stderr and "sandboxd start" in ran.stderr


def test_a_zip_of_the_folder_itself_gets_a_warning(daemon: Daemon, short_tmp: Path):
    sandbox_id = create(daemon)
    archive = short_tmp / "wrapped.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("proj/tests/test_a.py", "def test_a():\n    pass\n")
    up = sbx(daemon, "upload", sandbox_id, str(archive))
    assert up.returncode == 0
    assert "inside proj/" in up.stderr and "zip from inside the folder" in up.stderr
    flat = short_tmp / "flat.zip"
    with zipfile.ZipFile(flat, "w") as zf:
        zf.writestr("tests/test_a.py", "def test_a():\n    pass\n")
    quiet = sbx(daemon, "upload", sandbox_id, str(flat), "--json")
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout) == {
        "status": "uploaded",
        "files": 1,
        "bytes": 23,
        "skipped": [],
    }


def _big_project(root: Path) -> Path:
    proj = root / "big"
    proj.mkdir()
    (proj / "blob.bin").write_bytes(os.urandom(6 * 1024 * 1024))  # does not compress
    return proj


def test_a_large_upload_shows_a_progress_bar_on_a_terminal(daemon: Daemon, short_tmp: Path):
    sandbox_id = create(daemon)
    proj = _big_project(short_tmp)
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "--socket", str(daemon.socket_path),
             "upload", sandbox_id, str(proj)],
            stdout=subprocess.PIPE, stderr=terminal, text=True,
        )  # fmt: skip
        os.close(terminal)
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(controller)
    assert proc.returncode == 0
    assert out.startswith("uploaded 1 file")
    assert b"Uploading big" in seen and b"100%" in seen


def test_no_progress_bar_when_stderr_is_not_a_terminal(daemon: Daemon, short_tmp: Path):
    sandbox_id = create(daemon)
    up = sbx(daemon, "upload", sandbox_id, str(_big_project(short_tmp)))
    assert up.returncode == 0
    assert up.stderr == ""


def test_shell_completion_offers_sandbox_ids(daemon: Daemon):
    sandbox_id = create(daemon)
    env = {
        **os.environ,
        "_SANDBOXD_COMPLETE": "bash_complete",
        "COMP_WORDS": f"sandboxd --socket {daemon.socket_path} rm sb-",
        "COMP_CWORD": "4",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from sandboxd.cli import main; main(prog_name='sandboxd')"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert f"plain,{sandbox_id}" in done.stdout.splitlines()
    script = subprocess.run(
        [sys.executable, "-c", "from sandboxd.cli import main; main(prog_name='sandboxd')"],
        capture_output=True, text=True, env={**os.environ, "_SANDBOXD_COMPLETE": "bash_source"},
        timeout=60,
    )  # fmt: skip
    assert "_sandboxd_completion" in script.stdout


@pytest.mark.parametrize("command", [["mcp"], ["mcp", "--help"]])
def test_without_the_mcp_sdk_the_cli_still_works_and_says_how_to_get_it(command):
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "from sandboxd.cli import main\n"
        f"main({command!r}, prog_name='sandboxd')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if "--help" in command:
        assert done.returncode == 0 and "MCP" in done.stdout
    else:
        assert done.returncode == 1
        assert "pip install 'sandboxd[mcp]'" in done.stderr
    version = subprocess.run(
        [sys.executable, "-c", code.replace(repr(command), "['--version']")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert version.returncode == 0 and "sandboxd" in version.stdout
