"""Dead-letter moves and the per-queue housekeeping that triggers them (ARCHITECTURE.md §3).

The move of one message is one update_one of its document: `q` becomes the DLQ and the provenance is set in
the same write, so a crash leaves the message in exactly one queue (promise 1). The update is conditioned on
what the caller read (a guard: the claim that held it, or that no live claim does), so of two processes that
race to move or claim a message exactly one wins. The DLQ's marker counter and the queues' counters are
updated in the same multi-document transaction as the move, so DLQ markers are handed out in commit order
(a reader paging by marker never skips a moved message) and the counters never disagree with the moves.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.mongo_client import AsyncMongoClient

from core.metadata import QueuePolicy
from core.models import DeadLetterReason, QueueRef
from storage.mongodb.queries import Doc, lapsed
from storage.mongodb.schema import Collections, exhausted, gc_at, policy_of

T = TypeVar("T")

HOUSEKEEP_BATCH = 100  # lapsed claims one housekeeping call ends, so each call's work is bounded


async def in_transaction(
    client: AsyncMongoClient[Doc], fn: Callable[[AsyncClientSession], Awaitable[T]]
) -> T:
    """Run `fn` in a transaction, retried by the driver on transient errors (write conflicts)."""
    async with client.start_session() as session:
        return await session.with_transaction(fn)


class _NothingMoved(Exception):
    """Aborts a move transaction whose messages were all taken by someone else meanwhile."""


async def take_markers(
    c: Collections, q: QueueRef, n: int, *, now: int, session: AsyncClientSession
) -> tuple[int, QueuePolicy]:
    """Reserve `n` consecutive markers of `q` in the caller's transaction, creating the queue lazily (or
    making a deleted one live again); returns the first marker and the queue's policy. The queue document
    stays write-locked until the transaction ends, so markers become visible in the order they are taken."""
    doc = await c.queues.find_one_and_update(
        {"p": q.project, "n": q.name},
        {"$inc": {"seq": n}, "$set": {"live": True}, "$setOnInsert": {"meta": "{}", "pol": {}, "cr": now}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
        projection={"seq": 1, "pol": 1},
        session=session,
    )
    assert doc is not None  # an upsert returning the document after the update always has one
    return doc["seq"] - n + 1, policy_of(doc)


Moves = Sequence[tuple[Doc, Mapping[str, Any]]]


async def dead_letter(
    client: AsyncMongoClient[Doc],
    c: Collections,
    src: QueueRef,
    policy: QueuePolicy,
    moves: Moves,
    *,
    now: int,
    reason: DeadLetterReason,
) -> tuple[int, int]:
    """Move each (message document, guard) of `src` to the policy's DLQ, or discard it when there is none.

    A message moves only if it still is in `src` and matches its guard. Returns (moved, discarded). The moved
    message carries no claim, is claimable at once, gets a new marker in the DLQ and the DLQ's ttl if set.
    """
    if not moves:
        return 0, 0
    try:
        if policy.dead_letter_queue is None:
            return 0, await in_transaction(client, lambda s: _discard(c, src, moves, s))
        target = QueueRef(src.project, policy.dead_letter_queue)
        return await in_transaction(client, lambda s: _move(c, src, target, policy, moves, now, reason, s)), 0
    except _NothingMoved:
        return 0, 0


async def _discard(c: Collections, src: QueueRef, moves: Moves, s: AsyncClientSession) -> int:
    n = 0
    for doc, guard in moves:
        r = await c.messages.delete_one(
            {"_id": doc["_id"], "p": src.project, "q": src.name, **guard}, session=s
        )
        n += r.deleted_count
    if n == 0:
        raise _NothingMoved
    await c.queues.update_one({"p": src.project, "n": src.name}, {"$inc": {"n_disc": n}}, session=s)
    return n


async def _move(
    c: Collections,
    src: QueueRef,
    target: QueueRef,
    policy: QueuePolicy,
    moves: Moves,
    now: int,
    reason: DeadLetterReason,
    s: AsyncClientSession,
) -> int:
    marker, _ = await take_markers(c, target, len(moves), now=now, session=s)
    n = 0
    for i, (doc, guard) in enumerate(moves):
        e = now + policy.dead_letter_ttl * 1000 if policy.dead_letter_ttl else doc["e"]
        provenance = {
            "src": src.name,
            "rsn": reason,
            "cc": doc["cc"],
            "at": now,
            "first": (doc.get("dl") or {}).get("first", doc["cr"]),
        }
        r = await c.messages.update_one(
            {"_id": doc["_id"], "p": src.project, "q": src.name, **guard},
            {
                "$set": {
                    "q": target.name,
                    "k": marker + i,
                    "cc": 0,
                    "av": now,
                    "vis": now,
                    "cr": now,
                    "t": math.ceil((e - now) / 1000),
                    "e": e,
                    "gc": gc_at(e),
                    "dl": provenance,
                },
                "$unset": {"c": "", "ce": ""},
            },
            session=s,
        )
        n += r.modified_count
    if n == 0:
        raise _NothingMoved
    await c.queues.update_one({"p": src.project, "n": src.name}, {"$inc": {"n_dl": n}}, session=s)
    await c.queues.update_one({"p": target.project, "n": target.name}, {"$inc": {"n_rcv": n}}, session=s)
    return n


async def housekeep(
    client: AsyncMongoClient[Doc], c: Collections, q: QueueRef, now: int, policy: QueuePolicy | None = None
) -> int:
    """End the lapsed claims of `q` (up to HOUSEKEEP_BATCH): a message that used up its claims moves to the
    DLQ now (promise 7), the others become claimable again. Returns the number of lapsed claims seen."""
    ended = await lapsed(c, now, q, HOUSEKEEP_BATCH).to_list()
    if not ended:
        return 0
    if policy is None:
        policy = policy_of(await c.queues.find_one({"p": q.project, "n": q.name}, {"pol": 1}))
    # Guard on the very claim that lapsed: a message claimed again meanwhile is left to its new claim.
    moves = [(d, {"c": d["c"], "ce": d["ce"]}) for d in ended if exhausted(policy, d["cc"])]
    await dead_letter(client, c, q, policy, moves, now=now, reason="max_claims")
    back = [d["_id"] for d in ended if not exhausted(policy, d["cc"])]
    if back:
        await c.messages.update_many(
            {"_id": {"$in": back}, "ce": {"$lte": now}}, {"$unset": {"c": "", "ce": ""}}
        )
    return len(ended)
