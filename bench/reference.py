"""The reference every exec figure is compared with: raw bubblewrap, same flags, no daemon.

The argv comes from ``sandboxd.bwrap.build_argv`` on a ``SandboxSpec`` built
the way ``sandboxd.execution.Execution.run`` builds it, for a workspace,
home and etc folder of our own: the same prlimit and setpriv prefix, the
same options handed over on an ``--args`` memfd, the same seccomp program
on a memfd, the workspace bound by descriptor, ``--json-status-fd``.
``check_matches_daemon`` compares all of that with what a real daemon's
bwrap process runs (its argv, the option and seccomp memfds the daemon
holds, its rlimits and ids, read from /proc), so a change in the daemon
that this file does not follow is reported instead of silently measuring
something else.

It runs as a careful caller runs a sandbox: empty environment, stdin from
/dev/null, stdout and stderr on pipes read to the end, the status pipe read
to the end, the exit status checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd import bwrap, seccomp, toolchains
from sandboxd.config import Settings
from sandboxd.models import Language
from sandboxd.workspace import Owner

# Options whose value is a descriptor number: the numbers differ between callers.
FD_OPTIONS = ("--args", "--bind-fd", "--seccomp", "--json-status-fd", "--block-fd", "--sync-fd")


class ReferenceFailed(RuntimeError):
    pass


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # inheritable: bwrap reads it
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@dataclass
class RawBwrap:
    workspace: Path
    home: Path
    etc_dir: Path
    toolchain: toolchains.Toolchain
    owner: Owner | None
    bwrap_path: str
    seccomp_bpf: bytes | None
    rlimits: bwrap.Rlimits
    tmp_bytes: int

    @classmethod
    def create(
        cls, root: Path, settings: Settings, owner: Owner | None, language: Language
    ) -> RawBwrap:
        """Lay out a sandbox folder like the daemon's, owned like the daemon's."""
        root.mkdir(mode=0o711)
        etc = root / "etc"
        etc.mkdir(mode=0o755)
        for name, text in bwrap.etc_file_contents().items():
            (etc / name).write_text(text)
            os.chmod(etc / name, 0o644)
        for sub in ("workspace", "home"):
            (root / sub).mkdir(mode=0o700)
            if owner:
                os.chown(root / sub, owner.uid, owner.gid)
        limits = settings.limits
        return cls(
            workspace=root / "workspace",
            home=root / "home",
            etc_dir=etc,
            toolchain=toolchains.detect(settings)[language],
            owner=owner,
            bwrap_path=settings.bwrap,
            # Compiled once, as the daemon compiles it once at start-up.
            seccomp_bpf=seccomp.compile_bpf() if settings.seccomp else None,
            # As SandboxManager._rlimits sets them when a request asks for nothing.
            rlimits=bwrap.Rlimits(
                data_bytes=limits.memory_bytes,
                open_files=limits.open_files,
                file_bytes=limits.file_bytes,
                cpu_seconds=limits.cpu_seconds,
                processes=limits.processes if owner is not None else None,
            ),
            tmp_bytes=limits.tmp_bytes,
        )

    def spec(
        self,
        command: Sequence[str],
        status_fd: int | None,
        seccomp_fd: int | None,
        workspace_fd: int | None,
    ) -> bwrap.SandboxSpec:
        # Keep in step with sandboxd/execution.py, Execution.run.
        return bwrap.SandboxSpec(
            workspace=self.workspace,
            home=self.home,
            etc_dir=self.etc_dir,
            toolchain=self.toolchain,
            command=list(command),
            drop_to=self.owner,
            rlimits=self.rlimits,
            status_fd=status_fd,
            seccomp_fd=seccomp_fd,
            workspace_fd=workspace_fd,
            tmp_bytes=self.tmp_bytes,
        )

    @contextmanager
    def _descriptors(self) -> Iterator[dict[str, int]]:
        fds: dict[str, int] = {}
        try:
            fds["workspace"] = os.open(
                self.workspace, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
            if self.seccomp_bpf is not None:
                fds["seccomp"] = _memfd("seccomp", self.seccomp_bpf)
            yield fds
        finally:
            for fd in fds.values():
                os.close(fd)

    def run(self, command: Sequence[str], check: bool = True) -> float:
        """Run ``command`` in the sandbox, blocking; the wall-clock seconds it took."""
        started = time.perf_counter()
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        with self._descriptors() as fds:
            try:
                spec = self.spec(command, status_w, fds.get("seccomp"), fds["workspace"])
                fds["args"] = _memfd("args", bwrap.encode_args(bwrap.bwrap_options(spec)))
                proc = subprocess.Popen(
                    bwrap.build_argv(spec, self.bwrap_path, args_fd=fds["args"]),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(status_w, *fds.values()),
                    close_fds=True,
                    env={},
                )
            finally:
                os.close(status_w)
        with os.fdopen(status_r, "rb") as status_pipe:
            _, stderr = proc.communicate()
            status = status_pipe.read()
        elapsed = time.perf_counter() - started
        if check:
            _check(proc.returncode, status, stderr)
        return elapsed

    def argv_for_check(self, command: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
        """What runs before bwrap, bwrap's argv, and its options (made-up descriptor numbers)."""
        spec = self.spec(command, 90, 91 if self.seccomp_bpf is not None else None, 92)
        argv = bwrap.build_argv(spec, self.bwrap_path, args_fd=93)
        before = len(bwrap.launcher(spec, self.bwrap_path)) - 1
        return argv[:before], argv[before:], bwrap.bwrap_options(spec)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _check(returncode: int, status: bytes, stderr: bytes) -> None:
    exit_code = None
    text, pos, decoder = status.decode(errors="replace"), 0, json.JSONDecoder()
    while (pos := _skip_space(text, pos)) < len(text):
        doc, pos = decoder.raw_decode(text, pos)
        exit_code = doc.get("exit-code", exit_code)
    if returncode != 0 or exit_code not in (0, None):
        raise ReferenceFailed(
            f"raw bwrap exited {returncode} (exit-code {exit_code}): {stderr.decode()[-500:]}"
        )


# -- comparison with a real daemon --------------------------------------------------


def _bwrap_children(daemon_pid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if int(fields[1]) == daemon_pid and comm == "bwrap":
            pids.append(int(entry))
    return pids


def _settled_bwrap_child(daemon_pid: int) -> tuple[int, list[str]] | None:
    """A bwrap child of the daemon and its argv, once that argv can be read.

    The kernel renames a process (``comm``) before the ELF loader has set up
    the new argument area, so for a moment mid-exec, and again once the
    process is a zombie, /proc/PID/cmdline reads empty: such a child is not
    ready yet and the caller polls again.
    """
    for pid in _bwrap_children(daemon_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
        except OSError:
            continue
        if "--" in argv:
            return pid, argv
    return None


def _ids(pid: int) -> tuple[int, int]:
    uid = gid = -1
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("Gid:"):
                gid = int(line.split()[1])
    return uid, gid


_LIMIT_NAMES = {
    "--data": "Max data size",
    "--nofile": "Max open files",
    "--fsize": "Max file size",
    "--cpu": "Max cpu time",
    "--core": "Max core file size",
    "--nproc": "Max processes",
}


def _limits(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/limits") as f:
        for line in f.readlines()[1:]:
            name = line[:26].strip()
            out[name] = line[26:].split()[0]
    return out


def _memfds(pid: int) -> dict[str, bytes]:
    """The memfds a process holds, by name, with their content."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/memfd:"):
                name = target[len("/memfd:") :].split(" ")[0]
                with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                    found[name] = f.read()
        except OSError:
            continue
    return found


def _normalise(argv: list[str], paths: dict[str, str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] in FD_OPTIONS:
            arg = "{FD}"
        for path, name in paths.items():
            if arg == path or arg.startswith(path + "/"):
                arg = name + arg[len(path) :]
        out.append(arg)
    return out


def _difference(a: list[str], b: list[str]) -> str:
    only_a = [x for x in a if x not in b]
    only_b = [x for x in b if x not in a]
    if only_a or only_b:
        return f"daemon-only {only_a[:10]}, reference-only {only_b[:10]}"
    return "the same arguments in another order"


async def check_matches_daemon(
    raw: RawBwrap,
    daemon_pid: int,
    data_dir: Path,
    sandbox_root: Path,
    running: asyncio.Future[Any],
) -> dict[str, Any]:
    """Compare the reference with what a daemon really runs.

    ``running`` is an exec of ``sleep`` already sent to the daemon; while it
    runs we read its bwrap's argv, ids and limits, and the memfds (options,
    seccomp program) the daemon holds for it.
    """
    deadline = time.monotonic() + 10
    found = None
    while time.monotonic() < deadline and found is None:
        found = _settled_bwrap_child(daemon_pid)
        if found is None:
            await asyncio.sleep(0.005)
    if found is None:
        await running
        return {"matches": False, "detail": "found no bwrap child of the daemon"}
    pid, daemon_argv = found
    ids = _ids(pid)
    limits = _limits(pid)
    memfds = _memfds(daemon_pid)
    await running

    problems = []
    launcher, ours, our_options = raw.argv_for_check(daemon_argv[daemon_argv.index("--") + 1 :])
    # prlimit and setpriv have exec'd into bwrap: what remains of them is the
    # limits and ids they set.
    for arg in launcher:
        name, _, value = arg.partition("=")
        if name in _LIMIT_NAMES and limits.get(_LIMIT_NAMES[name]) != value:
            problems.append(f"{name}: daemon {limits.get(_LIMIT_NAMES[name])}, reference {value}")
    if os.geteuid() == 0:
        if raw.owner is None or "setpriv" not in launcher:
            problems.append("the reference runs sandboxed code as root")
        if ids[0] == 0:
            problems.append("the daemon's bwrap runs as root")
    elif raw.owner is not None or ids[0] != os.getuid():
        problems.append(f"ids: daemon's bwrap runs as {ids}, the reference as {raw.owner}")

    paths = {
        str(sandbox_root / "workspace"): "{WORKSPACE}",
        str(sandbox_root / "home"): "{HOME}",
        str(data_dir / "etc"): "{ETC}",
    }
    our_paths = {
        str(raw.workspace): "{WORKSPACE}",
        str(raw.home): "{HOME}",
        str(raw.etc_dir): "{ETC}",
    }
    a = _normalise(daemon_argv, paths)
    b = _normalise(ours, our_paths)
    a[0], b[0] = os.path.basename(a[0]), os.path.basename(b[0])
    if a != b:
        problems.append(f"argv: {_difference(a, b)}")
    if "--args" in daemon_argv:
        raw_options = memfds.get("sandboxd-args")
        if raw_options is None:
            problems.append("could not read the daemon's --args memfd")
        else:
            theirs = [x.decode() for x in raw_options.split(b"\0")[:-1]]
            a, b = _normalise(theirs, paths), _normalise(our_options, our_paths)
            if a != b:
                problems.append(f"options: {_difference(a, b)}")
    seccomp_in_play = "--seccomp" in our_options or "sandboxd-seccomp" in memfds
    if seccomp_in_play and memfds.get("sandboxd-seccomp") != raw.seccomp_bpf:
        problems.append("the seccomp programs differ")
    detail = (
        f"argv, {len(our_options)} options, seccomp program, rlimits and ids identical"
        if not problems
        else "; ".join(problems)
    )
    return {
        "matches": not problems,
        "detail": detail,
        "seccomp": raw.seccomp_bpf is not None,
        "daemon_bwrap_ids": ids,
    }
