"""Zaqar's topics (/v2/topics) on every store: a topic's life (create, metadata, list, stats, purge, delete),
its messages, and its subscribers, each told of every message posted (fan-out), a confirmation included.
A topic is apart from the project's queues: a queue of the same name is another thing."""

from __future__ import annotations

import uuid

import httpx
import pytest
from fastapi import FastAPI

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from service.delivery import NotificationSettings
from storage.base import Store
from tests.api.test_notifications import KEY, confirming, notify, subscribe
from tests.conftest import PROJECT, api_client
from tests.receivers import LOOPBACK_NETWORKS, HttpReceiver

pytestmark = pytest.mark.every_store

T = "/v2/topics/news"


async def post(client: httpx.AsyncClient, path: str, *bodies: object) -> list[str]:
    r = await client.post(f"{path}/messages", json={"messages": [{"body": b} for b in bodies]})
    assert r.status_code == 201, r.text
    return list(r.json()["resources"])


async def test_a_topic_lives_apart_from_the_queues(client: httpx.AsyncClient) -> None:
    r = await client.put(T, json={"team": "red", "_default_message_ttl": 120})
    assert (r.status_code, r.headers["location"]) == (201, T)
    assert (await client.put(T, json={})).status_code == 204
    got = (await client.get(T)).json()
    assert (got["team"], got["_default_message_ttl"]) == ("red", 120)
    patch = [{"op": "replace", "path": "/metadata/team", "value": "blue"}]
    r = await client.patch(
        T, json=patch, headers={"Content-Type": "application/openstack-messaging-v2.0-json-patch"}
    )
    assert r.status_code == 200, r.text
    await client.put("/v2/topics/alerts", json={})

    listed = (await client.get("/v2/topics", params={"detailed": "true", "limit": 1})).json()
    assert listed["topics"] == [{"name": "alerts", "href": "/v2/topics/alerts", "metadata": {}}]
    assert listed["links"][0]["href"].startswith("/v2/topics?")
    assert (await client.get("/v2/topics", params={"team": "blue"})).json()["topics"][0]["name"] == "news"
    assert (await client.get("/v2/queues")).json()["queues"] == []

    resources = await post(client, T, {"n": 1}, {"n": 2})
    assert all(r.startswith(f"{T}/messages/") for r in resources)
    await post(client, "/v2/queues/news", "a queue's")  # the same name, another thing
    stats = (await client.get(f"{T}/stats")).json()["messages"]
    assert (stats["total"], stats["free"]) == (2, 2)
    assert (stats["oldest"]["href"], stats["newest"]["href"]) == (resources[0], resources[1])
    assert (await client.get("/v2/queues/news/stats")).json()["messages"]["total"] == 1

    one = (await client.get(resources[0])).json()
    assert (one["body"], one["ttl"], one["href"]) == ({"n": 1}, 120, resources[0])
    page = (await client.get(f"{T}/messages", params={"echo": "true"})).json()
    assert [m["href"] for m in page["messages"]] == resources
    assert (await client.delete(resources[0])).status_code == 204
    assert (await client.get(resources[0])).status_code == 404
    assert (await client.post(f"{T}/purge", json={"resource_types": ["messages"]})).status_code == 204
    assert (await client.get(f"{T}/stats")).json()["messages"]["total"] == 0
    assert (await client.delete(T)).status_code == 204
    assert [t["name"] for t in (await client.get("/v2/topics")).json()["topics"]] == ["alerts"]
    assert (await client.get("/v2/queues/news/stats")).json()["messages"]["total"] == 1


async def test_a_topic_refuses_what_acts_on_claims(client: httpx.AsyncClient) -> None:
    r = await client.put(T, json={"_max_claim_count": 3, "_dead_letter_queue": "dlq"})
    assert r.status_code == 400
    assert "_dead_letter_queue, _max_claim_count" in r.json()["description"]
    assert (await client.post(f"{T}/claims", json={})).status_code == 404  # no claims on a topic
    r = await client.put("/v2/topics/bad name", json={})
    assert r.status_code == 400
    assert "Topic names" in r.json()["description"]


@pytest.fixture
def settings() -> Settings:
    notifications = NotificationSettings(
        allowed_networks=tuple(LOOPBACK_NETWORKS),  # type: ignore[arg-type]  # pydantic parses them
        webhook_timeout=1,
    )
    return Settings(storage_uri="redis://unused", notifications=notifications, signed_url_key=KEY)


@pytest.fixture
async def app(store: Store, clock: ManualClock, settings: Settings) -> FastAPI:
    return create_app(settings, store=store, clock=clock)


async def test_every_subscriber_of_a_topic_is_told_of_every_message(
    app: FastAPI, client: httpx.AsyncClient, webhook_receiver: HttpReceiver
) -> None:
    try:
        first = await subscribe(client, webhook_receiver.url_for("/one"), queue=T)
        await subscribe(client, webhook_receiver.url_for("/two"), queue=T)
        subs = (await client.get(f"{T}/subscriptions")).json()["subscriptions"]
        assert first in {s["id"] for s in subs}
        assert len(subs) == 2
        assert (await client.get("/v2/queues/news/subscriptions")).json()["subscriptions"] == []
        resources = await post(client, T, {"n": 1}, {"n": 2})
        assert await notify(app) == 4
        told = await webhook_receiver.arrived(4)
        by_path: dict[str, list[str]] = {}
        for request in told:
            doc = request.json()
            by_path.setdefault(request.target, []).append(doc["href"])
            assert doc["queue_name"] == "news"
        assert {p: sorted(h) for p, h in by_path.items()} == {
            "/one": sorted(resources),
            "/two": sorted(resources),
        }
        await post(client, "/v2/queues/news", "not for the topic's subscribers")
        assert await notify(app) == 0
    finally:
        await state_of(app).notifier.aclose()
        await state_of(app).deliverer.aclose()
        await state_of(app).long_polls.aclose()


async def test_a_topic_subscriber_confirms_through_its_signed_url(
    store: Store, clock: ManualClock, webhook_receiver: HttpReceiver
) -> None:
    app = create_app(confirming(), store=store, clock=clock)
    try:
        async with api_client(app) as client:
            sid = await subscribe(client, webhook_receiver.url_for("/confirm-me"), queue=T)
            assert await notify(app) == 1
            [request] = await webhook_receiver.arrived(1)
            doc = request.json()
            assert doc["URL-Paths"] == f"{T}/subscriptions/{sid}/confirm"
            assert doc["X-Project-ID"] == PROJECT
            signed = {k: doc[k] for k in ("URL-Signature", "URL-Methods", "URL-Paths", "URL-Expires")}
            headers = {**signed, "X-Project-ID": doc["X-Project-ID"], "Client-ID": str(uuid.uuid4())}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://charon"
            ) as anon:
                r = await anon.put(doc["URL-Paths"], json=doc["SubscribeBody"], headers=headers)
                assert r.status_code == 204, r.text
            assert (await client.get(f"{T}/subscriptions/{sid}")).json()["confirmed"] is True
    finally:
        await state_of(app).notifier.aclose()
        await state_of(app).deliverer.aclose()
        await state_of(app).long_polls.aclose()
