"""DELETE racing with an upload in flight: a clean problem, never a 500, nothing left behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sandboxd.config import Settings
from tests.conftest import make_zip
from tests.security.helpers import create_sandbox, expect_problem, wait_until

BOUNDARY = "sandboxd-race-boundary"


def _held_body(payload: bytes, release: asyncio.Event) -> AsyncIterator[bytes]:
    """A multipart body that sends half of the file, then waits for ``release``."""

    async def body() -> AsyncIterator[bytes]:
        yield (
            f"--{BOUNDARY}\r\n"
            'Content-Disposition: form-data; name="file"; filename="p.zip"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        half = len(payload) // 2
        yield payload[:half]
        await release.wait()
        yield payload[half:]
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    return body()


def _receiving(sandbox: dict[str, Any]) -> bool:
    tmp = Path(sandbox["workspace"]).parent / "tmp"
    try:
        return any(name.startswith("upload-") for name in os.listdir(tmp))
    except FileNotFoundError:
        return False


async def _delete_during_upload(client: Any, settings: Settings, endpoint: str) -> Any:
    sandbox = await create_sandbox(client)
    payload = make_zip({f"f{i}.txt": os.urandom(2048).hex() for i in range(64)})
    release = asyncio.Event()
    upload = asyncio.create_task(
        client.post(
            f"/v1/sandboxes/{sandbox['id']}/{endpoint}",
            data=_held_body(payload, release),
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        )
    )
    try:
        assert await wait_until(lambda: _receiving(sandbox), 10)
        r = await client.delete(f"/v1/sandboxes/{sandbox['id']}")
        assert r.status == 204
    finally:
        release.set()
    answer = await asyncio.wait_for(upload, 15)
    # Whatever the answer, the sandbox is gone without leftovers.
    assert os.listdir(settings.data_dir / "sandboxes") == []
    # The files are removed just after the answer, in the background.
    assert await wait_until(lambda: not os.listdir(settings.data_dir / "trash"), 10)
    return answer


async def test_delete_during_single_file_upload(client: Any, settings: Settings) -> None:
    answer = await _delete_during_upload(client, settings, "files")
    await expect_problem(answer, 404, "sandbox_not_found")


async def test_delete_during_archive_upload(client: Any, settings: Settings) -> None:
    answer = await _delete_during_upload(client, settings, "upload")
    await expect_problem(answer, 404, "sandbox_not_found")
