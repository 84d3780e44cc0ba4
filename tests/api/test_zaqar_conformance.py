"""What Zaqar's own tests (zaqar-tempest-plugin) and its real clients (openstacksdk, the `openstack messaging`
CLI) send, answered as Zaqar answers it (issue 43's root causes, one test each)."""

from __future__ import annotations

import httpx
import pytest

from tests.api.test_flows import post_messages


@pytest.mark.every_store
async def test_a_claim_takes_its_limit_from_the_body_as_openstacksdk_sends_it(
    client: httpx.AsyncClient,
) -> None:
    """openstacksdk's create_claim puts `limit` in the body; Zaqar takes it, and the query's wins."""
    await post_messages(client, "sdk", *range(6))
    r = await client.post("/v2/queues/sdk/claims", json={"ttl": 60, "grace": 30, "limit": 2})
    assert r.status_code == 201, r.text
    assert len(r.json()["messages"]) == 2
    r = await client.post("/v2/queues/sdk/claims", params={"limit": 3}, json={"ttl": 60, "limit": 1})
    assert r.status_code == 201, r.text
    assert len(r.json()["messages"]) == 3  # the query's limit, not the body's

    for bad in (0, 21, "5", 2.5):
        r = await client.post("/v2/queues/sdk/claims", json={"ttl": 60, "limit": bad})
        assert r.status_code == 400, (bad, r.text)
        assert "limit" in r.json()["description"], r.text
