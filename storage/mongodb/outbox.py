"""The outbox on MongoDB: the deliveries owed to subscriptions, written in the same transaction as what owes
them (storage.base.SubscriptionStore), and leased to notifiers.

A post to a queue, or a dead-letter move into one, first reads the queue's document (it does anyway: for the
policy, or to create the queue): when its `subs` counts no subscription, nothing here runs and the write is
what it always was (insert_in_order; one guarded update_one a move). Otherwise the queue's live confirmed
subscriptions are read, and when there are some the messages are written (inserted, or moved) together with
one delivery per message and subscription in one transaction, so a crash leaves the messages with their
deliveries or neither. A transaction must not meet another writer's marker (it would abort on the duplicate
key): its markers are reserved beforehand (counters.reserve_markers), as for a post with an Idempotency-Key.

The subscriptions read are those live just before the transaction: one deleted meanwhile leaves deliveries
that the lease drops (its subscription is gone); one confirmed meanwhile is owed from the next write on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError, DuplicateKeyError

from core.errors import MessageUnreadable
from core.models import Delivery, DeliveryKind, QueueRef
from core.sealing import UNREADABLE_PUT_OFF_MS
from storage.mongodb.counters import MARKER_ATTEMPTS, contended, marker_taken, reserve_markers
from storage.mongodb.queries import Doc, notified
from storage.mongodb.schema import (
    DELIVERED,
    DELIVERY,
    DUE_INDEX,
    QUEUE,
    SUBSCRIPTION,
    Collections,
    delivery_of,
    subscription_of,
)
from storage.mongodb.schema import MESSAGE as M
from storage.mongodb.transactions import in_transaction

D, S = DELIVERY, SUBSCRIPTION

log = logging.getLogger("charon.mongodb")


def owed(q: QueueRef, subscription_id: str, kind: DeliveryKind, now: int, message: Doc | None = None) -> Doc:
    """A delivery document: `kind` owed to the subscription now, `message` a message document (its DELIVERED
    fields are kept)."""
    doc: Doc = {
        D.ID: uuid.uuid4().hex,
        D.PROJECT: q.project,
        D.QUEUE: q.name,
        D.SUBSCRIPTION: subscription_id,
        D.KIND: kind,
        D.ATTEMPTS: 0,
        D.CREATED: now,
        D.DUE: now,
    }
    if message is not None:
        doc[D.MESSAGE] = {f: message[f] for f in DELIVERED if f in message}
    return doc


async def subscribers(c: Collections, q: QueueRef, queue_doc: Doc, now: int) -> list[str]:
    """The ids of the live confirmed subscriptions of `q` (whose document is `queue_doc`): nothing read when
    the queue has no subscription."""
    if not queue_doc.get(QUEUE.SUBSCRIPTIONS):
        return []
    return [d[S.ID] for d in await notified(c, q, now).to_list()]


async def owe(
    c: Collections,
    q: QueueRef,
    subscription_ids: Sequence[str],
    messages: Sequence[Doc],
    *,
    now: int,
    session: AsyncClientSession,
) -> None:
    """One notification per message per subscription, in the caller's transaction."""
    docs = [owed(q, s, "notification", now, m) for m in messages for s in subscription_ids]
    if docs:
        await c.deliveries.insert_many(docs, session=session)


async def insert_notifying(
    c: Collections, q: QueueRef, docs: Sequence[Doc], subscription_ids: Sequence[str], *, now: int
) -> None:
    """Insert the messages `docs` into `q` at markers reserved for them, with their notifications, in one
    transaction (a marker someone else took meanwhile only costs a new reservation)."""
    for _ in range(MARKER_ATTEMPTS):
        first = await reserve_markers(c, q, len(docs))
        for n, doc in enumerate(docs):
            doc[M.MARKER] = first + n

        async def post(s: AsyncClientSession) -> None:
            await c.messages.insert_many(docs, session=s)
            await owe(c, q, subscription_ids, docs, now=now, session=s)

        try:
            await in_transaction(c, post)
            return
        except (DuplicateKeyError, BulkWriteError) as exc:
            if not marker_taken(exc):
                raise
    raise contended(q)


async def move_notifying(
    c: Collections,
    target: QueueRef,
    writes: Sequence[tuple[Doc, Doc]],
    subscription_ids: Sequence[str],
    *,
    now: int,
) -> int:
    """counters.move_with_markers for a queue with subscriptions: each (match, update) moves its message into
    `target` at a reserved marker, and every message moved is owed to each subscription, all in one
    transaction. A write whose match matches nothing is skipped. Returns how many documents moved."""
    if not writes:
        return 0
    for _ in range(MARKER_ATTEMPTS):
        first = await reserve_markers(c, target, len(writes))
        moves = [
            (match, {**update, "$set": {**update["$set"], M.QUEUE: target.name, M.MARKER: first + n}})
            for n, (match, update) in enumerate(writes)
        ]
        try:
            return await in_transaction(c, _moving(c, target, moves, subscription_ids, now))
        except (DuplicateKeyError, BulkWriteError) as exc:
            if not marker_taken(exc):
                raise
    raise contended(target)


def _moving(
    c: Collections, target: QueueRef, moves: list[tuple[Doc, Doc]], subscription_ids: Sequence[str], now: int
) -> Callable[[AsyncClientSession], Coroutine[Any, Any, int]]:
    async def move(s: AsyncClientSession) -> int:
        moved: list[Doc] = []
        for match, into in moves:
            doc = await c.messages.find_one_and_update(
                match, into, DELIVERED, return_document=ReturnDocument.AFTER, session=s
            )
            if doc is not None:
                moved.append(doc)
        await owe(c, target, subscription_ids, moved, now=now, session=s)
        return len(moved)

    return move


async def lease(c: Collections, owner: str, *, now: int, lease_ms: int, limit: int) -> list[Delivery]:
    """Lease up to `limit` due deliveries, oldest due first, each with one find_one_and_update (so no two
    callers take the same one while its lease runs), with their subscriptions as they are now. Those owed to
    a subscription gone or expired, and notifications to one no longer confirmed, are deleted instead."""
    out: list[Delivery] = []
    taken: list[Any] = []
    until = now + lease_ms
    while len(out) < limit:
        docs = []
        for _ in range(limit - len(out)):
            doc = await c.deliveries.find_one_and_update(
                {D.DUE: {"$lte": now}, D.ID: {"$nin": taken}},  # (nin: a lease of 0 ms leaves them due)
                {"$set": {D.DUE: until, D.OWNER: owner}},
                sort=[(D.DUE, 1)],
                hint=DUE_INDEX,
            )
            if doc is None:
                break
            taken.append(doc[D.ID])
            docs.append(doc)
        if not docs:
            break
        wanted = list({d[D.SUBSCRIPTION] for d in docs})
        subs = {s[S.ID]: s for s in await c.subscriptions.find({S.ID: {"$in": wanted}}).to_list()}
        dropped = []
        for doc in docs:
            sub = subs.get(doc[D.SUBSCRIPTION])
            if _owed_to(doc, sub, now):
                assert sub is not None
                try:
                    out.append(delivery_of(doc, subscription_of(sub)))
                except (
                    MessageUnreadable
                ) as e:  # put off, not holding up the others; sent once the key is back
                    log.warning("project %s: delivery %s put off: %s", doc[D.PROJECT], doc[D.ID], e)
                    await finish(c, doc[D.ID], now + UNREADABLE_PUT_OFF_MS, attempted=False)
            else:
                dropped.append(doc[D.ID])
        if not dropped:
            break
        await c.deliveries.delete_many({D.ID: {"$in": dropped}, D.OWNER: owner, D.DUE: until})
    return out


def _owed_to(delivery: Doc, sub: Doc | None, now: int) -> bool:
    if sub is None or sub[S.EXPIRES] <= now:
        return False
    if (sub[S.PROJECT], sub[S.QUEUE]) != (delivery[D.PROJECT], delivery[D.QUEUE]):
        return False
    return bool(sub[S.CONFIRMED]) or delivery[D.KIND] != "notification"


async def finish(c: Collections, delivery_id: str, retry_at_ms: int | None, *, attempted: bool) -> None:
    if retry_at_ms is None:
        await c.deliveries.delete_one({D.ID: delivery_id})
        return
    await c.deliveries.update_one(
        {D.ID: delivery_id},
        {"$set": {D.DUE: retry_at_ms}, "$inc": {D.ATTEMPTS: int(attempted)}, "$unset": {D.OWNER: ""}},
    )


async def finish_all(c: Collections, delivery_ids: list[str]) -> None:
    if delivery_ids:
        await c.deliveries.delete_many({D.ID: {"$in": delivery_ids}})


async def backlog(c: Collections) -> tuple[int, int | None]:
    """(deliveries waiting, the earliest due time or None)."""
    n = await c.deliveries.count_documents({})
    first = await c.deliveries.find_one({}, {D.DUE: 1}, sort=[(D.DUE, 1)], hint=DUE_INDEX)
    return n, None if first is None else int(first[D.DUE])
