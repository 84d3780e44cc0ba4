"""Dead-letter moves and the per-queue housekeeping that triggers them (docs/contract.md).

The move of one message is one update_one of its document: `q` becomes the DLQ, it gets its DLQ marker and
the provenance in the same write, so a crash leaves the message in exactly one queue (promise 1). Into a DLQ
with live confirmed subscriptions, the moves and the deliveries they owe are one transaction instead
(outbox.py), so a crash leaves each message moved with its deliveries, or neither. The update is conditioned
on what the caller read (a guard: the claim that held it, or that no live claim does), so of two processes
that race to move or claim a message exactly one wins. The counters (n_dl, n_rsn, n_rcv, n_disc) are raised
right after: a crash in between can leave them short by the moves in flight, never the messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core.metadata import QueuePolicy
from core.models import DeadLetterReason, QueueRef, Rejection
from storage.mongodb.counters import count, ensure_queue, message_room, move_with_markers
from storage.mongodb.outbox import move_notifying, subscribers
from storage.mongodb.queries import Doc, lapsed
from storage.mongodb.schema import COUNTER, MOVED_OUT, UNCLAIMED, Collections, by_reason, gc_at
from storage.mongodb.schema import DEAD_LETTER as DL
from storage.mongodb.schema import MESSAGE as M

HOUSEKEEP_BATCH = 100  # lapsed claims one housekeeping call ends, so each call's work is bounded

Moves = Sequence[tuple[Doc, Mapping[str, Any]]]


async def dead_letter(
    c: Collections,
    src: QueueRef,
    policy: QueuePolicy,
    moves: Moves,
    *,
    now: int,
    reason: DeadLetterReason,
    rejection: Rejection | None = None,
    consumer: str = "",
) -> tuple[int, int]:
    """Move each (message document, guard) of `src` to the policy's DLQ, or discard it when there is none or
    the message is not DLQ-eligible. The provenance names `consumer` (the rejecter), or when '' the
    message's last claimer in `src`, if it had one.

    A message moves only if it still is in `src` and matches its guard. Returns (moved, discarded). The moved
    message carries no claim, is claimable at once and gets a new marker in the DLQ. Its ttl there: the DLQ
    ttl if set (for reason "expired", policy.expired_ttl), else what was left of it.
    """
    if not moves:
        return 0, 0
    moves, dropped = await _partition(c, src, policy, moves, now)
    discarded = 0
    for doc, guard in dropped:
        match = {M.ID: doc[M.ID], M.PROJECT: src.project, M.QUEUE: src.name, **guard}
        discarded += (await c.messages.delete_one(match)).deleted_count
    if discarded:
        await count(c, src, {COUNTER.DISCARDED: discarded})
    if policy.dead_letter_queue is None:
        return 0, discarded
    target = QueueRef(src.project, policy.dead_letter_queue)
    dlq = await ensure_queue(c, target, now)
    writes = []
    for doc, guard in moves:
        if doc.get(M.NOT_ELIGIBLE):
            continue
        if reason == "expired":
            e = now + (policy.expired_ttl or 0) * 1000
        elif policy.dead_letter_ttl:
            e = now + policy.dead_letter_ttl * 1000
        else:
            e = doc[M.EXPIRES]
        previous = doc.get(M.DEAD_LETTER) or {}
        provenance = {
            DL.source_queue: src.name,
            DL.reason: reason,
            DL.claim_count: doc[M.CLAIM_COUNT],
            DL.dead_lettered_at_ms: now,
            DL.first_enqueued_at_ms: previous.get(DL.first_enqueued_at_ms, doc[M.CREATED]),
            DL.redrive_count: previous.get(DL.redrive_count, 0),
        }
        if rejection is not None and rejection.reason is not None:
            provenance[DL.rejection_reason] = rejection.reason
        if rejection is not None and rejection.description is not None:
            provenance[DL.rejection_description] = rejection.description
        if who := consumer or doc.get(M.CLAIMER):
            provenance[DL.consumer] = who
        fields = {
            M.CLAIM_COUNT: 0,
            M.AVAILABLE: now,
            M.VISIBLE: now,
            M.CREATED: now,
            M.TTL: math.ceil((e - now) / 1000),
            M.EXPIRES: e,
            M.GC: gc_at(e),
            M.DEAD_LETTER: provenance,
        }
        match = {M.ID: doc[M.ID], M.PROJECT: src.project, M.QUEUE: src.name, **guard}
        writes.append((match, {"$set": fields, "$unset": MOVED_OUT}))
    if owed_to := await subscribers(c, target, dlq, now):
        moved = await move_notifying(c, target, writes, owed_to, now=now)
    else:
        moved = await move_with_markers(c, target, writes)
    if moved:
        await count(c, src, {COUNTER.DEAD_LETTERED: moved, by_reason(reason): moved})
        await count(c, target, {COUNTER.RECEIVED: moved})
    return moved, discarded


async def _partition(
    c: Collections, src: QueueRef, policy: QueuePolicy, moves: Moves, now: int
) -> tuple[Moves, Moves]:
    """The moves that go to the DLQ, and those discarded: all without a DLQ, the ineligible, and what does
    not fit in a DLQ at its `messages_per_queue` quota (as having none: a move may not fail)."""
    if policy.dead_letter_queue is None:
        return [], moves
    eligible = [(d, g) for d, g in moves if not d.get(M.NOT_ELIGIBLE)]
    dropped = [(d, g) for d, g in moves if d.get(M.NOT_ELIGIBLE)]
    room = await message_room(c, QueueRef(src.project, policy.dead_letter_queue), now)
    if room is not None and len(eligible) > room:
        return eligible[:room], [*dropped, *eligible[room:]]
    return eligible, dropped


async def housekeep(c: Collections, q: QueueRef, now: int, policy: QueuePolicy | None = None) -> int:
    """End the lapsed claims of `q` (up to HOUSEKEEP_BATCH): a message that used up its claims moves to the
    DLQ now (promise 7), the others become claimable again. Returns the number of lapsed claims seen."""
    ended = await lapsed(c, now, q, HOUSEKEEP_BATCH).to_list()
    if not ended:
        return 0
    if policy is None:
        policy = await c.policy(q)
    # Guard on the very claim that lapsed: a message claimed again meanwhile is left to its new claim.
    moves = [
        (d, {M.CLAIM: d[M.CLAIM], M.CLAIM_END: d[M.CLAIM_END]})
        for d in ended
        if policy.exhausted(d[M.CLAIM_COUNT])
    ]
    await dead_letter(c, q, policy, moves, now=now, reason="max_claims")
    back = [d for d in ended if not policy.exhausted(d[M.CLAIM_COUNT])]
    # A message waiting out its redelivery backoff (vis past now) shows as delayed from here on.
    for vis, ids in group_ids(back, lambda d: max(d.get(M.VISIBLE, 0), now)).items():
        await c.messages.update_many(
            {M.ID: {"$in": ids}, M.CLAIM_END: {"$lte": now}},
            {"$unset": UNCLAIMED, "$set": {M.AVAILABLE: vis}},
        )
    return len(ended)


def group_ids(docs: Sequence[Doc], key: Callable[[Doc], int]) -> dict[int, list[Any]]:
    """The documents' ids grouped by `key` (one update_many per distinct value)."""
    groups: dict[int, list[Any]] = {}
    for d in docs:
        groups.setdefault(key(d), []).append(d[M.ID])
    return groups
