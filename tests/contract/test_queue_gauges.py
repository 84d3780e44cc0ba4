"""Store.queue_gauges (GET /metrics' per-queue series) on every store: every queue of every project, in
(project, name) order, each with the stats `stats` answers for it, and at most `limit` of them."""

from __future__ import annotations

import uuid

import pytest

from core.clock import ManualClock
from core.models import QueueRef, Rejection
from storage.base import Store
from tests.contract.helpers import claim_ids, post, set_meta

pytestmark = pytest.mark.every_store


async def test_every_queue_of_every_project_with_what_stats_says(store: Store, clock: ManualClock) -> None:
    tag = uuid.uuid4().hex[:8]  # pooled stores share their Redis pool's projects registry with other tests
    alpha, beta = f"g-{tag}-alpha", f"g-{tag}-beta"
    orders, dlq = QueueRef(alpha, "orders"), QueueRef(alpha, "orders.dlq")
    await set_meta(
        store, orders, _dead_letter_queue=dlq.name, _max_claim_count=1, _dead_letter_on_expiry=True
    )
    await post(store, orders, *range(5))
    await post(store, orders, "later", delay=30)
    await post(store, orders, "short", ttl=60)
    cid, [first, *_] = await claim_ids(store, orders, limit=2)
    assert await store.dead_letter_message(orders, first, claim_id=cid, rejection=Rejection("no"))
    await store.release_claim(orders, cid, delay=0)
    await claim_ids(store, orders, limit=1)  # claims one, moves the released one (max claims)
    clock.advance(61)  # "short" expires; the claim too
    await store.sweep()
    await post(store, QueueRef(beta, "b"), "x")
    await post(store, QueueRef(beta, "a"), "y")

    gauges, more = await store.queue_gauges(limit=1_000_000)
    ours = [(q, s) for q, s in gauges if q.project in (alpha, beta)]
    expected = [orders, dlq, QueueRef(beta, "a"), QueueRef(beta, "b")]
    assert [q for q, _ in ours] == expected
    assert not more
    for q, stats in ours:
        assert stats == await store.stats(q), q
    received = dict(ours)[dlq]
    assert received.total == received.dead_letters_received >= 3  # rejected, max claims, expired
    assert gauges == sorted(gauges, key=lambda g: (g[0].project, g[0].name))


async def test_at_most_limit_queues_and_whether_more_exist(store: Store, clock: ManualClock) -> None:
    project = f"g-{uuid.uuid4().hex[:8]}"
    for name in ("c", "a", "b"):
        await post(store, QueueRef(project, name), name)
    everything, _ = await store.queue_gauges(limit=1_000_000)
    ours = [q for q, _ in everything if q.project == project]
    assert [q.name for q in ours] == ["a", "b", "c"]
    position = [q for q, _ in everything].index(ours[1]) + 1  # up to and including "b"
    gauges, more = await store.queue_gauges(limit=position)
    assert [q for q, _ in gauges] == [q for q, _ in everything[:position]]
    assert more
    gauges, more = await store.queue_gauges(limit=len(everything))
    assert len(gauges) == len(everything)
    assert not more
    assert await store.queue_gauges(limit=0) == ([], True)
