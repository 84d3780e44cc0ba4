"""Subscriptions on MongoDB (storage.base.SubscriptionStore).

Each write that adds or removes subscriptions runs in one transaction with the deliveries it owes or drops
and with the queue document's `subs` (how many subscription documents the queue has), which a post or a
move into the queue reads to skip the outbox when it is 0. So `subs` is never below the documents (only the
TTL index's backstop, dropping expired ones, leaves it above: a post then reads subscriptions for nothing
until the next write recounts), and two writes racing on a queue conflict on its document: one is retried
after the other, which keeps `max_per_queue` and the subscriber's uniqueness (also a unique index).

Expired subscriptions are invisible; the next create on their queue deletes them, what they are owed with
them (the lease drops that sooner).
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import DuplicateKeyError

from core.errors import Conflict, SubscriptionExists, SubscriptionNotFound
from core.models import Page, QueueRef, Subscription, SubscriptionId
from core.quotas import QUEUES, SUBSCRIPTIONS, exceeded
from storage.mongodb import quotas
from storage.mongodb.counters import ensure_queue
from storage.mongodb.outbox import owed
from storage.mongodb.queries import Doc
from storage.mongodb.schema import (
    DELIVERY,
    PROJECT_QUOTA,
    QUEUE,
    SUBSCRIPTION,
    SUBSCRIPTIONS_INDEX,
    Collections,
    gc_at,
    new_queue,
    queue_key,
    subscription_key,
    subscription_of,
    subscriptions_of,
)
from storage.mongodb.transactions import in_transaction

S = SUBSCRIPTION
CREATE_ATTEMPTS = 3  # a create that lost a race (the same subscriber, the queue created) looks again


def _live(now: int) -> Doc:
    return {S.EXPIRES: {"$gt": now}}


def _missing(subscription_id: str) -> SubscriptionNotFound:
    return SubscriptionNotFound(f"Subscription {subscription_id} does not exist or has expired.")


async def _drop(c: Collections, query: Doc, session: AsyncClientSession) -> int:
    """Delete the subscriptions matching `query` and what they are owed; returns how many."""
    ids = [d[S.ID] for d in await c.subscriptions.find(query, {S.ID: 1}, session=session).to_list()]
    if ids:
        await c.deliveries.delete_many({DELIVERY.SUBSCRIPTION: {"$in": ids}}, session=session)
        await c.subscriptions.delete_many({S.ID: {"$in": ids}}, session=session)
    return len(ids)


async def _take_subscription_slot(
    c: Collections, project: str, limit: int, now: int, session: AsyncClientSession
) -> None:
    """In the transaction that subscribes: QuotaExceeded when the project has `limit` live subscriptions.
    The project's `quotas` document is written first, so two such transactions conflict (counters.py)."""
    await c.quotas.update_one(
        {PROJECT_QUOTA.ID: project}, {"$inc": {PROJECT_QUOTA.SUBSCRIBING: 1}}, upsert=True, session=session
    )
    n = await c.subscriptions.count_documents({S.PROJECT: project, **_live(now)}, session=session)
    if n >= limit:
        raise exceeded(SUBSCRIPTIONS, use=n, adding=1, limit=limit, where="This project")


async def _recount(
    c: Collections, q: QueueRef, now: int, session: AsyncClientSession, *, create: bool
) -> None:
    """Set the queue document's `subs` to its subscription documents (creating the queue with `create`)."""
    n = await c.subscriptions.count_documents(subscriptions_of(q), session=session)
    update: Doc = {"$set": {QUEUE.SUBSCRIPTIONS: n}}
    if create:
        update["$setOnInsert"] = new_queue(now)
    await c.queues.update_one(queue_key(q), update, upsert=create, session=session)


async def create(
    c: Collections,
    q: QueueRef,
    subscription_id: SubscriptionId,
    *,
    subscriber: str,
    ttl: int,
    options: dict[str, Any],
    confirmed: bool,
    max_per_queue: int,
    now: int,
) -> tuple[Subscription, bool]:
    expires = now + ttl * 1000
    doc = {
        S.ID: subscription_id,
        S.PROJECT: q.project,
        S.QUEUE: q.name,
        S.SUBSCRIBER: subscriber,
        S.TTL: ttl,
        S.OPTIONS: orjson.dumps(options).decode(),
        S.CREATED: now,
        S.EXPIRES: expires,
        S.CONFIRMED: confirmed,
    }

    async def write(s: AsyncClientSession) -> tuple[Subscription, bool]:
        same = await c.subscriptions.find_one(
            {**subscriptions_of(q), S.SUBSCRIBER: subscriber, **_live(now)}, session=s
        )
        if same is not None:
            if not same[S.CONFIRMED]:  # asked again: its confirmation request goes out again
                await c.deliveries.insert_one(owed(q, same[S.ID], "confirmation", now), session=s)
            return subscription_of(same), False
        await _drop(c, {**subscriptions_of(q), S.EXPIRES: {"$lte": now}}, s)
        if limit is not None:
            await _take_subscription_slot(c, q.project, limit, now, s)
        live = await c.subscriptions.count_documents({**subscriptions_of(q), **_live(now)}, session=s)
        if live >= max_per_queue:
            raise Conflict(
                f"Queue {q.name} has {live} subscriptions, the most a queue may have "
                f"(CHARON_LIMITS__MAX_SUBSCRIPTIONS_PER_QUEUE={max_per_queue}); delete one first."
            )
        await c.subscriptions.insert_one({**doc, S.GC: gc_at(expires)}, session=s)
        if not confirmed:
            await c.deliveries.insert_one(owed(q, subscription_id, "confirmation", now), session=s)
        await _recount(c, q, now, s, create=True)
        return subscription_of(doc), True

    # outside the transaction, where a concurrent creation is no error; refused past the `queues` quota
    counted = await quotas.counted(c, q.project)
    limit = counted[SUBSCRIPTIONS]
    await ensure_queue(c, q, now, max_queues=counted[QUEUES])
    for _ in range(CREATE_ATTEMPTS - 1):
        with contextlib.suppress(DuplicateKeyError):
            return await in_transaction(c, write)
    return await in_transaction(c, write)


async def get(c: Collections, q: QueueRef, subscription_id: SubscriptionId, *, now: int) -> Subscription:
    doc = await c.subscriptions.find_one({**subscription_key(q, subscription_id), **_live(now)})
    if doc is None:
        raise _missing(subscription_id)
    return subscription_of(doc)


async def listing(
    c: Collections, q: QueueRef, *, marker: str | None, limit: int, now: int
) -> Page[Subscription]:
    query: Doc = {**subscriptions_of(q), **_live(now)}
    if marker:
        query[S.ID] = {"$gt": marker}
    docs = await c.subscriptions.find(query).sort(S.ID, 1).hint(SUBSCRIPTIONS_INDEX).limit(limit).to_list()
    items = [subscription_of(d) for d in docs]
    return Page(items=items, next_marker=items[-1].id if items else None)


async def change(
    c: Collections,
    q: QueueRef,
    subscription_id: SubscriptionId,
    *,
    subscriber: str | None,
    ttl: int | None,
    options: dict[str, Any] | None,
    now: int,
) -> None:
    this = subscription_key(q, subscription_id)
    taken = SubscriptionExists(f"Queue {q.name} already has a subscription for {subscriber}.")

    async def write(s: AsyncClientSession) -> None:
        if await c.subscriptions.find_one({**this, **_live(now)}, {S.ID: 1}, session=s) is None:
            raise _missing(subscription_id)
        fields: Doc = {}
        dropped = 0
        if subscriber is not None:
            other = {**subscriptions_of(q), S.SUBSCRIBER: subscriber, S.ID: {"$ne": subscription_id}}
            if await c.subscriptions.find_one({**other, **_live(now)}, {S.ID: 1}, session=s) is not None:
                raise taken
            dropped = await _drop(c, other, s)  # an expired one still holding the subscriber
            fields[S.SUBSCRIBER] = subscriber
        if ttl is not None:
            expires = now + ttl * 1000
            fields.update({S.TTL: ttl, S.EXPIRES: expires, S.GC: gc_at(expires)})
        if options is not None:
            fields[S.OPTIONS] = orjson.dumps(options).decode()
        if fields:
            await c.subscriptions.update_one(this, {"$set": fields}, session=s)
        if dropped:
            await _recount(c, q, now, s, create=False)

    try:
        await in_transaction(c, write)
    except DuplicateKeyError:  # another took the subscriber meanwhile
        raise taken from None


async def confirm(
    c: Collections, q: QueueRef, subscription_id: SubscriptionId, *, confirmed: bool, now: int
) -> None:
    this = {**subscription_key(q, subscription_id), **_live(now)}

    async def write(s: AsyncClientSession | None) -> None:
        r = await c.subscriptions.update_one(this, {"$set": {S.CONFIRMED: confirmed}}, session=s)
        if r.matched_count == 0:
            raise _missing(subscription_id)
        if not confirmed:
            await c.deliveries.insert_one(owed(q, subscription_id, "unsubscribed", now), session=s)

    if confirmed:
        await write(None)  # one document: no transaction needed
    else:
        await in_transaction(c, write)


async def delete(c: Collections, q: QueueRef, subscription_id: SubscriptionId, *, now: int) -> None:
    async def write(s: AsyncClientSession) -> None:
        if await _drop(c, subscription_key(q, subscription_id), s):
            await _recount(c, q, now, s, create=False)

    await in_transaction(c, write)


async def purge(c: Collections, q: QueueRef) -> None:
    async def write(s: AsyncClientSession) -> None:
        if await _drop(c, subscriptions_of(q), s):
            await c.queues.update_one(queue_key(q), {"$set": {QUEUE.SUBSCRIPTIONS: 0}}, session=s)

    await in_transaction(c, write)


async def delete_queue_document(c: Collections, q: QueueRef) -> None:
    """Delete the queue's document and its subscriptions (and what they are owed): one delete_one when it
    has none, else one transaction (a subscription created meanwhile conflicts with it on the document)."""
    if (await c.queues.delete_one({**queue_key(q), QUEUE.SUBSCRIPTIONS: {"$not": {"$gt": 0}}})).deleted_count:
        return
    if await c.queues.find_one(queue_key(q), {QUEUE.ID: 1}) is None:
        return

    async def write(s: AsyncClientSession) -> None:
        await _drop(c, subscriptions_of(q), s)
        await c.queues.delete_one(queue_key(q), session=s)

    await in_transaction(c, write)
