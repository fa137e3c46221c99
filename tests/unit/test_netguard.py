"""TCP mode's pieces without a server: the listen address, the token file, the settings."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from sandboxd import listen, netguard, paths
from sandboxd.config import ConfigError, load_settings

# -- the listen address ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:8765", "127.0.0.1", 8765),
        ("localhost:8765", "127.0.0.1", 8765),
        ("LOCALHOST:1", "127.0.0.1", 1),
        ("[::1]:8765", "[::1]", 8765),
        ("8765", "127.0.0.1", 8765),
        ("127.0.0.1:0", "127.0.0.1", 0),
        ("0.0.0.0:80", "0.0.0.0", 80),
    ],
)
def test_addresses_that_parse(text, host, port):
    address = listen.parse_address(text)
    assert address.host_name == host
    assert address.port == port


@pytest.mark.parametrize(
    "text",
    [
        "evil.com:80",
        "myhost:80",
        "127.0.0.1",
        "127.0.0.1:",
        ":8765",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "127.0.0.1:http",
        "::1:8765",
        "[::1]8765",
        "[::1]",
        "",
    ],
)
def test_addresses_that_do_not(text):
    with pytest.raises(ValueError):
        listen.parse_address(text)


@pytest.mark.parametrize("text", ["127.0.0.1:1", "127.0.0.2:1", "[::1]:1", "localhost:1"])
def test_loopback_needs_no_permission(text):
    listen.check_remote(listen.parse_address(text), allow_remote=False)


@pytest.mark.parametrize("text", ["0.0.0.0:1", "192.168.1.10:1", "[::]:1", "10.0.0.1:1"])
def test_anything_else_is_refused_without_allow_remote(text):
    with pytest.raises(listen.RemoteRefused, match="--allow-remote"):
        listen.check_remote(listen.parse_address(text), allow_remote=False)


def test_allow_remote_warns(caplog):
    with caplog.at_level(logging.WARNING):
        listen.check_remote(listen.parse_address("0.0.0.0:1"), allow_remote=True)
    assert "NOT loopback" in caplog.text


def test_bind_tcp_picks_a_free_port_and_reports_it():
    sock = listen.bind_tcp(listen.parse_address("127.0.0.1:0"))
    try:
        address = listen.address_of(sock)
        assert address.port > 0
        assert str(address.ip) == "127.0.0.1"
    finally:
        sock.close()


def test_extra_hosts_hold_a_specific_remote_address_but_not_a_wildcard():
    assert netguard.extra_hosts_for(listen.parse_address("127.0.0.1:1"), ()) == frozenset()
    assert netguard.extra_hosts_for(listen.parse_address("0.0.0.0:1"), ()) == frozenset()
    assert netguard.extra_hosts_for(listen.parse_address("192.168.1.5:1"), ["DevBox"]) == {
        "192.168.1.5",
        "devbox",
    }


# -- settings -----------------------------------------------------------------------


def test_listen_settings_from_the_file_and_the_command_line(short_tmp: Path):
    config = short_tmp / "c.toml"
    config.write_text('[listen]\ntcp = "127.0.0.1:9000"\ntoken_file = "/x/token"\n')
    settings = load_settings(config, listen={"tcp": "127.0.0.1:9001"})
    assert settings.listen.tcp == "127.0.0.1:9001"  # the command line wins...
    assert settings.listen.token_file == Path("/x/token")  # ...over that key only
    assert settings.shutdown_grace_seconds == 10.0


def test_a_bad_tcp_address_in_the_file_names_the_key(short_tmp: Path):
    config = short_tmp / "c.toml"
    config.write_text('[listen]\ntcp = "evil.com:80"\n')
    with pytest.raises(ConfigError, match=r"listen\.tcp.*not an IP address"):
        load_settings(config)


def test_default_token_file_is_beside_the_config_file(monkeypatch, short_tmp: Path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(short_tmp / "cfg"))
    assert paths.default_token_file() == short_tmp / "cfg" / "sandboxd" / "token"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert paths.default_token_file() == Path("/etc/sandboxd/token")


# -- the token file ------------------------------------------------------------------


def test_token_is_made_once_0600_in_a_0700_folder(short_tmp: Path):
    path = short_tmp / "cfg" / "token"
    token = netguard.load_or_create_token(path)
    assert len(token) >= netguard.TOKEN_MIN_LENGTH
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert netguard.load_or_create_token(path) == token
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temp file left


def test_tokens_differ_between_files(short_tmp: Path):
    assert netguard.load_or_create_token(short_tmp / "a") != netguard.load_or_create_token(
        short_tmp / "b"
    )


def test_a_token_file_others_can_read_is_refused(short_tmp: Path):
    path = short_tmp / "token"
    netguard.load_or_create_token(path)
    os.chmod(path, 0o644)
    with pytest.raises(netguard.TokenError, match="read by others"):
        netguard.load_or_create_token(path)


def test_a_symlinked_token_file_is_refused(short_tmp: Path):
    real = short_tmp / "real"
    netguard.load_or_create_token(real)
    (short_tmp / "token").symlink_to(real)
    with pytest.raises(netguard.TokenError):
        netguard.load_or_create_token(short_tmp / "token")


def test_a_short_or_empty_token_is_refused(short_tmp: Path):
    path = short_tmp / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"short\n")
    os.close(fd)
    with pytest.raises(netguard.TokenError, match="not usable"):
        netguard.load_or_create_token(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_a_token_file_owned_by_someone_else_is_refused(short_tmp: Path):
    path = short_tmp / "token"
    netguard.load_or_create_token(path)
    os.chown(path, 65534, 65534)
    with pytest.raises(netguard.TokenError, match="owned by you"):
        netguard.read_token(path)


def test_token_comparison_survives_non_ascii():
    guard = netguard.TcpGuard(token="a" * 40)
    assert not guard.token_matches(["Bearer ä" + "a" * 39])
    assert guard.token_matches(["Bearer " + "a" * 40])
    assert not guard.token_matches([])
