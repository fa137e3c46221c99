"""The one table from sandboxd's error classes to HTTP statuses.

Used by the error middleware (server.py) and by streaming exec's final
error event (sse.py), so both say the same status for the same error.
"""

from __future__ import annotations

from sandboxd import errors

# The one table from error class to HTTP status. Subclasses are listed
# before the classes they refine; the first match wins.
STATUS: list[tuple[type[errors.SandboxdError], int]] = [
    (errors.SandboxNotFound, 404),
    (errors.SandboxDeleted, 410),
    (errors.LegacyField, 422),
    (errors.InvalidRequest, 422),
    (errors.MalformedBody, 400),
    (errors.UnsupportedMediaType, 415),
    (errors.PayloadTooLarge, 413),
    (errors.QuotaExceeded, 413),
    (errors.TooManyRequests, 429),
    (errors.ArchiveTooLarge, 413),
    (errors.InvalidArchive, 422),
    (errors.MissingFile, 400),
    (errors.UnsafePath, 400),
    (errors.PathConflict, 409),
    (errors.NotAFolder, 422),
    (errors.NotAFile, 422),
    (errors.FileNotInWorkspace, 404),
    (errors.ToolchainMissing, 503),
    (errors.NetworkUnavailable, 503),
    (errors.ShuttingDown, 503),
    (errors.SandboxSetupFailed, 500),
    (errors.SandboxdError, 500),
]

# aiohttp's own refusals (no route, wrong method, body over client_max_size).
HTTP_CODES = {
    404: ("not_found", "No such endpoint"),
    405: ("method_not_allowed", "Method not allowed"),
    413: ("payload_too_large", "The request body is too large"),
}


def status_for(exc: errors.SandboxdError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500
