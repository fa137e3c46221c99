"""Settings: defaults, the config file, and command-line overrides.

The only reader of settings. The config file is TOML (stdlib tomllib),
validated by pydantic with unknown keys refused, so a typo is an error that
names the key and the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandboxd import listen, paths
from sandboxd.models import Language

MiB = 1024 * 1024
GiB = 1024 * MiB


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    exec_timeout_default: float = Field(60.0, gt=0)
    exec_timeout_max: float = Field(600.0, gt=0)
    output_bytes: int = Field(1 * MiB, gt=0, description="kept per stream (the end)")
    json_body_bytes: int = Field(1 * MiB, gt=0)
    upload_bytes: int = Field(256 * MiB, gt=0, description="one upload request body")
    archive_unpacked_bytes: int = Field(1 * GiB, gt=0)
    archive_entries: int = Field(50_000, gt=0)
    archive_path_bytes: int = Field(1024, gt=0)
    test_wait_seconds: float = Field(2.0, ge=0, description="the spec's fixed wait")
    # Per process inside a sandbox (rlimits); an exec may ask for less.
    memory_bytes: int = Field(4 * GiB, gt=0, description="RLIMIT_DATA")
    processes: int = Field(512, gt=0, description="RLIMIT_NPROC, per sandbox uid")
    open_files: int = Field(1024, gt=0, description="RLIMIT_NOFILE")
    file_bytes: int = Field(1 * GiB, gt=0, description="RLIMIT_FSIZE")
    cpu_seconds: int = Field(600, gt=0, description="RLIMIT_CPU")
    tmp_bytes: int = Field(512 * MiB, gt=0, description="size of each exec's /tmp")
    # Per sandbox and per daemon.
    workspace_bytes: int = Field(10 * GiB, gt=0, description="disk quota of one workspace")
    sandboxes: int = Field(20_000, gt=0, description="sandboxes at once")
    concurrent_execs: int = Field(64, gt=0, description="commands running at once")


class ToolchainConfig(_Strict):
    executable: Path | None = Field(None, description="the language's main program")


class Listen(_Strict):
    """The listeners besides the Unix socket (which is always there)."""

    tcp: str | None = Field(None, description="HOST:PORT for TCP mode; loopback only by default")
    allow_remote: bool = Field(False, description="let tcp be a non-loopback address")
    token_file: Path = Field(default_factory=paths.default_token_file)
    # Host names (no port) accepted in TCP mode besides localhost, 127.0.0.1, [::1].
    allowed_hosts: tuple[str, ...] = ()

    @field_validator("tcp")
    @classmethod
    def _valid_address(cls, value: str | None) -> str | None:
        if value is not None:
            listen.parse_address(value)  # its ValueError names what is wrong
        return value


class Settings(_Strict):
    socket_path: Path = Field(default_factory=paths.default_socket_path)
    data_dir: Path = Field(default_factory=paths.default_data_dir)
    bwrap: str = "bwrap"
    # The user-mode network stack for sandboxes created with "network": true.
    slirp4netns: str = "slirp4netns"
    # When the daemon is root, each sandbox's code runs as a host uid (and gid)
    # of its own from this range, never as root, so that one sandbox's
    # processes count against its own RLIMIT_NPROC, not another's.
    sandbox_uid_start: int = Field(524288, gt=0)
    sandbox_uid_count: int = Field(65536, gt=1)
    seccomp: bool = Field(True, description="load the seccomp filter (turn off only to debug)")
    limits: Limits = Field(default_factory=Limits)
    toolchains: dict[Language, ToolchainConfig] = Field(default_factory=dict)
    # Provisioned test runners; shared by every data dir of the user.
    toolchains_dir: Path = Field(default_factory=paths.default_toolchains_dir)
    listen: Listen = Field(default_factory=Listen)
    # On SIGTERM: how long running commands may go on before they are killed.
    shutdown_grace_seconds: float = Field(10.0, ge=0)


class ConfigError(Exception):
    """The config file is unreadable or invalid; the message names file and key."""


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Defaults, then the config file (if it exists), then non-None overrides."""
    path = config_file or paths.default_config_file()
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # --tcp overrides one key of [listen]
        else:
            data[key] = value
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from exc
