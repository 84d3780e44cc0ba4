"""Long-poll wake-ups when the store's side fails: a killed Redis subscriber connection (pub/sub delivers at
most once, so every waiter claims again and listens afresh), and a Redis that stops answering."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from core.clock import ManualClock
from core.errors import StorageUnavailable
from service.waiting import LongPolls
from storage.redis.store import RedisStore
from tests.contract.helpers import Q, post
from tests.servers import RedisServer

ANSWER_S = 10.0


@pytest.fixture
async def store(redis_url: str, clock: ManualClock) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock, timeout=1.0)
    yield store
    await store.aclose()


async def test_a_killed_subscriber_connection_loses_no_wake_up(
    store: RedisStore, redis_url: str, clock: ManualClock
) -> None:
    polls = LongPolls(lambda: store, clock=clock, max_waiting=10)
    waiting = asyncio.create_task(polls.claim(Q, ttl=60, grace=60, limit=1, wait=20))
    await asyncio.wait_for(clock.sleepers(1), ANSWER_S)
    admin = aioredis.Redis.from_url(redis_url)
    killed = await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    assert killed >= 1
    # the waiter was woken to claim again, found nothing, subscribed afresh and sleeps again
    await asyncio.sleep(0.3)
    await asyncio.wait_for(clock.sleepers(1), ANSWER_S)
    assert not waiting.done()
    await post(store, Q, "after the failure")
    result = await asyncio.wait_for(waiting, ANSWER_S)
    assert result.claim is not None
    assert [m.body for m in result.claim.messages] == ["after the failure"]
    await admin.aclose()
    await polls.aclose()


async def test_a_long_poll_on_a_redis_that_stopped_answering_is_503_not_a_hang(clock: ManualClock) -> None:
    server = RedisServer().start()
    store = RedisStore.from_url(server.url, namespace="t", clock=clock, timeout=0.5)
    polls = LongPolls(lambda: store, clock=clock, max_waiting=10)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await admin.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        with pytest.raises(StorageUnavailable):
            await asyncio.wait_for(polls.claim(Q, ttl=60, grace=60, limit=1, wait=20), ANSWER_S)
        assert polls.waiting == 0
    finally:
        await admin.aclose()
        await polls.aclose()
        await store.aclose()
        server.stop()
