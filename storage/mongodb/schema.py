"""The MongoDB document layout, its indexes, and the conversions between documents and domain values.

The one owner of the layout: every collection and field name (and dotted path) the driver uses is spelled
here and nowhere else; tests/storage/test_mongo_layout.py holds the other modules to that, and what the store
writes to exactly these fields.

Collections (names prefixed by the namespace, `<ns>.messages` ...; several services can share a database):

  messages  one document per live message of every queue of every project:
            _id (message id), p (project), q (queue), k (marker: per-queue counter, FIFO and paging),
            b (body, JSON bytes), t (ttl s), cr (created ms), e (expires ms), cl (client id),
            cc (claim count), av (claimable from, the delay: ms), vis (claimable from: max(av, claim end
            plus the redelivery wait bo)), c / ce (claim id / claim end ms; absent when no claim holds the
            message), bo (ms: the redelivery wait after the claim that holds it), ne (true: not DLQ-eligible),
            dl (the provenance, set by a dead-letter move: core.models.PROVENANCE's fields, src, rsn, ...,
            rc the redrive count; DeadLetterFields), gc (Date: e + slack, the TTL index's backstop should no
            sweeper run; the sweeper deletes expired messages well before it)
  queues    p, n (name), meta (JSON text, so any key is allowed), pol (the reserved keys parsed: core's
            policy fields, the backoff's in bo {d m x j l}; PolicyFields), cr, subs (how many subscription
            documents the queue has: absent or 0 lets a post or a move into it skip the outbox). Written by
            metadata writes (in transactions), lazy creation, and every subscription write (in its
            transaction).
  counters  _id {p, q}: seq (the marker counter), n_dl (dead-lettered out), n_rsn {max_claims, expired,
            rejected} (n_dl by reason), n_disc, n_rcv (received), n_rdr (redriven out of it, as a DLQ).
            Written by posts and moves, never in a transaction (counters.py says why).
  claims    _id (claim id), p, q, ttl, grace, cr, e (ms), gc (Date, TTL index: dropped a while after it ends);
            deleted with their queue (a claim does not outlive its queue, as in Zaqar)
  projects  _id (project), mver (metadata version: bumped by every metadata write of the project)
  quotas    _id (project), quota (the project's quota overrides, by quota name: core/quotas.py), rate {reads,
            writes} (its request-rate token buckets: tk tokens left, at ms of the last take; quotas.py), qc
            (bumped by each queue creation counted against a `queues` quota, in its transaction: counters.py),
            sc (the same, for each subscription made under a `subscriptions` quota: subscriptions.py)
  leases    _id (lease name), owner, until (ms)
  tasks     _id (redrive task id), p, q (the DLQ), status, spec, cr, up, end, cursor, scanned, moved, skipped,
            owner, lease (ms)
  idempotency  _id {p, q, k (an Idempotency-Key)}: fp (the post's fingerprint), ids, until (ms: the end of its
            window), gc (Date, TTL index). Written in the same transaction as the post's messages.
  subscriptions  _id (subscription id), p, q, u (subscriber URI, unique per p, q), ttl (s), opt (options, JSON
            text: round-trips any object exactly), cr, e (expires ms), ok (confirmed), gc (Date, TTL index)
  deliveries  the outbox: _id, p, q (the subscription's queue), s (subscription id), kind, m (the message as
            posted or dead-lettered: the message fields _id q b t cr e cl cc dl; absent for a confirmation or
            an unsubscribe), n (failed attempts), cr, due (ms: due from, or the end of the lease), owner.
            Written in the same transaction as what owes them (outbox.py).

A message lives in exactly one queue: moving it to a DLQ is one update_one of its `q` (and the DLQ fields),
so no crash can leave it in two queues or none (docs/contract.md promise 1). Into a DLQ with subscriptions,
that update_one and the inserts of its deliveries are one transaction (outbox.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from enum import StrEnum
from typing import Any

import orjson
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from core.metadata import (
    POLICY_FIELDS,
    STORED,
    DeadLetterDefaults,
    QueuePolicy,
    policy_fields,
    policy_from_fields,
)
from core.models import (
    PROVENANCE,
    ClaimId,
    DeadLetterReason,
    Delivery,
    Message,
    MessageId,
    QueueRef,
    Subscription,
    SubscriptionId,
    provenance_reader,
)
from core.quotas import QUOTAS, READS, WRITES, Counted
from core.sealing import body_of

GC_SLACK_MS = 300_000  # the TTL index drops a document this long after its logical end (memory only)

# Index names, passed as hints: the queries below are shaped for them, and a hint keeps a planner (or a
# wire-compatible server with a simpler one) from choosing a collection scan.
MARKER_INDEX = "marker"  # (p, q, k) unique: listing, oldest/newest, the counter's guard
CLAIMABLE_INDEX = "claimable"  # (p, q, k, vis): claim and pop, oldest first, `vis` checked in the index
CLAIM_INDEX = "claim"  # (c) sparse: the messages a claim holds
LAPSED_INDEX = "lapsed"  # (ce) sparse: claims that have ended, for the sweeper
EXPIRY_INDEX = "expiry"  # (e): expired messages, for the sweeper
QUEUE_INDEX = "queue"  # (p, n) unique on queues
GC_INDEX = "gc"  # (gc) TTL index, on each collection whose documents end
RUNNABLE_INDEX = "runnable"  # (status, lease) on tasks
TASKS_INDEX = "by_queue"  # (p, q, cr) on tasks
CLAIMS_INDEX = "by_queue"  # (p, q) on claims: a queue's, deleted with it
SUBSCRIPTIONS_INDEX = "by_queue"  # (p, q, _id, e) on subscriptions: listing, counting, those a post owes
SUBSCRIBER_INDEX = "subscriber"  # (p, q, u) unique on subscriptions
DUE_INDEX = "due"  # (due) on deliveries: leasing, the outbox's lag
OWED_INDEX = "owed"  # (s) on deliveries: what a subscription is owed, dropped with it


class Collection(StrEnum):
    MESSAGES = "messages"
    QUEUES = "queues"
    COUNTERS = "counters"
    CLAIMS = "claims"
    PROJECTS = "projects"
    LEASES = "leases"
    TASKS = "tasks"
    IDEMPOTENCY = "idempotency"
    SUBSCRIPTIONS = "subscriptions"
    DELIVERIES = "deliveries"
    QUOTAS = "quotas"

    def of(self, namespace: str) -> str:
        """The collection's name in `namespace`."""
        return f"{namespace}.{self.value}"


# The field names of each collection (and sub-document), the only place they are spelled; the module's
# docstring says what each holds. Each is one instance of a frozen dataclass whose attributes are plain str:
# they read as fast as a literal or a module constant, where an enum member costs 70-110 ns an access on
# CPython 3.11, and PyMongo encodes them exactly as it does literals. Other modules alias the two busiest:
# `MESSAGE as M`, `DEAD_LETTER as DL`.


@dataclass(frozen=True, slots=True)
class MessageFields:
    ID: str = "_id"
    PROJECT: str = "p"
    QUEUE: str = "q"
    MARKER: str = "k"
    BODY: str = "b"
    TTL: str = "t"
    CREATED: str = "cr"
    EXPIRES: str = "e"
    CLIENT: str = "cl"
    CLAIM_COUNT: str = "cc"
    AVAILABLE: str = "av"  # the delay
    VISIBLE: str = "vis"  # claimable from
    CLAIM: str = "c"
    CLAIM_END: str = "ce"
    BACKOFF: str = "bo"
    NOT_ELIGIBLE: str = "ne"
    CLAIMER: str = "ccl"  # the Client-ID of its last claimer in this queue (a dead-letter move takes it)
    DEAD_LETTER: str = "dl"  # DeadLetterFields
    GC: str = "gc"


# The provenance sub-document `dl` of a message: each core.models.PROVENANCE row's field under its own name,
# by the row's key (a provenance field's row names the field it is stored under, so a new one needs no change
# here). Read with message_of().
DeadLetterFields = make_dataclass(
    "DeadLetterFields",
    [(p.key, str, field(default=p.field)) for p in PROVENANCE],
    frozen=True,
    slots=True,
)


@dataclass(frozen=True, slots=True)
class QueueFields:
    ID: str = "_id"
    PROJECT: str = "p"
    NAME: str = "n"
    META: str = "meta"
    POLICY: str = "pol"  # PolicyFields, read with policy_of()
    CREATED: str = "cr"
    SUBSCRIPTIONS: str = "subs"  # how many subscription documents the queue has


@dataclass(frozen=True, slots=True)
class BackoffFields:
    """The sub-document `bo` of a policy (core.metadata.Backoff), by Backoff's attribute."""

    delay_ms: str = "d"
    multiplier: str = "m"
    max_ms: str = "x"
    jitter: str = "j"
    levels_ms: str = "l"


# core's policy fields that hold a part of the backoff, and their names in `bo`
IN_BACKOFF: Mapping[str, str] = {
    name: getattr(BackoffFields(), path.removeprefix("backoff."))
    for name, path in STORED
    if path.startswith("backoff.")
}
# The sub-document `pol` of a queue: the reserved metadata parsed (core.metadata.QueuePolicy), each field
# under core's name (core.metadata.POLICY_FIELDS: a reserved key's row names its field, so a new key needs
# no change here), but the backoff's, nested in `bo` (BackoffFields) as they were first stored, so that
# processes of every version read the same documents in a rolling restart. Read with policy_of().
PolicyFields = make_dataclass(
    "PolicyFields",
    [(f, str, field(default=f)) for f in POLICY_FIELDS if f not in IN_BACKOFF]
    + [("BACKOFF", str, field(default="bo"))],
    frozen=True,
    slots=True,
)


@dataclass(frozen=True, slots=True)
class CounterFields:
    ID: str = "_id"  # {PROJECT, QUEUE}
    PROJECT: str = "p"
    QUEUE: str = "q"
    SEQ: str = "seq"  # the marker counter
    DEAD_LETTERED: str = "n_dl"  # moved out to the DLQ
    BY_REASON: str = "n_rsn"  # {DeadLetterReason: count}: n_dl by reason
    DISCARDED: str = "n_disc"
    RECEIVED: str = "n_rcv"  # dead letters received
    REDRIVEN: str = "n_rdr"  # moved out by a redrive (this queue as a DLQ)


@dataclass(frozen=True, slots=True)
class ClaimFields:
    ID: str = "_id"
    PROJECT: str = "p"
    QUEUE: str = "q"
    TTL: str = "ttl"
    GRACE: str = "grace"
    CREATED: str = "cr"
    EXPIRES: str = "e"
    GC: str = "gc"


@dataclass(frozen=True, slots=True)
class ProjectFields:
    ID: str = "_id"
    METADATA_VERSION: str = "mver"


@dataclass(frozen=True, slots=True)
class ProjectQuotaFields:
    """A project's document of `quotas` (quotas.py): its own collection, so that a rate taken before the
    project's first metadata write never makes a `projects` document without its version."""

    ID: str = "_id"  # the project
    QUOTA: str = "quota"  # QuotaFields: the project's quota overrides
    RATE: str = "rate"  # RateFields: its request-rate token buckets
    CREATIONS: str = "qc"  # bumped by each queue creation under a `queues` quota (counters.py)
    SUBSCRIBING: str = "sc"  # bumped by each subscription made under a `subscriptions` quota
    POSTING: str = "bc"  # bumped by each post made under a `message_bytes` quota


# The sub-document `quota` of a project: an override a quota, under the quota's name (core's, as a policy
# field's is core's).
QuotaFields = make_dataclass(
    "QuotaFields", [(q.name.upper(), str, field(default=q.name)) for q in QUOTAS], frozen=True, slots=True
)


@dataclass(frozen=True, slots=True)
class RateFields:
    """The sub-document `rate` of a project: a token bucket (BucketFields) by core.quotas.Bucket."""

    READS: str = READS
    WRITES: str = WRITES


@dataclass(frozen=True, slots=True)
class BucketFields:
    TOKENS: str = "tk"  # tokens left at AT (a float)
    AT: str = "at"  # ms of the last take


@dataclass(frozen=True, slots=True)
class LeaseFields:
    ID: str = "_id"  # the lease's name
    OWNER: str = "owner"
    UNTIL: str = "until"


@dataclass(frozen=True, slots=True)
class TaskFields:
    ID: str = "_id"
    PROJECT: str = "p"
    QUEUE: str = "q"  # the DLQ
    STATUS: str = "status"
    SPEC: str = "spec"  # RedriveSpec.to_dict()
    CREATED: str = "cr"
    UPDATED: str = "up"
    END: str = "end"  # the DLQ's last marker when it began; 0 for a task of listed ids
    IDS_END: str = "ids"  # a task of listed ids: how many (its cursor counts ids)
    SIGNATURE_END: str = "sigend"  # a task with a signature filter walking markers: its END (END is 0)
    CURSOR: str = "cursor"
    SCANNED: str = "scanned"
    MOVED: str = "moved"
    SKIPPED: str = "skipped"
    OWNER: str = "owner"
    LEASE: str = "lease"
    GC: str = "gc"


@dataclass(frozen=True, slots=True)
class IdempotencyFields:
    ID: str = "_id"  # {PROJECT, QUEUE, KEY}
    PROJECT: str = "p"
    QUEUE: str = "q"
    KEY: str = "k"  # the Idempotency-Key
    FINGERPRINT: str = "fp"
    IDS: str = "ids"
    UNTIL: str = "until"
    GC: str = "gc"


@dataclass(frozen=True, slots=True)
class SubscriptionFields:
    ID: str = "_id"
    PROJECT: str = "p"
    QUEUE: str = "q"
    SUBSCRIBER: str = "u"
    TTL: str = "ttl"
    OPTIONS: str = "opt"  # JSON text
    CREATED: str = "cr"
    EXPIRES: str = "e"
    CONFIRMED: str = "ok"
    GC: str = "gc"


@dataclass(frozen=True, slots=True)
class DeliveryFields:
    ID: str = "_id"
    PROJECT: str = "p"
    QUEUE: str = "q"  # the subscription's
    SUBSCRIPTION: str = "s"
    KIND: str = "kind"  # DeliveryKind
    MESSAGE: str = "m"  # a message document's DELIVERED fields (MessageFields names)
    ATTEMPTS: str = "n"
    CREATED: str = "cr"
    DUE: str = "due"
    OWNER: str = "owner"


MESSAGE = MessageFields()
DEAD_LETTER = DeadLetterFields()
_read_provenance = provenance_reader({p.key: getattr(DEAD_LETTER, p.key) for p in PROVENANCE})
QUEUE = QueueFields()
POLICY = PolicyFields()
BACKOFF = BackoffFields()
COUNTER = CounterFields()
CLAIM = ClaimFields()
PROJECT = ProjectFields()
PROJECT_QUOTA = ProjectQuotaFields()
QUOTA_OVERRIDES = QuotaFields()
RATE = RateFields()
BUCKET = BucketFields()
LEASE = LeaseFields()
TASK = TaskFields()
IDEMPOTENCY = IdempotencyFields()
SUBSCRIPTION = SubscriptionFields()
DELIVERY = DeliveryFields()

# Dotted paths into sub-documents, for queries and updates.
REDRIVES_PATH = f"{MESSAGE.DEAD_LETTER}.{DEAD_LETTER.redrive_count}"
SOURCE_PATH = f"{MESSAGE.DEAD_LETTER}.{DEAD_LETTER.source_queue}"  # the queue a dead letter was moved out of
COUNTER_PROJECT_PATH = f"{COUNTER.ID}.{COUNTER.PROJECT}"
# The fields of a message document a delivery keeps (the message as it was posted or dead-lettered).
DELIVERED = dict.fromkeys(
    (
        MESSAGE.ID,
        MESSAGE.QUEUE,
        MESSAGE.BODY,
        MESSAGE.TTL,
        MESSAGE.CREATED,
        MESSAGE.EXPIRES,
        MESSAGE.CLIENT,
        MESSAGE.CLAIM_COUNT,
        MESSAGE.DEAD_LETTER,
    ),
    1,
)
# The $unset that takes a message out of its claim (with the claim's redelivery wait); shared, never mutated.
UNCLAIMED: Mapping[str, str] = {MESSAGE.CLAIM: "", MESSAGE.CLAIM_END: "", MESSAGE.BACKOFF: ""}
# The $unset of a move to another queue (dead letter, redrive): its last claimer belongs to the queue it left.
MOVED_OUT: Mapping[str, str] = {**UNCLAIMED, MESSAGE.CLAIMER: ""}


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
    subscriptions: AsyncCollection[dict[str, Any]]
    deliveries: AsyncCollection[dict[str, Any]]
    quotas: AsyncCollection[dict[str, Any]]
    defaults: DeadLetterDefaults = field(default_factory=DeadLetterDefaults)
    counted: Counted = field(default_factory=Counted)  # the counted quotas' defaults (core/quotas.py)
    # project -> (until, monotonic s; its counted quotas): storage/mongodb/quotas.py counted()
    counted_cache: dict[str, tuple[float, dict[str, int | None]]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        db: AsyncDatabase[dict[str, Any]],
        namespace: str,
        defaults: DeadLetterDefaults | None = None,
        counted: Counted | None = None,
    ) -> Collections:
        return cls(
            messages=db[Collection.MESSAGES.of(namespace)],
            queues=db[Collection.QUEUES.of(namespace)],
            counters=db[Collection.COUNTERS.of(namespace)],
            claims=db[Collection.CLAIMS.of(namespace)],
            projects=db[Collection.PROJECTS.of(namespace)],
            leases=db[Collection.LEASES.of(namespace)],
            tasks=db[Collection.TASKS.of(namespace)],
            idempotency=db[Collection.IDEMPOTENCY.of(namespace)],
            subscriptions=db[Collection.SUBSCRIPTIONS.of(namespace)],
            deliveries=db[Collection.DELIVERIES.of(namespace)],
            quotas=db[Collection.QUOTAS.of(namespace)],
            defaults=defaults or DeadLetterDefaults(),
            counted=counted or Counted(),
        )

    async def ensure_indexes(self) -> None:
        """Create every index the queries use (idempotent; run once per process before the first query)."""
        m = MESSAGE
        pqk = [(m.PROJECT, ASCENDING), (m.QUEUE, ASCENDING), (m.MARKER, ASCENDING)]
        await self.messages.create_indexes(
            [
                IndexModel(pqk, name=MARKER_INDEX, unique=True),
                IndexModel([*pqk, (m.VISIBLE, ASCENDING)], name=CLAIMABLE_INDEX),
                IndexModel([(m.CLAIM, ASCENDING)], name=CLAIM_INDEX, sparse=True),
                IndexModel([(m.CLAIM_END, ASCENDING)], name=LAPSED_INDEX, sparse=True),
                IndexModel([(m.EXPIRES, ASCENDING)], name=EXPIRY_INDEX),
                IndexModel([(m.GC, ASCENDING)], name=GC_INDEX, expireAfterSeconds=0),
            ]
        )
        await self.queues.create_index(
            [(QUEUE.PROJECT, ASCENDING), (QUEUE.NAME, ASCENDING)], name=QUEUE_INDEX, unique=True
        )
        await self.claims.create_index([(CLAIM.GC, ASCENDING)], name=GC_INDEX, expireAfterSeconds=0)
        by_queue = [(CLAIM.PROJECT, ASCENDING), (CLAIM.QUEUE, ASCENDING)]
        await self.claims.create_index(by_queue, name=CLAIMS_INDEX)
        t = TASK
        await self.tasks.create_index([(t.STATUS, ASCENDING), (t.LEASE, ASCENDING)], name=RUNNABLE_INDEX)
        await self.tasks.create_index(
            [(t.PROJECT, ASCENDING), (t.QUEUE, ASCENDING), (t.CREATED, ASCENDING)], name=TASKS_INDEX
        )
        await self.tasks.create_index([(t.GC, ASCENDING)], name=GC_INDEX, expireAfterSeconds=0)
        await self.idempotency.create_index(
            [(IDEMPOTENCY.GC, ASCENDING)], name=GC_INDEX, expireAfterSeconds=0
        )
        s, d = SUBSCRIPTION, DELIVERY
        pq = [(s.PROJECT, ASCENDING), (s.QUEUE, ASCENDING)]
        await self.subscriptions.create_indexes(
            [
                IndexModel([*pq, (s.ID, ASCENDING), (s.EXPIRES, ASCENDING)], name=SUBSCRIPTIONS_INDEX),
                IndexModel([*pq, (s.SUBSCRIBER, ASCENDING)], name=SUBSCRIBER_INDEX, unique=True),
                IndexModel([(s.GC, ASCENDING)], name=GC_INDEX, expireAfterSeconds=0),
            ]
        )
        await self.deliveries.create_indexes(
            [
                IndexModel([(d.DUE, ASCENDING)], name=DUE_INDEX),
                IndexModel([(d.SUBSCRIPTION, ASCENDING)], name=OWED_INDEX),
            ]
        )

    async def policy(self, q: QueueRef) -> QueuePolicy:
        """The policy in force for `q`: its reserved metadata, with the operator's dead-letter defaults where
        it sets nothing (the empty policy, so defaulted, for a queue never created)."""
        doc = await self.queues.find_one(queue_key(q), {QUEUE.POLICY: 1})
        return self.defaults.apply(q.name, policy_of(doc))

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
            self.subscriptions,
            self.deliveries,
            self.quotas,
        ):
            await collection.drop()


def queue_key(q: QueueRef) -> dict[str, Any]:
    """The filter that finds the queue's document in `queues`."""
    return {QUEUE.PROJECT: q.project, QUEUE.NAME: q.name}


def counter_key(q: QueueRef) -> dict[str, Any]:
    """The filter that finds the queue's document in `counters`."""
    return {COUNTER.ID: {COUNTER.PROJECT: q.project, COUNTER.QUEUE: q.name}}


def idempotency_key(q: QueueRef, key: str) -> dict[str, Any]:
    """The filter that finds the record of Idempotency-Key `key` of `q` in `idempotency`."""
    i = IDEMPOTENCY
    return {i.ID: {i.PROJECT: q.project, i.QUEUE: q.name, i.KEY: key}}


def new_queue(now: int) -> dict[str, Any]:
    """The fields of a queue created lazily (by a post, a move into it, a subscription): empty metadata."""
    return {QUEUE.META: "{}", QUEUE.POLICY: {}, QUEUE.CREATED: now}


def subscription_key(q: QueueRef, subscription_id: str) -> dict[str, Any]:
    """The filter that finds subscription `subscription_id` of `q` (live or not)."""
    s = SUBSCRIPTION
    return {s.ID: subscription_id, s.PROJECT: q.project, s.QUEUE: q.name}


def subscriptions_of(q: QueueRef) -> dict[str, Any]:
    """The filter that finds every subscription of `q` (live or not)."""
    return {SUBSCRIPTION.PROJECT: q.project, SUBSCRIPTION.QUEUE: q.name}


def by_reason(reason: DeadLetterReason) -> str:
    """The path of the counter of messages dead-lettered out of a queue for `reason`."""
    return f"{COUNTER.BY_REASON}.{reason}"


def gc_at(ms: int) -> dt.datetime:
    """The TTL index's time for a document whose logical life ends at `ms`."""
    return dt.datetime.fromtimestamp((ms + GC_SLACK_MS) / 1000, tz=dt.UTC)


def policy_doc(policy: QueuePolicy) -> dict[str, Any]:
    """The `pol` sub-document of `policy` (its unset fields left out)."""
    doc: dict[str, Any] = {}
    for name, value in policy_fields(policy).items():
        if value is None:
            continue
        stored = list(value) if isinstance(value, tuple) else value
        if name in IN_BACKOFF:
            doc.setdefault(POLICY.BACKOFF, {})[IN_BACKOFF[name]] = stored
        else:
            doc[name] = stored
    return doc


def policy_of(queue_doc: dict[str, Any] | None) -> QueuePolicy:
    pol = (queue_doc or {}).get(QUEUE.POLICY) or {}
    if bo := pol.get(POLICY.BACKOFF):
        pol = {**pol, **{name: bo[sub] for name, sub in IN_BACKOFF.items() if sub in bo}}
    return policy_from_fields(pol)


def message_of(doc: dict[str, Any]) -> Message:
    m = MESSAGE
    dl = doc.get(m.DEAD_LETTER)
    return Message(
        id=MessageId(doc[m.ID]),
        queue=doc[m.QUEUE],
        body=body_of(doc[m.BODY]),
        ttl=doc[m.TTL],
        created_ms=doc[m.CREATED],
        expires_ms=doc[m.EXPIRES],
        claim_count=doc[m.CLAIM_COUNT],
        claim_id=ClaimId(doc[m.CLAIM]) if doc.get(m.CLAIM) else None,
        claim_expires_ms=doc.get(m.CLAIM_END, 0),
        client_id=doc[m.CLIENT],
        dead_letter=_read_provenance(dl) if dl else None,
        dead_letter_eligible=not doc.get(m.NOT_ELIGIBLE, False),
    )


def subscription_of(doc: dict[str, Any]) -> Subscription:
    s = SUBSCRIPTION
    return Subscription(
        id=SubscriptionId(doc[s.ID]),
        queue=doc[s.QUEUE],
        subscriber=doc[s.SUBSCRIBER],
        ttl=doc[s.TTL],
        options=dict(orjson.loads(doc[s.OPTIONS])),
        created_ms=doc[s.CREATED],
        expires_ms=doc[s.EXPIRES],
        confirmed=doc[s.CONFIRMED],
    )


def delivery_of(doc: dict[str, Any], subscription: Subscription) -> Delivery:
    d = DELIVERY
    message = doc.get(d.MESSAGE)
    return Delivery(
        id=doc[d.ID],
        project=doc[d.PROJECT],
        subscription=subscription,
        kind=doc[d.KIND],
        message=None if message is None else message_of(message),
        attempts=doc[d.ATTEMPTS],
        created_ms=doc[d.CREATED],
    )
