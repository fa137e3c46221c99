"""The table for people, the JSON for machines, and the machine the run was on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

import sandboxd
from bench.harness import SOURCE_ROOT, Row, Stats


def pressure() -> dict[str, float]:
    """How contended the machine was: PSI 'some' averages over 60 s (percent of time)."""
    out = {}
    for kind in ("cpu", "io"):
        try:
            with open(f"/proc/pressure/{kind}") as f:
                first = f.readline().split()
            out[f"{kind}_some_avg60"] = float(first[2].split("=")[1])
        except (OSError, IndexError, ValueError):
            pass
    return out


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "cpu": cpu,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "bwrap": _first_line(["bwrap", "--version"]),
        "euid": os.geteuid(),
        "loadavg": os.getloadavg(),
        "pressure_at_end": pressure(),
    }


def source() -> dict[str, Any]:
    commit = _first_line(["git", "-C", str(SOURCE_ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _first_line(
        ["git", "-C", str(SOURCE_ROOT), "status", "--porcelain", "--untracked-files=no", "sandboxd"]
    )
    return {
        "version": sandboxd.__version__,
        "path": str(SOURCE_ROOT),
        "commit": commit,
        "sandboxd_modified": bool(dirty),
    }


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(stats: Stats | None) -> str:
    if stats is None:
        return "-"
    return f"{_fmt(stats.median)} [{_fmt(stats.min)}-{_fmt(stats.max)}]"


def _target(row: Row) -> str:
    if row.target is None:
        return "-"
    return f"{'<=' if row.better == 'lower' else '>='} {row.target:g}"


def _verdict(row: Row) -> str:
    if row.skipped:
        return "skipped"
    if row.met is None:
        return "-"
    return "met" if row.met else "MISSED"


def table(rows: list[Row]) -> str:
    header = ["benchmark", "unit", "sandboxd median [min-max]", "reference median [min-max]",
              "ratio", "target", "verdict", "errors"]  # fmt: skip
    lines = [header]
    for row in rows:
        if row.skipped:
            reason = row.skipped if len(row.skipped) <= 60 else row.skipped[:57] + "..."
            lines.append([row.title, "-", reason, "", "", "", "skipped", ""])
            continue
        ratio = row.ratio
        lines.append(
            [
                row.title,
                row.unit,
                _cell(row.measured),
                _cell(row.reference),
                "-" if ratio is None else f"{ratio:.2f}",
                _target(row),
                _verdict(row),
                str(row.errors),
            ]
        )
    widths = [max(len(line[i]) for line in lines if len(line) > i) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def notes(rows: list[Row]) -> str:
    out = []
    for row in rows:
        if row.reference_name or row.note:
            ref = f"vs {row.reference_name}" if row.reference_name else ""
            sep = "; " if ref and row.note else ""
            out.append(f"- {row.title}: {ref}{sep}{row.note}")
    return "\n".join(out)


def markdown(rows: list[Row]) -> str:
    """The same table as Markdown, for docs/performance.md."""
    lines = [
        "| benchmark | unit | sandboxd median [min-max] | reference | reference median [min-max]"
        " | ratio | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.skipped:
            lines.append(f"| {row.title} | | skipped: {row.skipped} | | | | | |")
            continue
        ratio = row.ratio
        lines.append(
            f"| {row.title} | {row.unit} | {_cell(row.measured)} | {row.reference_name or '-'}"
            f" | {_cell(row.reference)} | {'-' if ratio is None else f'{ratio:.2f}'}"
            f" | {_target(row)} | {_verdict(row)} |"
        )
    return "\n".join(lines)


def document(rows: list[Row], checks: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    return {
        "machine": machine(),
        "sandboxd": source(),
        "argv": sys.argv,
        "plan": plan,
        "checks": checks,
        "rows": [row.as_dict() for row in rows],
    }
