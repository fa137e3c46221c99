"""Zip upload of a project (10,000 files, 50 MB unpacked) against ``unzip`` to a local folder.

The project is generated, deterministic and text-like (it compresses about
as source code does), in 100 folders of 100 files of 1-9 kB. Each upload
goes to a fresh sandbox and each unzip to a fresh folder on the same file
system; creating and removing those is not timed, and the file system is
synced before each timed step so neither pays for the other's writeback.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import aiohttp

from bench.context import Context
from bench.harness import Row, Stats, create_sandbox, delete_sandbox, progress

# Words the generated files are made of (so they compress about as source code does).
_VOCABULARY = (
    "def return self import from class if else elif for while in not and or None True False "
    "value result items index count name path data config request response error status "
    "async await yield lambda with as try except finally raise assert print len range dict "
    "list set tuple str int float bytes open read write close append extend update get"
)
WORDS = _VOCABULARY.split()


def make_project_zip(path: Path, files: int, total_bytes: int, seed: int = 7) -> int:
    """Write the project as a zip at ``path``; return its unpacked size in bytes."""
    rng = random.Random(seed)
    corpus_words = []
    size = 0
    while size < 1 << 20:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        indent = "    " * rng.randint(0, 3)
        corpus_words.append(f"{indent}{line}\n")
        size += len(indent) + len(line) + 1
    corpus = "".join(corpus_words).encode()
    mean = total_bytes // files
    folders = max(1, files // 100)
    written = 0
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for d in range(folders):
            zf.writestr(zipfile.ZipInfo(f"src/pkg{d:03d}/"), b"")
        for i in range(files):
            n = rng.randint(mean // 5, 2 * mean - mean // 5)
            start = rng.randrange(0, len(corpus) - n)
            data = f"# file {i}\n".encode() + corpus[start : start + n]
            info = zipfile.ZipInfo(f"src/pkg{i % folders:03d}/mod{i // folders:04d}.py")
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            written += len(data)
    return written


async def run(ctx: Context) -> Row:
    plan = ctx.plan
    archive = ctx.root / "project.zip"
    progress(f"upload: making a {plan.upload_files}-file project")
    unpacked = make_project_zip(archive, plan.upload_files, plan.upload_bytes)
    zipped = archive.stat().st_size
    progress(f"upload vs unzip: {plan.upload_pairs} pairs ({zipped / 1e6:.1f} MB zipped)")
    unzip_root = ctx.root / "unzip"
    unzip_root.mkdir()
    errors = 0

    async def upload_once() -> float:
        nonlocal errors
        sandbox_id = (await create_sandbox(ctx.http))["id"]
        os.sync()
        with open(archive, "rb") as f:
            form = aiohttp.FormData()
            form.add_field("file", f, filename="project.zip", content_type="application/zip")
            started = time.perf_counter()
            async with ctx.http.post(f"/v1/sandboxes/{sandbox_id}/upload", data=form) as r:
                body = await r.json()
            elapsed = time.perf_counter() - started
        if r.status != 201 or body.get("files") != plan.upload_files:
            errors += 1
            progress(f"upload answered {r.status}: {body}")
        await delete_sandbox(ctx.http, sandbox_id)
        return elapsed

    def unzip_once(n: int) -> float:
        target = unzip_root / str(n)
        target.mkdir()
        os.sync()
        started = time.perf_counter()
        subprocess.run(
            ["unzip", "-q", str(archive), "-d", str(target)],
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        elapsed = time.perf_counter() - started
        shutil.rmtree(target)
        return elapsed

    ours: list[float] = []
    ref: list[float] = []
    for i in range(plan.upload_pairs):
        if i % 2:
            ours.append(await upload_once())
            ref.append(unzip_once(i))
        else:
            ref.append(unzip_once(i))
            ours.append(await upload_once())
    mb = unpacked / 1e6
    return Row(
        id="upload_zip",
        title=f"zip upload, {plan.upload_files:,} files / {mb:.0f} MB",
        unit="MB/s",
        measured=Stats.of([mb / t for t in ours]),
        reference=Stats.of([mb / t for t in ref]),
        reference_name="unzip -q to a local folder",
        better="higher",
        target=0.8,
        errors=errors,
        note=f"{zipped / 1e6:.1f} MB zipped; median {Stats.of(ours).median:.2f} s "
        f"vs {Stats.of(ref).median:.2f} s",
    )
