"""No project ever sees another's data."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.every_store

B = {"X-Project-ID": "project-b"}


async def test_project_b_cannot_see_or_touch_project_a(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/queues/shared/messages", json={"messages": [{"body": "secret"}]})
    mid = r.json()["resources"][0].rsplit("/", 1)[1]
    claim = await client.post("/v2/queues/shared/claims", params={"limit": 1})
    claim_href = claim.headers["location"]
    await client.post("/v2/queues/shared/messages", json={"messages": [{"body": "second"}]})

    assert (await client.get("/v2/queues", headers=B)).json()["queues"] == []
    listing = await client.get("/v2/queues/shared/messages", params={"include_claimed": "true"}, headers=B)
    assert listing.json()["messages"] == []
    assert (await client.get(f"/v2/queues/shared/messages/{mid}", headers=B)).status_code == 404
    assert (await client.get(claim_href, headers=B)).status_code == 404
    assert (await client.post("/v2/queues/shared/claims", headers=B)).status_code == 204
    assert (await client.delete("/v2/queues/shared/messages", params={"pop": 5}, headers=B)).json() == {
        "messages": []
    }
    assert (await client.delete(f"/v2/queues/shared/messages/{mid}", headers=B)).status_code == 204
    assert (await client.delete("/v2/queues/shared", headers=B)).status_code == 204
    assert (await client.get("/v2/queues/shared/stats", headers=B)).json()["messages"]["total"] == 0

    # project A still has both messages, and its claim
    stats = (await client.get("/v2/queues/shared/stats")).json()["messages"]
    assert (stats["total"], stats["claimed"]) == (2, 1)
    assert (await client.get(claim_href)).status_code == 200
    assert (await client.get(f"/v2/queues/shared/messages/{mid}")).json()["body"] == "secret"


async def test_project_ids_with_braces_stay_apart(client: httpx.AsyncClient) -> None:
    await client.post(
        "/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers={"X-Project-ID": "a}b"}
    )
    other = await client.get("/v2/queues/q/stats", headers={"X-Project-ID": "a%7Db"})
    assert other.json()["messages"]["total"] == 0
