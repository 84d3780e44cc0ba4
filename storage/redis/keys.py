"""The Redis layout: every key and hash field name the driver uses, and how a message hash reads back.

This module is the one owner. Scripts get the keys a caller knows in KEYS, built here; the few a script
derives from data (a DLQ's keys from the queue's policy, a message's hash from an id found in an index) are
built by lib.lua's `qkeys` and `message_key`, which tests/storage/test_layout.py holds to the builders below,
as it holds every hash field name in the .lua files to the field enums below. The queue hash's policy
fields and the message hash's provenance fields are the exceptions: their names are core's (a reserved key's
row in core.metadata, a provenance field's in core.models.PROVENANCE, names the field it is stored under), so
a new reserved key or provenance field needs no change here.

All keys of a project share the hash tag ``{<project>}``, so every script's keys, a queue's DLQ included,
live in one Redis Cluster slot. The trade-off: one project is one slot, so a single very large tenant cannot
spread over a cluster's shards.

Keys (prefix = ``<ns>:{<project>}:``):

  prefix queues                ZSET  queue names of the project (score 0, listed by lex order)
  prefix due                   ZSET  queue name -> ms, never later than the queue's next claim or message
                                     expiry; the sweeper (sweep.lua) visits the queues that are due
  prefix mver                  STRING the project's metadata version (a DLQ cycle check reads several queues)
  prefix q:<name>              HASH  QueueField, and the policy: POLICY_FIELDS
  prefix q:<name>:msgs         ZSET  id -> marker   every live message of the queue (paging, FIFO)
  prefix q:<name>:ready        ZSET  id -> marker   claimable now
  prefix q:<name>:delayed      ZSET  id -> ms       not claimable before the score (delay, backoff)
  prefix q:<name>:claimed      ZSET  id -> ms       claimed until the score
  prefix q:<name>:expiry       ZSET  id -> ms       the message expires at the score
  prefix q:<name>:idem:<key>   HASH  IdempotencyField: an Idempotency-Key's record (post_messages.lua)
  prefix q:<name>:waiting      STRING set while a long poll waits on the queue (expires with the wait)
  channel prefix q:<name>:wake  pub/sub: n messages of the queue became claimable (only while `waiting`)
  prefix m:<id>                HASH  MessageField, and the provenance: DEAD_LETTER_FIELDS
  prefix c:<claim id>          HASH  ClaimField;   prefix c:<claim id>:m  LIST of the message ids it took
  prefix t:<task id>           HASH  TaskField: a redrive task
  prefix tasks:<name>          ZSET  task id -> created ms: the redrive tasks of DLQ `name`
  prefix q:<name>:subs         ZSET  subscription ids of the queue (score 0, listed by lex order)
  prefix q:<name>:subscribers  HASH  subscriber URI -> subscription id (unique per queue)
  prefix q:<name>:notify       ZSET  subscription id -> expiry ms: the confirmed ones (told of each message)
  prefix s:<subscription id>   HASH  SubscriptionField
  prefix subs                  ZSET  subscription id -> expiry ms: every subscription of the project
  prefix outbox                ZSET  delivery id -> ms it is due (a leased one: when its lease ends)
  prefix outbox:seq            STRING the delivery id counter
  prefix outbox:owed           STRING how many messages' deliveries the outbox owes (the notifier's backlog)
  prefix quota                 HASH  a quota's name (core/quotas.py QUOTAS) -> the project's override
  prefix rate:<bucket>         HASH  BucketField: the project's token bucket `reads` or `writes`
                                     (take_tokens.lua; expires once it would be full again)
  prefix d:<delivery id>       HASH  DeliveryField, and for a dead letter's notification the message's
                                     MessageField copy; a post's notifications to one subscription are one
                                     hash, the messages packed in `_p`

Invariant: a live message id is in msgs, in expiry, and in exactly one of ready / delayed / claimed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from core import metadata
from core.models import (
    PROVENANCE,
    ClaimId,
    DeadLetter,
    Message,
    MessageId,
    QueueRef,
    Subscription,
    SubscriptionId,
    provenance_reader,
)
from core.sealing import body_of

KEY_LAYOUT_VERSION = 1


class QueueField(StrEnum):
    META = "meta"  # the metadata as JSON
    CREATED = "created"
    SEQ = "seq"  # the marker counter
    # and the policy, a field each (POLICY_FIELDS), of which the driver's Python reads one (export.py)
    DLQ = metadata.stored_as(metadata.DEAD_LETTER_QUEUE)
    # counters
    DEAD_LETTERED = "n_dl"  # moved out to the DLQ
    DEAD_LETTERED_MAX_CLAIMS = "n_dl_mc"  # ... of them for each reason (lib.lua DL_COUNTERS)
    DEAD_LETTERED_EXPIRED = "n_dl_exp"
    DEAD_LETTERED_REJECTED = "n_dl_rej"
    DISCARDED = "n_disc"
    RECEIVED = "n_rcv"  # dead letters received (as a DLQ)
    REDRIVEN = "n_rd"  # moved out by a redrive (as a DLQ)


# The reserved metadata parsed (core.metadata.QueuePolicy), stored in the queue's hash under core's field
# names (core.metadata.POLICY_FIELDS), in this order: policy_args() sends the values so, and scripts.py
# writes the same names, in the same order, into lib.lua's POLICY_FIELDS (write_metadata).
POLICY_FIELDS = metadata.POLICY_FIELDS


class MessageField(StrEnum):
    QUEUE = "q"
    BODY = "b"  # JSON text
    TTL = "t"
    CREATED = "cr"
    EXPIRES = "e"
    MARKER = "k"
    CLIENT = "cl"
    CLAIM = "c"  # '' when no claim holds it
    CLAIM_EXPIRES = "ce"
    CLAIM_COUNT = "cc"
    AVAILABLE = "av"  # claimable from (ms)
    NOT_ELIGIBLE = "ne"  # '1': posted with dead_letter_eligible false
    CLAIMER = "ccl"  # the Client-ID of its last claimer in this queue (a dead-letter move takes it)
    # and the provenance, a field each (DEAD_LETTER_FIELDS)


# The provenance, written by a dead-letter move: each core.models.PROVENANCE row's field prefixed with `d` (a
# message hash is flat), by the row's key.
DEAD_LETTER_FIELDS: Mapping[str, str] = {p.key: f"d{p.field}" for p in PROVENANCE}


class ClaimField(StrEnum):
    QUEUE = "q"
    TTL = "ttl"
    GRACE = "grace"
    CREATED = "cr"
    EXPIRES = "e"
    QUEUE_CREATED = "qc"  # the queue's `created` when the claim was made: a queue made again under the
    # name since (the old one deleted) has none of the old queue's claims (lib.lua live_claim)


class TaskField(StrEnum):
    QUEUE = "q"
    STATUS = "status"
    CREATED = "cr"
    UPDATED = "up"
    END = "end"
    CURSOR = "cursor"
    SCANNED = "scanned"
    MOVED = "moved"
    SKIPPED = "skipped"
    SPEC = "spec"
    OWNER = "owner"
    LEASE = "lease"
    # the spec's filters, parsed for redrive_step.lua
    DESTINATION = "dest"
    SOURCE = "fsrc"
    REASON = "frsn"
    AFTER = "fafter"
    BEFORE = "fbefore"
    LIMIT = "limit"
    IDS = "fids"  # a task of listed message ids: how many ('' otherwise); the ids are in its spec
    SIGNATURE = "fsig"  # a signature filter ('' otherwise): redrive_step moves only ids read and found of it
    SIGNATURE_END = "sigend"  # a signature task walking markers: its END (END is 0, see task_create.lua)


class SubscriptionField(StrEnum):
    QUEUE = "q"
    SUBSCRIBER = "s"
    TTL = "t"
    OPTIONS = "o"  # JSON
    CREATED = "cr"
    EXPIRES = "e"
    CONFIRMED = "c"  # '1' or '0'


class DeliveryField(StrEnum):
    """A delivery's own fields; a dead letter's notification's hash also holds its message's MessageField
    copy, whose names never start with '_'. A post's notifications to one subscription are one hash
    (lib.lua notify_post) with PACKED, COUNT, LEFT, and, per message i (1-based), `_x<i>` once finished,
    `_d<i>` when it is due (a lease's end or its retry time; unset: CREATED) and `_a<i>` its failed attempts
    (lib.lua pack_next_due, lease_deliveries.lua, finish_delivery.lua)."""

    KIND = "_k"
    SUBSCRIPTION = "_s"
    QUEUE = "_q"
    ATTEMPTS = "_a"
    CREATED = "_cr"
    MESSAGE = "_m"  # the message id (notifications only)
    PACKED = "_p"  # a post's messages: id US ttl US eligible 1/0 US body, ... (US = "\x1f")
    COUNT = "_n"  # how many PACKED holds
    LEFT = "_l"  # how many of PACKED are still owed


class IdempotencyField(StrEnum):
    FINGERPRINT = "fp"
    IDS = "ids"
    UNTIL = "until"


class BucketField(StrEnum):
    """A project's request-rate token bucket (take_tokens.lua)."""

    TOKENS = "tk"  # tokens left (a float) at AT
    AT = "at"  # ms of the last take


def _tag(project: str) -> str:
    # '{' and '}' would end the hash tag early and '%' is the escape itself; the rest is kept as is.
    return project.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def project_prefix(namespace: str, project: str) -> str:
    return f"{namespace}:{{{_tag(project)}}}:"


def projects_key(namespace: str) -> str:
    """SET of every project that has had a queue; the sweeper's periodic full scan walks it."""
    return f"{namespace}:projects"


def touched_key(namespace: str) -> str:
    """SET of projects some script ran on since the sweeper last took the set: their due times may be new."""
    return f"{namespace}:touched"


def due_projects_key(namespace: str) -> str:
    """ZSET project -> its earliest due time as the sweeper last saw it."""
    return f"{namespace}:due-projects"


def tasks_key(namespace: str) -> str:
    """ZSET of running redrive tasks, as JSON [project, queue, task id] -> when their runner's lease ends
    (0: not taken yet). An index only: each task's own hash is the truth."""
    return f"{namespace}:tasks"


def outbox_touched_key(namespace: str) -> str:
    """SET of projects some script owed deliveries since the notifier last took the set."""
    return f"{namespace}:outbox-touched"


def outbox_due_key(namespace: str) -> str:
    """ZSET project -> the earliest due time of its outbox as a notifier last saw it (a hint: each project's
    `outbox` is the truth; a full scan repairs it)."""
    return f"{namespace}:outbox-due"


def outbox_scan_key(namespace: str) -> str:
    """STRING held while the notifiers' periodic full scan of every project's outbox is not due again."""
    return f"{namespace}:outbox-full-scan"


def sweeper_lease_key(namespace: str) -> str:
    return f"{namespace}:sweeper-lease"


def health_key(namespace: str) -> str:
    """STRING written by GET /v2/health to see whether Redis takes writes (expires after 10 s)."""
    return f"{namespace}:health"


def full_scan_key(namespace: str) -> str:
    return f"{namespace}:sweeper-full-scan"


@dataclass(frozen=True, slots=True)
class ProjectKeys:
    """The keys of one project (all in its hash-tag slot)."""

    prefix: str

    @classmethod
    def of(cls, namespace: str, project: str) -> ProjectKeys:
        return cls(project_prefix(namespace, project))

    @property
    def queues(self) -> str:
        return f"{self.prefix}queues"

    @property
    def due(self) -> str:
        return f"{self.prefix}due"

    @property
    def metadata_version(self) -> str:
        return f"{self.prefix}mver"

    @property
    def quota(self) -> str:
        """HASH quota name -> the project's override (core/quotas.py)."""
        return f"{self.prefix}quota"

    def bucket(self, bucket: str) -> str:
        """HASH BucketField: the project's token bucket `reads` or `writes`."""
        return f"{self.prefix}rate:{bucket}"

    def queue(self, name: str) -> str:
        return f"{self.prefix}q:{name}"

    def messages(self, name: str) -> str:
        return f"{self.queue(name)}:msgs"

    def message(self, message_id: str) -> str:
        return f"{self.prefix}m:{message_id}"

    @property
    def message_prefix(self) -> str:
        """message(id) is this followed by the id: the dead-letter export (export.py) builds the keys of
        the ids it finds from it."""
        return f"{self.prefix}m:"

    def claim(self, claim_id: str) -> str:
        return f"{self.prefix}c:{claim_id}"

    def claim_messages(self, claim_id: str) -> str:
        return f"{self.prefix}c:{claim_id}:m"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}t:{task_id}"

    def tasks(self, name: str) -> str:
        """ZSET task id -> created ms: the redrive tasks of DLQ `name`."""
        return f"{self.prefix}tasks:{name}"

    def subscription(self, subscription_id: str) -> str:
        return f"{self.prefix}s:{subscription_id}"

    @property
    def message_expiry(self) -> str:
        """ZSET message id -> expiry ms: every message of the project, over its queues (the `message_bytes`
        quota forgets those expired when it counts)."""
        return f"{self.prefix}bytes"

    @property
    def message_sizes(self) -> str:
        """HASH message id -> the bytes of its body as stored, and field "" (lib.lua BYTES_SUM) their sum: the
        project's use of its `message_bytes` quota, once the expired ones are forgotten."""
        return f"{self.prefix}sizes"

    @property
    def subscription_expiry(self) -> str:
        """ZSET subscription id -> expiry ms: every subscription of the project (the `subscriptions` quota
        counts those not expired)."""
        return f"{self.prefix}subs"

    def delivery(self, delivery_id: str) -> str:
        return f"{self.prefix}d:{delivery_id}"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}outbox"

    @property
    def outbox_seq(self) -> str:
        return f"{self.prefix}outbox:seq"

    @property
    def outbox_owed(self) -> str:
        return f"{self.prefix}outbox:owed"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    prefix: str
    name: str

    @classmethod
    def of(cls, namespace: str, q: QueueRef) -> QueueKeys:
        return cls(project_prefix(namespace, q.project), q.name)

    @property
    def project(self) -> ProjectKeys:
        return ProjectKeys(self.prefix)

    @property
    def queue(self) -> str:
        return self.project.queue(self.name)

    @property
    def waiting(self) -> str:
        """STRING set (with an expiry) while a long poll waits on the queue (claim.lua)."""
        return f"{self.queue}:waiting"

    @property
    def wake_channel(self) -> str:
        """The pub/sub channel lib.lua's publish_wakes() tells the waiting long polls on."""
        return f"{self.queue}:wake"

    @property
    def subscriptions(self) -> str:
        return f"{self.queue}:subs"

    @property
    def subscribers(self) -> str:
        return f"{self.queue}:subscribers"

    @property
    def notify(self) -> str:
        return f"{self.queue}:notify"

    def idempotency(self, key: str) -> str:
        """HASH IdempotencyField: an Idempotency-Key's record (post_messages.lua)."""
        return f"{self.queue}:idem:{key}"

    def all(self) -> list[str]:
        """The KEYS every queue script takes first, in lib.lua's queue_script() order."""
        base, project = self.queue, self.project
        indexes = [f"{base}:{index}" for index in ("msgs", "ready", "delayed", "claimed", "expiry")]
        return [base, *indexes, project.queues, project.due]


# Plain str names for the reads of every message (a StrEnum key is a slower dict lookup than a str).
_Q, _B, _T, _CR, _E, _CL, _C, _CE, _CC, _NE = (
    f.value
    for f in (
        MessageField.QUEUE,
        MessageField.BODY,
        MessageField.TTL,
        MessageField.CREATED,
        MessageField.EXPIRES,
        MessageField.CLIENT,
        MessageField.CLAIM,
        MessageField.CLAIM_EXPIRES,
        MessageField.CLAIM_COUNT,
        MessageField.NOT_ELIGIBLE,
    )
)
_DSRC = DEAD_LETTER_FIELDS["source_queue"]  # on every dead letter
_read_provenance = provenance_reader(DEAD_LETTER_FIELDS, as_text=True)


def dead_letter_of(f: Mapping[str, Any]) -> DeadLetter | None:
    """The provenance in a message hash (str fields and values), None when it was never dead-lettered."""
    return _read_provenance(f) if _DSRC in f else None


def message_of(message_id: str, f: Mapping[str, Any]) -> Message:
    """A message from its hash (str fields and values); or from the fields a notification of a post keeps
    (body, ttl, created, eligibility, with the queue in `queue`: lib.lua notify_post), as it was posted."""
    if _Q not in f:
        created, ttl = int(f[_CR]), int(f[_T])
        return Message(
            id=MessageId(message_id),
            queue=f[DeliveryField.QUEUE],
            body=body_of(f[_B]),
            ttl=ttl,
            created_ms=created,
            expires_ms=created + ttl * 1000,
            dead_letter_eligible=f.get(_NE) != "1",
        )
    return Message(
        id=MessageId(message_id),
        queue=f[_Q],
        body=body_of(f[_B]),
        ttl=int(f[_T]),
        created_ms=int(f[_CR]),
        expires_ms=int(f[_E]),
        claim_count=int(f[_CC]),
        claim_id=ClaimId(f[_C]) if f[_C] else None,
        claim_expires_ms=int(f[_CE]),
        client_id=f[_CL],
        dead_letter=dead_letter_of(f),
        dead_letter_eligible=f.get(_NE) != "1",
    )


_SQ, _SS, _ST, _SO, _SCR, _SE, _SC = (f.value for f in SubscriptionField)


def subscription_of(subscription_id: str, f: Mapping[str, Any]) -> Subscription:
    """A subscription from its hash (str fields and values)."""
    return Subscription(
        id=SubscriptionId(subscription_id),
        queue=f[_SQ],
        subscriber=f[_SS],
        ttl=int(f[_ST]),
        options=orjson.loads(f[_SO]),
        created_ms=int(f[_SCR]),
        expires_ms=int(f[_SE]),
        confirmed=f[_SC] == "1",
    )
