"""The claim step on MongoDB: which messages a claim takes, and the dead-letter moves on the way."""

from __future__ import annotations

from core.metadata import QueuePolicy
from core.models import ClaimId, QueueRef
from storage.mongodb.moves import dead_letter
from storage.mongodb.queries import claim_candidates, claimable
from storage.mongodb.schema import Collections, exhausted, gc_at

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
) -> tuple[int, int, int]:
    """Claim up to `limit` messages of `q` for `claim_id` until `until`, oldest first; returns (claimed,
    dead-lettered, discarded).

    Each round reads the oldest claimable messages, up to the number still wanted. The exhausted ones are
    moved (or discarded); the others are claimed by one update_many that increments each one's claim count
    in the same write (promise 5) and re-checks claimability per message, so a message another claimer took
    meanwhile is skipped and the next round fills the claim up (promise 4). A claimed message lives at least
    until `keep_until` (Zaqar's grace rule).
    """
    guard = claimable(q, now)
    if policy.max_claim_count is not None:
        guard["cc"] = {"$lt": policy.max_claim_count}
    got = moved = discarded = 0
    for _ in range(CLAIM_ROUNDS):
        candidates = await claim_candidates(c, q, now, limit - got).to_list()
        if not candidates:
            break
        spent = [(d, {"vis": {"$lte": now}, "cc": d["cc"]}) for d in candidates if exhausted(policy, d["cc"])]
        m, d = await dead_letter(c, q, policy, spent, now=now, reason="max_claims")
        moved, discarded = moved + m, discarded + d
        fresh = [d["_id"] for d in candidates if not exhausted(policy, d["cc"])]
        if fresh:
            r = await c.messages.update_many(
                {"_id": {"$in": fresh}, **guard},
                {
                    "$set": {"c": claim_id, "ce": until, "vis": until},
                    "$inc": {"cc": 1},
                    "$max": {"e": keep_until, "gc": gc_at(keep_until)},
                },
            )
            got += r.modified_count
        if got >= limit:
            break
    return got, moved, discarded
