"""Streaming exec: Server-Sent Events while the command runs, the JSON body at the end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.conftest import form_with_file, make_zip

SSE = {"Accept": "text/event-stream"}


async def sandbox(client) -> dict:
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201
    return await r.json()


async def read_events(response) -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []
    kind = None
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((kind, json.loads(line[len("data: ") :])))
    return events


async def test_events_then_the_same_body_as_json(client):
    made = await sandbox(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/exec",
        json={"command": "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exit 3"},
        headers=SSE,
    )
    assert r.status == 200
    assert r.content_type == "text/event-stream"
    events = await read_events(r)
    kinds = [k for k, _ in events]
    assert kinds[-1] == "result"
    streamed = [(k, d["text"]) for k, d in events[:-1]]
    assert streamed == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    result = events[-1][1]
    plain = await client.post(
        f"/v1/sandboxes/{made['id']}/exec",
        json={"command": "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exit 3"},
    )
    expected = await plain.json()
    assert set(result) == set(expected)
    for key in ("output", "stdout", "stderr", "exit_code", "timed_out", "truncated"):
        assert result[key] == expected[key]


async def test_test_mode_sends_a_phase_event_before_the_runner(client):
    made = await sandbox(client)
    archive = make_zip({"tests/test_a.py": "def test_a():\n    print('in test')\n"})
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/upload", data=form_with_file(archive, "p.zip")
    )
    assert r.status == 201
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/exec",
        json={"command": "echo building", "test": True},
        headers=SSE,
    )
    events = await read_events(r)
    kinds = [k for k, _ in events]
    phase = kinds.index("phase")
    assert events[phase][1] == {"phase": "tests", "runner": "pytest"}
    assert ("stdout", {"text": "building\n"}) in events[:phase]
    after = "".join(d.get("text", "") for _, d in events[phase + 1 : -1])
    assert "1 passed" in after
    assert events[-1][0] == "result"
    assert events[-1][1]["tests"]["passed"] == 1


async def test_refusals_before_the_start_are_plain_problems(client):
    made = await sandbox(client)
    r = await client.post(
        f"/v1/sandboxes/{made['id']}/exec",
        json={"command": "pwd", "cwd": "missing"},
        headers=SSE,
    )
    assert r.status == 422
    assert (await r.json())["code"] == "not_a_folder"


async def test_a_client_that_leaves_kills_the_command(client):
    made = await sandbox(client)
    sid = made["id"]
    r = await client.post(
        f"/v1/sandboxes/{sid}/exec",
        json={"command": "echo started; sleep 3; touch late"},
        headers=SSE,
    )
    first = await r.content.readline()
    assert first == b"event: stdout\n"
    r.close()  # the client goes away mid-command
    for _ in range(100):
        state = await (await client.get(f"/v1/sandboxes/{sid}")).json()
        if state["running_commands"] == 0:
            break
        await asyncio.sleep(0.05)
    assert state["running_commands"] == 0
    # Had the command lived on, it would have finished (and made the file) by now.
    assert not (Path(made["workspace"]) / "late").exists()
