"""The Python client: talk to the daemon over its Unix socket, get models back.

    from sandboxd.client import Sandbox

    with Sandbox.create("python") as sb:          # deleted again on exit
        sb.upload_dir("proj")                      # zipped from inside proj/
        result = sb.exec("pytest", test=True, on_output=lambda s, t: print(t, end=""))
        print(result.exit_code, result.tests)

``Client`` (the whole API) and ``Sandbox`` (one sandbox) are plain calls;
``AsyncClient`` and ``AsyncSandbox`` are the same for asyncio code. Results
are the pydantic models of sandboxd.models (``SandboxInfo`` is
``sandboxd.models.Sandbox``). A problem the daemon answers raises the class
of its ``code`` (``SandboxNotFound``, ``ValidationFailed``...: all
``DaemonError``); no daemon on the socket raises ``NotRunning``; every error
of this package is a ``ClientError``.

The socket is found as the CLI finds it: the ``socket`` argument, else
``SANDBOXD_SOCKET``, else ``socket_path`` in the config file, else the
default (``$XDG_RUNTIME_DIR/sandboxd/sandboxd.sock``).
"""

from sandboxd.client.aio import (
    AsyncClient,
    OutputCallback,
    PhaseCallback,
    ProgressCallback,
    call,
    command_line,
    find_socket,
    request,
)
from sandboxd.client.errors import (
    ERRORS,
    ArchiveTooLarge,
    ClientError,
    ConnectionLost,
    DaemonError,
    FileNotFound,
    InternalError,
    InvalidArchive,
    LegacyField,
    MalformedBody,
    MethodNotAllowed,
    MissingFile,
    NetworkUnavailable,
    NotAFile,
    NotAFolder,
    NotFound,
    NotRunning,
    PathConflict,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxDeleted,
    SandboxNotFound,
    SandboxSetupFailed,
    ShuttingDown,
    ToolchainMissing,
    TooManyRequests,
    UnsafePath,
    UnsupportedMediaType,
    ValidationFailed,
    error_from_problem,
)
from sandboxd.client.handles import AsyncSandbox, Sandbox
from sandboxd.client.sync import Client
from sandboxd.models import Sandbox as SandboxInfo

__all__ = [
    "ERRORS",
    "ArchiveTooLarge",
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "ClientError",
    "ConnectionLost",
    "DaemonError",
    "FileNotFound",
    "InternalError",
    "InvalidArchive",
    "LegacyField",
    "MalformedBody",
    "MethodNotAllowed",
    "MissingFile",
    "NetworkUnavailable",
    "NotAFile",
    "NotAFolder",
    "NotFound",
    "NotRunning",
    "OutputCallback",
    "PathConflict",
    "PayloadTooLarge",
    "PhaseCallback",
    "ProgressCallback",
    "QuotaExceeded",
    "Sandbox",
    "SandboxDeleted",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxSetupFailed",
    "ShuttingDown",
    "TooManyRequests",
    "ToolchainMissing",
    "UnsafePath",
    "UnsupportedMediaType",
    "ValidationFailed",
    "call",
    "command_line",
    "error_from_problem",
    "find_socket",
    "request",
]
