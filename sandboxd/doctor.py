"""`sandboxd doctor`: check what sandboxd needs from the host, and say how to fix what is missing.

Each check looks at the real thing where it can (runs bubblewrap, builds a
sandbox end to end in a throw-away data folder) rather than guessing from
version numbers, so its answer is the daemon's own. A check ends ``ok``,
``warn`` (sandboxd works, with less) or ``fail`` (it cannot work until
fixed); any failure makes the exit status 1.
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sandboxd import netguard, seccomp, toolchains
from sandboxd.config import Settings
from sandboxd.daemon import socket_answers
from sandboxd.sandboxes import SandboxManager
from sandboxd.workspace import remove_tree

MiB = 1024 * 1024
MIN_BWRAP = (0, 8, 0)  # --disable-userns
FREE_FAIL = 100 * MiB
FREE_WARN = 1024 * MiB
NOBODY = 65534

APPARMOR_SYSCTL = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
APPARMOR_FIX = (
    "Ubuntu 23.10+ restricts user namespaces with AppArmor: sudo apt install "
    "apparmor-profiles && sudo ln -s /usr/share/apparmor/extra-profiles/bwrap-userns-restrict "
    "/etc/apparmor.d/ && sudo systemctl reload apparmor (or, less safely, "
    "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)"
)


class Level(StrEnum):
    ok = "ok"
    warn = "warn"
    fail = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    message: str
    fix: str | None = None

    def lines(self) -> list[str]:
        out = [f"{self.level.value:<5} {self.name}: {self.message}"]
        if self.fix and self.level is not Level.ok:
            out.append(f"      fix: {self.fix}")
        return out


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


# -- bubblewrap ---------------------------------------------------------------------


def bwrap_path(settings: Settings) -> str | None:
    return shutil.which(settings.bwrap)


def check_bwrap(settings: Settings) -> Check:
    path = bwrap_path(settings)
    if path is None:
        return Check(
            "bwrap",
            Level.fail,
            f"bubblewrap ({settings.bwrap}) is not installed",
            "sudo apt-get install bubblewrap (Debian, Ubuntu) or sudo dnf install bubblewrap "
            '(Fedora), or set bwrap = "/path/to/bwrap" in the config file',
        )
    done = _run([path, "--version"])
    text = (done.stdout.strip() if done else "") or "no version"
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if done is None or done.returncode != 0 or found is None:
        return Check("bwrap", Level.fail, f"{path} does not run ({text})", "reinstall bubblewrap")
    version = tuple(int(part or 0) for part in found.groups())
    if version < MIN_BWRAP:
        need = ".".join(map(str, MIN_BWRAP))
        return Check(
            "bwrap",
            Level.fail,
            f"{path} is {text}; sandboxd needs {need} or later (for --disable-userns)",
            f"install bubblewrap {need} or later (Debian 12 and Ubuntu 24.04 have it)",
        )
    setuid = " (setuid root)" if os.stat(path).st_mode & stat.S_ISUID else ""
    return Check("bwrap", Level.ok, f"{path}: {text}{setuid}")


def check_userns(settings: Settings) -> Check:
    """Can the uid that runs sandboxes create a user namespace with bwrap?"""
    name = "user namespaces"
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return Check(
            name,
            Level.fail,
            "user.max_user_namespaces is 0: no one may create user namespaces",
            "sudo sysctl -w user.max_user_namespaces=15000 and put it in /etc/sysctl.d/",
        )
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return Check(
            name,
            Level.fail,
            "kernel.unprivileged_userns_clone is 0: unprivileged user namespaces are off",
            "sudo sysctl -w kernel.unprivileged_userns_clone=1 and put it in /etc/sysctl.d/",
        )
    path = bwrap_path(settings)
    if path is None:
        return Check(name, Level.warn, "not checked: needs bubblewrap (see bwrap)")
    # As root the sandboxes run as an unprivileged uid: check as one.
    drop = (
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        if os.geteuid() == 0
        else []
    )
    argv = [
        *drop,
        path,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        "/bin/true",
    ]
    done = _run(argv)
    restricted = _read(APPARMOR_SYSCTL) == "1"
    who = f"uid {NOBODY}" if drop else "you"
    if done is not None and done.returncode == 0:
        extra = " (AppArmor restricts them, and bwrap is allowed)" if restricted else ""
        return Check(name, Level.ok, f"{who} can create them with bwrap{extra}")
    reason = (done.stderr.strip().splitlines() or ["no output"])[-1] if done else "did not run"
    if restricted:
        fix = APPARMOR_FIX
    else:
        fix = (
            "inside a container, the container must allow user namespaces; on old Debian "
            "kernels set kernel.unprivileged_userns_clone=1"
        )
    return Check(name, Level.fail, f"bwrap cannot create one as {who}: {reason}", fix)


def check_sandbox(settings: Settings) -> Check:
    """The daemon's own start-up self-test, in a throw-away data folder."""
    name = "sandbox"
    if bwrap_path(settings) is None:
        return Check(name, Level.warn, "not checked: needs bubblewrap (see bwrap)")
    scratch = Path(tempfile.mkdtemp(prefix="sandboxd-doctor-"))
    os.chmod(scratch, 0o711)  # as root, the sandbox uid must traverse it
    try:
        trial = settings.model_copy(update={"data_dir": scratch / "data"})
        manager = SandboxManager(trial, toolchains.detect(trial))
        manager.open()

        async def selftest() -> None:
            try:
                await manager.selftest()
            finally:
                await manager.close()

        asyncio.run(selftest())
    except Exception as exc:  # whatever stops it is the answer
        detail = getattr(exc, "detail", None) or str(exc) or type(exc).__name__
        return Check(
            name,
            Level.fail,
            f"a command cannot run under the full isolation: {detail}",
            "fix the checks above; `sandboxd serve --log-level debug` shows the same error",
        )
    finally:
        remove_tree(scratch)
    return Check(name, Level.ok, "`true` runs under the full isolation (the daemon's self-test)")


# -- kernel features -----------------------------------------------------------------


def check_seccomp(settings: Settings) -> Check:
    status = _read("/proc/self/status") or ""
    if not re.search(r"^Seccomp:", status, re.M):
        return Check(
            "seccomp",
            Level.fail,
            "the kernel has no seccomp (no Seccomp: line in /proc/self/status)",
            "use a kernel built with CONFIG_SECCOMP_FILTER (every distribution kernel is)",
        )
    if not settings.seccomp:
        return Check(
            "seccomp",
            Level.warn,
            "the kernel supports it, but the filter is turned off in the config file",
            "remove `seccomp = false` from the config file",
        )
    try:
        program = seccomp.compile_bpf()
    except Exception as exc:
        return Check(
            "seccomp",
            Level.fail,
            f"the filter cannot be built: {exc}",
            "sudo apt-get install libseccomp2, then reinstall sandboxd (it needs pyseccomp)",
        )
    return Check("seccomp", Level.ok, f"supported; the filter builds ({len(program) // 8} rules)")


def check_pidfd() -> Check:
    """The daemon watches every command through a pidfd (Linux 5.3 and later)."""
    name = "pidfd"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:
        return Check(
            name,
            Level.fail,
            f"this kernel ({platform.release()}) cannot open pidfds: {exc.strerror}",
            "run sandboxd on Linux 5.3 or later (Debian 12 and Ubuntu 22.04 have it)",
        )
    return Check(name, Level.ok, f"supported ({platform.release()})")


def _own_cgroup() -> Path | None:
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def check_cgroups() -> Check:
    name = "cgroup v2"
    root = Path("/sys/fs/cgroup")
    note = "sandboxd limits each process with rlimits either way"
    if not (root / "cgroup.controllers").exists():
        return Check(
            name,
            Level.warn,
            f"not mounted as the unified hierarchy (cgroup v1 or hybrid); {note}",
            "boot with systemd.unified_cgroup_hierarchy=1 (the default since Debian 11)",
        )
    own = _own_cgroup()
    if own is None or not own.is_dir():
        return Check(name, Level.warn, f"cannot find this process's cgroup; {note}")
    controllers = set((_read(own / "cgroup.controllers") or "").split())
    writable = os.access(own, os.W_OK) and os.access(own / "cgroup.subtree_control", os.W_OK)
    wanted = {"memory", "pids", "cpu"}
    if writable and wanted <= controllers:
        return Check(name, Level.ok, f"{own} is delegated with {', '.join(sorted(controllers))}")
    missing = ", ".join(sorted(wanted - controllers)) or "none"
    return Check(
        name,
        Level.warn,
        f"{own} is not delegated to this user (writable: {'yes' if writable else 'no'}, "
        f"missing controllers: {missing}); {note}",
        "run sandboxd as the systemd user service in contrib/systemd (Delegate=yes)",
    )


# -- toolchains --------------------------------------------------------------------


def check_toolchains(settings: Settings) -> Iterator[Check]:
    for language, chain in toolchains.detect(settings).items():
        name = f"toolchain {language.value}"
        missing = chain.missing()
        if missing:
            yield Check(
                name,
                Level.warn,
                f"{language.value} sandboxes cannot run commands: {missing}",
                chain.install_hint,
            )
            continue
        version = toolchains.version_of(chain) or "version unknown"
        runner = chain.runner_missing()
        if runner:
            yield Check(
                name,
                Level.warn,
                f"{chain.executable} ({version}); test mode cannot run: {runner}",
                chain.runner_hint,
            )
        else:
            yield Check(name, Level.ok, f"{chain.executable} ({version}); tests: {chain.runner}")


# -- files -------------------------------------------------------------------------


def check_socket_dir(settings: Settings) -> Check:
    name = "socket"
    path = settings.socket_path
    directory = path.parent
    if len(str(path).encode()) >= 108:
        return Check(
            name,
            Level.fail,
            f"{path} is longer than the 107 bytes a Unix socket path may have",
            "choose a shorter --socket",
        )
    try:
        st = directory.lstat()
    except FileNotFoundError:
        return Check(name, Level.ok, f"{directory} does not exist yet; it is made 0700 at start")
    except OSError as exc:
        return Check(name, Level.fail, f"cannot look at {directory}: {exc.strerror}")
    if not stat.S_ISDIR(st.st_mode):
        return Check(name, Level.fail, f"{directory} is not a directory", f"move {directory} away")
    if st.st_uid != os.geteuid():
        return Check(
            name,
            Level.fail,
            f"{directory} belongs to uid {st.st_uid}, not to you",
            f"remove {directory} (it is remade at start) or choose another --socket",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o700:
        return Check(
            name,
            Level.warn,
            f"{directory} has mode {mode:o}, not 700 (the daemon sets 700 when it starts)",
            f"chmod 700 {directory}",
        )
    state = "no daemon listens yet"
    if os.path.lexists(path):
        sock_mode = stat.S_IMODE(path.lstat().st_mode)
        if sock_mode & 0o077:
            return Check(
                name,
                Level.fail,
                f"{path} has mode {sock_mode:o}: other users can reach the daemon",
                "stop the daemon and start it again (it makes the socket 0600)",
            )
        state = "a daemon answers" if socket_answers(path) else "nothing answers (stale)"
    return Check(name, Level.ok, f"{directory} is 0700 and yours; {path}: {state}")


def check_data_dir(settings: Settings) -> Check:
    name = "data dir"
    existing = settings.data_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        return Check(
            name,
            Level.fail,
            f"{existing} is not writable, so {settings.data_dir} cannot be used",
            "choose another --data-dir",
        )
    free = shutil.disk_usage(existing).free
    text = f"{settings.data_dir}: {free / MiB / 1024:.1f} GiB free"
    if free < FREE_FAIL:
        return Check(name, Level.fail, text, "free some space, or choose another --data-dir")
    if free < FREE_WARN:
        return Check(name, Level.warn, text, "free some space: uploads and pip installs need it")
    return Check(name, Level.ok, text)


def check_token(settings: Settings) -> Check | None:
    token_file = settings.listen.token_file
    if settings.listen.tcp is None and not os.path.lexists(token_file):
        return None  # TCP mode not in use
    if not os.path.lexists(token_file):
        return Check("tcp token", Level.ok, f"{token_file} is made at the first start in TCP mode")
    try:
        netguard.read_token(token_file)
    except netguard.TokenError as exc:
        return Check("tcp token", Level.fail, str(exc), f"rm {token_file}; restart the daemon")
    return Check("tcp token", Level.ok, f"{token_file} is yours and 0600")


def run(settings: Settings) -> Iterator[Check]:
    """Every check, in the order a person would fix things."""
    steps: list[Callable[[], Check | None]] = [
        lambda: check_bwrap(settings),
        lambda: check_userns(settings),
        lambda: check_seccomp(settings),
        check_pidfd,
        lambda: check_sandbox(settings),
        check_cgroups,
    ]
    for step in steps:
        result = step()
        if result is not None:
            yield result
    yield from check_toolchains(settings)
    for last in (check_socket_dir(settings), check_data_dir(settings), check_token(settings)):
        if last is not None:
            yield last
