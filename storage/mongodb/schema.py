"""The MongoDB document layout, its indexes, and the conversions between documents and domain values.

Collections (names prefixed by the namespace, `<ns>.messages` ...; several services can share a database):

  messages  one document per live message of every queue of every project:
            _id (message id), p (project), q (queue), k (marker: per-queue counter, FIFO and paging),
            b (body, JSON bytes), t (ttl s), cr (created ms), e (expires ms), cl (client id),
            cc (claim count), av (claimable from, the delay: ms), vis (claimable from: max(av, claim end
            plus the redelivery wait bo)), c / ce (claim id / claim end ms; absent when no claim holds the
            message), bo (ms: the redelivery wait after the claim that holds it), ne (true: not DLQ-eligible),
            dl {src, rsn, cc, at, first, rc, rr, rd} (provenance, set by a dead-letter move; rc redrive count,
            rr/rd a rejection's text), gc (Date: e + slack, the TTL index's backstop should no sweeper run;
            the sweeper deletes expired messages well before it)
  queues    p, n (name), meta (JSON text, so any key is allowed), pol {dttl ddelay maxpost maxcc dlq dlqttl
            bo expttl maxttl} (the reserved keys parsed), cr. Written by metadata writes (in transactions) and
            lazy creation.
  counters  _id {p, q}: seq (the marker counter), n_dl (dead-lettered out), n_disc, n_rcv (received).
            Written by posts and moves, never in a transaction (counters.py says why).
  claims    _id (claim id), p, q, ttl, grace, cr, e (ms), gc (Date, TTL index: dropped a while after it ends)
  projects  _id (project), mver (metadata version: bumped by every metadata write of the project)
  leases    _id (lease name), owner, until (ms)
  tasks     _id (redrive task id), p, q (the DLQ), status, spec, cr, up, end, cursor, scanned, moved, skipped,
            owner, lease (ms)
  idempotency  _id {p, q, k (an Idempotency-Key)}: fp (the post's fingerprint), ids, until (ms: the end of its
            window), gc (Date, TTL index). Written in the same transaction as the post's messages.

A message lives in exactly one queue: moving it to a DLQ is one update_one of its `q` (and the DLQ fields),
so no crash can leave it in two queues or none (ARCHITECTURE.md §3 promise 1).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from core.metadata import Backoff, DeadLetterDefaults, QueuePolicy
from core.models import ClaimId, DeadLetter, Message, MessageId, QueueRef, Rejection

GC_SLACK_MS = 300_000  # the TTL index drops a document this long after its logical end (memory only)

# Index names, passed as hints: the queries below are shaped for them, and a hint keeps a planner (or a
# wire-compatible server with a simpler one) from choosing a collection scan.
MARKER_INDEX = "marker"  # (p, q, k) unique: listing, oldest/newest, the counter's guard
CLAIMABLE_INDEX = "claimable"  # (p, q, k, vis): claim and pop, oldest first, `vis` checked in the index
CLAIM_INDEX = "claim"  # (c) sparse: the messages a claim holds
LAPSED_INDEX = "lapsed"  # (ce) sparse: claims that have ended, for the sweeper
EXPIRY_INDEX = "expiry"  # (e): expired messages, for the sweeper
QUEUE_INDEX = "queue"  # (p, n) unique on queues


# Field names for code that reads documents outside the store (storage/mongodb/export.py); the module's
# docstring says what each holds.
class Collection(StrEnum):
    MESSAGES = "messages"
    QUEUES = "queues"
    COUNTERS = "counters"
    PROJECTS = "projects"

    def of(self, namespace: str) -> str:
        """The collection's name in `namespace`."""
        return f"{namespace}.{self.value}"


class MessageField(StrEnum):
    ID = "_id"
    PROJECT = "p"
    QUEUE = "q"
    MARKER = "k"
    BODY = "b"
    CREATED = "cr"
    EXPIRES = "e"
    CLAIM_COUNT = "cc"
    DEAD_LETTER = "dl"


class DeadLetterField(StrEnum):
    """The provenance sub-document `dl` of a message."""

    SOURCE = "src"
    REASON = "rsn"
    CLAIM_COUNT = "cc"
    AT = "at"
    FIRST = "first"
    REDRIVES = "rc"
    REJECT_REASON = "rr"
    REJECT_DESCRIPTION = "rd"


class QueueField(StrEnum):
    PROJECT = "p"
    NAME = "n"
    POLICY = "pol"  # read with policy_of()


class CounterField(StrEnum):
    ID = "_id"  # {PROJECT, QUEUE}
    PROJECT = "p"
    QUEUE = "q"
    RECEIVED = "n_rcv"  # dead letters received


@dataclass(frozen=True, slots=True)
class Collections:
    messages: AsyncCollection[dict[str, Any]]
    queues: AsyncCollection[dict[str, Any]]
    counters: AsyncCollection[dict[str, Any]]
    claims: AsyncCollection[dict[str, Any]]
    projects: AsyncCollection[dict[str, Any]]
    leases: AsyncCollection[dict[str, Any]]
    tasks: AsyncCollection[dict[str, Any]]
    idempotency: AsyncCollection[dict[str, Any]]
    defaults: DeadLetterDefaults = field(default_factory=DeadLetterDefaults)

    @classmethod
    def of(
        cls, db: AsyncDatabase[dict[str, Any]], namespace: str, defaults: DeadLetterDefaults | None = None
    ) -> Collections:
        return cls(
            messages=db[f"{namespace}.messages"],
            queues=db[f"{namespace}.queues"],
            counters=db[f"{namespace}.counters"],
            claims=db[f"{namespace}.claims"],
            projects=db[f"{namespace}.projects"],
            leases=db[f"{namespace}.leases"],
            tasks=db[f"{namespace}.tasks"],
            idempotency=db[f"{namespace}.idempotency"],
            defaults=defaults or DeadLetterDefaults(),
        )

    async def ensure_indexes(self) -> None:
        """Create every index the queries use (idempotent; run once per process before the first query)."""
        pq = [("p", ASCENDING), ("q", ASCENDING)]
        await self.messages.create_indexes(
            [
                IndexModel([*pq, ("k", ASCENDING)], name=MARKER_INDEX, unique=True),
                IndexModel([*pq, ("k", ASCENDING), ("vis", ASCENDING)], name=CLAIMABLE_INDEX),
                IndexModel([("c", ASCENDING)], name=CLAIM_INDEX, sparse=True),
                IndexModel([("ce", ASCENDING)], name=LAPSED_INDEX, sparse=True),
                IndexModel([("e", ASCENDING)], name=EXPIRY_INDEX),
                IndexModel([("gc", ASCENDING)], name="gc", expireAfterSeconds=0),
            ]
        )
        await self.queues.create_index([("p", ASCENDING), ("n", ASCENDING)], name=QUEUE_INDEX, unique=True)
        await self.claims.create_index([("gc", ASCENDING)], name="gc", expireAfterSeconds=0)
        await self.tasks.create_index([("status", ASCENDING), ("lease", ASCENDING)], name="runnable")
        await self.tasks.create_index(
            [("p", ASCENDING), ("q", ASCENDING), ("cr", ASCENDING)], name="by_queue"
        )
        await self.tasks.create_index([("gc", ASCENDING)], name="gc", expireAfterSeconds=0)
        await self.idempotency.create_index([("gc", ASCENDING)], name="gc", expireAfterSeconds=0)

    async def policy(self, q: QueueRef) -> QueuePolicy:
        """The policy in force for `q`: its reserved metadata, with the operator's dead-letter defaults where
        it sets nothing (the empty policy, so defaulted, for a queue never created)."""
        return self.defaults.apply(q.name, policy_of(await self.queues.find_one(queue_key(q), {"pol": 1})))

    async def drop(self) -> None:
        for collection in (
            self.messages,
            self.queues,
            self.counters,
            self.claims,
            self.projects,
            self.leases,
            self.tasks,
            self.idempotency,
        ):
            await collection.drop()


def queue_key(q: QueueRef) -> dict[str, Any]:
    """The filter that finds the queue's document in `queues`."""
    return {"p": q.project, "n": q.name}


def gc_at(ms: int) -> dt.datetime:
    """The TTL index's time for a document whose logical life ends at `ms`."""
    return dt.datetime.fromtimestamp((ms + GC_SLACK_MS) / 1000, tz=dt.UTC)


def policy_doc(policy: QueuePolicy) -> dict[str, Any]:
    fields = {
        "dttl": policy.default_message_ttl,
        "ddelay": policy.default_message_delay,
        "maxpost": policy.max_messages_post_size,
        "maxcc": policy.max_claim_count,
        "dlq": policy.dead_letter_queue,
        "dlqttl": policy.dead_letter_ttl,
        "bo": _backoff_doc(policy.backoff),
        "expttl": policy.expired_ttl,
        "maxttl": policy.max_message_ttl,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _backoff_doc(b: Backoff | None) -> dict[str, Any] | None:
    if b is None:
        return None
    return {"d": b.delay_ms, "m": b.multiplier, "x": b.max_ms, "j": b.jitter, "l": list(b.levels_ms)}


def policy_of(queue_doc: dict[str, Any] | None) -> QueuePolicy:
    pol = (queue_doc or {}).get("pol") or {}
    return QueuePolicy(
        default_message_ttl=pol.get("dttl"),
        default_message_delay=pol.get("ddelay"),
        max_messages_post_size=pol.get("maxpost"),
        max_claim_count=pol.get("maxcc"),
        dead_letter_queue=pol.get("dlq"),
        dead_letter_ttl=pol.get("dlqttl"),
        backoff=Backoff(bo["d"], bo["m"], bo["x"], bo["j"], tuple(bo["l"]))
        if (bo := pol.get("bo"))
        else None,
        expired_ttl=pol.get("expttl"),
        max_message_ttl=pol.get("maxttl"),
    )


def message_of(doc: dict[str, Any]) -> Message:
    dead_letter = None
    if dl := doc.get("dl"):
        rejection = None
        if "rr" in dl or "rd" in dl:
            rejection = Rejection(reason=dl.get("rr"), description=dl.get("rd"))
        dead_letter = DeadLetter(
            source_queue=dl["src"],
            reason=dl["rsn"],
            claim_count=dl["cc"],
            dead_lettered_at_ms=dl["at"],
            first_enqueued_at_ms=dl["first"],
            redrive_count=dl.get("rc", 0),
            rejection=rejection,
        )
    return Message(
        id=MessageId(doc["_id"]),
        queue=doc["q"],
        body=orjson.loads(doc["b"]),
        ttl=doc["t"],
        created_ms=doc["cr"],
        expires_ms=doc["e"],
        claim_count=doc["cc"],
        claim_id=ClaimId(doc["c"]) if doc.get("c") else None,
        claim_expires_ms=doc.get("ce", 0),
        client_id=doc["cl"],
        dead_letter=dead_letter,
        dead_letter_eligible=not doc.get("ne", False),
    )
