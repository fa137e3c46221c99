"""The errors sandboxd itself raises.

Each class carries a stable machine ``code`` and a human ``title``; the
message is the RFC 9457 ``detail``. HTTP statuses are not decided here: the
server holds the one table from class to status, so the core stays free of
HTTP.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SandboxdError(Exception):
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class SandboxNotFound(SandboxdError):
    code = "sandbox_not_found"
    title = "Sandbox not found"


class SandboxDeleted(SandboxdError):
    code = "sandbox_deleted"
    title = "Sandbox was deleted while the command ran"


class InvalidRequest(SandboxdError):
    """The body did not validate. ``extra["errors"]`` lists each bad field."""

    code = "validation_failed"
    title = "The request is not valid"


class LegacyField(InvalidRequest):
    code = "legacy_field"
    title = "A field that no longer exists was sent"


class MalformedBody(SandboxdError):
    code = "malformed_body"
    title = "The request body could not be parsed"


class UnsupportedMediaType(SandboxdError):
    code = "unsupported_media_type"
    title = "Unsupported content type"


class PayloadTooLarge(SandboxdError):
    code = "payload_too_large"
    title = "The request body is too large"


class MissingFile(SandboxdError):
    code = "missing_file"
    title = "No file in the form field 'file'"


class UnsafePath(SandboxdError):
    code = "unsafe_path"
    title = "The path is not allowed"


class PathConflict(SandboxdError):
    code = "path_conflict"
    title = "The path conflicts with what is in the workspace"


class InvalidArchive(SandboxdError):
    code = "invalid_archive"
    title = "The archive is not a valid, safe zip file"


class ArchiveTooLarge(InvalidArchive):
    code = "archive_too_large"
    title = "The archive exceeds a limit"


class SandboxSetupFailed(SandboxdError):
    """bubblewrap could not build the sandbox: the sandbox failed, not the program."""

    code = "sandbox_setup_failed"
    title = "The sandbox could not be set up"


class ToolchainMissing(SandboxdError):
    code = "toolchain_missing"
    title = "The language's toolchain is not installed"


class ShuttingDown(SandboxdError):
    code = "shutting_down"
    title = "The daemon is shutting down"


class QuotaExceeded(SandboxdError):
    code = "quota_exceeded"
    title = "The workspace is over its disk quota"


class TooManyRequests(SandboxdError):
    """A daemon-wide limit (sandboxes, concurrent commands) is reached; retry later."""

    code = "too_many_requests"
    title = "Too many requests"

    def __init__(self, detail: str, retry_after: int = 1) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class NetworkUnavailable(SandboxdError):
    code = "network_unavailable"
    title = "Network access cannot be given on this host"


class NotAFolder(SandboxdError):
    code = "not_a_folder"
    title = "No such folder in the workspace"


class FileNotInWorkspace(SandboxdError):
    code = "file_not_found"
    title = "No such file in the workspace"


class NotAFile(SandboxdError):
    code = "not_a_file"
    title = "The path is not a regular file"
