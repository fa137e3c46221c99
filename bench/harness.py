"""What every benchmark shares: a real daemon process, statistics, rows of results.

The daemon is started exactly as a user starts it (``python -m sandboxd ...
serve``, default settings, default log level) from the same source tree the
benchmark imported, in a short temp dir under /tmp that uid 65534 can
traverse (the daemon drops sandboxed code to it when it runs as root).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

import sandboxd

# The source tree the benchmark measures: the daemon runs from it too.
SOURCE_ROOT = Path(sandboxd.__file__).resolve().parents[1]


def make_workdir() -> Path:
    """A short temp dir (socket paths < 108 bytes), 0711 so uid 65534 can traverse it."""
    path = Path(tempfile.mkdtemp(prefix="sbxb", dir="/tmp"))
    os.chmod(path, 0o711)
    return path


@dataclass
class Stats:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            raise ValueError("no samples")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def scaled(self, factor: float) -> Stats:
        return Stats(self.median * factor, self.min * factor, self.max * factor, self.n)

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


@dataclass
class Row:
    """One line of the table: sandboxd's figure, its reference, their ratio and the target."""

    id: str
    title: str
    unit: str
    measured: Stats | None = None
    reference: Stats | None = None
    reference_name: str | None = None
    # "lower": ratio = measured / reference, target is a maximum;
    # "higher": ratio = measured / reference (throughputs), target is a minimum.
    better: str = "lower"
    target: float | None = None
    errors: int = 0
    note: str = ""
    skipped: str | None = None
    optional: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.measured is None or self.reference is None or self.reference.median == 0:
            return None
        return self.measured.median / self.reference.median

    @property
    def met(self) -> bool | None:
        ratio = self.ratio
        if self.target is None or ratio is None:
            return None
        ok = ratio <= self.target if self.better == "lower" else ratio >= self.target
        return ok and self.errors == 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        target = d.get("target")
        return cls(
            id=d["id"],
            title=d["title"],
            unit=d["unit"],
            measured=Stats(**d["measured"]) if d.get("measured") else None,
            reference=Stats(**d["reference"]) if d.get("reference") else None,
            reference_name=d.get("reference_name"),
            better="higher" if target and target["op"] == ">=" else "lower",
            target=target["value"] if target else None,
            errors=d.get("errors", 0),
            note=d.get("note", ""),
            skipped=d.get("skipped"),
            optional=d.get("optional", False),
            extra=d.get("extra", {}),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "unit": self.unit,
            "measured": self.measured.as_dict() if self.measured else None,
            "reference": self.reference.as_dict() if self.reference else None,
            "reference_name": self.reference_name,
            "ratio": self.ratio,
            "target": (
                None
                if self.target is None
                else {"op": "<=" if self.better == "lower" else ">=", "value": self.target}
            ),
            "met": self.met,
            "errors": self.errors,
            "note": self.note,
            "skipped": self.skipped,
            "optional": self.optional,
            "extra": self.extra,
        }


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (not its children)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssSampler:
    """Samples a process's RSS every few milliseconds in a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def http_get_blocking(socket_path: Path, path: str, timeout: float = 2.0) -> int:
    """One ``GET`` over a fresh connection; the status code (0 if it could not connect)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: sandboxd\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                return 0
            head += chunk
        return int(head.split(b" ", 2)[1])
    except OSError:
        return 0
    finally:
        sock.close()


@dataclass
class BenchDaemon:
    """A real ``sandboxd serve`` on a Unix socket, with its own data dir."""

    root: Path
    name: str
    # Python run in the daemon before sandboxd starts: for trying a fix
    # without editing sandboxd/ (``--daemon-prelude``), never in a real run.
    prelude: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.root / self.name / "run" / "s.sock"

    @property
    def data_dir(self) -> Path:
        return self.root / self.name / "data"

    @property
    def log_path(self) -> Path:
        return self.root / self.name / "daemon.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self) -> list[str]:
        if self.prelude is None:
            launch = ["-m", "sandboxd"]
        else:
            code = f"exec(open({str(self.prelude)!r}).read())\n"
            launch = ["-c", code + "from sandboxd.cli import main\nmain(prog_name='sandboxd')"]
        return [
            sys.executable,
            *launch,
            "--socket",
            str(self.socket_path),
            "--data-dir",
            str(self.data_dir),
            # A config file that does not exist: the defaults, not the user's settings.
            "--config",
            str(self.root / self.name / "config.toml"),
            "serve",
        ]

    def start(self, timeout: float = 120.0) -> float:
        """Start it; return the seconds until it answered its first request."""
        (self.root / self.name).mkdir(mode=0o711, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH")) if p
        )
        with open(self.log_path, "ab") as log:
            started = time.perf_counter()
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=SOURCE_ROOT,
                env=env,
            )
        # The socket listens before the registry is loaded and the self-test
        # has run; a request waits in the backlog until the app serves it.
        deadline = started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"daemon {self.name} exited {self.proc.returncode}: {self.log()}"
                )
            if http_get_blocking(self.socket_path, "/v1/version", timeout=timeout) == 200:
                return time.perf_counter() - started
            time.sleep(0.002)
        raise RuntimeError(f"daemon {self.name} did not answer within {timeout:g} s: {self.log()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def session(self, limit: int = 128) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(self.socket_path), limit=limit),
            base_url="http://sandboxd",
            timeout=aiohttp.ClientTimeout(total=900),
        )


@contextlib.contextmanager
def daemons(root: Path) -> Iterator[list[BenchDaemon]]:
    """A list to put started daemons in; all are stopped on the way out."""
    started: list[BenchDaemon] = []
    try:
        yield started
    finally:
        for d in started:
            d.stop()


def remove_workdir(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


class ApiError(RuntimeError):
    pass


async def create_sandbox(http: aiohttp.ClientSession, language: str = "python") -> dict[str, Any]:
    async with http.post("/v1/sandboxes", json={"language": language}) as r:
        body: dict[str, Any] = await r.json()
        if r.status != 201:
            raise ApiError(f"create answered {r.status}: {body}")
        return body


async def delete_sandbox(http: aiohttp.ClientSession, sandbox_id: str) -> None:
    async with http.delete(f"/v1/sandboxes/{sandbox_id}") as r:
        if r.status != 204:
            raise ApiError(f"delete answered {r.status}: {await r.text()}")


async def exec_command(
    http: aiohttp.ClientSession, sandbox_id: str, command: str, **fields: Any
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command, **fields}
    ) as r:
        return r.status, await r.json()


@dataclass
class Plan:
    """How many runs of what: the full run, or ``--quick`` (a smoke run, numbers not meaningful)."""

    quick: bool
    exec_pairs: int
    lifecycle_pairs: int
    throughput_rounds: int
    throughput_levels: tuple[int, ...]
    throughput_batch: dict[int, int]
    upload_files: int
    upload_bytes: int
    upload_pairs: int
    scale_sandboxes: int
    memory_sandboxes: int
    startup_pairs: int
    list_pairs: int
    create_pairs: int
    test_pairs: int
    srt_runs: int

    @classmethod
    def full(cls) -> Plan:
        return cls(
            quick=False,
            exec_pairs=400,
            lifecycle_pairs=400,
            throughput_rounds=7,
            throughput_levels=(1, 4, 16, 64),
            throughput_batch={1: 40, 4: 80, 16: 160, 64: 256},
            upload_files=10_000,
            upload_bytes=50 * 1000 * 1000,
            upload_pairs=5,
            scale_sandboxes=10_000,
            memory_sandboxes=1_000,
            startup_pairs=3,
            list_pairs=10,
            create_pairs=100,
            test_pairs=10,
            srt_runs=20,
        )

    @classmethod
    def smoke(cls) -> Plan:
        return cls(
            quick=True,
            exec_pairs=10,
            lifecycle_pairs=10,
            throughput_rounds=1,
            throughput_levels=(1, 4, 16, 64),
            throughput_batch={1: 4, 4: 8, 16: 16, 64: 64},
            upload_files=500,
            upload_bytes=2 * 1000 * 1000,
            upload_pairs=1,
            scale_sandboxes=200,
            memory_sandboxes=100,
            startup_pairs=1,
            list_pairs=2,
            create_pairs=5,
            test_pairs=1,
            srt_runs=2,
        )


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(daemon_pid: int) -> dict[str, float]:
    """CPU time so far of the daemon, its reaped children (bwrap and all under it),
    this process (the clients or the raw caller) and this process's reaped children."""
    with open(f"/proc/{daemon_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    utime, stime, cutime, cstime = (int(x) / _CLK_TCK for x in fields[11:15])
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "daemon": utime + stime,
        "daemon_children": cutime + cstime,
        "bench": me.ru_utime + me.ru_stime,
        "bench_children": kids.ru_utime + kids.ru_stime,
    }


class CpuAccount:
    """CPU milliseconds per operation, split by who spent them, summed over batches."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.count = 0

    def add(self, before: dict[str, float], after: dict[str, float], count: int) -> None:
        for key in before:
            self.spent[key] = self.spent.get(key, 0.0) + after[key] - before[key]
        self.count += count

    def per_op_ms(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {k: round(v * 1000 / self.count, 3) for k, v in self.spent.items()}


def cpu_note(ours: CpuAccount, ref: CpuAccount) -> str:
    """The CPU one exec costs on top of bwrap: the daemon and its client, or the raw caller.

    bwrap's own CPU is left out: the daemon is a subreaper and reaps the PID 1
    bwrap leaves behind (so its CPU lands in the daemon's children), while the
    raw caller's orphans go to the host's init (so ours would look cheaper).
    """
    a, b = ours.per_op_ms(), ref.per_op_ms()
    if not a or not b:
        return ""
    return (
        f"CPU ms per exec beyond bwrap: sandboxd {a['daemon']:.1f} + its HTTP client"
        f" {a['bench']:.1f}; raw caller {b['bench']:.1f}"
    )
