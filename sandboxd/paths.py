"""Where sandboxd keeps things. The only user of platformdirs.

A per-user daemon follows the XDG base directories. Run as root (as CI does)
it uses system locations instead: the sandboxed code then runs as an
unprivileged uid, which must be able to traverse to the workspaces, and
root's home (mode 0700) would stop it.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "sandboxd"


def running_as_root() -> bool:
    return os.geteuid() == 0


def runtime_dir() -> Path:
    if running_as_root():
        return Path("/run") / APP
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / APP
    # No XDG_RUNTIME_DIR (a plain ssh session, a container): a private
    # directory in /tmp, named by uid so users cannot collide.
    return Path("/tmp") / f"{APP}-{os.getuid()}"


def default_socket_path() -> Path:
    return runtime_dir() / f"{APP}.sock"


def default_data_dir() -> Path:
    if running_as_root():
        return Path("/var/lib") / APP
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def default_toolchains_dir() -> Path:
    """Test runners provisioned by `sandboxd toolchains install`.

    Beside the default data dir, not inside whichever --data-dir is in use,
    so one install serves every daemon of the user (and the test suite's).
    """
    return default_data_dir() / "toolchains"


def default_config_file() -> Path:
    if running_as_root():
        return Path("/etc") / APP / "config.toml"
    return Path(platformdirs.user_config_dir(APP, appauthor=False)) / "config.toml"


def default_token_file() -> Path:
    """The bearer token of TCP mode: beside the config file, so it survives reboots."""
    return default_config_file().parent / "token"


def default_log_file(runtime: Path) -> Path:
    """Where `sandboxd start` sends the background daemon's stderr."""
    return runtime / f"{APP}.log"
