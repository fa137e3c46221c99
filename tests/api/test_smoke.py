async def test_create_and_exec(client):
    r = await client.post("/v1/sandboxes", json={})
    assert r.status == 201
    sid = (await r.json())["id"]
    r = await client.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo hi; exit 4"})
    body = await r.json()
    assert r.status == 200, body
    assert body["output"] == "hi\n"
    assert body["exit_code"] == 4
