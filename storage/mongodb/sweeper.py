"""The background sweep on MongoDB (docs/contract.md promise 7) and the lease for it."""

from __future__ import annotations

from pymongo.errors import DuplicateKeyError

from core.models import QueueRef
from storage.mongodb.moves import dead_letter, housekeep
from storage.mongodb.queries import MOVE_FIELDS, Doc, lapsed
from storage.mongodb.schema import EXPIRY_INDEX, LEASE, Collections
from storage.mongodb.schema import MESSAGE as M

SWEEP_BATCH = 500  # lapsed claims one sweep round looks at
SWEEP_ROUNDS = 20


async def sweep_all(c: Collections, now: int) -> int:
    """End every lapsed claim (moving exhausted messages to their DLQ) and delete expired messages (or move
    them to their DLQ, with `_dead_letter_on_expiry`), in every project. Both are found through an index of
    their own (lapsed claims, expiry), so the work is O(what is due), however many queues exist. Returns the
    number of queues visited."""
    visited: set[tuple[str, str]] = set()
    for _ in range(SWEEP_ROUNDS):
        ended = await lapsed(c, now, limit=SWEEP_BATCH).to_list()
        due = {(d[M.PROJECT], d[M.QUEUE]) for d in ended}
        for project, name in sorted(due):
            await housekeep(c, QueueRef(project, name), now)
        visited |= due
        if len(ended) < SWEEP_BATCH:
            break
    for _ in range(SWEEP_ROUNDS):
        expired = await (
            c.messages.find({M.EXPIRES: {"$lte": now}}, {**MOVE_FIELDS, M.PROJECT: 1, M.QUEUE: 1})
            .hint(EXPIRY_INDEX)
            .limit(SWEEP_BATCH)
            .to_list()
        )
        by_queue: dict[tuple[str, str], list[Doc]] = {}
        for d in expired:
            by_queue.setdefault((d[M.PROJECT], d[M.QUEUE]), []).append(d)
        for (project, name), docs in sorted(by_queue.items()):
            await expire(c, QueueRef(project, name), docs, now)
        visited |= set(by_queue)
        if len(expired) < SWEEP_BATCH:
            break
    return len(visited)


async def expire(c: Collections, q: QueueRef, docs: list[Doc], now: int) -> None:
    """Messages of `q` whose ttl ran out: moved to the DLQ with reason "expired" when the queue has
    `_dead_letter_on_expiry`, else deleted. Guarded on the expiry, so a claim renewed meanwhile keeps them."""
    policy = await c.policy(q)
    if policy.expired_ttl is not None:
        moves = [(d, {M.EXPIRES: {"$lte": now}}) for d in docs]
        await dead_letter(c, q, policy, moves, now=now, reason="expired")
        return
    await c.messages.delete_many({M.ID: {"$in": [d[M.ID] for d in docs]}, M.EXPIRES: {"$lte": now}})


async def take_lease(c: Collections, name: str, owner: str, *, now: int, ms: int) -> bool:
    """Hold lease `name` for `ms` if nobody holds it now."""
    try:
        await c.leases.update_one(
            {LEASE.ID: name, LEASE.UNTIL: {"$lte": now}},
            {"$set": {LEASE.UNTIL: now + ms, LEASE.OWNER: owner}},
            upsert=True,
        )
    except DuplicateKeyError:
        return False  # the document exists and its lease has not ended: someone else holds it
    return True
