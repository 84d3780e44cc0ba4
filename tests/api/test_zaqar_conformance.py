"""What Zaqar's own tests (zaqar-tempest-plugin) and its real clients (openstacksdk, the `openstack messaging`
CLI) send, answered as Zaqar answers it (issue 43's root causes, one test each)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from tests.api.test_dead_letter_features import dead_letter_all
from tests.api.test_flows import post_messages
from tests.conftest import api_client


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
        for query in ({}, {"limit": 1}):  # bounded even where the query's wins
            r = await client.post("/v2/queues/sdk/claims", params=query, json={"ttl": 60, "limit": bad})
            assert r.status_code == 400, (bad, r.text)
            assert "limit" in r.json()["description"], r.text


DASHED = "3381af92-2b9e-11e3-b191-71861300734c"  # an id of Zaqar's Redis driver


@pytest.mark.every_store
async def test_an_id_in_another_form_is_an_id_of_nothing(client: httpx.AsyncClient) -> None:
    """Zaqar's tests send its own ids (dashed UUIDs), `-1` and other text where an id goes: DELETE answers
    204 and GET 404, as for a well-formed id that names nothing, and the text is not echoed back."""
    (kept,) = await post_messages(client, "ids", "kept")
    r = await client.post("/v2/queues/ids/subscriptions", json={"subscriber": "https://hooks.example.com/h"})
    assert r.status_code == 201, r.text
    for other in (DASHED, "-1", "invalid"):
        for kind in ("messages", "claims", "subscriptions"):
            assert (await client.delete(f"/v2/queues/ids/{kind}/{other}")).status_code == 204, (kind, other)
            got = await client.get(f"/v2/queues/ids/{kind}/{other}")
            assert got.status_code == 404, (kind, other)
            assert other not in got.json()["description"]
        r = await client.patch(f"/v2/queues/ids/claims/{other}", json={"ttl": 60})
        assert r.status_code == 404
        r = await client.patch(f"/v2/queues/ids/subscriptions/{other}", json={"ttl": 600})
        assert r.status_code == 404

        listed = {"ids": f"{other},{DASHED}"}
        assert (await client.get("/v2/queues/ids/messages", params=listed)).status_code == 404
        assert (await client.delete("/v2/queues/ids/messages", params=listed)).status_code == 204
        both = {"ids": f"{other},{kept}"}  # the listed message that exists is found, and deleted
        r = await client.get("/v2/queues/ids/messages", params=both)
        assert [m["id"] for m in r.json()["messages"]] == [kept]
    assert (await client.delete("/v2/queues/ids/messages", params={"ids": f"-1,{kept}"})).status_code == 204
    assert (await client.get(f"/v2/queues/ids/messages/{kept}")).status_code == 404
    assert (await client.delete("/v2/queues/ids/messages", params={"ids": ","})).status_code == 204


@pytest.mark.every_store
async def test_a_claim_does_not_outlive_its_queue(client: httpx.AsyncClient, clock: ManualClock) -> None:
    """After DELETE of the queue, its claim is gone: GET and PATCH 404, DELETE 204 (Zaqar's tempest
    test_update_claim_on_non_existing_queue); and a queue made again under the name has none of them."""
    await post_messages(client, "gone", 1, 2)
    r = await client.post("/v2/queues/gone/claims", json={"ttl": 60})
    assert r.status_code == 201, r.text
    claim = r.headers["location"]
    assert (await client.get(claim)).status_code == 200
    assert (await client.delete("/v2/queues/gone")).status_code == 204
    assert (await client.get(claim)).status_code == 404
    assert (await client.patch(claim, json={"ttl": 120})).status_code == 404
    assert (await client.delete(claim)).status_code == 204
    assert (await client.delete(claim, params={"acknowledge": "true"})).status_code == 404

    r = await client.post("/v2/queues/again/claims", json={"ttl": 60})
    assert r.status_code == 204  # nothing there: no claim
    await post_messages(client, "again", 1)
    r = await client.post("/v2/queues/again/claims", json={"ttl": 60})
    old = r.headers["location"]
    assert (await client.delete("/v2/queues/again")).status_code == 204
    clock.advance(0.001)  # Redis tells queues of one name apart by the ms each was made (lib.lua live_claim)
    await post_messages(client, "again", 2)  # the queue made again under its name
    assert (await client.get(old)).status_code == 404
    assert (await client.patch(old, json={"ttl": 120})).status_code == 404


@pytest.mark.every_store
async def test_a_listing_goes_on_after_a_message_id_as_openstacksdk_pages(client: httpx.AsyncClient) -> None:
    """openstacksdk asks for the next page with `marker=<the last message's id>`, not the next link's."""
    ids = await post_messages(client, "paged", *range(7))
    params = {"echo": "true", "limit": 3}
    seen: list[str] = []
    marker = None
    while True:
        page = await client.get(
            "/v2/queues/paged/messages", params={**params, **({"marker": marker} if marker else {})}
        )
        assert page.status_code == 200, page.text
        got = [m["id"] for m in page.json()["messages"]]
        if not got:
            break
        seen += got
        marker = got[-1]
    assert seen == ids
    r = await client.get("/v2/queues/paged/messages", params={**params, "marker": ids[5]})
    assert [m["id"] for m in r.json()["messages"]] == ids[6:]
    await client.delete(f"/v2/queues/paged/messages/{ids[2]}")  # a deleted message: the listing ends there
    r = await client.get("/v2/queues/paged/messages", params={**params, "marker": ids[2]})
    assert (r.status_code, r.json()["messages"], r.json()["links"]) == (200, [], [])
    r = await client.get("/v2/queues/paged/messages", params={"marker": "not-a-marker"})
    assert r.status_code == 400
    assert "message id" in r.json()["description"]


# Zaqar's own get_checksum (zaqar/storage/utils.py, 23.0.1) of these bodies, computed by Zaqar.
CHECKSUMMED = {
    "MD5:ae877fcb955a3b56da531136bf249bd4": {"event": "créé", "n": [1.5, None, True], "k": {"z": 1, "a": 2}},
    "MD5:20cd815523e5806aec29a57282b0d49f": "text",
}


@pytest.mark.every_store
async def test_every_read_carries_zaqars_checksum_when_enabled(
    store: Store, clock: ManualClock, client: httpx.AsyncClient
) -> None:
    """With CHARON_ENABLE_CHECKSUM, get, list, by ids, claim, a claim's messages, pop and the redrive sample
    show each message's `checksum` as Zaqar writes it; without it, none does (Zaqar's default)."""
    bodies = list(CHECKSUMMED.values())
    ids = await post_messages(client, "sums", *bodies)
    assert "checksum" not in (await client.get(f"/v2/queues/sums/messages/{ids[0]}")).json()

    app = create_app(Settings(storage_uri="redis://unused", enable_checksum=True), store=store, clock=clock)
    async with api_client(app) as summed:
        expected = dict(zip(ids, CHECKSUMMED, strict=True))

        def sums(messages: list[dict[str, Any]]) -> dict[str, str]:
            return {m["id"]: m["checksum"] for m in messages}

        assert (await summed.get(f"/v2/queues/sums/messages/{ids[0]}")).json()["checksum"] == expected[ids[0]]
        listed = await summed.get("/v2/queues/sums/messages", params={"echo": "true"})
        assert sums(listed.json()["messages"]) == expected
        by_ids = await summed.get("/v2/queues/sums/messages", params={"ids": ",".join(ids)})
        assert sums(by_ids.json()["messages"]) == expected
        claimed = await summed.post("/v2/queues/sums/claims", json={"ttl": 60})
        assert sums(claimed.json()["messages"]) == expected
        held = await summed.get(claimed.headers["location"])
        assert sums(held.json()["messages"]) == expected

        await post_messages(summed, "sums", *bodies)
        popped = await summed.delete("/v2/queues/sums/messages", params={"pop": 2})
        assert sorted(m["checksum"] for m in popped.json()["messages"]) == sorted(CHECKSUMMED)

        await dead_letter_all(summed, "orders", *bodies)  # into orders.dlq
        preview = await summed.post("/v2/queues/orders.dlq/redrive", json={"dry_run": True})
        assert sorted(m["checksum"] for m in preview.json()["sample"]) == sorted(CHECKSUMMED)
    await state_of(app).long_polls.aclose()
