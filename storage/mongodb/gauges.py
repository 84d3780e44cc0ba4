"""Store.queue_gauges on MongoDB: every queue of every project with its stats, for GET /metrics.

Three reads, whatever the number of queues: the first `limit` + 1 queues in (project, name) order (the
`queues` index), one aggregation over the live messages of those queues (walked in the marker index's order,
so each queue's first and last message are its oldest and newest, as `stats` finds them), and their counters
(a batch of ids at a time). Unlike `stats`, nothing is housekept first: a claim that has ended or a message
that has expired since the last sweep is counted as the sweeper left it (the live filter still leaves out an
expired message). The aggregation reads every live message of the queues it covers: its cost is the
messages', where the Redis driver's is the queues'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pymongo

from core.models import MessageId, MessageStamp, QueueRef, QueueStats
from storage.mongodb.counters import queue_stats
from storage.mongodb.errors import unavailable_as_domain_error
from storage.mongodb.queries import Doc
from storage.mongodb.schema import COUNTER, MARKER_INDEX, QUEUE, QUEUE_INDEX, Collections, counter_key
from storage.mongodb.schema import MESSAGE as M

COUNTERS_BATCH = 1000  # queues whose counters one find reads


async def queue_gauges(
    c: Collections, *, now: int, limit: int, deadline_s: float, ready: Callable[[], Awaitable[None]]
) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
    with pymongo.timeout(deadline_s):  # as the store's other reads: one deadline for all of it
        async with unavailable_as_domain_error():
            await ready()
            queues = await _queues(c, limit + 1)
            more = len(queues) > limit
            queues = queues[:limit]
            if not queues:
                return [], more
            messages = await _messages(c, now, last=queues[-1] if more else None)
            counters = await _counters(c, queues)
    gauges = []
    for q in queues:
        m = messages.get(q, {})
        n = counters.get(q, {})
        total, claimed = m.get("total", 0), m.get("claimed", 0)
        stats = queue_stats(
            total=total,
            claimed=claimed,
            delayed=m.get("delayed", 0),
            oldest=MessageStamp(MessageId(m["oldest_id"]), m["oldest_at"]) if m else None,
            newest=MessageStamp(MessageId(m["newest_id"]), m["newest_at"]) if m else None,
            counters=n,
        )
        gauges.append((q, stats))
    return gauges, more


async def _queues(c: Collections, wanted: int) -> list[QueueRef]:
    cursor = (
        c.queues.find({}, {QUEUE.PROJECT: 1, QUEUE.NAME: 1})
        .sort([(QUEUE.PROJECT, pymongo.ASCENDING), (QUEUE.NAME, pymongo.ASCENDING)])
        .hint(QUEUE_INDEX)
        .limit(wanted)
    )
    return [QueueRef(d[QUEUE.PROJECT], d[QUEUE.NAME]) async for d in cursor]


async def _messages(c: Collections, now: int, *, last: QueueRef | None) -> dict[QueueRef, Doc]:
    """Per queue: total, claimed and delayed live messages, and the first and last by marker; only the
    queues up to `last` (all of them when None)."""
    live: Doc = {M.EXPIRES: {"$gt": now}}
    if last is not None:
        live["$or"] = [
            {M.PROJECT: {"$lt": last.project}},
            {M.PROJECT: last.project, M.QUEUE: {"$lte": last.name}},
        ]

    def count(field: str) -> Doc:
        return {"$sum": {"$cond": [{"$gt": [f"${field}", now]}, 1, 0]}}

    pipeline: list[Doc] = [
        {"$match": live},
        {"$sort": {M.PROJECT: 1, M.QUEUE: 1, M.MARKER: 1}},
        {
            "$group": {
                M.ID: {"project": f"${M.PROJECT}", "queue": f"${M.QUEUE}"},
                "total": {"$sum": 1},
                "claimed": count(M.CLAIM_END),
                "delayed": count(M.AVAILABLE),
                "oldest_id": {"$first": f"${M.ID}"},
                "oldest_at": {"$first": f"${M.CREATED}"},
                "newest_id": {"$last": f"${M.ID}"},
                "newest_at": {"$last": f"${M.CREATED}"},
            }
        },
    ]
    found: dict[QueueRef, Doc] = {}
    async for doc in await c.messages.aggregate(pipeline, hint=MARKER_INDEX):
        key: dict[str, Any] = doc[M.ID]
        found[QueueRef(key["project"], key["queue"])] = doc
    return found


async def _counters(c: Collections, queues: list[QueueRef]) -> dict[QueueRef, Doc]:
    found: dict[QueueRef, Doc] = {}
    for i in range(0, len(queues), COUNTERS_BATCH):
        ids = [counter_key(q)[COUNTER.ID] for q in queues[i : i + COUNTERS_BATCH]]
        async for doc in c.counters.find({COUNTER.ID: {"$in": ids}}):
            key = doc[COUNTER.ID]
            found[QueueRef(key[COUNTER.PROJECT], key[COUNTER.QUEUE])] = doc
    return found
