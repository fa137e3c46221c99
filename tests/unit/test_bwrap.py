"""bwrap.build_argv as data: golden argv lists for hand-built specs (nothing from the host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.bwrap import (
    Rlimits,
    SandboxSpec,
    build_argv,
    bwrap_options,
    encode_args,
    launcher,
)
from sandboxd.models import Language
from sandboxd.toolchains import Toolchain
from sandboxd.workspace import Owner

COMMAND = ("/bin/sh", "-c", "echo hi")


def _toolchain() -> Toolchain:
    return Toolchain(
        language=Language.python,
        executable="/usr/bin/python3",
        install_hint="apt-get install python3",
        runner="pytest",
        runner_display="python3 -m pytest tests",
        runner_argv=("python3", "-m", "pytest", "tests"),
        env={"LANG": "en_US.UTF-8", "TERM": "vt100", "PYTHONUNBUFFERED": "1"},
        path=("/toolchain/bin", "/opt/sandboxd/node/bin"),
        shims={"python": "/usr/bin/python3", "pip": "/usr/bin/pip3"},
        ro_binds=(("/opt/tool", "/opt/tool"), ("/host/runners/node", "/opt/sandboxd/node")),
    )


def _spec(**changes: object) -> SandboxSpec:
    fields: dict[str, object] = {
        "workspace": Path("/srv/sbx/ws"),
        "home": Path("/srv/sbx/home"),
        "etc_dir": Path("/srv/etc"),
        "toolchain": _toolchain(),
        "command": COMMAND,
    }
    fields.update(changes)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


ISOLATION = [
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop", "ALL",
    "--clearenv",
    "--uid", "1000",
    "--gid", "1000",
    "--hostname", "sandbox",
]  # fmt: skip

SYSTEM = [
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/sbin", "/sbin",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
    "--ro-bind-try", "/etc/ssl/certs", "/etc/ssl/certs",
    "--proc", "/proc",
    "--dev", "/dev",
]  # fmt: skip

MiB = 1024 * 1024

# the default tmp_bytes: 512 MiB for /tmp, /dev/shm capped at 64 MiB
TMPFS = [
    "--size", str(512 * MiB), "--tmpfs", "/tmp",
    "--size", str(64 * MiB), "--tmpfs", "/dev/shm",
]  # fmt: skip

ETC = [
    "--ro-bind", "/srv/etc/passwd", "/etc/passwd",
    "--ro-bind", "/srv/etc/group", "/etc/group",
    "--ro-bind", "/srv/etc/hosts", "/etc/hosts",
]  # fmt: skip

TOOLCHAIN = [
    "--ro-bind", "/opt/tool", "/opt/tool",
    "--ro-bind", "/host/runners/node", "/opt/sandboxd/node",
    "--dir", "/opt/sandboxd/bin",
    # shims are sorted by name
    "--symlink", "/usr/bin/pip3", "/opt/sandboxd/bin/pip",
    "--symlink", "/usr/bin/python3", "/opt/sandboxd/bin/python",
]  # fmt: skip

WORKSPACE_BY_PATH = ["--bind", "/srv/sbx/ws", "/workspace"]

HOME_AND_CHDIR = [
    "--bind", "/srv/sbx/home", "/home/sandbox",
    "--remount-ro", "/",
    "--chdir", "/workspace",
]  # fmt: skip

ENV = [
    # the shim dir first, then the toolchain's own folders, then the system's
    "--setenv", "PATH",
    "/opt/sandboxd/bin:/toolchain/bin:/opt/sandboxd/node/bin:/usr/local/bin:/usr/bin:/bin",
    "--setenv", "HOME", "/home/sandbox",
    "--setenv", "USER", "sandbox",
    "--setenv", "LOGNAME", "sandbox",
    "--setenv", "SHELL", "/bin/sh",
    "--setenv", "LANG", "en_US.UTF-8",
    "--setenv", "TMPDIR", "/tmp",
    # LANG and TERM keep their base position but take the toolchain's value.
    "--setenv", "TERM", "vt100",
    "--setenv", "PYTHONUNBUFFERED", "1",
]  # fmt: skip

OPTIONS = [
    *ISOLATION,
    *SYSTEM,
    *TMPFS,
    *ETC,
    *TOOLCHAIN,
    *WORKSPACE_BY_PATH,
    *HOME_AND_CHDIR,
    *ENV,
]

GOLDEN = ["bwrap", *OPTIONS, "--", *COMMAND]

RLIMITS = Rlimits(
    data_bytes=4 * 1024 * MiB,
    open_files=1024,
    file_bytes=1024 * MiB,
    cpu_seconds=600,
    processes=512,
)

PRLIMIT = [
    "prlimit",
    f"--data={4 * 1024 * MiB}",
    "--nofile=1024",
    f"--fsize={1024 * MiB}",
    "--cpu=600",
    "--core=0",
    "--nproc=512",
    "--",
]

SETPRIV = ["setpriv", "--reuid=524288", "--regid=524289", "--clear-groups", "--"]


def _full_spec(**changes: object) -> SandboxSpec:
    """Every optional part set: limits, uid drop, seccomp, workspace by fd, status fd."""
    fields: dict[str, object] = {
        "drop_to": Owner(uid=524288, gid=524289),
        "rlimits": RLIMITS,
        "status_fd": 7,
        "seccomp_fd": 8,
        "workspace_fd": 5,
        "tmp_bytes": 32 * MiB,
    }
    fields.update(changes)
    return _spec(**fields)


def _env(argv: list[str]) -> dict[str, list[str]]:
    """Every value each variable is set to, in order."""
    seen: dict[str, list[str]] = {}
    for i, arg in enumerate(argv):
        if arg == "--setenv":
            seen.setdefault(argv[i + 1], []).append(argv[i + 2])
    return seen


def _bwrap_part(argv: list[str]) -> list[str]:
    """The bwrap options: between the bwrap executable and the final ``--``."""
    start = argv.index("bwrap") + 1
    end = len(argv) - len(COMMAND) - 1
    assert argv[end] == "--"
    return argv[start:end]


def _has_sequence(argv: list[str], seq: list[str]) -> bool:
    return any(argv[i : i + len(seq)] == seq for i in range(len(argv) - len(seq) + 1))


def test_golden_argv() -> None:
    assert build_argv(_spec()) == GOLDEN


def test_golden_argv_with_every_option() -> None:
    assert build_argv(_full_spec()) == [
        *PRLIMIT,
        *SETPRIV,
        "bwrap",
        *ISOLATION,
        *SYSTEM,
        "--size", str(32 * MiB), "--tmpfs", "/tmp",
        "--size", str(32 * MiB), "--tmpfs", "/dev/shm",
        *ETC,
        *TOOLCHAIN,
        # by descriptor: a workspace path swapped for a link cannot redirect it
        "--bind-fd", "5", "/workspace",
        *HOME_AND_CHDIR,
        *ENV,
        "--seccomp", "8",
        "--json-status-fd", "7",
        "--",
        *COMMAND,
    ]  # fmt: skip


def test_golden_argv_with_args_fd() -> None:
    """With --args the options travel on a descriptor; the command stays in argv."""
    spec = _full_spec()
    argv = build_argv(spec, args_fd=9)
    assert argv == [*PRLIMIT, *SETPRIV, "bwrap", "--args", "9", "--", *COMMAND]
    assert launcher(spec) == [*PRLIMIT, *SETPRIV, "bwrap"]
    # what goes on the descriptor is exactly the options build_argv would inline
    inline = build_argv(spec)
    assert bwrap_options(spec) == inline[len(launcher(spec)) : -len(COMMAND) - 1]


def test_encode_args_is_nul_terminated() -> None:
    assert encode_args(["--bind", "/a b", "/ü"]) == b"--bind\0/a b\0/\xc3\xbc\0"
    assert encode_args([]) == b""
    encoded = encode_args(bwrap_options(_full_spec()))
    assert encoded.endswith(b"\0")
    assert encoded.split(b"\0")[:-1] == [a.encode() for a in bwrap_options(_full_spec())]


def test_rlimits_args() -> None:
    assert RLIMITS.to_args() == PRLIMIT
    no_nproc = Rlimits(data_bytes=1, open_files=2, file_bytes=3, cpu_seconds=4)
    assert no_nproc.to_args() == [
        "prlimit",
        "--data=1",
        "--nofile=2",
        "--fsize=3",
        "--cpu=4",
        "--core=0",
        "--",
    ]


def test_every_tmpfs_has_its_size_right_before_it() -> None:
    for spec in (_spec(), _full_spec(), _spec(tmp_bytes=1000 * MiB)):
        options = bwrap_options(spec)
        tmpfs_at = [i for i, o in enumerate(options) if o == "--tmpfs"]
        assert len(tmpfs_at) == 2
        for i in tmpfs_at:
            assert options[i - 2] == "--size"
        assert options.count("--size") == 2
    options = bwrap_options(_spec(tmp_bytes=1000 * MiB))
    assert _has_sequence(options, ["--size", str(1000 * MiB), "--tmpfs", "/tmp"])
    assert _has_sequence(options, ["--size", str(64 * MiB), "--tmpfs", "/dev/shm"])


def test_custom_bwrap_executable() -> None:
    argv = build_argv(_spec(), bwrap="/opt/bin/bwrap")
    assert argv[0] == "/opt/bin/bwrap"
    assert "bwrap" not in argv
    argv = build_argv(_spec(drop_to=Owner(1, 1)), bwrap="/opt/bin/bwrap")
    assert argv[5] == "/opt/bin/bwrap"


@pytest.mark.parametrize("args_fd", [None, 9])
@pytest.mark.parametrize("full", [False, True], ids=["plain", "full"])
@pytest.mark.parametrize(
    "command",
    [("/bin/sh", "-c", "true"), ("--", "-x"), ("/bin/echo", "--unshare-all", "--")],
)
def test_double_dash_sits_right_before_the_command(
    full: bool, args_fd: int | None, command: tuple[str, ...]
) -> None:
    spec = _full_spec(command=command) if full else _spec(command=command)
    argv = build_argv(spec, args_fd=args_fd)
    assert argv[-len(command) :] == list(command)
    assert argv[-len(command) - 1] == "--"
    # No other "--" between bwrap and the command: bwrap stops at the first one.
    bwrap_at = argv.index("bwrap")
    assert argv[bwrap_at:].index("--") == len(argv) - bwrap_at - len(command) - 1


@pytest.mark.parametrize("full", [False, True], ids=["plain", "full"])
def test_isolation_flags_present(full: bool) -> None:
    options = _bwrap_part(build_argv(_full_spec() if full else _spec()))
    for flag in (
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert options.count(flag) == 1, flag
    assert _has_sequence(options, ["--cap-drop", "ALL"])
    # Nothing shares a namespace back or adds a capability.
    assert not [o for o in options if o.startswith("--share") or o == "--cap-add"]


def test_workspace_and_home_bound_read_write() -> None:
    options = _bwrap_part(build_argv(_spec()))
    assert _has_sequence(options, ["--bind", "/srv/sbx/ws", "/workspace"])
    assert _has_sequence(options, ["--bind", "/srv/sbx/home", "/home/sandbox"])
    assert not _has_sequence(options, ["--ro-bind", "/srv/sbx/ws", "/workspace"])
    assert _has_sequence(options, ["--chdir", "/workspace"])
    assert options.count("--chdir") == 1


def test_no_setpriv_without_drop_to() -> None:
    argv = build_argv(_spec())
    assert argv[0] == "bwrap"
    assert "setpriv" not in argv
    argv = build_argv(_full_spec(drop_to=None))
    assert argv[: len(PRLIMIT) + 1] == [*PRLIMIT, "bwrap"]
    assert "setpriv" not in argv
    assert not [a for a in argv if a.startswith(("--reuid", "--regid", "--clear-groups"))]


@pytest.mark.parametrize("owner", [Owner(65534, 65534), Owner(1234, 4321), Owner(0, 0)])
def test_setpriv_prefix_with_drop_to(owner: Owner) -> None:
    argv = build_argv(_spec(drop_to=owner))
    assert argv[:6] == [
        "setpriv",
        f"--reuid={owner.uid}",
        f"--regid={owner.gid}",
        "--clear-groups",
        "--",
        "bwrap",
    ]
    assert argv.count("setpriv") == 1


def test_no_prlimit_without_rlimits() -> None:
    argv = build_argv(_full_spec(rlimits=None))
    assert argv[: len(SETPRIV) + 1] == [*SETPRIV, "bwrap"]
    assert "prlimit" not in argv


def test_seccomp_only_when_given() -> None:
    assert "--seccomp" not in build_argv(_spec())
    options = _bwrap_part(build_argv(_spec(seccomp_fd=12)))
    assert _has_sequence(options, ["--seccomp", "12"])
    assert options.count("--seccomp") == 1


def test_workspace_bound_by_fd_when_given() -> None:
    options = _bwrap_part(build_argv(_spec(workspace_fd=4)))
    assert _has_sequence(options, ["--bind-fd", "4", "/workspace"])
    # only one thing is mounted at /workspace, and the path is not used at all
    assert [o for o in options if o == "/workspace"] == ["/workspace", "/workspace"]  # + --chdir
    assert "/srv/sbx/ws" not in options


def test_json_status_fd_only_when_given() -> None:
    assert "--json-status-fd" not in build_argv(_spec())
    options = _bwrap_part(build_argv(_spec(status_fd=11)))
    assert _has_sequence(options, ["--json-status-fd", "11"])
    assert options.count("--json-status-fd") == 1


def test_toolchain_env_overrides_base_env() -> None:
    env = _env(build_argv(_spec()))
    # each variable set exactly once: bwrap would apply the last one, but a
    # duplicate means the override logic is wrong
    assert all(len(values) == 1 for values in env.values()), env
    assert env["LANG"] == ["en_US.UTF-8"]
    assert env["TERM"] == ["vt100"]
    assert env["PYTHONUNBUFFERED"] == ["1"]
    assert env["HOME"] == ["/home/sandbox"]


def test_base_env_without_toolchain_env() -> None:
    toolchain = Toolchain(
        language=Language.go,
        executable="/usr/bin/go",
        install_hint="",
        runner="go test",
        runner_display="go test",
        runner_argv=("go", "test"),
    )
    env = _env(build_argv(_spec(toolchain=toolchain)))
    assert env == {
        "PATH": ["/opt/sandboxd/bin:/usr/local/bin:/usr/bin:/bin"],
        "HOME": ["/home/sandbox"],
        "USER": ["sandbox"],
        "LOGNAME": ["sandbox"],
        "SHELL": ["/bin/sh"],
        "LANG": ["C.UTF-8"],
        "TMPDIR": ["/tmp"],
        "TERM": ["dumb"],
    }
    options = _bwrap_part(build_argv(_spec(toolchain=toolchain)))
    # no shims: the shim dir is still made, but holds no links
    assert _has_sequence(options, ["--dir", "/opt/sandboxd/bin"])
    assert not any(o.startswith("/opt/sandboxd/bin/") for o in options)


def test_extra_env_overrides_toolchain_env() -> None:
    env = _env(build_argv(_spec(extra_env={"LANG": "C", "PATH": "/extra", "FOO": "bar"})))
    assert env["LANG"] == ["C"]
    assert env["PATH"] == ["/extra"]
    assert env["FOO"] == ["bar"]


def test_spec_is_not_mutated_and_argv_is_fresh() -> None:
    spec = _spec(drop_to=Owner(5, 5))
    first = build_argv(spec)
    first.append("junk")
    assert build_argv(spec)[-1] == COMMAND[-1]
