"""Wire models: what goes over HTTP, validated by pydantic.

Requests are strict (no coercion: ``"test": "yes"`` is an error, not True)
and refuse unknown fields, so a typo is reported instead of ignored.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class Language(StrEnum):
    python = "python"
    node = "node"
    go = "go"


ALLOWED_LANGUAGES = [lang.value for lang in Language]

LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-/]{1,64}$")]
LabelValue = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^\x00]*$")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSandboxRequest(_Request):
    language: Language = Language.python
    network: bool = False
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)


PositiveInt = Annotated[int, Field(gt=0)]


class ExecLimits(_Request):
    """Lower per-process limits for one command (at most the configured ones)."""

    # The floors leave room for bwrap, setpriv and a shell to start at all.
    memory_bytes: Annotated[int, Field(ge=64 * 1024 * 1024)] | None = None
    processes: Annotated[int, Field(ge=16)] | None = None
    open_files: Annotated[int, Field(ge=32)] | None = None
    file_bytes: PositiveInt | None = None
    cpu_seconds: PositiveInt | None = None


EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, StringConstraints(max_length=32768, pattern=r"^[^\x00]*$")]


class ExecRequest(_Request):
    command: Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\x00]*$")]
    test: bool = False
    timeout: Annotated[float, Field(gt=0)] | None = None
    limits: ExecLimits | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=256)
    cwd: Annotated[str, StringConstraints(max_length=4096, pattern=r"^[^\x00]*$")] | None = Field(
        None, description="a folder inside the workspace, relative to it (or under /workspace)"
    )
    stdin: str | None = Field(None, description="text fed to the command's standard input")


class SandboxStatus(StrEnum):
    created = "created"
    running = "running"
    idle = "idle"


class Sandbox(BaseModel):
    id: str
    language: Language
    status: SandboxStatus
    created_at: datetime
    labels: dict[str, str] = Field(default_factory=dict)
    network: bool = False
    workspace: str = Field(description="host path of the workspace folder")
    running_commands: int = 0
    last_exec_at: datetime | None = None


class SandboxList(BaseModel):
    sandboxes: list[Sandbox]


class FileEntry(BaseModel):
    path: str = Field(description="relative to the workspace")
    type: str = Field(description="file, dir, symlink or other")
    size: int
    mtime: datetime


class FileList(BaseModel):
    path: str
    entries: list[FileEntry]
    truncated: bool = Field(False, description="more entries exist than were listed")


class FileUploaded(BaseModel):
    filename: str
    path: str = Field("", description="where it landed, relative to the workspace")
    size: int


class ArchiveUploaded(BaseModel):
    status: str = "uploaded"
    files: int
    bytes: int


class TestsResult(BaseModel):
    runner: str
    command: str
    exit_code: int | None
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    no_tests: bool = False
    summary: str | None = Field(None, description="the runner's own summary line")
    output: str = ""
    stdout: str = ""
    stderr: str = ""


class CommandResult(BaseModel):
    """The command's own result in test mode, beside the runner's."""

    exit_code: int | None = Field(description="null if it was still running when the tests ended")
    still_running: bool = False
    output: str = ""
    stdout: str = ""
    stderr: str = ""


class ExecResult(BaseModel):
    output: str
    exit_code: int | None = Field(description="null when the command was killed by the timeout")
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool
    truncated: bool
    quota_exceeded: bool = Field(
        False, description="the command was stopped for filling the workspace's disk quota"
    )
    command: CommandResult | None = None
    tests: TestsResult | None = None


class Problem(BaseModel):
    """RFC 9457 problem details, plus a stable machine ``code``."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: list[dict[str, str]] | None = None


class DaemonStatus(BaseModel):
    version: str
    pid: int
    uptime_seconds: float
    socket: str
    data_dir: str
    sandboxes: int
    running_commands: int
    isolation: dict[str, str]
    limits: dict[str, float | int]


class Version(BaseModel):
    version: str
    api: str = "v1"
