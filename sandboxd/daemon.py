"""Running the daemon: listening sockets, preflight checks, serve, start and stop.

Theory of operation. The Unix socket is either handed over by systemd
(socket activation, see systemd.py) or created by us, not by aiohttp, so
that it is 0600 from the moment it exists: bound under a umask of 0177 in a
0700 directory. TCP mode adds a loopback listener whose requests must pass
netguard's checks. Every listener is served by one app through SockSite.

Lifecycle: READY=1 goes to systemd once the self-test passed and every
socket is served. SIGHUP re-reads the config file and applies its [limits]
to requests and commands that start afterwards. SIGTERM (or SIGINT) closes
the listeners at once, lets requests in progress finish for up to
``shutdown_grace_seconds``, then kills the commands still running (their
requests still get an answer), and exits 0; a second SIGTERM kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sandboxd import __version__, listen, logs, netguard, paths, systemd
from sandboxd.config import ConfigError, Settings
from sandboxd.errors import SandboxSetupFailed
from sandboxd.netguard import TcpGuard
from sandboxd.runner import seal_descriptors
from sandboxd.server import LIVE_SETTINGS, MANAGER, create_app, settings_of

log = logging.getLogger("sandboxd")

# How long after the grace period aiohttp waits before it cancels handlers.
SHUTDOWN_MARGIN = 5.0

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


PATH_HELP = (
    "bubblewrap could not create a sandbox: {reason}\n\n"
    "The sandboxes run as an unprivileged uid, which must be able to reach the data "
    "folder {data_dir}: every folder above it needs execute permission for others "
    "(chmod o+x on each; a home folder of mode 0700 stops it). Choose a data folder "
    "elsewhere with --data-dir, or fix the modes."
)


def selftest_help(reason: str, settings: Settings) -> str:
    """Say what to fix when the start-up self-test fails, from bwrap's own words."""
    if "Can't find source path" in reason and "Permission denied" in reason:
        return PATH_HELP.format(reason=reason, data_dir=settings.data_dir)
    return USERNS_HELP.format(reason=reason)


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


@dataclass
class Listener:
    """One listening socket the daemon serves, and what to clean up after it."""

    sock: socket.socket
    kind: str  # "unix" or "tcp"
    name: str  # the path, or HOST:PORT
    # A socket file we made ourselves (not systemd's): removed at exit if still ours.
    owned_inode: int | None = None


def _unix_name(sock: socket.socket) -> str:
    name = sock.getsockname()
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return str(name)


def adopt(sockets: list[socket.socket], settings: Settings) -> list[Listener]:
    """Listeners for the sockets systemd passed us, after checking each is safe to serve."""
    listeners = []
    for sock in sockets:
        if sock.family == socket.AF_UNIX:
            name = _unix_name(sock)
            if not name or name.startswith("\0"):
                raise DaemonStartError(
                    "systemd passed an abstract (or unnamed) Unix socket: abstract sockets ignore "
                    "file permissions, so any local user could connect. Use a path in "
                    "ListenStream=, such as %t/sandboxd/sandboxd.sock."
                )
            mode = stat.S_IMODE(os.stat(name).st_mode)
            if mode & 0o077:
                log.warning(
                    "the socket %s passed by systemd has mode %o: other users may reach "
                    "the daemon; set SocketMode=0600",
                    name,
                    mode,
                )
            listeners.append(Listener(sock, "unix", name))
        elif sock.family in (socket.AF_INET, socket.AF_INET6):
            address = listen.address_of(sock)
            try:
                listen.check_remote(address, settings.listen.allow_remote)
            except listen.RemoteRefused as exc:
                raise DaemonStartError(f"systemd passed a TCP socket on {exc}") from None
            listeners.append(Listener(sock, "tcp", str(address)))
        else:
            raise DaemonStartError(f"systemd passed a socket of family {sock.family!r}.")
    return listeners


def open_listeners(settings: Settings, inherited: list[socket.socket]) -> list[Listener]:
    """The inherited sockets, plus the Unix socket (unless inherited) and --tcp (if asked)."""
    listeners = adopt(inherited, settings)
    if not any(item.kind == "unix" for item in listeners):
        sock = bind_socket(settings.socket_path)
        inode = os.stat(settings.socket_path).st_ino
        listeners.insert(0, Listener(sock, "unix", str(settings.socket_path), inode))
    if settings.listen.tcp is not None:
        address = listen.parse_address(settings.listen.tcp)
        try:
            listen.check_remote(address, settings.listen.allow_remote)
            sock = listen.bind_tcp(address)
        except listen.RemoteRefused as exc:
            close_listeners(listeners)
            raise DaemonStartError(str(exc)) from None
        except OSError as exc:
            close_listeners(listeners)
            raise DaemonStartError(f"cannot listen on {address}: {exc.strerror}.") from None
        listeners.append(Listener(sock, "tcp", str(listen.address_of(sock))))
    return listeners


def close_listeners(listeners: list[Listener]) -> None:
    for item in listeners:
        item.sock.close()
        if item.owned_inode is None:
            continue
        # Remove the socket file only if it is still ours (not a newer daemon's).
        with contextlib.suppress(OSError):
            if os.stat(item.name).st_ino == item.owned_inode:
                os.unlink(item.name)


def tcp_guard_for(settings: Settings, listeners: list[Listener]) -> TcpGuard | None:
    tcp = [item for item in listeners if item.kind == "tcp"]
    if not tcp:
        return None
    try:
        token = netguard.load_or_create_token(settings.listen.token_file)
    except (netguard.TokenError, OSError) as exc:
        raise DaemonStartError(f"TCP mode needs its token: {exc}") from None
    extra: set[str] = set()
    for item in tcp:
        extra |= netguard.extra_hosts_for(
            listen.address_of(item.sock), settings.listen.allowed_hosts
        )
    return TcpGuard(token=token, extra_hosts=frozenset(extra))


# -- SIGHUP -----------------------------------------------------------------------

# What a reload can change in a running daemon. Everything else (where it
# listens, where data lives, how sandboxes are isolated) is fixed at start.
_RELOAD_NEEDS_RESTART = ("json_body_bytes",)  # aiohttp fixes the body size at start


def apply_settings(app: web.Application, settings: Settings) -> None:
    """Put ``settings`` in force for the requests and commands that start from now on."""
    app[LIVE_SETTINGS].current = settings
    manager = app[MANAGER]
    manager.settings = settings
    manager.limits = settings.limits


def reload_settings(
    app: web.Application, baseline: Settings, load: Callable[[], Settings]
) -> Settings | None:
    """Re-read the config file and apply its [limits]; None (and a log line) if invalid.

    ``baseline`` is the settings as loaded at start, so only real edits of
    the file are reported as needing a restart.
    """
    try:
        fresh = load()
    except ConfigError as exc:
        log.error("reload: the config file is invalid, nothing changed: %s", exc)
        return None
    fixed = [
        name
        for name in type(fresh).model_fields
        if name != "limits" and getattr(fresh, name) != getattr(baseline, name)
    ]
    fixed += [
        f"limits.{name}"
        for name in _RELOAD_NEEDS_RESTART
        if getattr(fresh.limits, name) != getattr(baseline.limits, name)
    ]
    if fixed:
        log.warning("reload: changes to %s take effect only at the next start", ", ".join(fixed))
    current = settings_of(app)
    changed = {
        name: value
        for name, value in fresh.limits.model_dump().items()
        if value != getattr(current.limits, name)
    }
    updated = current.model_copy(update={"limits": fresh.limits})
    apply_settings(app, updated)
    log.info(
        "reload: limits in force%s",
        ": " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else " unchanged",
    )
    return updated


# -- serve --------------------------------------------------------------------------


async def _kill_after_grace(app: web.Application, grace: float, hurry: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(hurry.wait(), grace)
    running = app[MANAGER].running_commands
    if running:
        log.warning("killing %d command(s) still running", running)
    await app[MANAGER].close()


async def _serve(
    settings: Settings,
    listeners: list[Listener],
    guard: TcpGuard | None,
    notifier: systemd.Notifier,
    load: Callable[[], Settings] | None,
    baseline: Settings,
) -> None:
    # Handlers first: the socket already listens, so a client may connect and
    # a supervisor may send SIGTERM before the app is ready.
    stop = asyncio.Event()
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_stop_signal() -> None:
        if stop.is_set():
            hurry.set()  # a second SIGTERM: do not wait for the grace period
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop_signal)
    # Until the app runs there is nothing to reload; ignoring SIGHUP meanwhile
    # keeps its default action (exit) from killing a starting daemon.
    loop.add_signal_handler(signal.SIGHUP, lambda: None)
    grace = settings.shutdown_grace_seconds
    app = create_app(settings, tcp_guard=guard)
    runner = web.AppRunner(
        app,
        access_log=logging.getLogger(logs.ACCESS),
        access_log_class=logs.AccessLogger,
        handle_signals=False,
        # A backstop: running commands are killed at `grace`, so their
        # handlers answer well before this.
        shutdown_timeout=grace + SHUTDOWN_MARGIN,
    )
    await runner.setup()  # runs cleanup_ctx start-up: loads the registry
    try:
        await app[MANAGER].selftest()
    except SandboxSetupFailed as exc:
        await runner.cleanup()
        raise DaemonStartError(selftest_help(exc.detail, settings)) from None
    freeze_startup_heap()
    for item in listeners:
        await web.SockSite(runner, item.sock).start()
        log.info("listening on %s%s", item.name, " (token required)" if item.kind == "tcp" else "")
    log.info("sandboxd %s ready (data in %s)", __version__, settings.data_dir)
    if load is not None:

        def on_reload() -> None:
            notifier.reloading()
            reload_settings(app, baseline, load)
            notifier.ready("reloaded the config file")

        loop.add_signal_handler(signal.SIGHUP, on_reload)
    notifier.ready(f"listening on {', '.join(item.name for item in listeners)}")
    await stop.wait()
    running = app[MANAGER].running_commands
    notifier.stopping(f"stopping; {running} command(s) running")
    if running:
        log.info("stopping: waiting up to %g s for %d running command(s)", grace, running)
    else:
        log.info("stopping")
    # Stop accepting at once; a new daemon may bind while this one drains.
    for site in list(runner.sites):
        await site.stop()
    killer = asyncio.create_task(_kill_after_grace(app, grace, hurry))
    try:
        await runner.cleanup()  # waits for requests in progress, then closes the manager
    finally:
        killer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await killer
    log.info("stopped")


def freeze_startup_heap() -> None:
    """Keep what start-up loaded out of the cyclic garbage collector.

    Modules, pydantic schemas and the registry live as long as the daemon
    (about 50,000 objects). A full collection walks them all and holds the
    event loop for 45-50 ms on a small machine, long enough to read a running
    command's stdout and stderr out of order; frozen, it takes well under a
    millisecond.
    """
    gc.collect()
    gc.freeze()


def _use_pidfd_child_watcher() -> None:
    """On Python 3.11, asyncio waits for each child in a thread of its own;
    a pidfd watcher waits in the event loop instead (about 2 ms less per exec).
    Python 3.12 and later choose it by themselves."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # the kernel has no pidfds
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


def serve(settings: Settings, load: Callable[[], Settings] | None = None) -> None:
    """Run the daemon until SIGTERM. ``load`` re-reads the settings on SIGHUP."""
    # Before anything opens a descriptor that could take the number 0, 1 or 2.
    seal_descriptors()
    notifier = systemd.Notifier.from_environ()
    try:
        inherited = systemd.listen_fds()
    except systemd.ActivationError as exc:
        raise DaemonStartError(str(exc)) from None
    preflight(settings)
    listeners = open_listeners(settings, inherited)
    loaded = settings  # what the config file said, for telling later edits apart
    try:
        unix = next(item for item in listeners if item.kind == "unix")
        if unix.owned_inode is None:
            # systemd's socket may be elsewhere than --socket: report the real one.
            settings = settings.model_copy(update={"socket_path": Path(unix.name)})
        guard = tcp_guard_for(settings, listeners)
        _use_pidfd_child_watcher()
        asyncio.run(_serve(settings, listeners, guard, notifier, load, loaded))
    finally:
        close_listeners(listeners)


def start_background(
    settings: Settings, args: list[str], serve_args: list[str] | None = None, wait: float = 15.0
) -> int:
    """Start `sandboxd serve` detached; return its pid once the socket accepts."""
    if socket_answers(settings.socket_path):
        raise AlreadyRunning(f"sandboxd is already running on {settings.socket_path}.")
    prepare_socket_dir(settings.socket_path.parent)
    log_file = paths.default_log_file(settings.socket_path.parent)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", *args, "serve", *(serve_args or [])],
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
        # A zombie has exited: it only waits for its parent (which, for a
        # daemon started by `sandboxd start`, is whoever adopted it) to reap it.
        if _is_zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False
