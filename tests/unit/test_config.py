"""config.load_settings: defaults, then the TOML file, then non-None overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.config import ConfigError, Limits, Settings, load_settings
from sandboxd.models import Language

VALID = """\
bwrap = "/opt/bwrap/bin/bwrap"
socket_path = "/srv/sbx/file.sock"
data_dir = "/srv/sbx/data"
sandbox_uid_start = 600000
seccomp = false

[limits]
output_bytes = 5000
exec_timeout_default = 12.5
test_wait_seconds = 0

[toolchains.python]
executable = "/opt/python/bin/python3"
"""


def _config(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "config.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_valid_file_overrides_defaults(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, VALID))
    assert settings.bwrap == "/opt/bwrap/bin/bwrap"
    assert settings.socket_path == Path("/srv/sbx/file.sock")
    assert settings.data_dir == Path("/srv/sbx/data")
    assert settings.sandbox_uid_start == 600000
    assert settings.seccomp is False
    assert settings.limits.output_bytes == 5000
    assert settings.limits.exec_timeout_default == 12.5
    assert settings.limits.test_wait_seconds == 0
    assert settings.toolchains[Language.python].executable == Path("/opt/python/bin/python3")
    # what the file does not name keeps its default
    defaults = Limits()
    assert settings.limits.archive_entries == defaults.archive_entries == 50_000
    assert settings.limits.exec_timeout_max == defaults.exec_timeout_max
    assert settings.sandbox_uid_count == Settings().sandbox_uid_count


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "absent.toml") == Settings()


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(_config(tmp_path, "")) == Settings()


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    settings = load_settings(
        _config(tmp_path, VALID),
        socket_path=Path("/kw/s.sock"),
        data_dir=Path("/kw/data"),
        bwrap="/kw/bwrap",
    )
    assert settings.socket_path == Path("/kw/s.sock")
    assert settings.data_dir == Path("/kw/data")
    assert settings.bwrap == "/kw/bwrap"
    # the rest of the file still applies
    assert settings.limits.output_bytes == 5000
    assert settings.sandbox_uid_start == 600000


def test_overrides_win_over_defaults(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "absent.toml", socket_path=Path("/kw/s.sock"))
    assert settings.socket_path == Path("/kw/s.sock")
    assert settings.data_dir == Settings().data_dir


def test_none_overrides_are_ignored(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, VALID), socket_path=None, data_dir=None, bwrap=None)
    assert settings.socket_path == Path("/srv/sbx/file.sock")
    assert settings.data_dir == Path("/srv/sbx/data")
    assert settings.bwrap == "/opt/bwrap/bin/bwrap"


def test_none_overrides_without_file_keep_defaults(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "absent.toml", socket_path=None, data_dir=None)
    assert settings == Settings()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[limits]\noutput_byte = 5\n", "limits.output_byte"),
        ("sockett_path = '/x'\n", "sockett_path"),
        ("[limit]\noutput_bytes = 5\n", "limit"),
        ("[toolchains.python]\nexe = '/x'\n", "toolchains.python.exe"),
        ("[toolchains.rust]\nexecutable = '/x'\n", "rust"),
        ("[limits]\noutput_bytes = 0\n", "limits.output_bytes"),
        ("[limits]\nexec_timeout_max = 'ten'\n", "limits.exec_timeout_max"),
        ("sandbox_uid_start = -1\n", "sandbox_uid_start"),
        ("sandbox_uid_count = 1\n", "sandbox_uid_count"),
        ("sandbox_uid = 1000\n", "sandbox_uid"),
    ],
)
def test_invalid_key_or_value_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = _config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert str(path) in message
    assert key in message


def test_typo_is_refused_even_beside_valid_keys(tmp_path: Path) -> None:
    path = _config(tmp_path, VALID + "\n[limits.extra]\n")
    with pytest.raises(ConfigError, match="limits"):
        load_settings(path)


def test_every_problem_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, "[limits]\noutput_byte = 5\narchive_entrie = 3\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "limits.output_byte" in str(info.value)
    assert "limits.archive_entrie" in str(info.value)


def test_toml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = _config(tmp_path, "[limits\noutput_bytes = 5\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = _config(tmp_path, b'bwrap = "\xff\xfe"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_unreadable_path_is_a_config_error(tmp_path: Path) -> None:
    folder = tmp_path / "config.toml"
    folder.mkdir()
    with pytest.raises(ConfigError) as info:
        load_settings(folder)
    assert str(folder) in str(info.value)


def test_settings_are_frozen(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path, VALID))
    with pytest.raises(ValueError):
        settings.bwrap = "/other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        settings.limits.output_bytes = 1  # type: ignore[misc]
