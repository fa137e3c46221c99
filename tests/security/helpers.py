"""Helpers shared by the security tier: calls, problem checks, tree snapshots, markers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

PROBLEM_TYPE = "application/problem+json"

AS_ROOT = os.geteuid() == 0


def sandbox_owner(data_dir: Path, sandbox: dict[str, Any]) -> tuple[int, int]:
    """The host uid and gid a sandbox's code runs as and its files belong to.

    As root, each sandbox has a uid of its own, recorded in its sandbox.json;
    otherwise it is the daemon's (here: the test's) own uid.
    """
    if not AS_ROOT:
        return os.geteuid(), os.getegid()
    record = json.loads((data_dir / "sandboxes" / sandbox["id"] / "sandbox.json").read_text())
    uid = int(record["uid"])
    return uid, uid


async def create_sandbox(http: Any, language: str = "python") -> dict[str, Any]:
    r = await http.post("/v1/sandboxes", json={"language": language})
    body = await r.json()
    assert r.status == 201, body
    return body


async def run(
    http: Any, sandbox_id: str, command: str, *, test: bool = False, timeout: float | None = None
) -> dict[str, Any]:
    """Exec ``command`` and return the 200 answer's body."""
    payload: dict[str, Any] = {"command": command}
    if test:
        payload["test"] = True
    if timeout is not None:
        payload["timeout"] = timeout
    r = await http.post(f"/v1/sandboxes/{sandbox_id}/exec", json=payload)
    body = await r.json(content_type=None)
    assert r.status == 200, body
    return body


async def expect_problem(r: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Assert an RFC 9457 answer with this status and machine code; return its body."""
    text = await r.text()
    assert r.status == status, text
    assert r.content_type == PROBLEM_TYPE, (r.content_type, text)
    body = json.loads(text)
    assert body["code"] == code, body
    assert body["status"] == status, body
    return body


def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below ``root`` (never following links): type, mode, owner and content."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid)
            else:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_uid, st.st_size, digest)
    return out


def file_digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sleep_marker() -> str:
    """A sleep duration no other process on the host uses, to find ours with pgrep -f."""
    return f"{300 + secrets.randbelow(600)}.{secrets.randbelow(10**6):06d}1"


def pids_matching(pattern: str) -> list[int]:
    """Host pids whose full command line contains ``pattern`` (a fixed string)."""
    found = []
    own = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if pattern.encode() in raw.replace(b"\0", b" "):
            found.append(int(entry))
    return sorted(found)


def exact_sleeps(marker: str) -> list[int]:
    """Host pids of ``sleep <marker>`` itself (not bwrap or sh, whose argv also hold it)."""
    exact = f"sleep\0{marker}\0".encode()
    found = []
    for pid in pids_matching(f"sleep {marker}"):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == exact:
                found.append(pid)
        except OSError:
            pass
    return found


def pgrep(pattern: str) -> list[int]:
    """pgrep -f, as a person would check by hand."""
    done = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return sorted(int(p) for p in done.stdout.split())


async def wait_until(predicate: Any, timeout: float, step: float = 0.02) -> bool:
    """Poll ``predicate`` without blocking the loop (the app may run in this loop)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())


def raw_multipart(
    disposition: str, data: bytes, boundary: str = "sandboxd-sec-boundary"
) -> tuple[bytes, str]:
    """A multipart body with one part whose Content-Disposition is written exactly as given."""
    head = (
        f"--{boundary}\r\n"
        f"Content-Disposition: {disposition}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return head + data + tail, f"multipart/form-data; boundary={boundary}"
