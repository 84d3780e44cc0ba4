"""The claim step on MongoDB: which messages a claim takes, and the dead-letter moves on the way."""

from __future__ import annotations

from typing import Any

from core.metadata import QueuePolicy
from core.models import ClaimId, QueueRef
from storage.mongodb.moves import dead_letter
from storage.mongodb.queries import CLAIM_FIELDS, Doc, claim_candidates, claimable
from storage.mongodb.schema import MESSAGE as M
from storage.mongodb.schema import Collections, gc_at

CLAIM_ROUNDS = 1000  # a claim stops after this many rounds that lost every candidate to other claimers


async def take_messages(
    c: Collections,
    q: QueueRef,
    policy: QueuePolicy,
    claim_id: ClaimId,
    *,
    now: int,
    until: int,
    keep_until: int,
    limit: int,
    client_id: str = "",
) -> tuple[list[Doc] | None, int, int]:
    """Claim up to `limit` messages of `q` for `claim_id` (by `client_id`, kept on each as its last
    claimer) until `until`, oldest first; returns (the claimed
    messages' documents as they now are, dead-lettered, discarded). The documents are the candidates read
    with the changes the claim made; when a round lost some of its candidates to another claimer, which
    ones it got is known only by reading them back (claimed is then None; the caller reads).

    Each round reads the oldest claimable messages, up to the number still wanted. The exhausted ones are
    moved (or discarded); the others are claimed by one update_many that increments each one's claim count
    in the same write (promise 5) and re-checks claimability per message, so a message another claimer took
    meanwhile is skipped and the next round fills the claim up (promise 4). A claimed message lives at least
    until `keep_until` (Zaqar's grace rule).
    """
    guard = claimable(q, now)
    if policy.max_claim_count is not None:
        guard[M.CLAIM_COUNT] = {"$lt": policy.max_claim_count}
    got = moved = discarded = 0
    claimed: list[Doc] | None = []
    for _ in range(CLAIM_ROUNDS):
        candidates = await claim_candidates(c, q, now, limit - got, CLAIM_FIELDS).to_list()
        if not candidates:
            break
        spent = [
            (d, {M.VISIBLE: {"$lte": now}, M.CLAIM_COUNT: d[M.CLAIM_COUNT]})
            for d in candidates
            if policy.exhausted(d[M.CLAIM_COUNT])
        ]
        m, d = await dead_letter(c, q, policy, spent, now=now, reason="max_claims")
        moved, discarded = moved + m, discarded + d
        fresh = [d for d in candidates if not policy.exhausted(d[M.CLAIM_COUNT])]
        n = await _claim_fresh(
            c, policy, fresh, guard, claim_id, until=until, keep_until=keep_until, client_id=client_id
        )
        got += n
        if claimed is not None and n == len(fresh):
            claimed += [_as_claimed(d, claim_id, until, keep_until, policy, client_id) for d in fresh]
        elif n:
            claimed = None
        if got >= limit:
            break
    return claimed if got else [], moved, discarded


def _as_claimed(
    doc: Doc, claim_id: ClaimId, until: int, keep_until: int, policy: QueuePolicy, client_id: str
) -> Doc:
    """A candidate's document with what _claim_fresh wrote to it."""
    wait = policy.backoff.wait_ms(doc[M.ID], doc[M.CLAIM_COUNT] + 1) if policy.backoff else 0
    return {
        **doc,
        M.CLAIM: claim_id,
        M.CLAIMER: client_id,
        M.CLAIM_END: until,
        M.VISIBLE: until + wait,
        M.CLAIM_COUNT: doc[M.CLAIM_COUNT] + 1,
        M.EXPIRES: max(doc[M.EXPIRES], keep_until),
    }


async def _claim_fresh(
    c: Collections,
    policy: QueuePolicy,
    fresh: list[Doc],
    guard: Doc,
    claim_id: ClaimId,
    *,
    until: int,
    keep_until: int,
    client_id: str,
) -> int:
    """Claim the `fresh` candidates that still match `guard`; returns how many were claimed.

    Without a redelivery backoff, one update_many. With one, a message becomes claimable again only its
    backoff after the claim ends (vis = until + bo), and bo depends on its new claim count (and its id, for
    jitter): one update_many per distinct wait, each also guarded on the claim count it was computed from.
    """
    if not fresh:
        return 0
    update: Doc = {
        "$set": {M.CLAIM: claim_id, M.CLAIM_END: until, M.VISIBLE: until, M.CLAIMER: client_id},
        "$inc": {M.CLAIM_COUNT: 1},
        "$max": {M.EXPIRES: keep_until, M.GC: gc_at(keep_until)},
    }
    backoff = policy.backoff
    if backoff is None:
        r = await c.messages.update_many({M.ID: {"$in": [d[M.ID] for d in fresh]}, **guard}, update)
        return r.modified_count
    groups: dict[tuple[int, int], list[Any]] = {}
    for d in fresh:
        cc = d[M.CLAIM_COUNT]
        groups.setdefault((cc, backoff.wait_ms(d[M.ID], cc + 1)), []).append(d[M.ID])
    got = 0
    for (cc, wait), ids in groups.items():
        set_fields = {
            M.CLAIM: claim_id,
            M.CLAIM_END: until,
            M.VISIBLE: until + wait,
            M.BACKOFF: wait,
            M.CLAIMER: client_id,
        }
        r = await c.messages.update_many(
            {M.ID: {"$in": ids}, **guard, M.CLAIM_COUNT: cc}, {**update, "$set": set_fields}
        )
        got += r.modified_count
    return got
