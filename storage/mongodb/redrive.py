"""Redrive on MongoDB: one batch of a task moves matching messages out of a DLQ, each with one update_one."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from core.models import QueueRef, RedriveSpec, RedriveTask, TaskId, TaskStatus
from storage.mongodb.counters import count, ensure_queue, may_create, message_room, move_with_markers
from storage.mongodb.queries import Doc, not_claimed
from storage.mongodb.schema import (
    COUNTER,
    MARKER_INDEX,
    MOVED_OUT,
    REDRIVES_PATH,
    TASK,
    Collections,
    message_of,
)
from storage.mongodb.schema import MESSAGE as M

TASK_KEEP_MS = 7 * 86_400_000  # a finished task's document is kept this long (TTL index on gc)


@dataclass(frozen=True, slots=True)
class Step:
    status: TaskStatus
    cursor: int
    scanned: int
    moved: int
    skipped: int


def task_of(doc: Doc) -> RedriveTask:
    t = TASK
    return RedriveTask(
        id=TaskId(doc[t.ID]),
        queue=doc[t.QUEUE],
        spec=RedriveSpec.from_dict(doc[t.SPEC]),
        status=doc[t.STATUS],
        created_ms=doc[t.CREATED],
        updated_ms=doc[t.UPDATED],
        end_marker=doc[next(k for k in (t.IDS_END, t.SIGNATURE_END, t.END) if k in doc)],
        cursor=doc[t.CURSOR],
        scanned=doc[t.SCANNED],
        moved=doc[t.MOVED],
        skipped=doc[t.SKIPPED],
        owner=doc[t.OWNER],
    )


async def redrive_batch(c: Collections, q: QueueRef, task: RedriveTask, *, now: int, batch: int) -> Step:
    """Look at the next `batch` messages of DLQ `q` after the task's cursor (up to its end marker) and move
    each live, unclaimed one that matches the task's filters (a task of listed ids: the next `batch` ids,
    each dead-lettered before the task began) to its destination (the task's, else the queue
    it was dead-lettered from): a new marker there, no claim, claim count 0, redrive count + 1. A move is
    guarded on the message still being in `q`, unclaimed, so a consumer that claims it meanwhile wins."""
    spec = task.spec
    if spec.message_ids is not None:  # listed ids: the next `batch` of them looked up (cursor: ids done)
        listed = spec.message_ids[task.cursor : task.cursor + batch]
        found = {
            d[M.ID]: d
            for d in await c.messages.find(
                {M.ID: {"$in": list(listed)}, M.PROJECT: q.project, M.QUEUE: q.name}
            ).to_list()
        }
        docs = [found.get(i) for i in listed]
    else:
        docs = list(
            await c.messages.find(
                {
                    M.PROJECT: q.project,
                    M.QUEUE: q.name,
                    M.MARKER: {"$gt": task.cursor, "$lte": task.end_marker},
                }
            )
            .sort(M.MARKER, 1)
            .hint(MARKER_INDEX)
            .limit(batch)
            .to_list()
        )
    wanted = None if spec.limit is None else spec.limit - task.moved
    plan: list[tuple[Doc, str]] = []
    cursor, scanned, skipped = task.cursor, 0, 0
    for doc in docs:
        if wanted is not None and len(plan) >= wanted:
            break
        scanned += 1
        if doc is None:  # a listed id that is not (or no longer) in this DLQ
            cursor += 1
            continue
        cursor = cursor + 1 if spec.message_ids is not None else doc[M.MARKER]
        message = message_of(doc)
        if doc[M.EXPIRES] <= now or not spec.matches(message):
            continue
        assert message.dead_letter is not None  # matches() holds only for dead letters
        if spec.message_ids is not None and message.dead_letter.dead_lettered_at_ms > task.created_ms:
            continue  # dead-lettered (again) after the task began: not its business, as for a walk by marker
        destination = spec.destination or message.dead_letter.source_queue
        if message.is_claimed(now) or destination == q.name:
            skipped += 1
            continue
        plan.append((doc, destination))
    moved = 0
    for destination, group in groupby(plan, key=lambda pair: pair[1]):
        target = QueueRef(q.project, destination)
        room = await message_room(c, target, now) if await may_create(c, target) else 0
        docs_to = [doc for doc, _ in group]
        if room is not None and len(docs_to) > room:  # a full destination: the rest stay here, skipped
            skipped += len(docs_to) - room
            docs_to = docs_to[:room]
        if not docs_to:
            continue
        await ensure_queue(c, target, now)
        writes: list[tuple[Doc, Doc]] = []
        for doc in docs_to:
            match: dict[str, Any] = {
                M.ID: doc[M.ID],
                M.PROJECT: q.project,
                M.QUEUE: q.name,
                M.CLAIM_END: not_claimed(now),
            }
            update = {
                "$set": {M.CLAIM_COUNT: 0, M.VISIBLE: now, M.AVAILABLE: now},
                "$unset": MOVED_OUT,
                "$inc": {REDRIVES_PATH: 1},
            }
            writes.append((match, update))
        done = await move_with_markers(c, target, writes)
        moved, skipped = moved + done, skipped + len(writes) - done
    if moved:
        await count(c, q, {COUNTER.REDRIVEN: moved})
    finished = (
        len(docs) < batch
        or cursor >= task.end_marker
        or (wanted is not None and task.moved + moved >= spec.limit)  # type: ignore[operator]
    )
    return Step("succeeded" if finished else "running", cursor, scanned, moved, skipped)
