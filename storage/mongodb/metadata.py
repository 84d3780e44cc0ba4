"""Queue metadata writes: compare-and-set against the project's metadata version, in the caller's transaction
(the version and the queue's metadata are two documents, and the DLQ cycle check reads several queues)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.errors import DuplicateKeyError

from core.errors import MetadataChanged
from core.metadata import QueuePolicy
from core.models import QueueRef
from storage.mongodb.counters import take_queue_slot
from storage.mongodb.schema import PROJECT, QUEUE, Collections, policy_doc, queue_key

STALE = "The queue metadata of this project changed meanwhile; read it again."


async def bump_version(
    c: Collections, project: str, expected: int | None, session: AsyncClientSession
) -> None:
    """Bump the project's metadata version; MetadataChanged when it is no longer `expected` (None: bump
    regardless)."""
    p = PROJECT
    bump = {"$inc": {p.METADATA_VERSION: 1}}
    if expected is None:
        await c.projects.update_one({p.ID: project}, bump, upsert=True, session=session)
        return
    try:
        # Version 0 is "no document yet": the upsert creates it, and fails if it exists with another.
        r = await c.projects.update_one(
            {p.ID: project, p.METADATA_VERSION: expected}, bump, upsert=expected == 0, session=session
        )
    except DuplicateKeyError:
        raise MetadataChanged(STALE) from None
    if r.matched_count == 0 and r.upserted_id is None:
        raise MetadataChanged(STALE)


async def write_metadata(
    c: Collections,
    q: QueueRef,
    metadata: Mapping[str, Any],
    policy: QueuePolicy,
    expected_version: int | None,
    *,
    now: int,
    session: AsyncClientSession,
    max_queues: int | None = None,
) -> None:
    """Replace the queue's metadata and policy, creating the queue, if the project is at that version (and
    has room under `max_queues`, its `queues` quota, for the queue and the DLQ the policy names, those of
    them that do not exist yet)."""
    if max_queues is not None:
        names = {q.name, policy.dead_letter_queue or q.name}  # and the DLQ it names, made by its first move
        found = await c.queues.count_documents(
            {QUEUE.PROJECT: q.project, QUEUE.NAME: {"$in": list(names)}}, session=session
        )
        if found < len(names):
            await take_queue_slot(c, q.project, len(names) - found, max_queues, session)
    await bump_version(c, q.project, expected_version, session)
    await c.queues.update_one(
        queue_key(q),
        {
            "$set": {QUEUE.META: orjson.dumps(dict(metadata)).decode(), QUEUE.POLICY: policy_doc(policy)},
            "$setOnInsert": {QUEUE.CREATED: now},
        },
        upsert=True,
        session=session,
    )
