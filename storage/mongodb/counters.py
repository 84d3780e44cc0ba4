"""Per-queue bookkeeping that posts and moves do without transactions: lazy queue creation, markers, counters;
and the counted quotas' checks, which do need one (below).

No multi-document transaction runs on these hot paths. On MongoDB a transaction whose client dies stays open
(holding its write locks) until `transactionLifetimeLimitSeconds`, 60 s by default: a crashed API process
would stall every post to, and every move into, the queues it was writing for that long.

Markers (Zaqar's scheme): a writer reads the queue's counter, writes its messages at counter+1, +2, ... under
the unique (p, q, k) index, and then raises the counter to its last marker. A writer that finds a marker
taken (duplicate key) raises the counter to the highest marker present and tries again above it. Since every
attempt starts right after a counter value, and the counter only moves past markers that exist, a marker is
never taken after a higher one became visible, so a reader paging by marker skips nothing. (The one
exception needs a writer stalled between reading the counter and writing, while the message at that very
next marker is posted and deleted: its write then lands below markers already seen.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from core.errors import OutcomeUnknown, StorageUnavailable
from core.models import MessageStamp, QueueRef, QueueStats
from core.quotas import MESSAGE_BYTES, MESSAGES_PER_QUEUE, QUEUES, exceeded
from storage.mongodb import quotas
from storage.mongodb.errors import after_commit
from storage.mongodb.queries import Doc
from storage.mongodb.schema import (
    COUNTER,
    EXPIRY_INDEX,
    MARKER_INDEX,
    MESSAGE,
    PROJECT_QUOTA,
    QUEUE,
    Collections,
    counter_key,
    new_queue,
    queue_key,
)
from storage.mongodb.transactions import in_transaction

MARKER_ATTEMPTS = 1000  # give up (503) only under contention no real load produces
DUPLICATE_KEY = 11000


async def ensure_queue(
    c: Collections,
    q: QueueRef,
    now: int,
    *,
    max_queues: int | None = None,
    before_creation: Callable[[], Awaitable[None]] | None = None,
) -> Doc:
    """The queue's document (its policy, and whether it has subscriptions), created (empty metadata) when
    absent, as a post or a move into a DLQ does. With `max_queues` (the project's `queues` quota, for a
    creation a caller asked for), the creation is refused (QuotaExceeded) when the project has that many;
    `before_creation` runs first when the queue is absent (a post's refusal of itself, which then makes no
    queue)."""
    doc = await c.queues.find_one(queue_key(q), {QUEUE.POLICY: 1, QUEUE.SUBSCRIPTIONS: 1})
    if doc is not None:
        return doc
    if before_creation is not None:
        await before_creation()
    if max_queues is not None:

        async def create(s: AsyncClientSession) -> None:
            if await c.queues.find_one(queue_key(q), {QUEUE.ID: 1}, session=s) is None:
                await take_queue_slot(c, q.project, 1, max_queues, s)
                await c.queues.insert_one({**queue_key(q), **new_queue(now)}, session=s)

        for _ in range(MARKER_ATTEMPTS):
            try:
                await in_transaction(c, create)
            except DuplicateKeyError:  # created concurrently (or the quotas document was): look again
                doc = await c.queues.find_one(queue_key(q), {QUEUE.POLICY: 1, QUEUE.SUBSCRIPTIONS: 1})
                if doc is not None:
                    return doc
                continue
            return {QUEUE.POLICY: {}}
        raise StorageUnavailable(f"Queue {q.name!r} could not be made: it kept being made and deleted.")
    with contextlib.suppress(DuplicateKeyError):  # created concurrently
        await c.queues.update_one(
            queue_key(q),
            {"$setOnInsert": new_queue(now)},
            upsert=True,
        )
    return {QUEUE.POLICY: {}}


# Counted quotas (core/quotas.py), counted from what the store holds, in a transaction that first writes one
# document every counted change of the same scope writes too (the project's `quotas` document for queues, the
# queue's document for its messages): two such transactions conflict, and the one retried counts again, so
# racing writers never pass the quota together.


async def take_queue_slot(
    c: Collections, project: str, adding: int, limit: int, session: AsyncClientSession
) -> None:
    """In the transaction that creates `adding` queues of `project`: QuotaExceeded when they would take it
    past `limit` queues."""
    await c.quotas.update_one(
        {PROJECT_QUOTA.ID: project}, {"$inc": {PROJECT_QUOTA.CREATIONS: 1}}, upsert=True, session=session
    )
    n = await c.queues.count_documents({QUEUE.PROJECT: project}, session=session)
    if n + adding > limit:
        raise exceeded(QUEUES, use=n, adding=adding, limit=limit, where="This project")


async def may_create(c: Collections, q: QueueRef) -> bool:
    """Whether `q` exists, or the project has room for it under its `queues` quota (not in a transaction:
    for a redrive, which skips the messages of a destination it may not make)."""
    if await c.queues.find_one(queue_key(q), {QUEUE.ID: 1}) is not None:
        return True
    limit = (await quotas.counted(c, q.project))[QUEUES]
    return limit is None or await c.queues.count_documents({QUEUE.PROJECT: q.project}) < limit


async def live_messages(
    c: Collections, q: QueueRef, now: int, session: AsyncClientSession | None = None
) -> int:
    """The queue's messages, less the expired ones the sweeper has not deleted yet (found by the expiry
    index: few)."""
    of_queue = {MESSAGE.PROJECT: q.project, MESSAGE.QUEUE: q.name}
    total = await c.messages.count_documents(of_queue, session=session)
    expired = (
        await c.messages.find(
            {**of_queue, MESSAGE.EXPIRES: {"$lte": now}},
            {MESSAGE.ID: 1},
            session=session,
        )
        .hint(EXPIRY_INDEX)
        .to_list()
    )
    return total - len(expired)


async def take_message_room(
    c: Collections, q: QueueRef, adding: int, limit: int, now: int, session: AsyncClientSession
) -> None:
    """In the transaction of a post of `adding` messages to `q`, after it took its markers
    (reserve_markers with the session: the queue's counter is the document written first, see above):
    QuotaExceeded when they would take it past `limit`."""
    n = await live_messages(c, q, now, session)
    if n + adding > limit:
        raise exceeded(MESSAGES_PER_QUEUE, use=n, adding=adding, limit=limit, where=f"Queue {q.name!r}")


async def held_bytes(
    c: Collections, project: str, now: int, session: AsyncClientSession | None = None
) -> int:
    """The bytes of the bodies (as stored) of the project's live messages: a sum over all of them (the
    `message_bytes` quota's cost, in each post under it)."""
    live = {MESSAGE.PROJECT: project, MESSAGE.EXPIRES: {"$gt": now}}
    total = {"$group": {MESSAGE.ID: None, "bytes": {"$sum": {"$binarySize": f"${MESSAGE.BODY}"}}}}
    found = await (await c.messages.aggregate([{"$match": live}, total], session=session)).to_list()
    return int(found[0]["bytes"]) if found else 0


async def take_byte_room(
    c: Collections, project: str, adding: int, limit: int, now: int, session: AsyncClientSession
) -> None:
    """In the transaction of a post of `adding` bytes to a queue of `project`: QuotaExceeded when they would
    take it past `limit`. The project's quotas document, written first, makes two such posts conflict (the
    one retried counts again)."""
    await c.quotas.update_one(
        {PROJECT_QUOTA.ID: project}, {"$inc": {PROJECT_QUOTA.POSTING: 1}}, upsert=True, session=session
    )
    n = await held_bytes(c, project, now, session)
    if n + adding > limit:
        raise exceeded(MESSAGE_BYTES, use=n, adding=adding, limit=limit, where="This project")


async def message_room(c: Collections, q: QueueRef, now: int) -> int | None:
    """How many more messages `q` takes under its `messages_per_queue` quota (None: no limit), for a move
    into it (not in a transaction: moves made at the same moment may pass the quota by as many)."""
    limit = (await quotas.counted(c, q.project))[MESSAGES_PER_QUEUE]
    return None if limit is None else max(0, limit - await live_messages(c, q, now))


async def count(c: Collections, q: QueueRef, counts: Mapping[str, int]) -> None:
    """Add to the queue's counters (n_dl, n_rsn.<reason>, n_disc, n_rcv, n_rdr: path -> n), after the moves
    they count: a failure leaves them short (as a crash there would), never fails the moves."""
    await after_commit(
        c.counters.update_one(counter_key(q), {"$inc": dict(counts)}, upsert=True), f"counting {list(counts)}"
    )


async def _last_marker(c: Collections, q: QueueRef) -> int:
    doc = await c.counters.find_one(counter_key(q), {COUNTER.SEQ: 1})
    return int(doc.get(COUNTER.SEQ, 0)) if doc else 0


async def _raise_counter(c: Collections, q: QueueRef, marker: int) -> None:
    await c.counters.update_one(counter_key(q), {"$max": {COUNTER.SEQ: marker}}, upsert=True)


async def _heal(c: Collections, q: QueueRef, taken: int) -> int:
    """Raise the counter past marker `taken`, found taken by a writer that has not raised the counter yet
    (or died before it could); returns where the counter is now. Writers raise it as soon as they are done,
    so stepping past a marker at a time is needed only over the batch of a writer that died."""
    now_at = max(taken, await _last_marker(c, q))
    await _raise_counter(c, q, now_at)
    return now_at


def marker_taken(exc: DuplicateKeyError | BulkWriteError) -> bool:
    """Whether a duplicate key is a message marker (someone else's), not a message id or a record."""
    text = str(exc.details if isinstance(exc, BulkWriteError) else exc)
    return MARKER_INDEX in text


def contended(q: QueueRef, *, partly: bool = False) -> StorageUnavailable:
    cls = OutcomeUnknown if partly else StorageUnavailable
    return cls(f"Queue {q.name!r} is too busy to take a marker.")


async def insert_in_order(c: Collections, q: QueueRef, docs: Sequence[Doc]) -> None:
    """Insert `docs` into `q` in their order, giving them consecutive markers after the queue's last. Once
    they are in, raising the counter is bookkeeping (the next writer heals a counter left behind)."""
    pending = list(docs)
    base = await _last_marker(c, q)
    for _ in range(MARKER_ATTEMPTS):
        for i, doc in enumerate(pending):
            doc[MESSAGE.MARKER] = base + 1 + i
        try:
            await c.messages.insert_many(pending)  # ordered: stops at the first marker someone else holds
        except BulkWriteError as exc:
            errors: list[dict[str, Any]] = exc.details.get("writeErrors", [])
            if any(e.get("code") != DUPLICATE_KEY for e in errors):
                raise
            done = int(exc.details.get("nInserted", 0))
            pending = pending[done:]
            base = await _heal(c, q, taken=base + 1 + done)
            continue
        await after_commit(_raise_counter(c, q, pending[-1][MESSAGE.MARKER]), "raising the marker counter")
        return
    raise contended(q, partly=len(pending) < len(docs))


async def reserve_markers(
    c: Collections, q: QueueRef, n: int, session: AsyncClientSession | None = None
) -> int:
    """Take the next `n` markers of `q` for one writer alone (the counter goes past them first); returns the
    first. For a write inside a transaction, which must not meet another writer's marker: a reader paging
    by marker may pass these before that transaction commits (a wider form of the gap above), unless they
    are taken in that transaction (`session`), which then also holds the counter until it ends. Writers
    racing to make the counter's document: the losers' upsert fails (or, on some servers, answers nothing)
    and they take their markers from the document the winner made (in a transaction: it starts again)."""
    if session is not None:
        doc = await c.counters.find_one_and_update(
            counter_key(q),
            {"$inc": {COUNTER.SEQ: n}},
            upsert=True,
            return_document=ReturnDocument.AFTER,
            session=session,
        )
        if doc is None:
            raise OperationFailure(
                "the marker counter was made meanwhile", 112, {"errorLabels": ["TransientTransactionError"]}
            )
        return int(doc[COUNTER.SEQ]) - n + 1
    for _ in range(MARKER_ATTEMPTS):
        try:
            doc = await c.counters.find_one_and_update(
                counter_key(q), {"$inc": {COUNTER.SEQ: n}}, upsert=True, return_document=ReturnDocument.AFTER
            )
        except DuplicateKeyError:
            continue
        if doc is not None:
            return int(doc[COUNTER.SEQ]) - n + 1
    raise contended(q)


async def move_with_markers(c: Collections, target: QueueRef, writes: Sequence[tuple[Doc, Doc]]) -> int:
    """For each (match, update): update_one that also moves the document into `target` at its next marker,
    in order. A write whose `match` matches nothing (someone else moved, claimed or deleted the message) is
    skipped. Returns how many documents moved."""
    marker = await _last_marker(c, target) + 1
    moved = 0
    for match, update in writes:
        for _ in range(MARKER_ATTEMPTS):
            into = {**update, "$set": {**update["$set"], MESSAGE.QUEUE: target.name, MESSAGE.MARKER: marker}}
            try:
                result = await c.messages.update_one(match, into)
            except DuplicateKeyError:
                marker = await _heal(c, target, taken=marker) + 1
                continue
            if result.modified_count:
                moved += 1
                marker += 1
            break
        else:
            raise contended(target)
    if moved:
        await after_commit(_raise_counter(c, target, marker - 1), "raising the marker counter")
    return moved


def queue_stats(
    *,
    total: int,
    claimed: int,
    delayed: int,
    oldest: MessageStamp | None,
    newest: MessageStamp | None,
    counters: Mapping[str, Any],
) -> QueueStats:
    """A queue's stats from its message counts and its counters document (stats() and queue_gauges)."""
    return QueueStats(
        free=total - claimed,
        claimed=claimed,
        total=total,
        delayed=delayed,
        oldest=oldest,
        newest=newest,
        dead_lettered=counters.get(COUNTER.DEAD_LETTERED, 0),
        discarded=counters.get(COUNTER.DISCARDED, 0),
        dead_letters_received=counters.get(COUNTER.RECEIVED, 0),
        dead_lettered_by_reason=dict(counters.get(COUNTER.BY_REASON, {})),
        redriven=counters.get(COUNTER.REDRIVEN, 0),
    )
