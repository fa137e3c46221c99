"""Wrong types and malformed bodies everywhere: a precise 4xx problem, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandboxd.config import Settings
from tests.security.helpers import expect_problem


def _fields(problem: dict[str, Any]) -> list[str]:
    return [e["field"] for e in problem.get("errors", [])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": 123}, "command"),
        ({"command": []}, "command"),
        ({"command": ["echo", "hi"]}, "command"),
        ({"command": None}, "command"),
        ({"command": ""}, "command"),
        ({"command": {"sh": "true"}}, "command"),
        ({"command": True}, "command"),
        ({"command": "echo \u0000hi"}, "command"),
        ({}, "command"),
        ({"command": "true", "test": "yes"}, "test"),
        ({"command": "true", "test": 1}, "test"),
        ({"command": "true", "test": None}, "test"),
        ({"command": "true", "timeout": -1}, "timeout"),
        ({"command": "true", "timeout": 0}, "timeout"),
        ({"command": "true", "timeout": "5"}, "timeout"),
        ({"command": "true", "timeout": True}, "timeout"),
        ({"command": "true", "timeout": [5]}, "timeout"),
        ({"command": "true", "timeout": 1e9}, "timeout"),
        ({"command": "true", "timeout": 601}, "timeout"),
        ({"command": "true", "extra": 1}, "extra"),
        ({"command": "true", "environ": {"A": "b"}}, "environ"),
        ({"command": "true", "env": {"A=B": "c"}}, "env.A=B.[key]"),
        # bwrap's options travel NUL-separated (--args): a NUL would inject options.
        ({"command": "true", "env": {"A": "b\u0000c"}}, "env.A"),
        ({"command": "true", "env": ["A=b"]}, "env"),
        ({"cmd": "true"}, "cmd"),
        ({"command": "true", "limits": []}, "limits"),
        ({"command": "true", "limits": "low"}, "limits"),
        ({"command": "true", "limits": {"processes": 0}}, "limits.processes"),
        ({"command": "true", "limits": {"processes": -5}}, "limits.processes"),
        ({"command": "true", "limits": {"memory_bytes": "1"}}, "limits.memory_bytes"),
        ({"command": "true", "limits": {"cpu_seconds": 1.5}}, "limits.cpu_seconds"),
        ({"command": "true", "limits": {"bogus": 1}}, "limits.bogus"),
        # Only lower than configured: a request cannot raise its own limits.
        ({"command": "true", "limits": {"processes": 10**9}}, "limits.processes"),
        ({"command": "true", "limits": {"memory_bytes": 2**62}}, "limits.memory_bytes"),
        ({"command": "true", "limits": {"open_files": 10**6}}, "limits.open_files"),
    ],
)
async def test_exec_wrong_types(
    client: Any, sandbox: dict[str, Any], body: dict[str, Any], field: str
) -> None:
    r = await client.post(f"/v1/sandboxes/{sandbox['id']}/exec", json=body)
    problem = await expect_problem(r, 422, "validation_failed")
    assert field in _fields(problem), problem
    assert field in problem["detail"], problem


async def test_exec_timeout_over_max_names_the_max(client: Any, sandbox: dict[str, Any]) -> None:
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec", json={"command": "true", "timeout": 1e9}
    )
    problem = await expect_problem(r, 422, "validation_failed")
    assert problem["errors"] == [{"field": "timeout", "message": "at most 600"}]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"command": "true", "timeout": NaN}',
        b'{"command": "true", "timeout": Infinity}',
        b'{"command": "true", "timeout": -Infinity}',
        b'{"command": "true", "timeout": 1e400}',
    ],
)
async def test_exec_non_finite_timeouts(client: Any, sandbox: dict[str, Any], raw: bytes) -> None:
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec",
        data=raw,
        headers={"Content-Type": "application/json"},
    )
    assert r.status in (400, 422), await r.text()
    problem = await expect_problem(
        r, r.status, "malformed_body" if r.status == 400 else "validation_failed"
    )
    assert problem["status"] == r.status


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"[]", 422, "validation_failed"),
        (b'"x"', 422, "validation_failed"),
        (b"42", 422, "validation_failed"),
        (b"null", 422, "validation_failed"),
        (b"{", 400, "malformed_body"),
        (b"{'command': 'true'}", 400, "malformed_body"),
        (b'{"command": "true",}', 400, "malformed_body"),
        (b"\xff\xfe{}", 400, "malformed_body"),
        (b'{"command": "\xff"}', 400, "malformed_body"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "malformed_body"),
        (b"", 400, "malformed_body"),
        (b"   ", 400, "malformed_body"),
    ],
)
async def test_exec_malformed_bodies(
    client: Any, sandbox: dict[str, Any], raw: bytes, status: int, code: str
) -> None:
    r = await client.post(
        f"/v1/sandboxes/{sandbox['id']}/exec",
        data=raw,
        headers={"Content-Type": "application/json"},
    )
    await expect_problem(r, status, code)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"language": 5}, "language"),
        ({"language": None}, "language"),
        ({"language": ["python"]}, "language"),
        ({"language": "Python"}, "language"),
        ({"language": "ruby"}, "language"),
        ({"language": "python", "extra": True}, "extra"),
        ({"language": "python", "labels": []}, "labels"),
        ({"language": "python", "labels": {"k": 1}}, "labels.k"),
        ({"language": "python", "labels": {"bad key!": "v"}}, "labels.bad key!.[key]"),
        ({"language": "python", "labels": {f"k{i}": "v" for i in range(33)}}, "labels"),
    ],
)
async def test_create_wrong_types(
    client: Any, settings: Settings, body: dict[str, Any], field: str
) -> None:
    r = await client.post("/v1/sandboxes", json=body)
    problem = await expect_problem(r, 422, "validation_failed")
    assert field in _fields(problem), problem
    assert list((settings.data_dir / "sandboxes").iterdir()) == []


async def test_create_java_lists_the_languages(client: Any) -> None:
    r = await client.post("/v1/sandboxes", json={"language": "java"})
    problem = await expect_problem(r, 422, "validation_failed")
    assert problem["errors"][0]["field"] == "language"
    for language in ("python", "node", "go"):
        assert language in problem["detail"], problem
    assert "allowed: python, node, go" in problem["detail"]


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"[]", 422, "validation_failed"),
        (b'"x"', 422, "validation_failed"),
        (b"{", 400, "malformed_body"),
        (b"not json", 400, "malformed_body"),
    ],
)
async def test_create_malformed_bodies(client: Any, raw: bytes, status: int, code: str) -> None:
    r = await client.post("/v1/sandboxes", data=raw, headers={"Content-Type": "application/json"})
    await expect_problem(r, status, code)


@pytest.mark.parametrize(
    "body",
    [{"filename": "x.py"}, {"filename": "x.py", "command": "python x.py"}],
)
async def test_legacy_filename_field(
    client: Any, sandbox: dict[str, Any], body: dict[str, Any]
) -> None:
    r = await client.post(f"/v1/sandboxes/{sandbox['id']}/exec", json=body)
    problem = await expect_problem(r, 422, "legacy_field")
    assert "v0.4.0" in problem["detail"]
    assert problem["errors"] == [
        {"field": "filename", "message": "replaced by 'command' in v0.4.0"}
    ]


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/sandboxes/sb-0000000000000000", 404, "sandbox_not_found"),
        ("DELETE", "/v1/sandboxes/sb-0000000000000000", 404, "sandbox_not_found"),
        ("DELETE", "/v1/sandboxes/..%2F..%2Fetc", 404, "sandbox_not_found"),
        ("DELETE", "/v1/sandboxes/%2E%2E", 404, "not_found"),  # the URL normalises to /v1/
        ("POST", "/v1/sandboxes/sb-0000000000000000/exec", 404, "sandbox_not_found"),
        ("GET", "/v1/nothing", 404, "not_found"),
        ("PUT", "/v1/sandboxes", 405, "method_not_allowed"),
        ("PATCH", "/v1/status", 405, "method_not_allowed"),
    ],
)
async def test_unknown_targets(
    client: Any, settings: Settings, method: str, path: str, status: int, code: str
) -> None:
    etc_before = (
        sorted((settings.data_dir / "etc").iterdir())
        if (settings.data_dir / "etc").exists()
        else None
    )
    r = await client.request(method, path, json={"command": "true"})
    await expect_problem(r, status, code)
    if etc_before is not None:
        assert sorted((settings.data_dir / "etc").iterdir()) == etc_before


FUZZ_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    1e308,
    "",
    "x",
    "\u0000",
    [],
    [1],
    {},
    {"a": 1},
    "🙂" * 10,
]


@pytest.mark.parametrize("value", FUZZ_VALUES, ids=[json.dumps(v)[:20] for v in FUZZ_VALUES])
async def test_no_value_in_any_field_is_a_500(
    client: Any, sandbox: dict[str, Any], value: Any
) -> None:
    sid = sandbox["id"]
    for path, body in [
        (f"/v1/sandboxes/{sid}/exec", {"command": value}),
        (f"/v1/sandboxes/{sid}/exec", {"command": "true", "test": value}),
        (f"/v1/sandboxes/{sid}/exec", {"command": "true", "timeout": value}),
        (f"/v1/sandboxes/{sid}/exec", {"command": "true", "limits": value}),
        (f"/v1/sandboxes/{sid}/exec", {"command": "true", "limits": {"processes": value}}),
        (f"/v1/sandboxes/{sid}/exec", value),
        ("/v1/sandboxes", {"language": value}),
        ("/v1/sandboxes", {"labels": value}),
        ("/v1/sandboxes", {"labels": {"k": value}}),
        ("/v1/sandboxes", value),
    ]:
        r = await client.post(path, json=body)
        text = await r.text()
        assert r.status < 500, (path, body, text)
        if r.status >= 400:
            assert r.content_type == "application/problem+json", (path, body, text)
