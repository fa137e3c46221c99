"""Shared fixtures. Everything here runs real bubblewrap: a missing bwrap fails, never skips."""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sandboxd.config import Limits, Settings
from sandboxd.server import create_app


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path (Unix socket paths must stay under 108 bytes).

    Mode 0711 so that, when the tests run as root, the unprivileged uid the
    sandboxes run as can traverse to the workspaces.
    """
    path = Path(tempfile.mkdtemp(prefix="sbx", dir="/tmp"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def uid_range_for_test() -> tuple[int, int]:
    """A uid range of its own for each test's daemon (when run as root).

    Sandbox uids are per daemon; tests that shared one range would share
    process counts, and on a machine whose PID 1 does not reap, zombies.
    """
    return 1_000_000 + random.randrange(100_000) * 1000, 1000


def make_settings(root: Path, **limits: Any) -> Settings:
    start, count = uid_range_for_test()
    return Settings(
        socket_path=root / "s.sock",
        data_dir=root / "data",
        limits=Limits(**limits),
        sandbox_uid_start=start,
        sandbox_uid_count=count,
    )


@pytest.fixture
def settings(short_tmp: Path) -> Settings:
    return make_settings(short_tmp)


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> Any:
    """An aiohttp test client on the real app (real bwrap behind exec)."""
    return await aiohttp_client(create_app(settings))


def make_zip(files: dict[str, bytes | str], *, symlinks: dict[str, str] | None = None) -> bytes:
    """A zip held in memory; names are written exactly as given (no sanitising)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100644 << 16) if not name.endswith("/") else (0o040755 << 16)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, target)
    return buf.getvalue()


def form_with_file(data: bytes, filename: str | None, field: str = "file") -> aiohttp.FormData:
    # quote_fields=False sends the name as curl and browsers do, not percent-encoded.
    form = aiohttp.FormData(quote_fields=False)
    form.add_field(field, data, filename=filename, content_type="application/octet-stream")
    return form


@dataclass
class Daemon:
    """A real `sandboxd serve` process on a real Unix socket."""

    root: Path
    socket_path: Path
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def argv(self, *args: str) -> list[str]:
        """`python -m sandboxd` with this daemon's socket, data dir and config."""
        return [
            sys.executable,
            "-m",
            "sandboxd",
            "--socket",
            str(self.socket_path),
            "--data-dir",
            str(self.data_dir),
            "--config",
            str(self.root / "config.toml"),
            *args,
        ]

    def cli(
        self, *args: str, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=timeout, check=check
        )

    def start(self, pass_fds: Sequence[int] = (), close_stdin: bool = False) -> None:
        """Start it; ``pass_fds`` and ``close_stdin`` start it the way a careless
        parent would (a leaked descriptor, no standard input)."""
        self.log_path = self.root / "daemon.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            self.argv("serve"),
            stdout=log,
            stderr=log,
            stdin=None if close_stdin else subprocess.DEVNULL,
            pass_fds=pass_fds,
            preexec_fn=(lambda: os.close(0)) if close_stdin else None,
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log()}")
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(self.socket_path))
                return
            except OSError:
                time.sleep(0.05)
            finally:
                probe.close()
        raise RuntimeError(f"daemon did not listen: {self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(self.socket_path)),
            base_url="http://sandboxd",
        )


@pytest.fixture
def daemon_factory(short_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(
        root=short_tmp, socket_path=short_tmp / "run" / "s.sock", data_dir=short_tmp / "data"
    )
    yield d
    d.stop()


@pytest.fixture
def daemon(daemon_factory: Daemon) -> Daemon:
    daemon_factory.start()
    return daemon_factory


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with daemon.session() as session:
        yield session
