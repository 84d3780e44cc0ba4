"""The background sweep on MongoDB (ARCHITECTURE.md §3 promise 7) and the lease for it."""

from __future__ import annotations

from pymongo.errors import DuplicateKeyError

from core.models import QueueRef
from storage.mongodb.moves import housekeep
from storage.mongodb.queries import lapsed
from storage.mongodb.schema import EXPIRY_INDEX, Collections

SWEEP_BATCH = 500  # lapsed claims one sweep round looks at
SWEEP_ROUNDS = 20


async def sweep_all(c: Collections, now: int) -> int:
    """End every lapsed claim (moving exhausted messages to their DLQ) and delete expired messages, in every
    project. Both are found through an index of their own (lapsed claims, expiry), so the work is O(what is
    due), however many queues exist. Returns the number of queues visited."""
    visited: set[tuple[str, str]] = set()
    for _ in range(SWEEP_ROUNDS):
        ended = await lapsed(c, now, limit=SWEEP_BATCH).to_list()
        due = {(d["p"], d["q"]) for d in ended}
        for project, name in sorted(due):
            await housekeep(c, QueueRef(project, name), now)
        visited |= due
        if len(ended) < SWEEP_BATCH:
            break
    await c.messages.delete_many({"e": {"$lte": now}}, hint=EXPIRY_INDEX)
    return len(visited)


async def take_lease(c: Collections, name: str, owner: str, *, now: int, ms: int) -> bool:
    """Hold lease `name` for `ms` if nobody holds it now."""
    try:
        await c.leases.update_one(
            {"_id": name, "until": {"$lte": now}}, {"$set": {"until": now + ms, "owner": owner}}, upsert=True
        )
    except DuplicateKeyError:
        return False  # the document exists and its lease has not ended: someone else holds it
    return True
