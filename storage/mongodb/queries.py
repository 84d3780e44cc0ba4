"""The hot queries, each shaped for one index (schema.py) and hinted to it; tests explain() these very cursors
to check that none of them scans the collection."""

from __future__ import annotations

from typing import Any

from pymongo.asynchronous.cursor import AsyncCursor

from core.models import ClaimId, QueueRef
from storage.mongodb.schema import (
    CLAIM_INDEX,
    CLAIMABLE_INDEX,
    LAPSED_INDEX,
    MARKER_INDEX,
    SUBSCRIPTION,
    SUBSCRIPTIONS_INDEX,
    Collections,
    subscriptions_of,
)
from storage.mongodb.schema import MESSAGE as M

Doc = dict[str, Any]
# The fields a dead-letter move reads from the message it moves (the claim fields let a caller guard on them).
MOVE_FIELDS = {
    M.CLAIM_COUNT: 1,
    M.CREATED: 1,
    M.EXPIRES: 1,
    M.DEAD_LETTER: 1,
    M.CLAIM: 1,
    M.CLAIM_END: 1,
    M.NOT_ELIGIBLE: 1,
    M.VISIBLE: 1,
    M.CLAIMER: 1,
}
# What a claim reads of its candidates: everything but the indexing fields, so that it can answer with the
# messages it claimed without reading them again.
CLAIM_FIELDS = {M.GC: 0, M.BACKOFF: 0}


def claimable(q: QueueRef, now: int) -> Doc:
    """Messages of `q` a claim may take now: not delayed, not under a live claim, not expired."""
    return {M.PROJECT: q.project, M.QUEUE: q.name, M.VISIBLE: {"$lte": now}, M.EXPIRES: {"$gt": now}}


def not_claimed(now: int) -> Doc:
    return {"$not": {"$gt": now}}  # no claim end, or one that has passed


def claim_candidates(
    c: Collections, q: QueueRef, now: int, n: int, fields: Doc | None = None
) -> AsyncCursor[Doc]:
    """The `n` oldest claimable messages of `q` (claim): the index keeps them in marker order and checks `vis`
    in its keys, so messages under a claim are skipped without being fetched."""
    projection = MOVE_FIELDS if fields is None else fields
    return c.messages.find(claimable(q, now), projection).sort(M.MARKER, 1).hint(CLAIMABLE_INDEX).limit(n)


def listing(
    c: Collections,
    q: QueueRef,
    *,
    now: int,
    marker: int,
    limit: int,
    echo: bool,
    client_id: str,
    include_claimed: bool,
    include_delayed: bool,
) -> AsyncCursor[Doc]:
    """Up to `limit` live messages of `q` after `marker`, in marker order, without the ones the flags hide."""
    query: Doc = {M.PROJECT: q.project, M.QUEUE: q.name, M.MARKER: {"$gt": marker}, M.EXPIRES: {"$gt": now}}
    if not include_claimed:
        query[M.CLAIM_END] = not_claimed(now)
    if not include_delayed:
        query[M.AVAILABLE] = {"$lte": now}
    if not echo:
        query[M.CLIENT] = {"$ne": client_id}
    return c.messages.find(query).sort(M.MARKER, 1).hint(MARKER_INDEX).limit(limit)


def held(q: QueueRef, claim_id: ClaimId, now: int) -> Doc:
    """The live messages of `q` that claim `claim_id` holds."""
    return {M.CLAIM: claim_id, M.PROJECT: q.project, M.QUEUE: q.name, M.EXPIRES: {"$gt": now}}


def held_by(
    c: Collections, q: QueueRef, claim_id: ClaimId, now: int, extra: Doc | None = None
) -> AsyncCursor[Doc]:
    """The live messages of `q` that claim `claim_id` holds, in marker order."""
    return c.messages.find({**held(q, claim_id, now), **(extra or {})}).sort(M.MARKER, 1).hint(CLAIM_INDEX)


def lapsed(c: Collections, now: int, q: QueueRef | None = None, limit: int = 0) -> AsyncCursor[Doc]:
    """Messages whose claim has ended but not been cleared yet (of `q`, or of every queue: the sweeper)."""
    query: Doc = {M.CLAIM_END: {"$lte": now}}
    if q is not None:
        query[M.PROJECT], query[M.QUEUE] = q.project, q.name
    return c.messages.find(query, {**MOVE_FIELDS, M.PROJECT: 1, M.QUEUE: 1}).hint(LAPSED_INDEX).limit(limit)


def notified(c: Collections, q: QueueRef, now: int) -> AsyncCursor[Doc]:
    """The ids of the live confirmed subscriptions of `q`: those a post to it, or a move into it, owes."""
    s = SUBSCRIPTION
    query = {**subscriptions_of(q), s.EXPIRES: {"$gt": now}, s.CONFIRMED: True}
    return c.subscriptions.find(query, {s.ID: 1}).hint(SUBSCRIPTIONS_INDEX)
