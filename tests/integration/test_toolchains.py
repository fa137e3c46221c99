"""Each language's toolchain and test runner, end to end: real daemon, real pytest, jest, go test.

Projects under tests/fixtures/ are zipped from inside their folder at test
time, the way the spec asks users to zip them.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from tests.conftest import form_with_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def zip_dir(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(folder).as_posix())
    return buf.getvalue()


async def project_sandbox(http, language: str, fixture: str) -> str:
    async with http.post("/v1/sandboxes", json={"language": language}) as r:
        sid = (await r.json())["id"]
    archive = zip_dir(FIXTURES / language / fixture)
    async with http.post(f"/v1/sandboxes/{sid}/upload", data=form_with_file(archive, "p.zip")) as r:
        assert r.status == 201, await r.text()
    return sid


async def run(http, sid: str, command: str, test: bool = False, timeout: float = 120) -> dict:
    async with http.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": command, "test": test, "timeout": timeout}
    ) as r:
        body = await r.json()
        assert r.status == 200, body
        return body


RUNNERS = {"python": "pytest", "node": "jest", "go": "go test"}


@pytest.mark.parametrize("language", ["python", "node", "go"])
async def test_passing_project(http, language):
    sid = await project_sandbox(http, language, "pass")
    result = await run(http, sid, "true", test=True)
    tests = result["tests"]
    assert tests["runner"] == RUNNERS[language]
    assert (tests["passed"], tests["failed"]) == (1, 0), result["output"]
    assert tests["exit_code"] == 0
    assert result["exit_code"] == 0
    assert tests["no_tests"] is False


@pytest.mark.parametrize("language", ["python", "node", "go"])
async def test_failing_project(http, language):
    sid = await project_sandbox(http, language, "fail")
    result = await run(http, sid, "true", test=True)
    tests = result["tests"]
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (1, 2, 1), result["output"]
    assert tests["exit_code"] != 0
    assert result["exit_code"] == tests["exit_code"]
    assert tests["summary"]


@pytest.mark.parametrize("language", ["python", "node", "go"])
async def test_project_without_tests_says_so(http, language):
    sid = await project_sandbox(http, language, "notests")
    result = await run(http, sid, "true", test=True)
    tests = result["tests"]
    assert tests["no_tests"] is True, result["output"]
    assert (tests["passed"], tests["failed"]) == (0, 0)


@pytest.mark.parametrize(
    ("language", "command"), [("python", "python3 server.py"), ("node", "node server.js")]
)
async def test_tests_reach_a_server_the_command_started(http, language, command):
    sid = await project_sandbox(http, language, "server")
    result = await run(http, sid, command, test=True)
    assert result["tests"]["passed"] == 1, result["output"]
    assert result["command"]["still_running"] is True
    assert result["exit_code"] == 0


@pytest.mark.parametrize(
    ("language", "command"),
    [
        ("python", "python --version && python3 --version && pip --version && pytest --version"),
        ("node", "node --version && npm --version && npx --version"),
        ("go", "go version && gofmt -l . && go env GOCACHE"),
    ],
)
async def test_usual_commands_work_as_typed(http, language, command):
    async with http.post("/v1/sandboxes", json={"language": language}) as r:
        sid = (await r.json())["id"]
    result = await run(http, sid, command)
    assert result["exit_code"] == 0, result["output"]


async def test_go_build_cache_lives_outside_the_workspace(http):
    sid = await project_sandbox(http, "go", "pass")
    result = await run(http, sid, "go env GOCACHE GOPATH")
    assert result["stdout"].split() == ["/home/sandbox/.cache/go-build", "/home/sandbox/go"]
    await run(http, sid, "go test ./...")
    listing = await run(http, sid, "ls -A")
    assert sorted(listing["stdout"].split()) == ["go.mod", "sum.go", "sum_test.go"]
    cached = await run(http, sid, "ls /home/sandbox/.cache/go-build | wc -l")
    assert int(cached["stdout"]) > 0


async def test_go_vendor_builds_offline(http):
    sid = await project_sandbox(http, "go", "vendored")
    result = await run(http, sid, "true", test=True)
    assert result["tests"]["passed"] == 1, result["output"]


async def test_node_modules_in_the_workspace_resolve(http):
    sid = await project_sandbox(http, "node", "pass")
    async with http.post(
        f"/v1/sandboxes/{sid}/upload",
        data=form_with_file(
            _zip(
                {
                    "node_modules/leftpad/index.js": "module.exports = (s, n) => s.padStart(n);\n",
                    "node_modules/leftpad/package.json": '{"name": "leftpad", "main": "index.js"}',
                    "pad.test.js": (
                        "const pad = require('leftpad');\n"
                        "test('pads', () => { expect(pad('x', 3)).toBe('  x'); });\n"
                    ),
                }
            ),
            "p.zip",
        ),
    ) as r:
        assert r.status == 201
    result = await run(http, sid, "true", test=True)
    assert result["tests"]["passed"] == 2, result["output"]


async def test_pip_install_persists_for_later_commands_and_tests(http):
    sid = await project_sandbox(http, "python", "pass")
    wheel = _wheel("greeting", "1.0", "def hello():\n    return 'hi'\n")
    async with http.post(
        f"/v1/sandboxes/{sid}/files", data=form_with_file(wheel, "greeting-1.0-py3-none-any.whl")
    ) as r:
        assert r.status == 201
    installed = await run(http, sid, "pip install --no-index greeting-1.0-py3-none-any.whl")
    assert installed["exit_code"] == 0, installed["output"]
    later = await run(http, sid, "python -c 'import greeting; print(greeting.hello())'")
    assert later["stdout"] == "hi\n", later["output"]
    archive = _zip(
        {
            "tests/test_greeting.py": (
                "import greeting\n\ndef test_hi():\n    assert greeting.hello() == 'hi'\n"
            )
        }
    )
    async with http.post(f"/v1/sandboxes/{sid}/upload", data=form_with_file(archive, "t.zip")) as r:
        assert r.status == 201
    result = await run(http, sid, "true", test=True)
    assert result["tests"]["passed"] == 2, result["output"]


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


def _wheel(name: str, version: str, source: str) -> bytes:
    """A minimal pure-python wheel, built by hand so no build backend or network is needed."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record
    return _zip(files)
