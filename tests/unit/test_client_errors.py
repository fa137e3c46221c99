"""The client's error mapping: one exception class per problem code, at one boundary."""

from __future__ import annotations

import pytest

import sandboxd.client as client
from sandboxd import errors
from sandboxd.client import errors as client_errors
from sandboxd.client.errors import ERRORS, error_from_problem
from sandboxd.problems import HTTP_CODES


def _daemon_error_classes() -> list[type[errors.SandboxdError]]:
    out: list[type[errors.SandboxdError]] = []
    stack = [errors.SandboxdError]
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return out


def test_every_code_the_daemon_raises_has_a_class():
    codes = {cls.code for cls in _daemon_error_classes()}
    assert codes - set(ERRORS) == set()


def test_the_codes_of_aiohttps_own_refusals_have_classes_too():
    for code, _title in HTTP_CODES.values():
        assert code in ERRORS
    assert ERRORS["not_found"] is client.NotFound
    assert ERRORS["method_not_allowed"] is client.MethodNotAllowed
    assert ERRORS["internal_error"] is client.InternalError


def test_every_class_has_its_own_code_and_is_exported():
    assert len(ERRORS) == len(set(ERRORS.values()))
    for code, cls in ERRORS.items():
        assert cls.code == code
        assert issubclass(cls, client.DaemonError)
        assert issubclass(cls, client.ClientError)
        assert getattr(client, cls.__name__) is cls, f"sandboxd.client lacks {cls.__name__}"
        assert cls.__name__ in client.__all__


def test_the_hierarchy_mirrors_the_daemons():
    # except ValidationFailed also catches LegacyField, as on the daemon's side.
    for cls in _daemon_error_classes():
        parent = cls.__mro__[1]
        if parent is errors.SandboxdError or cls is errors.SandboxdError:
            continue
        assert issubclass(ERRORS[cls.code], ERRORS[parent.code]), cls.__name__
    assert issubclass(client.LegacyField, client.ValidationFailed)
    assert issubclass(client.ArchiveTooLarge, client.InvalidArchive)


def test_a_problem_becomes_its_class_with_everything_in_it():
    body = {
        "type": "urn:sandboxd:problem:sandbox_not_found",
        "title": "Sandbox not found",
        "status": 404,
        "detail": "No sandbox has the id 'sb-x'.",
        "code": "sandbox_not_found",
    }
    exc = error_from_problem(404, body)
    assert type(exc) is client.SandboxNotFound
    assert (exc.status, exc.code, exc.detail, exc.body) == (
        404,
        "sandbox_not_found",
        "No sandbox has the id 'sb-x'.",
        body,
    )
    assert str(exc) == "No sandbox has the id 'sb-x'. (sandbox_not_found, HTTP 404)"


def test_validation_errors_list_each_field():
    exc = error_from_problem(
        422,
        {
            "code": "validation_failed",
            "detail": "language: unknown",
            "errors": [{"field": "language", "message": "unknown"}],
        },
    )
    assert isinstance(exc, client.ValidationFailed)
    assert exc.errors == [{"field": "language", "message": "unknown"}]


def test_too_many_requests_carries_retry_after():
    exc = error_from_problem(
        429, {"code": "too_many_requests", "detail": "busy"}, {"Retry-After": "3"}
    )
    assert isinstance(exc, client.TooManyRequests)
    assert exc.retry_after == 3.0
    assert error_from_problem(429, {"code": "too_many_requests"}).retry_after is None


@pytest.mark.parametrize(
    ("body", "code", "detail"),
    [
        ({"code": "from_a_newer_daemon", "detail": "new"}, "from_a_newer_daemon", "new"),
        ("not a problem", "unknown", "Bad Gateway"),
        ({}, "unknown", "Bad Gateway"),
    ],
)
def test_an_unknown_code_or_a_body_that_is_no_problem_is_a_plain_daemon_error(body, code, detail):
    exc = error_from_problem(502, body, reason="Bad Gateway")
    assert type(exc) is client.DaemonError
    assert (exc.status, exc.code, exc.detail) == (502, code, detail)


def test_not_running_names_the_socket(tmp_path):
    exc = client.NotRunning(tmp_path / "s.sock")
    assert isinstance(exc, client.ClientError)
    assert str(tmp_path / "s.sock") in str(exc)
    assert exc.socket_path == tmp_path / "s.sock"


def test_the_module_is_the_single_source_of_the_classes():
    # The package re-exports the very classes the boundary raises, not copies.
    for name in ("SandboxNotFound", "DaemonError", "NotRunning", "ConnectionLost"):
        assert getattr(client, name) is getattr(client_errors, name)
