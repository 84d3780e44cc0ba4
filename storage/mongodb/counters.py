"""Per-queue bookkeeping that posts and moves do without transactions: lazy queue creation, markers, counters.

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
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from core.errors import OutcomeUnknown, StorageUnavailable
from core.models import MessageStamp, QueueRef, QueueStats
from storage.mongodb.errors import after_commit
from storage.mongodb.queries import Doc
from storage.mongodb.schema import (
    COUNTER,
    MARKER_INDEX,
    MESSAGE,
    QUEUE,
    Collections,
    counter_key,
    new_queue,
    queue_key,
)

MARKER_ATTEMPTS = 1000  # give up (503) only under contention no real load produces
DUPLICATE_KEY = 11000


async def ensure_queue(c: Collections, q: QueueRef, now: int) -> Doc:
    """The queue's document (its policy, and whether it has subscriptions), created (empty metadata) when
    absent, as a post or a move into a DLQ does."""
    doc = await c.queues.find_one(queue_key(q), {QUEUE.POLICY: 1, QUEUE.SUBSCRIPTIONS: 1})
    if doc is not None:
        return doc
    with contextlib.suppress(DuplicateKeyError):  # created concurrently
        await c.queues.update_one(
            queue_key(q),
            {"$setOnInsert": new_queue(now)},
            upsert=True,
        )
    return {QUEUE.POLICY: {}}


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


async def reserve_markers(c: Collections, q: QueueRef, n: int) -> int:
    """Take the next `n` markers of `q` for one writer alone (the counter goes past them first); returns the
    first. For a write inside a transaction, which must not meet another writer's marker: a reader paging
    by marker may pass these before that transaction commits (a wider form of the gap above)."""
    doc = await c.counters.find_one_and_update(
        counter_key(q), {"$inc": {COUNTER.SEQ: n}}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert doc is not None  # an upsert returning the document after it
    return int(doc[COUNTER.SEQ]) - n + 1


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
