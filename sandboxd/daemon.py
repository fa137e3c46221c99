"""Running the daemon: the listening socket, preflight checks, serve, start and stop.

The socket is created by us (not by aiohttp) so that it is 0600 from the
moment it exists: bind under a umask of 0177, in a 0700 directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web

from sandboxd import paths
from sandboxd.config import Settings
from sandboxd.errors import SandboxSetupFailed
from sandboxd.server import MANAGER, create_app

log = logging.getLogger("sandboxd")

ACCESS_LOG_FORMAT = "%r %s %b %Tfs"

USERNS_HELP = (
    "bubblewrap could not create a sandbox: {reason}\n\n"
    "sandboxd needs unprivileged user namespaces. On Ubuntu 23.10 and later, AppArmor "
    "blocks them for programs without a profile: install the bwrap profile "
    "(sudo apt install apparmor-profiles; sudo ln -s "
    "/usr/share/apparmor/extra-profiles/bwrap-userns-restrict /etc/apparmor.d/ && "
    "sudo systemctl reload apparmor) or, less safely, "
    "set sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0. Elsewhere check "
    "that user.max_user_namespaces is not 0 (sysctl user.max_user_namespaces) and, on old "
    "Debian kernels, kernel.unprivileged_userns_clone=1. Inside a container, the container "
    "itself must allow user namespaces."
)


class DaemonStartError(Exception):
    """A problem that stops the daemon from starting; the message says how to fix it."""


class AlreadyRunning(DaemonStartError):
    pass


def prepare_socket_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise DaemonStartError(f"{directory} must be a directory owned by you.")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)


def socket_answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def bind_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600, replacing a stale one."""
    if len(str(path).encode()) >= 108:
        raise DaemonStartError(f"The socket path {path} is longer than the 107 bytes Unix allows.")
    prepare_socket_dir(path.parent)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise DaemonStartError(f"{path} exists and is not a socket; move it away.")
        if socket_answers(path):
            raise AlreadyRunning(f"sandboxd is already running on {path}.")
        path.unlink()  # left behind by a daemon that crashed
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(512)
    sock.setblocking(False)
    return sock


def preflight(settings: Settings) -> None:
    if shutil.which(settings.bwrap) is None:
        raise DaemonStartError(
            f"bubblewrap ({settings.bwrap}) is not installed. Install it with "
            "`sudo apt-get install bubblewrap` (Debian, Ubuntu) or `sudo dnf install bubblewrap` "
            "(Fedora), then start sandboxd again."
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        raise DaemonStartError(
            "Running as root needs setpriv (util-linux) to drop to an unprivileged uid."
        )


async def _serve(settings: Settings, sock: socket.socket) -> None:
    # Handlers first: the socket already listens, so a client may connect and
    # a supervisor may send SIGTERM before the app is ready.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = create_app(settings)
    runner = web.AppRunner(
        app, access_log=logging.getLogger("sandboxd.access"), access_log_format=ACCESS_LOG_FORMAT
    )
    await runner.setup()  # runs cleanup_ctx start-up: loads the registry
    try:
        await app[MANAGER].selftest()
    except SandboxSetupFailed as exc:
        await runner.cleanup()
        raise DaemonStartError(USERNS_HELP.format(reason=exc.detail)) from None
    site = web.SockSite(runner, sock, shutdown_timeout=10.0)
    await site.start()
    log.info("sandboxd listening on %s (data in %s)", settings.socket_path, settings.data_dir)
    await stop.wait()
    log.info("stopping")
    await runner.cleanup()


def serve(settings: Settings) -> None:
    preflight(settings)
    sock = bind_socket(settings.socket_path)
    inode = os.stat(settings.socket_path).st_ino
    try:
        asyncio.run(_serve(settings, sock))
    finally:
        sock.close()
        # Remove the socket only if it is still ours (not a newer daemon's).
        with contextlib.suppress(OSError):
            if os.stat(settings.socket_path).st_ino == inode:
                os.unlink(settings.socket_path)


def start_background(settings: Settings, args: list[str], wait: float = 15.0) -> int:
    """Start `sandboxd serve` detached; return its pid once the socket accepts."""
    if socket_answers(settings.socket_path):
        raise AlreadyRunning(f"sandboxd is already running on {settings.socket_path}.")
    prepare_socket_dir(settings.socket_path.parent)
    log_file = paths.default_log_file(settings.socket_path.parent)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", *args, "serve"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace").splitlines()[-15:]
            raise DaemonStartError(
                f"sandboxd exited with status {proc.returncode} while starting:\n" + "\n".join(tail)
            )
        if socket_answers(settings.socket_path):
            return proc.pid
        time.sleep(0.05)
    proc.terminate()
    raise DaemonStartError(f"sandboxd did not start listening within {wait:g} s; see {log_file}.")


def wait_for_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return True
        # A child of ours (tests) lingers as a zombie until reaped.
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        time.sleep(0.05)
    return False
