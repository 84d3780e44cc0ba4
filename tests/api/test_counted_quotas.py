"""The counted quotas (`queues`, `messages_per_queue`; docs/quotas.md) through the HTTP API: an admin sets
them, a project reads them, and past one a request answers 403 in Zaqar's error shape naming the quota and
what is held, having done nothing; the service's defaults (CHARON_QUOTAS__*) apply to every project; a bad
value is a 400 naming the field."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.redis.store import RedisStore
from tests.conftest import PROJECT, api_client

ADMIN = {"X-Roles": "admin"}


def messages(n: int) -> dict[str, Any]:
    return {"messages": [{"body": i} for i in range(n)]}


@pytest.mark.every_store
async def test_past_a_counted_quota_a_request_gets_403_and_nothing_is_done(client: httpx.AsyncClient) -> None:
    r = await client.put(f"/v2/quotas/{PROJECT}", json={"queues": 1, "messages_per_queue": 2}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["quotas"] | {"reads_per_second": 0} == {
        "reads_per_second": 0,
        "writes_per_second": None,
        "queues": 1,
        "messages_per_queue": 2,
        "message_bytes": None,
        "subscriptions": None,
    }
    assert (await client.post("/v2/queues/q/messages", json=messages(2))).status_code == 201
    r = await client.post("/v2/queues/q/messages", json=messages(1))
    assert r.status_code == 403
    assert r.json() == {
        "title": "Quota exceeded",
        "description": "Queue 'q' holds 2 messages and this would add 1; its quota 'messages_per_queue' is "
        "2. Remove some first, or ask an administrator to raise the quota (PUT /v2/quotas/{project}).",
        "quota": "messages_per_queue",
    }
    stats = (await client.get("/v2/queues/q/stats")).json()["messages"]
    assert stats["total"] == 2
    patch = [{"op": "add", "path": "/metadata/_max_claim_count", "value": 3}]
    refusals = [
        await client.put("/v2/queues/another"),
        await client.post("/v2/queues/another/messages", json=messages(1)),
        await client.post(
            "/v2/queues/another/subscriptions", json={"subscriber": "https://hooks.example.com/"}
        ),
    ]
    for r in refusals:
        assert r.status_code == 403, r.text
        assert r.json()["quota"] == "queues"
        assert "This project holds 1 queues" in r.json()["description"]
    r = await client.patch(
        "/v2/queues/another",
        json=patch,
        headers={"Content-Type": "application/openstack-messaging-v2.0-json-patch"},
    )
    assert r.status_code in (403, 404), r.text  # a PATCH of a queue that does not exist may be a 404
    shown = (await client.get(f"/v2/quotas/{PROJECT}")).json()
    assert (shown["use"], shown["quotas"]["queues"]) == ({"queues": 1}, 1)  # bytes: only under their quota
    listed = (await client.get("/v2/queues")).json()["queues"]
    assert [q["name"] for q in listed] == ["q"]
    r = await client.put(f"/v2/quotas/{PROJECT}", json={"messages_per_queue": None}, headers=ADMIN)
    assert r.json()["overrides"] == {"queues": 1}
    assert (await client.post("/v2/queues/q/messages", json=messages(3))).status_code == 201
    await client.put(f"/v2/quotas/{PROJECT}", json={"subscriptions": 1}, headers=ADMIN)
    hook = {"subscriber": "https://hooks.example.com/a"}
    assert (await client.post("/v2/queues/q/subscriptions", json=hook)).status_code == 201
    r = await client.post("/v2/queues/q/subscriptions", json={"subscriber": "https://hooks.example.com/b"})
    assert (r.status_code, r.json()["quota"]) == (403, "subscriptions")
    assert "This project holds 1 subscriptions" in r.json()["description"]
    await client.put(f"/v2/quotas/{PROJECT}", json={"message_bytes": 6}, headers=ADMIN)
    r = await client.post("/v2/queues/q/messages", json=messages(2))  # bodies 0 and 1: two bytes more
    assert (r.status_code, r.json()["quota"]) == (403, "message_bytes")
    assert r.json()["description"].startswith(
        "This project holds 5 bytes and this would add 2; its quota 'message_bytes' is 6."
    )
    assert (await client.post("/v2/queues/q/messages", json=messages(1))).status_code == 201
    assert (await client.get(f"/v2/quotas/{PROJECT}")).json()["use"]["message_bytes"] == 6


async def test_the_services_defaults_apply_to_every_project(redis_url: str, clock: ManualClock) -> None:
    settings = Settings(storage_uri=redis_url, quotas={"queues": 2, "messages_per_queue": 1})
    store = RedisStore.from_url(
        redis_url, namespace=f"t{uuid.uuid4().hex[:8]}", clock=clock, quotas=settings.quotas.counted()
    )
    try:
        async with api_client(create_app(settings, store=store, clock=clock)) as c:
            shown = (await c.get(f"/v2/quotas/{PROJECT}")).json()
            assert shown["defaults"]["queues"] == 2
            assert shown["quotas"]["messages_per_queue"] == 1
            assert (await c.post("/v2/queues/a/messages", json=messages(1))).status_code == 201
            assert (await c.post("/v2/queues/a/messages", json=messages(1))).status_code == 403
            assert (await c.put("/v2/queues/b")).status_code == 201
            assert (await c.put("/v2/queues/c")).status_code == 403
            other = {"X-Project-ID": "someone-else"}
            assert (await c.put("/v2/queues/c", headers=other)).status_code == 201
            r = await c.put("/v2/quotas/someone-else", json={"queues": 5}, headers=ADMIN)
            assert r.json()["quotas"]["queues"] == 5
            assert (await c.put("/v2/queues/d", headers=other)).status_code == 201
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"queues": 2.5}, "queues"),
        ({"queues": -1}, "greater than or equal to 0"),
        ({"messages_per_queue": 2_000_000_000}, "less than or equal to 1000000000"),
        ({"queues": "5"}, "queues"),
        ({"messages_per_queue": True}, "messages_per_queue"),
        ({"message_bytes": 10**15 + 1}, "less than or equal to 1000000000000000"),
        ({"message_bytes": 1.5}, "message_bytes"),
    ],
)
async def test_bad_counted_quotas_are_refused_by_name(
    client: httpx.AsyncClient, body: Any, fragment: str
) -> None:
    r = await client.put(f"/v2/quotas/{PROJECT}", json=body, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"title", "description"}
    assert fragment in r.json()["description"]


async def test_an_admins_counted_quotas_apply_to_the_projects_topics_counted_apart(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.put(f"/v2/quotas/{PROJECT}", json={"queues": 1}, headers=ADMIN)).status_code == 200
    assert (await client.put("/v2/queues/q")).status_code == 201
    assert (await client.put("/v2/topics/t1")).status_code == 201  # topics are counted apart from queues
    r = await client.put("/v2/topics/t2")
    assert (r.status_code, r.json()["quota"]) == (403, "queues")
    assert (await client.delete(f"/v2/quotas/{PROJECT}", headers=ADMIN)).status_code == 204
    assert (await client.put("/v2/topics/t2")).status_code == 201
