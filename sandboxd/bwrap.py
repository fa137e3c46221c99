"""Pure functions from a sandbox description to a bubblewrap argv.

Each bwrap option is a small value with ``to_args()`` (bubblejail's habit),
so the argv is data: built without running anything and tested as golden
lists. Nothing here touches the filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandboxd.toolchains import HOME, SHIM_DIR, Toolchain
from sandboxd.workspace import Owner

WORKSPACE = "/workspace"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
SANDBOX_HOSTNAME = "sandbox"


class Option(Protocol):
    def to_args(self) -> list[str]: ...


@dataclass(frozen=True)
class Flag:
    name: str

    def to_args(self) -> list[str]:
        return [self.name]


@dataclass(frozen=True)
class Value:
    name: str
    value: str

    def to_args(self) -> list[str]:
        return [self.name, self.value]


@dataclass(frozen=True)
class Mount:
    """``--bind``, ``--ro-bind``, ``--symlink`` and friends: an option with source and dest."""

    name: str
    source: str
    dest: str

    def to_args(self) -> list[str]:
        return [self.name, self.source, self.dest]


@dataclass(frozen=True)
class SetEnv:
    key: str
    value: str

    def to_args(self) -> list[str]:
        return ["--setenv", self.key, self.value]


# The isolation every sandbox gets, whatever it runs. --unshare-user is
# explicit because --unshare-all only tries it, and --disable-userns needs it.
ISOLATION: tuple[Option, ...] = (
    Flag("--unshare-all"),
    Flag("--unshare-user"),
    Flag("--disable-userns"),
    Flag("--die-with-parent"),
    Flag("--new-session"),
    Value("--cap-drop", "ALL"),
    Flag("--clearenv"),
    Value("--uid", str(SANDBOX_UID)),
    Value("--gid", str(SANDBOX_GID)),
    Value("--hostname", SANDBOX_HOSTNAME),
)

# Debian 12 is merged-/usr: /bin, /lib and friends are links into /usr.
# /etc gets only the generated passwd, group and hosts, the CA certificates,
# and the alternatives links (without them `awk` and friends do not exist).
SYSTEM: tuple[Option, ...] = (
    Mount("--ro-bind", "/usr", "/usr"),
    Mount("--symlink", "usr/bin", "/bin"),
    Mount("--symlink", "usr/sbin", "/sbin"),
    Mount("--symlink", "usr/lib", "/lib"),
    Mount("--symlink", "usr/lib64", "/lib64"),
    Mount("--ro-bind-try", "/etc/alternatives", "/etc/alternatives"),
    Mount("--ro-bind-try", "/etc/ssl/certs", "/etc/ssl/certs"),
    Value("--proc", "/proc"),
    Value("--dev", "/dev"),
)

# Files the daemon writes once into its data dir and binds into every sandbox.
ETC_FILES = ("passwd", "group", "hosts")


def etc_file_contents() -> dict[str, str]:
    return {
        "passwd": (
            "root:x:0:0:root:/root:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{HOME}:/bin/sh\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n",
        "hosts": f"127.0.0.1\tlocalhost {SANDBOX_HOSTNAME}\n::1\tlocalhost ip6-localhost\n",
        # slirp4netns's built-in DNS forwarder.
        "resolv.conf": "nameserver 10.0.2.3\n",
    }


@dataclass(frozen=True)
class Rlimits:
    """Per-process limits, set by prlimit(1) in front of bwrap (no preexec_fn)."""

    data_bytes: int
    open_files: int
    file_bytes: int
    cpu_seconds: int
    # RLIMIT_NPROC counts every process of the host uid, so it is only set
    # where the sandbox has a uid of its own.
    processes: int | None = None

    def to_args(self) -> list[str]:
        args = [
            "prlimit",
            f"--data={self.data_bytes}",
            f"--nofile={self.open_files}",
            f"--fsize={self.file_bytes}",
            f"--cpu={self.cpu_seconds}",
            "--core=0",
        ]
        if self.processes is not None:
            args.append(f"--nproc={self.processes}")
        return [*args, "--"]


@dataclass(frozen=True)
class SandboxSpec:
    workspace: Path
    home: Path
    etc_dir: Path
    toolchain: Toolchain
    command: Sequence[str]
    # Set when the daemon is root: drop to this uid before bwrap, so the
    # sandboxed code is never host root even inside its user namespace.
    drop_to: Owner | None = None
    rlimits: Rlimits | None = None
    status_fd: int | None = None
    seccomp_fd: int | None = None
    # An O_PATH descriptor of the workspace: bound by descriptor, so a path
    # swapped for a symlink cannot redirect the bind.
    workspace_fd: int | None = None
    tmp_bytes: int = 512 * 1024 * 1024
    # With network: bwrap waits on this descriptor until the network helper
    # has configured the sandbox's interface, and /etc/resolv.conf is bound.
    block_fd: int | None = None
    network: bool = False
    cwd: str = WORKSPACE
    extra_env: dict[str, str] = field(default_factory=dict)


def slirp4netns_argv(
    binary: str, child_pid: int, ready_fd: int, userns_fd: int, drop_to: Owner | None = None
) -> list[str]:
    """The user-mode network stack for a sandbox created with network access.

    Outbound traffic only: --disable-host-loopback keeps the host's 127.0.0.1
    (and so the daemon and local services) out of reach. The helper runs as
    the sandbox's own uid, so it holds no right the sandbox lacks. (slirp4netns
    1.2's --enable-sandbox and --enable-seccomp make its setns() fail when it
    is not root, so they are not used.) ``userns_fd`` is the user namespace that
    owns the sandbox's network namespace: with --disable-userns the sandbox's
    processes sit in a nested one, which would not let the helper in.
    """
    prefix = privilege_drop(drop_to) if drop_to else []
    return [
        *prefix,
        binary,
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        f"--ready-fd={ready_fd}",
        f"--userns-path=/proc/self/fd/{userns_fd}",
        str(child_pid),
        "tap0",
    ]


def privilege_drop(owner: Owner) -> list[str]:
    # setpriv execs bwrap in the same process: no extra fork, no preexec_fn.
    return [
        "setpriv",
        f"--reuid={owner.uid}",
        f"--regid={owner.gid}",
        "--clear-groups",
        "--",
    ]


def _options(spec: SandboxSpec) -> Iterable[Option]:
    yield from ISOLATION
    yield from SYSTEM
    yield Value("--size", str(spec.tmp_bytes))
    yield Value("--tmpfs", "/tmp")
    yield Value("--size", str(min(spec.tmp_bytes, 64 * 1024 * 1024)))
    yield Value("--tmpfs", "/dev/shm")
    for name in (*ETC_FILES, *(("resolv.conf",) if spec.network else ())):
        yield Mount("--ro-bind", str(spec.etc_dir / name), f"/etc/{name}")
    for source, dest in spec.toolchain.ro_binds:
        yield Mount("--ro-bind", source, dest)
    yield Value("--dir", SHIM_DIR)
    for name, target in sorted(spec.toolchain.shims.items()):
        yield Mount("--symlink", target, f"{SHIM_DIR}/{name}")
    if spec.workspace_fd is not None:
        yield Mount("--bind-fd", str(spec.workspace_fd), WORKSPACE)
    else:
        yield Mount("--bind", str(spec.workspace), WORKSPACE)
    yield Mount("--bind", str(spec.home), HOME)
    # The tmpfs root and what bwrap made on it (/etc, /opt...) become
    # read-only; the binds and tmpfs mounts above keep their own modes.
    yield Value("--remount-ro", "/")
    yield Value("--chdir", spec.cwd)
    env = {
        "PATH": spec.toolchain.search_path,
        "HOME": HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "TERM": "dumb",
        **spec.toolchain.env,
        **spec.extra_env,
    }
    for key, value in env.items():
        yield SetEnv(key, value)
    if spec.seccomp_fd is not None:
        yield Value("--seccomp", str(spec.seccomp_fd))
    if spec.status_fd is not None:
        yield Value("--json-status-fd", str(spec.status_fd))
    if spec.block_fd is not None:
        yield Value("--block-fd", str(spec.block_fd))


def bwrap_options(spec: SandboxSpec) -> list[str]:
    """bwrap's options, without the command: what --args carries."""
    args: list[str] = []
    for option in _options(spec):
        args.extend(option.to_args())
    return args


def launcher(spec: SandboxSpec, bwrap: str = "bwrap") -> list[str]:
    """What runs before bwrap's arguments: prlimit, setpriv, bwrap."""
    argv = spec.rlimits.to_args() if spec.rlimits else []
    if spec.drop_to:
        argv += privilege_drop(spec.drop_to)
    argv.append(bwrap)
    return argv


def build_argv(spec: SandboxSpec, bwrap: str = "bwrap", args_fd: int | None = None) -> list[str]:
    """The full argv. With ``args_fd`` the options are left for that descriptor (see
    ``bwrap_options``), so /proc/1/cmdline inside shows no host paths; bwrap takes the
    command itself only from its real argv."""
    options = ["--args", str(args_fd)] if args_fd is not None else bwrap_options(spec)
    return [*launcher(spec, bwrap), *options, "--", *spec.command]


def encode_args(args: Sequence[str]) -> bytes:
    """bwrap's --args format: NUL-terminated strings."""
    return b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in args)
