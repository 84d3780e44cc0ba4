"""Long-poll wake-ups from Redis pub/sub: one subscriber connection per store, one channel per queue that
somebody in this process waits on (keys.py QueueKeys.wake_channel).

lib.lua publishes on a queue's channel, after a script made n of its messages claimable, only while the
queue's `waiting` flag is set (claim.lua sets it when a long poll found nothing). `listen` returns once Redis
has confirmed the subscription, so a message made claimable after it returns is told. Pub/sub delivers at
most once: when the subscriber connection fails, every subscription is forgotten and `on_wake(None, 0)` tells
the caller, whose waiters claim again and `listen` afresh. `listen` is idempotent: the caller (service/
waiting.py) counts its waiters per queue and calls `unlisten` when the last one leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.errors import StorageUnavailable
from core.models import QueueRef
from storage.base import WakeCallback
from storage.redis.keys import QueueKeys
from storage.redis.runner import closed_transport

log = logging.getLogger("charon.redis")

READ_WAIT_S = 1.0  # the reader's longest wait for a message before it looks whether it is closed


class RedisWakeups:
    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        namespace: str,
        on_wake: WakeCallback,
        timeout: float,
    ) -> None:
        self._client, self._namespace, self._on_wake, self._timeout = client, namespace, on_wake, timeout
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._queues: dict[str, QueueRef] = {}  # channel -> queue
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._closed = False

    def _channel(self, q: QueueRef) -> str:
        return QueueKeys.of(self._namespace, q).wake_channel

    async def listen(self, q: QueueRef) -> None:
        channel = self._channel(q)
        try:
            if channel not in self._confirmed:
                self._queues[channel] = q
                self._confirmed[channel] = asyncio.get_running_loop().create_future()
                if self._pubsub is None:
                    self._pubsub = self._client.pubsub()
                await self._pubsub.subscribe(channel)
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.create_task(self._read(self._pubsub), name="charon-wakeups")
            await asyncio.wait_for(asyncio.shield(self._confirmed[channel]), self._timeout)
        except (RedisError, OSError, TimeoutError, RuntimeError) as exc:
            await self.unlisten(q)
            if not _lost(exc):  # (TimeoutError is an OSError)
                raise
            raise StorageUnavailable(f"Redis did not take the long poll's subscription ({exc}).") from exc
        except BaseException:
            await self.unlisten(q)
            raise

    async def unlisten(self, q: QueueRef) -> None:
        channel = self._channel(q)
        if self._confirmed.pop(channel, None) is None:
            return
        self._queues.pop(channel, None)
        if self._pubsub is not None:
            with _unless_lost():
                await self._pubsub.unsubscribe(channel)

    async def _read(self, pubsub: Any) -> None:
        try:
            while not self._closed:  # until aclose() or a failure: a listen can come at any moment
                message = await pubsub.get_message(timeout=READ_WAIT_S)
                if message is None:
                    continue
                channel = message["channel"]
                if message["type"] == "subscribe":
                    waiting = self._confirmed.get(channel)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(None)
                elif message["type"] == "message" and channel in self._queues:
                    self._on_wake(self._queues[channel], int(message["data"]))
        except (RedisError, OSError, RuntimeError) as exc:
            if not _lost(exc):
                raise
            log.warning("long-poll wake-ups: the subscriber connection failed (%s); waking every waiter", exc)
            self._reset(pubsub)

    def _reset(self, pubsub: Any) -> None:
        """After a failed connection: forget every subscription (the next listen makes it again), fail the
        listens still waiting for a confirmation, and wake everyone to claim again."""
        if self._pubsub is pubsub:
            self._pubsub = None
        for waiting in self._confirmed.values():
            if not waiting.done():
                waiting.set_exception(StorageUnavailable("Redis dropped the long poll's subscription."))
                waiting.exception()  # retrieved: a listen that gave up on it leaves no "never retrieved" log
        self._confirmed.clear()
        self._queues.clear()
        self._on_wake(None, 0)
        asyncio.get_running_loop().create_task(_close(pubsub))

    async def aclose(self) -> None:
        self._closed = True
        self._confirmed.clear()
        if self._reader is not None:
            # ended before its connection is closed: a read cut short reconnects (redis-py's retry), and a
            # connection made after the close would be left open. The flag ends it within READ_WAIT_S even
            # if a read swallows the cancellation.
            self._reader.cancel()
            await asyncio.wait([self._reader])
        if self._pubsub is not None:
            await _close(self._pubsub)
            self._pubsub = None


async def _close(pubsub: Any) -> None:
    with _unless_lost():
        await pubsub.aclose()


def _lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection to Redis failed (uvloop's closed transport included)."""
    return isinstance(exc, RedisError | OSError) or closed_transport(exc)


@contextlib.contextmanager
def _unless_lost() -> Iterator[None]:
    """Best effort: a failed connection is ignored, anything else raised."""
    try:
        yield
    except (RedisError, OSError, RuntimeError) as exc:
        if not _lost(exc):
            raise
