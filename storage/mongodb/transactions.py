"""The driver's multi-document transactions, all run through `in_transaction`: metadata writes, a post with
an Idempotency-Key or owing notifications, a dead-letter move into a queue with subscriptions, and the
subscription writes. Every other write is a single-document one (counters.py says why)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pymongo
from pymongo.asynchronous.client_session import AsyncClientSession

from storage.mongodb.schema import Collections

R = TypeVar("R")

TRANSACTION_TIMEOUT_S = 10


async def in_transaction(c: Collections, fn: Callable[[AsyncClientSession], Coroutine[Any, Any, R]]) -> R:
    """Run `fn` in a transaction, retried by the driver on transient errors (write conflicts), for at most
    TRANSACTION_TIMEOUT_S: a transaction left open by a killed process holds its documents until the server
    aborts it (transactionLifetimeLimitSeconds, 60 s), and a request should fail (503) before. `fn` may run
    more than once: it must start from nothing each time."""
    with pymongo.timeout(TRANSACTION_TIMEOUT_S):
        async with c.messages.database.client.start_session() as session:
            return await session.with_transaction(fn)
