"""Redrive on MongoDB: one batch of a task moves matching messages out of a DLQ, each with one update_one."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

from core.models import QueueRef, RedriveSpec, RedriveTask, TaskId, TaskStatus
from storage.mongodb.counters import ensure_queue, move_with_markers
from storage.mongodb.queries import Doc, not_claimed
from storage.mongodb.schema import MARKER_INDEX, Collections, message_of

TASK_KEEP_MS = 7 * 86_400_000  # a finished task's document is kept this long (TTL index on gc)


@dataclass(frozen=True, slots=True)
class Step:
    status: TaskStatus
    cursor: int
    scanned: int
    moved: int
    skipped: int


def task_of(doc: Doc) -> RedriveTask:
    return RedriveTask(
        id=TaskId(doc["_id"]),
        queue=doc["q"],
        spec=RedriveSpec.from_dict(doc["spec"]),
        status=doc["status"],
        created_ms=doc["cr"],
        updated_ms=doc["up"],
        end_marker=doc["end"],
        cursor=doc["cursor"],
        scanned=doc["scanned"],
        moved=doc["moved"],
        skipped=doc["skipped"],
        owner=doc["owner"],
    )


async def redrive_batch(c: Collections, q: QueueRef, task: RedriveTask, *, now: int, batch: int) -> Step:
    """Look at the next `batch` messages of DLQ `q` after the task's cursor (up to its end marker) and move
    each live, unclaimed one that matches the task's filters to its destination (the task's, else the queue
    it was dead-lettered from): a new marker there, no claim, claim count 0, redrive count + 1. A move is
    guarded on the message still being in `q`, unclaimed, so a consumer that claims it meanwhile wins."""
    spec = task.spec
    docs = (
        await c.messages.find(
            {"p": q.project, "q": q.name, "k": {"$gt": task.cursor, "$lte": task.end_marker}}
        )
        .sort("k", 1)
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
        cursor, scanned = doc["k"], scanned + 1
        message = message_of(doc)
        if doc["e"] <= now or not spec.matches(message):
            continue
        assert message.dead_letter is not None  # matches() holds only for dead letters
        destination = spec.destination or message.dead_letter.source_queue
        if message.is_claimed(now) or destination == q.name:
            skipped += 1
            continue
        plan.append((doc, destination))
    moved = 0
    for destination, group in groupby(plan, key=lambda pair: pair[1]):
        target = QueueRef(q.project, destination)
        await ensure_queue(c, target, now)
        writes: list[tuple[Doc, Doc]] = []
        for doc, _ in group:
            match: dict[str, Any] = {"_id": doc["_id"], "p": q.project, "q": q.name, "ce": not_claimed(now)}
            update = {
                "$set": {"cc": 0, "vis": now, "av": now},
                "$unset": {"c": "", "ce": "", "bo": ""},
                "$inc": {"dl.rc": 1},
            }
            writes.append((match, update))
        done = await move_with_markers(c, target, writes)
        moved, skipped = moved + done, skipped + len(writes) - done
    finished = (
        len(docs) < batch
        or cursor >= task.end_marker
        or (wanted is not None and task.moved + moved >= spec.limit)  # type: ignore[operator]
    )
    return Step("succeeded" if finished else "running", cursor, scanned, moved, skipped)
