"""The state one benchmark run hands to each benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.harness import BenchDaemon, Plan
from bench.reference import RawBwrap
from sandboxd.config import Settings
from sandboxd.workspace import Owner


@dataclass
class Context:
    root: Path
    plan: Plan
    settings: Settings
    daemon: BenchDaemon
    http: aiohttp.ClientSession
    # A python sandbox of the daemon's, and a raw bwrap folder laid out like it.
    sandbox_id: str
    raw: RawBwrap
    owner: Owner | None
    srt: str | None
    profile_dir: Path | None = None
