"""The man page documents every config key with its default, and has every section it should."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandboxd.config import Limits, Listen, Settings

SCD = Path(__file__).resolve().parents[2] / "man" / "sandboxd.1.scd"


def _section(name: str) -> str:
    text = SCD.read_text()
    match = re.search(rf"^# {name}\n(.*?)(?=^# )", text, re.S | re.M)
    assert match, f"no {name} section"
    return match.group(1)


def _documented_config() -> dict[str, Any]:
    block = re.search(r"```\n(.*?)```", _section("CONFIGURATION"), re.S)
    assert block
    return tomllib.loads(block.group(1))


def _leaves(model: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        out[name] = None if field.default_factory is not None else field.default
    return out


def test_the_config_example_is_valid_toml_and_valid_settings():
    data = _documented_config()
    placeholders = {k for k, v in data.items() if v == "..."}
    data = {k: v for k, v in data.items() if k not in placeholders}
    data["listen"] = {k: v for k, v in data["listen"].items() if v != "..."}
    Settings.model_validate(data)


def test_every_key_is_documented_with_its_default():
    data = _documented_config()
    for name, default in _leaves(Settings).items():
        assert name in data, f"{name} is not in CONFIGURATION"
        if default is not None and not isinstance(default, BaseModel):
            assert data[name] == default, f"{name}: documented {data[name]!r}, is {default!r}"
    for name, default in _leaves(Limits).items():
        assert data["limits"][name] == default, f"limits.{name}"
    listen = data["listen"]
    for name, default in _leaves(Listen).items():
        assert name in listen, f"listen.{name} is not in CONFIGURATION"
        if name != "tcp" and default is not None:
            assert listen[name] == (list(default) if isinstance(default, tuple) else default)
    assert Listen().tcp is None  # documented as "default: none"


def test_every_section_is_there():
    text = SCD.read_text()
    for name in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "COMMANDS",
        "HTTP API",
        "TCP MODE",
        "SYSTEMD",
        "CONFIGURATION",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "SIGNALS",
        "SECURITY",
        "EXAMPLES",
        "SEE ALSO",
    ]:
        assert f"\n# {name}\n" in text, name


def test_signals_and_environment_name_what_the_daemon_uses():
    signals = _section("SIGNALS")
    for sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        assert f"*{sig}*" in signals
    environment = _section("ENVIRONMENT")
    for var in (
        "SANDBOXD_SOCKET",
        "SANDBOXD_DATA_DIR",
        "SANDBOXD_CONFIG",
        "XDG_RUNTIME_DIR",
        "LISTEN_FDS",
        "LISTEN_PID",
        "NOTIFY_SOCKET",
        "JOURNAL_STREAM",
    ):
        assert var in environment, var


def test_files_lists_every_default_path():
    files = _section("FILES")
    for fragment in (
        "sandboxd.sock",
        "sandboxd.log",
        "sandboxes/ID/",
        "trash/",
        "etc/",
        "toolchains/",
        "config.toml",
        "sandboxd/token",
        "sandboxd.socket",
        "sandboxd.service",
    ):
        assert fragment in files, fragment
