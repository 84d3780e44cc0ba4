"""The pool catalogue's rules, on each management store: Redis, Redis Cluster and MongoDB."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from core.errors import Conflict, OutcomeUnknown
from core.models import QueueRef
from storage.pooling.catalogue import Catalogue, Pool
from storage.pooling.mongo_catalogue import MongoCatalogue
from storage.pooling.redis_catalogue import RedisCatalogue
from tests.servers import RedisServer

P = "project-a"


@pytest.fixture(params=["redis", "cluster", "mongo"])
async def catalogue(request: pytest.FixtureRequest) -> AsyncIterator[Catalogue]:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    cat: Catalogue
    if request.param == "mongo":
        cat = MongoCatalogue.from_url(request.getfixturevalue("mongodb_uri"), namespace=namespace)
    else:
        url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
        cat = RedisCatalogue.from_url(url, namespace=namespace)
    await cat.put_pool(Pool("a", "redis://a", 1))
    await cat.put_pool(Pool("b", "redis://b", 1))
    yield cat
    await cat.aclose()


async def test_a_placement_is_made_once_and_then_kept(catalogue: Catalogue) -> None:
    q = QueueRef(P, "orders")
    assert await catalogue.lookup(q) is None
    assert await catalogue.place(q, "a") == "a"
    assert await catalogue.place(q, "b") == "a"  # the first placement wins
    assert await catalogue.lookup(q) == "a"
    assert await catalogue.lookup(QueueRef("project-b", "orders")) is None  # projects never mix


async def test_concurrent_placements_agree_on_one_pool(catalogue: Catalogue) -> None:
    q = QueueRef(P, "raced")
    answers = await asyncio.gather(*(catalogue.place(q, "a" if i % 2 else "b") for i in range(10)))
    assert len(set(answers)) == 1
    assert await catalogue.lookup(q) == answers[0]


async def test_a_pool_that_does_not_exist_places_nothing(catalogue: Catalogue) -> None:
    q = QueueRef(P, "nowhere")
    assert await catalogue.place(q, "missing") is None
    assert await catalogue.lookup(q) is None


async def test_a_pool_holding_queues_cannot_be_deleted(catalogue: Catalogue) -> None:
    await catalogue.place(QueueRef(P, "orders"), "a")
    with pytest.raises(Conflict, match=r"'a' still holds 1 queue\(s\) \(project-a/orders\)"):
        await catalogue.delete_pool("a")
    assert await catalogue.get_pool("a") is not None
    assert await catalogue.place(QueueRef(P, "more"), "a") == "a"  # still a pool
    await catalogue.delete_pool("b")  # holds nothing
    assert [p.name for p in await catalogue.list_pools()] == ["a"]
    assert await catalogue.place(QueueRef(P, "late"), "b") is None


async def test_deleting_a_pool_while_queues_are_placed_leaves_no_queue_in_a_missing_pool(
    catalogue: Catalogue,
) -> None:
    async def delete() -> bool:
        try:
            await catalogue.delete_pool("a")
        except Conflict:
            return False
        return True

    results = await asyncio.gather(delete(), *(catalogue.place(QueueRef(P, f"q{i}"), "a") for i in range(20)))
    pool_gone = await catalogue.get_pool("a") is None
    placed = [await catalogue.lookup(QueueRef(P, f"q{i}")) for i in range(20)]
    assert results[0] is pool_gone
    if pool_gone:
        assert placed == [None] * 20
    else:
        assert set(placed) <= {"a", None}
        assert [r for r in results[1:] if r is not None] == [p for p in placed if p is not None]


async def test_a_referenced_dlq_keeps_its_placement_until_its_referrers_are_stale(
    catalogue: Catalogue,
) -> None:
    dlq = QueueRef(P, "orders.dlq")
    assert await catalogue.place(dlq, "a", referrer="orders") == "a"
    assert await catalogue.place(dlq, "b", referrer="other") == "a"  # not recorded: another pool
    refs = await catalogue.referrers(dlq)
    assert set(refs) == {"orders"}
    assert not await catalogue.unplace(dlq, stale={})
    assert await catalogue.lookup(dlq) == "a"
    # A referrer written again after it was found stale is not dropped.
    await catalogue.place(dlq, "a", referrer="orders")
    assert not await catalogue.unplace(dlq, stale=refs)
    assert await catalogue.unplace(dlq, stale=await catalogue.referrers(dlq))
    assert await catalogue.lookup(dlq) is None
    await catalogue.delete_pool("a")


async def test_referrer_names_with_dots_round_trip(catalogue: Catalogue) -> None:
    dlq = QueueRef(P, "dlq")
    await catalogue.place(dlq, "a", referrer="billing.v2.orders")
    assert set(await catalogue.referrers(dlq)) == {"billing.v2.orders"}


async def test_a_placement_that_times_out_once_sent_is_an_unknown_outcome() -> None:
    """The catalogue's scripts run like the driver's (ScriptRunner): a place sent to a server that answers
    too late says the outcome is unknown (503, "may have been made"), never "nothing changed": a script
    sent may run after the answer (not here: the paused server drops it with the dropped connection)."""
    server = RedisServer().start()  # its own: CLIENT PAUSE stops every client of the server
    cat = RedisCatalogue.from_url(server.url, namespace="t", timeout=0.3)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await cat.put_pool(Pool("a", "redis://a", 1))
        await admin.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
        with pytest.raises(OutcomeUnknown):
            await cat.place(QueueRef(P, "orders"), "a")
    finally:
        await cat.aclose()
        await admin.aclose()
        server.stop()
