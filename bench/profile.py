"""Where the daemon's time goes: py-spy attached to it while one benchmark runs.

Optional (py-spy is not a dependency): ``python -m bench --py-spy DIR``
writes one collapsed-stack file per benchmark into DIR and prints the
functions that held the most samples, by self time and inclusive time.
"""

from __future__ import annotations

import collections
import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(out_dir: Path | None, name: str, pid: int) -> Iterator[None]:
    exe = py_spy() if out_dir else None
    if out_dir is None or exe is None:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}.txt"
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--rate",
            "1000",
            "--format",
            "raw",
            "--output",
            str(out),
            "--pid",
            str(pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def summary(path: Path, top: int = 25) -> str:
    """The top functions of a collapsed-stack file, by self and inclusive samples."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{path.name}: {total} samples"]
    lines.append("  self:")
    lines += [f"    {n:6d} {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"    {n:6d} {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)
