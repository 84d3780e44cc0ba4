"""Dead-letter queues through the HTTP API: the walk-through of docs/dead-letter-queues.md, provenance on
every read, the validation of the reserved keys (DLQ cycles included), and the sweeper running inside the
app."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from api.render import iso
from api.schemas import MessageOut
from app.main import create_app
from app.settings import Settings
from core import signatures
from core.clock import ManualClock
from storage.base import Store
from tests.api.test_flows import JSON_PATCH, post_messages
from tests.conftest import api_client


async def claim_and_release(client: httpx.AsyncClient, queue: str) -> list[dict[str, Any]]:
    r = await client.post(f"/v2/queues/{queue}/claims", json={"ttl": 60, "grace": 60})
    if r.status_code == 204:
        return []
    assert r.status_code == 201, r.text
    assert (await client.delete(r.headers["location"])).status_code == 204
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


@pytest.mark.every_store
async def test_walk_through_three_claims_then_the_dlq(client: httpx.AsyncClient, clock: ManualClock) -> None:
    meta = {"_max_claim_count": 3, "_dead_letter_queue": "orders.dlq", "_dead_letter_queue_messages_ttl": 600}
    assert (await client.put("/v2/queues/orders", json=meta)).status_code == 201
    shown = (await client.get("/v2/queues/orders")).json()
    assert {k: shown[k] for k in meta} == meta
    posted_at = clock.now_ms()
    [mid] = await post_messages(client, "orders", {"order": 42})
    for count in (1, 2, 3):
        [m] = await claim_and_release(client, "orders")
        assert (m["id"], m["claim_count"], "dead_letter" in m) == (mid, count, False)
        clock.advance(1)
    assert await claim_and_release(client, "orders") == []  # moved when the third claim was released

    r = await client.get(f"/v2/queues/orders.dlq/messages/{mid}?provenance=true")
    assert r.status_code == 200, r.text
    got = r.json()
    MessageOut.model_validate(got)
    assert (got["body"], got["ttl"], got["claim_count"]) == ({"order": 42}, 600, 0)
    assert got["dead_letter"] == {
        "source_queue": "orders",
        "reason": "max_claims",
        "claim_count": 3,
        "dead_lettered_at": iso(posted_at + 2000),  # when the third claim was released
        "first_enqueued_at": iso(posted_at),
        "redrive_count": 0,
        "consumer": client.headers["Client-ID"],  # whose claim used up the last delivery
        # no error text in the body or a rejection: the cause is its source queue and reason
        "signature": signatures.signature(None, "orders", "max_claims"),
    }
    # the signature shown is the one a redrive by signature selects (the console's "redrive this cause")
    preview = await client.post(
        "/v2/queues/orders.dlq/redrive",
        json={"dry_run": True, "filter": {"signature": got["dead_letter"]["signature"]}},
    )
    assert (preview.json()["matched"], preview.json()["would_move"]) == (1, 1)
    source = (await client.get("/v2/queues/orders/stats")).json()["messages"]
    dlq = (await client.get("/v2/queues/orders.dlq/stats")).json()["messages"]
    assert (source["total"], source["dead_lettered"], source["discarded"]) == (0, 1, 0)
    assert (dlq["total"], dlq["free"], dlq["dead_letters_received"]) == (1, 1, 1)

    plain = (await client.get(f"/v2/queues/orders.dlq/messages/{mid}")).json()
    assert "dead_letter" not in plain  # by default: what python-zaqarclient reads
    claim = await client.post("/v2/queues/orders.dlq/claims?provenance=true", json={"ttl": 60})
    assert claim.status_code == 201  # claimable in the DLQ at once
    assert claim.json()["messages"][0]["dead_letter"]["source_queue"] == "orders"
    held = await client.get(claim.headers["location"], params={"provenance": "true"})
    assert held.json()["messages"][0]["dead_letter"]["claim_count"] == 3
    listing = await client.get(
        "/v2/queues/orders.dlq/messages",
        params={"include_claimed": "true", "echo": "true", "provenance": "true"},
    )
    assert listing.status_code == 200  # Zaqar 23.0.1 answers 503 here
    [listed] = listing.json()["messages"]
    assert listed["id"] == mid
    assert "claim_id=" in listed["href"]
    assert listed["dead_letter"]["reason"] == "max_claims"


@pytest.mark.every_store
async def test_without_a_dlq_the_exhausted_message_is_discarded(client: httpx.AsyncClient) -> None:
    await client.put("/v2/queues/jobs", json={"_max_claim_count": 1})
    await post_messages(client, "jobs", 1, 2)
    assert len(await claim_and_release(client, "jobs")) == 2
    assert await claim_and_release(client, "jobs") == []
    stats = (await client.get("/v2/queues/jobs/stats")).json()["messages"]
    assert (stats["total"], stats["discarded"], stats["dead_lettered"]) == (0, 2, 0)


@pytest.mark.every_store
async def test_provenance_can_be_hidden_per_request(client: httpx.AsyncClient) -> None:
    await client.put("/v2/queues/a", json={"_max_claim_count": 1, "_dead_letter_queue": "a.dlq"})
    [mid] = await post_messages(client, "a", "x")
    await claim_and_release(client, "a")
    plain = await client.get(f"/v2/queues/a.dlq/messages/{mid}", params={"provenance": "false"})
    assert set(plain.json()) == {"id", "href", "ttl", "age", "body", "claim_count"}
    listing = await client.get("/v2/queues/a.dlq/messages", params={"provenance": "false", "echo": "true"})
    assert "dead_letter" not in listing.json()["messages"][0]
    bad = await client.get(f"/v2/queues/a.dlq/messages/{mid}", params={"provenance": "sometimes"})
    assert bad.status_code == 400
    assert "provenance" in bad.json()["description"]


@pytest.mark.every_store
async def test_provenance_off_by_setting_can_be_asked_for(store: Store, clock: ManualClock) -> None:
    app = create_app(Settings(storage_uri="redis://unused", provenance=False), store=store, clock=clock)
    async with api_client(app) as client:
        await client.put("/v2/queues/a", json={"_max_claim_count": 1, "_dead_letter_queue": "a.dlq"})
        [mid] = await post_messages(client, "a", "x")
        await claim_and_release(client, "a")
        claim = await client.post("/v2/queues/a.dlq/claims")
        assert "dead_letter" not in claim.json()["messages"][0]  # what python-zaqarclient can read
        asked = await client.get(f"/v2/queues/a.dlq/messages/{mid}", params={"provenance": "true"})
        assert asked.json()["dead_letter"]["source_queue"] == "a"


async def set_dlq_by_patch(client: httpx.AsyncClient, queue: str, dlq: str) -> httpx.Response:
    op = [{"op": "add", "path": "/metadata/_dead_letter_queue", "value": dlq}]
    return await client.patch(f"/v2/queues/{queue}", json=op, headers={"Content-Type": JSON_PATCH})


@pytest.mark.parametrize("by", ["put", "patch"])
async def test_a_dlq_cycle_is_refused_with_the_cycle_named(client: httpx.AsyncClient, by: str) -> None:
    await client.put("/v2/queues/b", json={"_dead_letter_queue": "c"})
    await client.put("/v2/queues/c", json={"_dead_letter_queue": "a"})
    if by == "put":
        r = await client.put("/v2/queues/a", json={"_dead_letter_queue": "b"})
    else:
        r = await set_dlq_by_patch(client, "a", "b")
    assert r.status_code == 400, r.text
    assert "a -> b -> c -> a" in r.json()["description"]
    assert "_dead_letter_queue" not in (await client.get("/v2/queues/a")).json()
    # breaking the chain elsewhere makes the same write legal
    ops = [{"op": "remove", "path": "/metadata/_dead_letter_queue"}]
    await client.patch("/v2/queues/c", json=ops, headers={"Content-Type": JSON_PATCH})
    assert (await set_dlq_by_patch(client, "a", "b")).status_code == 200


@pytest.mark.every_store
async def test_dlq_chains_and_cycles_are_per_project(client: httpx.AsyncClient) -> None:
    other = {"X-Project-ID": "project-b"}
    assert (
        await client.put("/v2/queues/b", json={"_dead_letter_queue": "a"}, headers=other)
    ).status_code == 201
    assert (await client.put("/v2/queues/a", json={"_dead_letter_queue": "b"})).status_code == 201


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"_max_claim_count": 2.5}, "_max_claim_count must be an integer"),
        ({"_max_claim_count": -1}, "_max_claim_count must be between 1"),
        ({"_dead_letter_queue": 7}, "_dead_letter_queue must be 1 to 64"),
        ({"_dead_letter_queue": "x" * 65}, "_dead_letter_queue must be 1 to 64"),
        ({"_dead_letter_queue_messages_ttl": 1_209_601}, "between 60 and 1209600"),
        ({"_dead_letter_queue_messages_ttl": "600"}, "_dead_letter_queue_messages_ttl must be an integer"),
    ],
)
async def test_bad_dead_letter_keys_by_patch(
    client: httpx.AsyncClient, value: dict[str, Any], fragment: str
) -> None:
    [(key, v)] = value.items()
    op = [{"op": "add", "path": f"/metadata/{key}", "value": v}]
    r = await client.patch("/v2/queues/q", json=op, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["description"]
    assert key not in (await client.get("/v2/queues/q")).json()


@pytest.mark.every_store
async def test_the_apps_sweeper_moves_messages_whose_last_claim_expired(
    store: Store, clock: ManualClock
) -> None:
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0.02), store=store, clock=clock)
    async with app.router.lifespan_context(app), api_client(app) as client:
        await client.put("/v2/queues/s", json={"_max_claim_count": 1, "_dead_letter_queue": "s.dlq"})
        [mid] = await post_messages(client, "s", "x")
        assert (await client.post("/v2/queues/s/claims", json={"ttl": 60, "grace": 0})).status_code == 201
        clock.advance(61)
        for _ in range(250):  # up to 5 s; the sweeper runs every 20 ms
            if (await client.get(f"/v2/queues/s.dlq/messages/{mid}")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("the sweeper did not move the message")


@pytest.mark.every_store
async def test_concurrent_patches_lose_no_update(client: httpx.AsyncClient) -> None:
    async def add(i: int) -> int:
        op = [{"op": "add", "path": f"/metadata/k{i}", "value": i}]
        r = await client.patch("/v2/queues/busy", json=op, headers={"Content-Type": JSON_PATCH})
        return r.status_code

    assert await asyncio.gather(*(add(i) for i in range(6))) == [200] * 6
    meta = (await client.get("/v2/queues/busy")).json()
    assert {k: meta[k] for k in meta if k.startswith("k")} == {f"k{i}": i for i in range(6)}


@pytest.mark.every_store
async def test_concurrent_writes_cannot_close_a_dlq_cycle(client: httpx.AsyncClient) -> None:
    async def point(queue: str, dlq: str) -> int:
        return (await client.put(f"/v2/queues/{queue}", json={"_dead_letter_queue": dlq})).status_code

    for i in range(10):
        a, b = f"a{i}", f"b{i}"
        statuses = sorted(await asyncio.gather(point(a, b), point(b, a)))
        assert statuses == [201, 400]  # one wins; the other sees it and is refused
