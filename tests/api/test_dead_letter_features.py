"""Issue 7 through the HTTP API, end to end: redelivery backoff, release with a delay, reject, expiry to the
DLQ, DLQ-eligibility, redrive (dry run, inline, as a task, cancelled) and auto-named DLQs, with every new key
and parameter's bad input answered 400 naming its bound."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from api.schemas import MessageOut, RedrivePreviewOut, RedriveTaskOut
from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core import signatures
from core.clock import ManualClock
from service.redrive import RedriveRunner
from storage.base import Store
from tests.api.test_flows import JSON_PATCH, post_messages
from tests.conftest import api_client

SPENT = {"_max_claim_count": 1, "_dead_letter_queue": "orders.dlq"}


async def claim(client: httpx.AsyncClient, queue: str, limit: int = 10) -> tuple[str, list[dict[str, Any]]]:
    """(claim id, messages), or ("", []) on 204."""
    r = await client.post(f"/v2/queues/{queue}/claims?limit={limit}", json={"ttl": 60, "grace": 60})
    if r.status_code == 204:
        return "", []
    assert r.status_code == 201, r.text
    return r.headers["location"].rsplit("/", 1)[1], r.json()["messages"]


async def dead_letter_all(client: httpx.AsyncClient, queue: str, *bodies: object) -> list[str]:
    assert (await client.put(f"/v2/queues/{queue}", json=SPENT)).status_code in (201, 204)
    ids = await post_messages(client, queue, *bodies)
    cid, _ = await claim(client, queue, limit=20)
    assert (await client.delete(f"/v2/queues/{queue}/claims/{cid}")).status_code == 204
    return ids


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("_redelivery_delay", -1, "between 0 and 43200"),
        ("_redelivery_delay", 50_000, "between 0 and 43200"),
        ("_redelivery_delay", "5", "between 0 and 43200"),
        ("_redelivery_delay_multiplier", 0.5, "between 1 and 100"),
        ("_max_redelivery_delay", 43_201, "between 0 and 43200"),
        ("_redelivery_jitter", 1.5, "between 0 and 1"),
        ("_redelivery_delay_levels", [], "1 to 32"),
        ("_redelivery_delay_levels", "1s", "1 to 32"),
        ("_redelivery_delay_levels", ["5x"], '"1s", "500ms"'),
        ("_redelivery_delay_levels", ["13h"], "between 0 and 43200 seconds"),
        ("_dead_letter_on_expiry", "yes", "true or false"),
        ("_max_message_ttl", 10, "between 60 and 1209600"),
    ],
)
async def test_bad_new_keys_are_400_with_the_bound(
    client: httpx.AsyncClient, key: str, value: Any, fragment: str
) -> None:
    r = await client.put("/v2/queues/q", json={key: value})
    assert r.status_code == 400, r.text
    assert key in r.json()["description"]
    assert fragment in r.json()["description"]
    op = [{"op": "add", "path": f"/metadata/{key}", "value": value}]
    r = await client.patch("/v2/queues/q", json=op, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 400, r.text


async def test_default_ttl_above_max_ttl_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.put("/v2/queues/q", json={"_max_message_ttl": 120, "_default_message_ttl": 600})
    assert r.status_code == 400
    assert "must not exceed _max_message_ttl (120)" in r.json()["description"]


@pytest.mark.every_store
async def test_backoff_and_release_with_delay_over_http(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    meta = {"_redelivery_delay": 5, "_redelivery_delay_multiplier": 2, "_max_redelivery_delay": 15}
    assert (await client.put("/v2/queues/jobs", json=meta)).status_code == 201
    assert (await client.get("/v2/queues/jobs")).json()["_redelivery_delay"] == 5
    [mid] = await post_messages(client, "jobs", "job")
    cid, _ = await claim(client, "jobs")
    assert (await client.delete(f"/v2/queues/jobs/claims/{cid}")).status_code == 204
    clock.advance(4.999)
    assert (await claim(client, "jobs"))[1] == []
    clock.advance(0.001)
    cid, [m] = await claim(client, "jobs")
    assert (m["id"], m["claim_count"]) == (mid, 2)
    for bad in ("-1", "43201", "soon"):
        r = await client.delete(f"/v2/queues/jobs/claims/{cid}?delay={bad}")
        assert r.status_code == 400, r.text
    assert (await client.delete(f"/v2/queues/jobs/claims/{cid}?delay=30")).status_code == 204
    clock.advance(29.999)
    assert (await claim(client, "jobs"))[1] == []
    clock.advance(0.001)
    assert [m["id"] for m in (await claim(client, "jobs"))[1]] == [mid]


@pytest.mark.every_store
async def test_release_one_message_over_http(client: httpx.AsyncClient, clock: ManualClock) -> None:
    first, second = await post_messages(client, "jobs", "a", "b")
    cid, _ = await claim(client, "jobs")
    base = f"/v2/queues/jobs/messages/{first}/release"
    assert (await client.post(base)).status_code == 400  # claim_id is required
    assert (await client.post(f"{base}?claim_id={'f' * 32}")).status_code == 403
    assert (
        await client.post(f"/v2/queues/jobs/messages/{'0' * 32}/release?claim_id={cid}")
    ).status_code == 404
    assert (await client.post(f"{base}?claim_id={cid}&delay=99999")).status_code == 400
    assert (await client.post(f"{base}?claim_id={cid}&delay=10")).status_code == 204
    held = (await client.get(f"/v2/queues/jobs/claims/{cid}")).json()["messages"]
    assert [m["id"] for m in held] == [second]
    clock.advance(10)
    assert [m["id"] for m in (await claim(client, "jobs"))[1]] == [first]


@pytest.mark.every_store
async def test_reject_over_http(client: httpx.AsyncClient, clock: ManualClock) -> None:
    [mid] = await post_messages(client, "orders", {"sku": None})
    cid, _ = await claim(client, "orders")
    url = f"/v2/queues/orders/messages/{mid}/dead_letter?claim_id={cid}"
    r = await client.post(url, json={"reason": "bad schema"})
    assert r.status_code == 409
    assert "no dead-letter queue" in r.json()["description"]
    op = [{"op": "add", "path": "/metadata/_dead_letter_queue", "value": "orders.dlq"}]
    assert (
        await client.patch("/v2/queues/orders", json=op, headers={"Content-Type": JSON_PATCH})
    ).status_code == 200
    for body, status in (({"reason": "x" * 257}, 400), ({"why": "?"}, 400), ({"reason": 5}, 400)):
        assert (await client.post(url, json=body)).status_code == status
    wrong = f"/v2/queues/orders/messages/{mid}/dead_letter?claim_id={'a' * 32}"
    assert (await client.post(wrong)).status_code == 403
    r = await client.post(url, json={"reason": "bad schema", "description": "sku is null"})
    assert r.status_code == 200, r.text
    assert r.json() == {"outcome": "moved"}
    got = (await client.get(f"/v2/queues/orders.dlq/messages/{mid}?provenance=true")).json()
    MessageOut.model_validate(got)
    assert got["dead_letter"]["reason"] == "rejected"
    assert got["dead_letter"]["rejection"] == {"reason": "bad schema", "description": "sku is null"}
    assert (await client.post(url)).status_code == 404  # gone from the queue


@pytest.mark.every_store
async def test_expiry_to_dlq_and_eligibility_over_http(
    client: httpx.AsyncClient, store: Store, clock: ManualClock
) -> None:
    meta = {"_dead_letter_queue": "orders.dlq", "_dead_letter_on_expiry": True, "_max_message_ttl": 60}
    assert (await client.put("/v2/queues/orders", json=meta)).status_code == 201
    r = await client.post(
        "/v2/queues/orders/messages",
        json={"messages": [{"body": "keep", "ttl": 600}, {"body": "drop", "dead_letter_eligible": False}]},
    )
    assert r.status_code == 201
    keep, drop = (h.rsplit("/", 1)[1] for h in r.json()["resources"])
    assert "dead_letter_eligible" not in (await client.get(f"/v2/queues/orders/messages/{drop}")).json()
    shown = (await client.get(f"/v2/queues/orders/messages/{drop}?provenance=true")).json()
    assert (shown["ttl"], shown["dead_letter_eligible"]) == (60, False)
    bad = {"messages": [{"body": 1, "dead_letter_eligible": "no"}]}
    assert (await client.post("/v2/queues/orders/messages", json=bad)).status_code == 400
    clock.advance(60)
    await store.sweep()
    got = (await client.get(f"/v2/queues/orders.dlq/messages/{keep}?provenance=true")).json()
    assert got["dead_letter"]["reason"] == "expired"
    assert (await client.get(f"/v2/queues/orders.dlq/messages/{drop}")).status_code == 404
    stats = (await client.get("/v2/queues/orders/stats")).json()["messages"]
    assert (stats["dead_lettered"], stats["discarded"], stats["total"]) == (1, 1, 0)


@pytest.mark.every_store
async def test_redrive_dry_run_and_inline(client: httpx.AsyncClient, clock: ManualClock) -> None:
    ids = await dead_letter_all(client, "orders", "o1", "o2")
    await dead_letter_all(client, "billing", "b1")
    r = await client.post(
        "/v2/queues/orders.dlq/redrive", json={"dry_run": True, "filter": {"source_queue": "orders"}}
    )
    assert r.status_code == 200, r.text
    preview = RedrivePreviewOut.model_validate(r.json())
    assert (preview.matched, preview.would_move, preview.by_source_queue) == (2, 2, {"orders": 2})
    # their cause: no error text, so their source queue and reason; what filter.signature selects
    assert preview.by_signature == {signatures.signature(None, "orders", "max_claims"): 2}
    assert [m.id for m in preview.sample] == ids
    assert preview.complete
    assert (await client.get("/v2/queues/orders.dlq/stats")).json()["messages"]["total"] == 3  # moved nothing
    r = await client.post(
        "/v2/queues/orders.dlq/redrive", json={"filter": {"source_queue": "orders"}, "limit": 10}
    )
    assert r.status_code == 200, r.text
    task = RedriveTaskOut.model_validate(r.json())
    assert (task.status, task.progress.moved) == ("succeeded", 2)
    back = (await client.get("/v2/queues/orders/messages?echo=true&provenance=true")).json()["messages"]
    assert [(m["id"], m["claim_count"], m["dead_letter"]["redrive_count"]) for m in back] == [
        (ids[0], 0, 1),
        (ids[1], 0, 1),
    ]
    assert (await client.get(task.href)).json()["status"] == "succeeded"


@pytest.mark.every_store
async def test_redrive_of_listed_ids_dry_run_then_exactly_those(client: httpx.AsyncClient) -> None:
    ids = await dead_letter_all(client, "orders", "o1", "o2", "o3")
    unknown = "f" * 32
    body = {"filter": {"message_ids": [ids[2], unknown, ids[0], ids[2]]}}
    r = await client.post("/v2/queues/orders.dlq/redrive", json={**body, "dry_run": True})
    assert r.status_code == 200, r.text
    preview = RedrivePreviewOut.model_validate(r.json())
    assert (preview.scanned, preview.matched, preview.would_move, preview.complete) == (3, 2, 2, True)
    assert sorted(m.id for m in preview.sample) == sorted([ids[0], ids[2]])
    r = await client.post("/v2/queues/orders.dlq/redrive", json={**body, "limit": 100})
    assert r.status_code == 200, r.text
    task = RedriveTaskOut.model_validate(r.json())
    assert (task.status, task.progress.moved) == ("succeeded", 2)
    assert task.request["filter"] == {"message_ids": [ids[2], unknown, ids[0]]}  # a repeated id counts once
    left = (await client.get("/v2/queues/orders.dlq/messages?echo=true")).json()["messages"]
    assert [m["id"] for m in left] == [ids[1]]


@pytest.mark.every_store
async def test_redrive_by_signature_dry_run_then_exactly_that_cause(client: httpx.AsyncClient) -> None:
    bodies = [{"error": f"customer cus_{i}Zq81PzaBx{i} not found", "n": i} for i in range(3)]
    ids = await dead_letter_all(client, "orders", bodies[0], {"error": "timeout"}, *bodies[1:], "plain")
    wanted = {ids[0], ids[2], ids[3]}
    # the whole DLQ by cause, and each dead letter's cause where it is read: the same signatures
    everything = (await client.post("/v2/queues/orders.dlq/redrive", json={"dry_run": True})).json()
    customer, timeout = signatures.signature("customer <*> not found"), signatures.signature("timeout")
    plain = signatures.signature(None, "orders", "max_claims")
    assert everything["by_signature"] == {customer: 3, timeout: 1, plain: 1}
    listed = (await client.get("/v2/queues/orders.dlq/messages?echo=true&provenance=true")).json()["messages"]
    assert [m["dead_letter"]["signature"] for m in listed] == [customer, timeout, customer, customer, plain]
    body = {"filter": {"signature": customer}}
    r = await client.post("/v2/queues/orders.dlq/redrive", json={**body, "dry_run": True})
    assert r.status_code == 200, r.text
    preview = RedrivePreviewOut.model_validate(r.json())
    assert (preview.scanned, preview.matched, preview.would_move) == (5, 3, 3)
    assert {m.id for m in preview.sample} == wanted
    r = await client.post("/v2/queues/orders.dlq/redrive", json={**body, "limit": 100})
    assert r.status_code == 200, r.text
    task = RedriveTaskOut.model_validate(r.json())
    assert (task.status, task.progress.moved, task.request["filter"]) == ("succeeded", 3, body["filter"])
    left = (await client.get("/v2/queues/orders.dlq/messages?echo=true")).json()["messages"]
    assert {m["id"] for m in left} == set(ids) - wanted


@pytest.mark.every_store
async def test_redrive_as_a_task_then_cancel(store: Store, clock: ManualClock, settings: Settings) -> None:
    app = create_app(settings, store=store, clock=clock)
    async with api_client(app) as client:
        await _redrive_as_a_task_then_cancel(client, state_of(app).redrive, clock)


async def _redrive_as_a_task_then_cancel(
    client: httpx.AsyncClient, runner: RedriveRunner, clock: ManualClock
) -> None:
    await dead_letter_all(client, "orders", *range(20))
    r = await client.post("/v2/queues/orders.dlq/redrive", json={"destination": "replay"})
    assert r.status_code == 202, r.text
    href = r.headers["location"]
    await runner.finished(href.rsplit("/", 1)[1])
    task = (await client.get(href)).json()
    assert (task["status"], task["progress"]["moved"]) == ("succeeded", 20)
    assert task["request"] == {"destination": "replay"}
    assert (await client.get("/v2/queues/replay/stats")).json()["messages"]["total"] == 20
    await dead_letter_all(client, "orders", *range(5))
    clock.advance(1)
    r = await client.post("/v2/queues/orders.dlq/redrive", json={"max_per_second": 1})
    assert r.status_code == 202
    task_id = r.headers["location"].rsplit("/", 1)[1]
    # the runner moves a batch of 1 and waits a second on the clock (no lifespan here: no adoption loop)
    await asyncio.wait_for(clock.sleepers(), timeout=30)
    cancelled = (await client.delete(r.headers["location"])).json()
    assert cancelled["status"] == "cancelled"
    clock.advance(1)  # the runner wakes for its next batch, and finds the task cancelled
    await runner.finished(task_id)
    after = (await client.get(r.headers["location"])).json()
    assert after["status"] == "cancelled"
    assert after["progress"]["moved"] == 1  # its first batch, and nothing after the cancel
    listed = (await client.get("/v2/queues/orders.dlq/redrive")).json()["tasks"]
    assert [(t["href"], t["status"]) for t in listed] == [
        (r.headers["location"], "cancelled"),
        (href, "succeeded"),
    ]
    assert (await client.get("/v2/queues/orders.dlq/redrive?limit=21")).status_code == 400
    assert (await client.get("/v2/queues/orders.dlq/stats")).json()["messages"]["total"] == 4


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"destination": "orders.dlq"}, "another queue"),
        ({"destination": "bad name"}, "destination"),
        ({"filter": {"reason": "tired"}}, "filter.reason"),
        (
            {
                "filter": {
                    "dead_lettered_after": "2026-01-02T00:00:00Z",
                    "dead_lettered_before": "2026-01-01T00:00:00Z",
                }
            },
            "earlier",
        ),
        ({"filter": {"dead_lettered_after": "yesterday"}}, "dead_lettered_after"),
        ({"limit": 0}, "limit"),
        ({"max_per_second": 10_001}, "max_per_second"),
        ({"dry_run": "yes"}, "dry_run"),
        ({"everything": True}, "everything"),
        ({"filter": {"message_ids": []}}, "filter.message_ids"),
        ({"filter": {"message_ids": ["0" * 32] * 1001}}, "1000"),
        ({"filter": {"message_ids": ["not-an-id"]}}, "filter.message_ids.0"),
        ({"filter": {"message_ids": "0" * 32}}, "filter.message_ids"),
        ({"filter": {"signature": "0123456789ABCDEF"}}, "filter.signature"),  # as insights writes it
        ({"filter": {"signature": "0" * 17}}, "filter.signature"),
        ({"filter": {"signature": 1234}}, "filter.signature"),
    ],
)
async def test_bad_redrive_requests(client: httpx.AsyncClient, body: dict[str, Any], fragment: str) -> None:
    r = await client.post("/v2/queues/orders.dlq/redrive", json=body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["description"]


async def test_unknown_redrive_task_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get(f"/v2/queues/orders.dlq/redrive/{'1' * 32}")).status_code == 404
    assert (await client.delete("/v2/queues/orders.dlq/redrive/nope")).status_code == 404


async def test_auto_named_dlqs_over_http(defaulted_store: Store, clock: ManualClock) -> None:
    settings = Settings(
        storage_uri="redis://unused", default_max_claim_count=2, dead_letter_queue_template="{queue}.DLQ"
    )
    async with api_client(create_app(settings, store=defaulted_store, clock=clock)) as client:
        shown = (await client.get("/v2/queues/orders")).json()
        assert (shown["_max_claim_count"], shown["_dead_letter_queue"]) == (2, "orders.DLQ")
        assert "_dead_letter_queue" not in (await client.get("/v2/queues/orders.DLQ")).json()
        [mid] = await post_messages(client, "orders", "x")
        for _ in range(2):
            cid, _ = await claim(client, "orders")
            await client.delete(f"/v2/queues/orders/claims/{cid}")
        got = (await client.get(f"/v2/queues/orders.DLQ/messages/{mid}?provenance=true")).json()
        assert got["dead_letter"]["source_queue"] == "orders"
        r = await client.put("/v2/queues/orders.DLQ", json={"_dead_letter_queue": "orders"})
        assert r.status_code == 400  # orders -> orders.DLQ (by the template) -> orders would be a cycle
        assert "cycle" in r.json()["description"]


@pytest.mark.parametrize(
    "template", ["{queue}", "DLQ", "{queue}/dlq", "{queue}.{queue}", "x" * 33 + "{queue}"]
)
def test_bad_templates_stop_the_service_at_start(template: str) -> None:
    with pytest.raises(ValidationError, match="template"):
        Settings(storage_uri="redis://unused", dead_letter_queue_template=template)


@pytest.mark.every_store
async def test_the_consumer_that_failed_is_in_the_provenance(client: httpx.AsyncClient) -> None:
    worker_a, worker_b = "3381af92-2b9e-11e3-b191-71861300734c", "4481af92-2b9e-11e3-b191-71861300734d"
    assert (await client.put("/v2/queues/orders", json=SPENT)).status_code in (201, 204)
    spent, rejected = await post_messages(client, "orders", "spent", "rejected")
    r = await client.post(
        "/v2/queues/orders/claims?limit=2", json={"ttl": 60}, headers={"Client-ID": worker_a}
    )
    cid = r.headers["location"].rsplit("/", 1)[1]
    url = f"/v2/queues/orders/messages/{rejected}/dead_letter?claim_id={cid}"
    assert (await client.post(url, headers={"Client-ID": worker_b})).status_code == 200
    assert (await client.delete(f"/v2/queues/orders/claims/{cid}")).status_code == 204
    got = (await client.get(f"/v2/queues/orders.dlq/messages?ids={spent},{rejected}&provenance=true")).json()
    by_id = {m["id"]: m["dead_letter"] for m in got["messages"]}
    assert (by_id[spent]["reason"], by_id[spent]["consumer"]) == ("max_claims", worker_a)
    assert (by_id[rejected]["reason"], by_id[rejected]["consumer"]) == ("rejected", worker_b)
