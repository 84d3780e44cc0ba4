"""GET /metrics on a live app (its lifespan running the sweeper), on every store: after real traffic (posts,
claims until dead-lettered, a reject, an expiry through the ManualClock and a sweep, a discard, a redrive)
every series docs/operations.md documents is there, nothing else named charon_ is, the per-queue values are
what the store's stats say, no project's series name another's queues; the cardinality cap; who may
scrape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import MetricsSettings, Settings
from core.clock import ManualClock
from core.models import QueueRef
from service.gauges import OTHER, REASONS, UNKNOWN_REASON
from storage.base import Store
from tests.conftest import CLIENT_ID
from tests.metrics_doc import documented, sample_names, samples

pytestmark = pytest.mark.every_store

ADMIN = {"X-Roles": "admin"}
ALPHA, BETA = "m-alpha", "m-beta"
MESSAGES = "/v2/queues/{queue_name}/messages"


def client(app: Any, project: str = ALPHA, **transport: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, **transport),
        base_url="http://charon",
        headers={"Client-ID": CLIENT_ID, "X-Project-ID": project},
    )


def settings(**metrics: Any) -> Settings:
    return Settings(
        storage_uri="redis://unused",
        sweep_interval=0.05,
        metrics=MetricsSettings(**{"cache_seconds": 0, **metrics}),
    )


@pytest.fixture
async def live(store: Store, clock: ManualClock) -> AsyncIterator[Any]:
    app = create_app(settings(), store=store, clock=clock)
    async with app.router.lifespan_context(app):
        yield app


async def scrape(c: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = await c.get("/metrics", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return {(s.name, frozenset(s.labels.items())): s.value for s in samples(r.text)}


def value(scraped: dict[Any, float], name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


def queues_of(scraped: dict[Any, float], name: str) -> dict[tuple[str, str], float]:
    out = {}
    for (sample, labels), v in scraped.items():
        if sample == name:
            d = dict(labels)
            out[d["project"], d["queue"]] = v
    return out


async def claim(c: httpx.AsyncClient, queue: str) -> tuple[str, list[str]]:
    r = await c.post(f"/v2/queues/{queue}/claims?limit=1", json={"ttl": 60, "grace": 60})
    if r.status_code == 204:
        return "", []
    assert r.status_code == 201, r.text
    return r.headers["location"].rsplit("/", 1)[1], [m["id"] for m in r.json()["messages"]]


async def post(c: httpx.AsyncClient, queue: str, *messages: dict[str, Any]) -> list[str]:
    r = await c.post(f"/v2/queues/{queue}/messages", json={"messages": list(messages)})
    assert r.status_code == 201, r.text
    return [h.rsplit("/", 1)[1] for h in r.json()["resources"]]


async def traffic(alpha: httpx.AsyncClient, beta: httpx.AsyncClient, store: Store, clock: ManualClock) -> int:
    """Every kind of move once; returns how many posts answered 201."""
    meta = {"_max_claim_count": 1, "_dead_letter_queue": "orders.dlq", "_dead_letter_on_expiry": True}
    assert (await alpha.put("/v2/queues/orders", json=meta)).status_code == 201
    assert (await alpha.put("/v2/queues/nodlq", json={"_max_claim_count": 1})).status_code == 201
    await post(alpha, "orders", {"body": "a"}, {"body": "b"}, {"body": "c"}, {"body": "d", "ttl": 60})
    cid, _ = await claim(alpha, "orders")  # a
    assert (await alpha.delete(f"/v2/queues/orders/claims/{cid}")).status_code == 204
    cid, [b] = await claim(alpha, "orders")  # moves a (max_claims), claims b
    r = await alpha.post(f"/v2/queues/orders/messages/{b}/dead_letter?claim_id={cid}", json={"reason": "no"})
    assert r.json() == {"outcome": "moved"}  # rejected
    await post(alpha, "nodlq", {"body": "x"})
    cid, _ = await claim(alpha, "nodlq")
    assert (await alpha.delete(f"/v2/queues/nodlq/claims/{cid}")).status_code == 204
    assert await claim(alpha, "nodlq") == ("", [])  # discarded
    clock.advance(61)  # d expires
    await store.sweep()
    await post(alpha, "orders", {"body": "later", "delay": 30})
    await claim(alpha, "orders")  # c
    r = await alpha.post("/v2/queues/orders.dlq/redrive", json={"destination": "replay", "limit": 1})
    assert r.status_code == 200, r.text
    await post(beta, "inbox", {"body": "y"})
    # a bucket of one read: the second is refused; and counted quotas, for their use
    quota = {"reads_per_second": 0.01, "queues": 4, "messages_per_queue": 10, "message_bytes": 30}
    assert (await beta.put(f"/v2/quotas/{BETA}", json=quota, headers=ADMIN)).status_code == 200
    assert (await beta.get("/v2/queues/inbox/stats")).status_code == 200
    assert (await beta.get("/v2/queues/inbox/stats")).status_code == 429
    clock.advance(5)  # the oldest messages are 66 s old
    return 4


async def test_a_scrape_after_real_traffic_reads_every_documented_series(
    live: Any, store: Store, clock: ManualClock
) -> None:
    began = time.time()
    async with client(live) as alpha, client(live, BETA) as beta:
        before = await scrape(alpha)
        posts = await traffic(alpha, beta, store, clock)
        assert (await alpha.get("/nope")).status_code == 404
        assert (await alpha.head("/v2/ping")).status_code == 204
        scraped = await scrape(alpha)

    # every documented series, and nothing else of ours
    names = {name for name, _ in scraped}
    expected = sample_names()
    assert expected - names == set()
    assert {n for n in names if n.startswith("charon_")} - sample_names() == set()
    for (name, labels), _ in scraped.items():
        series = next((s for s in documented() if name == s or name.startswith(f"{s}_")), None)
        if series is not None:
            assert {k for k, _ in labels} - {"le"} == set(documented()[series][1]), name

    # per queue: what the store's stats say
    ours = {
        QueueRef(ALPHA, "orders"),
        QueueRef(ALPHA, "orders.dlq"),
        QueueRef(ALPHA, "nodlq"),
        QueueRef(ALPHA, "replay"),
        QueueRef(BETA, "inbox"),
    }
    assert set(queues_of(scraped, "charon_queue_messages_ready")) == {(q.project, q.name) for q in ours}
    assert value(scraped, "charon_queues") == len(ours)
    assert value(scraped, "charon_metrics_queues_truncated") == 0
    assert value(scraped, "charon_metrics_store_ok") == 1
    for q in ours:
        stats = await store.stats(q)
        labels = {"project": q.project, "queue": q.name}
        assert value(scraped, "charon_queue_messages_ready", **labels) == stats.free - stats.delayed
        assert value(scraped, "charon_queue_messages_claimed", **labels) == stats.claimed
        assert value(scraped, "charon_queue_messages_delayed", **labels) == stats.delayed
        age = (clock.now_ms() - stats.oldest.created_ms) / 1000 if stats.oldest else 0
        assert value(scraped, "charon_queue_oldest_message_age_seconds", **labels) == age
        by_reason = {
            r: value(scraped, "charon_queue_dead_lettered_total", **labels, reason=r)
            for r in (*REASONS, UNKNOWN_REASON)
        }
        assert sum(by_reason.values()) == stats.dead_lettered
        for reason, n in stats.dead_lettered_by_reason.items():
            assert by_reason[reason] == n
        assert value(scraped, "charon_queue_dead_letters_received_total", **labels) == (
            stats.dead_letters_received
        )
        assert value(scraped, "charon_queue_discarded_total", **labels) == stats.discarded
        assert value(scraped, "charon_queue_redriven_total", **labels) == stats.redriven
    orders = {"project": ALPHA, "queue": "orders"}
    assert (
        value(scraped, "charon_queue_messages_ready", **orders),
        value(scraped, "charon_queue_messages_claimed", **orders),
        value(scraped, "charon_queue_messages_delayed", **orders),
        value(scraped, "charon_queue_oldest_message_age_seconds", **orders),
    ) == (0, 1, 1, 66)
    assert value(scraped, "charon_queue_dead_letters_received_total", project=ALPHA, queue="orders.dlq") == 3
    assert value(scraped, "charon_queue_discarded_total", project=ALPHA, queue="nodlq") == 1
    # the counted quotas: beta's in force and its use; alpha has none
    assert value(scraped, "charon_project_queues", project=ALPHA) == 4
    assert value(scraped, "charon_project_queues", project=BETA) == 1
    assert value(scraped, "charon_quota_limit", project=BETA, quota="queues") == 4
    assert value(scraped, "charon_quota_use_ratio", project=BETA, quota="queues") == 0.25
    assert value(scraped, "charon_quota_use_ratio", project=BETA, quota="messages_per_queue") == 0.1
    assert value(scraped, "charon_quota_use_ratio", project=BETA, quota="message_bytes") == 0.1  # '"y"'
    assert not [
        labels for (name, labels) in scraped if name == "charon_quota_limit" and ("project", ALPHA) in labels
    ]
    # no project's series name another's queues
    for name in ("charon_queue_messages_ready", "charon_queue_dead_letters_received_total"):
        by_project: dict[str, set[str]] = {}
        for project, queue in queues_of(scraped, name):
            by_project.setdefault(project, set()).add(queue)
        assert by_project == {ALPHA: {"orders", "orders.dlq", "nodlq", "replay"}, BETA: {"inbox"}}

    # HTTP: by route template, method and status
    def delta(name: str, **labels: str) -> float:
        return value(scraped, name, **labels) - value(before, name, **labels)

    assert delta("charon_http_requests_total", route=MESSAGES, method="POST", status="201") == posts
    assert delta("charon_http_request_duration_seconds_count", route=MESSAGES, method="POST") == posts
    assert delta("charon_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert delta("charon_http_requests_total", route="/v2/ping", method="HEAD", status="204") == 1
    assert delta("charon_http_requests_total", route="/metrics", method="GET", status="200") == 1
    # redrive, sweeper, notifier
    assert delta("charon_redrive_messages_moved_total") == 1
    assert delta("charon_redrive_messages_scanned_total") >= 1
    assert value(scraped, "charon_redrive_tasks_running") == 0
    assert value(scraped, "charon_sweeper_last_sweep_timestamp_seconds") >= began
    assert 0 <= value(scraped, "charon_sweeper_lag_seconds") < 30
    assert ("charon_notifications_total", frozenset({("kind", "notification"), ("result", "failed")})) in (
        scraped
    )
    assert ("charon_notification_latency_seconds_count", frozenset()) in scraped


async def test_queues_past_max_queues_add_up_in_other_and_past_max_read_are_left_out(
    store: Store, clock: ManualClock
) -> None:
    app = create_app(settings(max_queues=2, max_queues_read=4), store=store, clock=clock)
    async with client(app) as c:
        for name, n in (("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)):
            await post(c, name, *({"body": i} for i in range(n)))
            clock.advance(10)
        scraped = await scrape(c)
    assert queues_of(scraped, "charon_queue_messages_ready") == {
        (ALPHA, "a"): 1,
        (ALPHA, "b"): 2,
        (OTHER, OTHER): 3 + 4,  # e is past max_queues_read
    }
    assert value(scraped, "charon_queue_oldest_message_age_seconds", project=OTHER, queue=OTHER) == 30
    assert (
        value(scraped, "charon_queue_dead_lettered_total", project=OTHER, queue=OTHER, reason="expired") == 0
    )
    assert (value(scraped, "charon_queues"), value(scraped, "charon_metrics_queues_truncated")) == (4, 1)


async def test_the_store_read_once_for_scrapes_within_cache_seconds(store: Store, clock: ManualClock) -> None:
    app = create_app(settings(cache_seconds=300), store=store, clock=clock)
    async with client(app) as c:
        await post(c, "a", {"body": 1})
        first = await scrape(c)
        await post(c, "a", {"body": 2})
        assert queues_of(await scrape(c), "charon_queue_messages_ready") == {(ALPHA, "a"): 1}
        assert queues_of(first, "charon_queue_messages_ready") == {(ALPHA, "a"): 1}


# -- who may scrape ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "transport", "headers", "status"),
    [
        ({}, {}, {}, 403),  # the policy's metrics:get: admin only
        ({}, {}, {"X-Roles": "member"}, 403),
        ({}, {}, ADMIN, 200),
        ({"bearer_token": "s3cret"}, {}, {"Authorization": "Bearer s3cret"}, 200),
        ({"bearer_token": "s3cret"}, {}, {"Authorization": "Bearer wrong"}, 403),
        ({"bearer_token": "s3cret"}, {}, {"Authorization": "Bearer wrong", **ADMIN}, 403),
        ({"bearer_token": "s3cret"}, {}, ADMIN, 200),  # no bearer token: the rule
        # an empty token is no token (compose's ${X:-}): an empty Bearer is not let in by it
        ({"bearer_token": ""}, {}, {"Authorization": "Bearer "}, 403),
        ({"bearer_token": " "}, {}, {"Authorization": "Bearer"}, 403),
        ({"allow_loopback": True}, {}, {}, 200),  # httpx's ASGI client is 127.0.0.1
        ({"allow_loopback": True}, {"client": ("10.1.2.3", 4000)}, {}, 403),
        ({}, {"client": ("::1", 4000)}, {}, 403),
    ],
)
async def test_who_may_scrape(
    redis_store: Store,
    clock: ManualClock,
    metrics: dict[str, Any],
    transport: dict[str, Any],
    headers: dict[str, str],
    status: int,
) -> None:
    app = create_app(settings(**metrics), store=redis_store, clock=clock)
    async with client(app, **transport) as c:
        r = await c.get("/metrics", headers=headers)
    assert r.status_code == status, r.text
    if status == 403 and "Authorization" not in headers:
        assert "metrics:get" in r.json()["description"]


async def test_keystone_refuses_a_member_and_lets_an_admin_in(
    redis_store: Store, clock: ManualClock, keystone: Any
) -> None:
    from tests.api.test_auth import keystone_settings, token

    app = create_app(keystone_settings(keystone), store=redis_store, clock=clock)
    async with client(app, project=keystone.project_ids["alpha"]) as c:
        assert (await c.get("/metrics")).status_code == 401
        r = await c.get("/metrics", headers=token(keystone, "alice"))
        assert r.status_code == 403
        assert "metrics:get" in r.json()["description"]
        r = await c.get("/metrics", headers={**token(keystone, "alice"), "X-Roles": "admin"})
        assert r.status_code == 403  # roles come from the token
        r = await c.get("/metrics", headers=token(keystone, "admin"))
        assert r.status_code == 200
        assert "charon_http_requests_total" in r.text


async def test_openmetrics_when_asked(redis_store: Store, clock: ManualClock) -> None:
    app = create_app(settings(), store=redis_store, clock=clock)
    async with client(app) as c:
        r = await c.get("/metrics", headers={**ADMIN, "Accept": "application/openmetrics-text"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("# EOF\n")
        ignored = await c.get("/metrics?x=1", headers=ADMIN)  # takes no parameter: ignored, and named
        assert (ignored.status_code, ignored.headers["charon-ignored-parameters"]) == (200, "x")
