"""The exceptions of the Python client: one class per problem ``code``.

The daemon answers every refusal with an RFC 9457 problem carrying a stable
``code``; ``error_from_problem`` turns one into the matching class, and is
the only place that does (sandboxd.client calls it for plain answers and for
the ``error`` event that ends a stream). The classes mirror sandboxd.errors,
so ``except ValidationFailed`` also catches ``LegacyField``, and
``except InvalidArchive`` also catches ``ArchiveTooLarge``. A code this
client does not know (a newer daemon) still raises ``DaemonError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ClientError(Exception):
    """Base for everything the client raises."""


class NotRunning(ClientError):
    """No daemon answers on the socket."""

    def __init__(self, socket_path: Path) -> None:
        super().__init__(f"sandboxd is not running (no daemon answers on {socket_path}).")
        self.socket_path = socket_path


class ConnectionLost(ClientError):
    """The connection broke before the daemon answered (it stopped, or refused a body)."""


class DaemonError(ClientError):
    """The daemon answered with an RFC 9457 problem.

    ``status`` is the HTTP status; for an error that ends a stream it is the
    one the problem names, else 200 (the status the stream itself had).
    """

    code: str = ""

    def __init__(self, status: int, code: str, detail: str, body: Mapping[str, Any]) -> None:
        super().__init__(f"{detail} ({code}, HTTP {status})")
        self.status = status
        self.code = code  # the instance's own: also set for codes with no class
        self.detail = detail
        self.body = dict(body)


class SandboxNotFound(DaemonError):
    code = "sandbox_not_found"


class SandboxDeleted(DaemonError):
    """The sandbox was deleted while the command ran; the command was killed."""

    code = "sandbox_deleted"


class ValidationFailed(DaemonError):
    """Fields were wrong or missing; ``errors`` lists each one."""

    code = "validation_failed"

    @property
    def errors(self) -> list[dict[str, str]]:
        return list(self.body.get("errors") or [])


class LegacyField(ValidationFailed):
    code = "legacy_field"


class MalformedBody(DaemonError):
    code = "malformed_body"


class UnsupportedMediaType(DaemonError):
    code = "unsupported_media_type"


class PayloadTooLarge(DaemonError):
    code = "payload_too_large"


class MissingFile(DaemonError):
    code = "missing_file"


class UnsafePath(DaemonError):
    code = "unsafe_path"


class PathConflict(DaemonError):
    code = "path_conflict"


class InvalidArchive(DaemonError):
    code = "invalid_archive"


class ArchiveTooLarge(InvalidArchive):
    code = "archive_too_large"


class SandboxSetupFailed(DaemonError):
    code = "sandbox_setup_failed"


class ToolchainMissing(DaemonError):
    code = "toolchain_missing"


class ShuttingDown(DaemonError):
    code = "shutting_down"


class QuotaExceeded(DaemonError):
    code = "quota_exceeded"


class TooManyRequests(DaemonError):
    """A daemon-wide limit is reached; ``retry_after`` says how many seconds to wait."""

    code = "too_many_requests"

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        body: Mapping[str, Any],
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, detail, body)
        self.retry_after = retry_after


class NetworkUnavailable(DaemonError):
    code = "network_unavailable"


class NotAFolder(DaemonError):
    code = "not_a_folder"


class FileNotFound(DaemonError):
    code = "file_not_found"


class NotAFile(DaemonError):
    code = "not_a_file"


class NotFound(DaemonError):
    """No such endpoint (a client and daemon of different versions)."""

    code = "not_found"


class MethodNotAllowed(DaemonError):
    code = "method_not_allowed"


class InternalError(DaemonError):
    code = "internal_error"


def _all_subclasses(cls: type[DaemonError]) -> list[type[DaemonError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


ERRORS: dict[str, type[DaemonError]] = {cls.code: cls for cls in _all_subclasses(DaemonError)}


def error_from_problem(
    status: int, body: Any, headers: Mapping[str, str] | None = None, reason: str = ""
) -> DaemonError:
    """The exception for a problem the daemon sent (the one conversion point)."""
    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    code = str(problem.get("code") or "unknown")
    detail = str(problem.get("detail") or reason or f"HTTP {status}")
    cls = ERRORS.get(code, DaemonError)
    if cls is TooManyRequests:
        retry = (headers or {}).get("Retry-After")
        try:
            retry_after = float(retry) if retry is not None else None
        except ValueError:
            retry_after = None
        return TooManyRequests(status, code, detail, problem, retry_after)
    return cls(status, code, detail, problem)
