"""Domain values passed between the API layer and the storage drivers."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Generic, Literal, NewType, TypeVar

from core import signatures

MessageId = NewType("MessageId", str)
ClaimId = NewType("ClaimId", str)


def new_ids(n: int) -> list[str]:
    """`n` new ids (of messages, claims, leases): 32 random hex digits each, as uuid4().hex without building
    UUIDs (ten of them were 5 % of a post), from one os.urandom call (a system call each was ten a post)."""
    digits = os.urandom(16 * n).hex()
    return [digits[i : i + 32] for i in range(0, 32 * n, 32)]


def new_id() -> str:
    """A new id, as new_ids makes them."""
    return new_ids(1)[0]


DeadLetterReason = Literal["max_claims", "expired", "rejected"]

T = TypeVar("T")


# A project's topics (Zaqar's /v2/topics) are the queues of a space of their own, the project's id and this:
# no project id has a comma (core/limits.check_project), so no project's queues are another's topics, and
# every driver keeps, counts, expires, notifies and purges a topic's messages as a queue's.
TOPIC_SPACE = ",topics"


def topics_of(project: str) -> str:
    """The space whose queues are `project`'s topics."""
    return project + TOPIC_SPACE


def kind_of(project: str) -> Literal["queues", "topics"]:
    """What the queues of `project` (a project, or a project's topic space) are to the API."""
    return "topics" if project.endswith(TOPIC_SPACE) else "queues"


def owner_of(project: str) -> str:
    """The project whose queues or topics those of `project` are."""
    return project.removesuffix(TOPIC_SPACE)


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A queue inside a project (or a topic, inside the project's topic space); every storage call is scoped
    by it."""

    project: str
    name: str

    @property
    def kind(self) -> Literal["queues", "topics"]:
        return kind_of(self.project)

    @property
    def href(self) -> str:
        return f"/v2/{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message as posted. `ttl`/`delay` of None take the queue's defaults."""

    body: Any
    ttl: int | None = None
    delay: int | None = None
    dead_letter_eligible: bool = True  # False: discarded (and counted) where it would move to a DLQ


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A post's Idempotency-Key: within `window_ms` of the first post with `key` on the queue, a post with
    the same key and the same `fingerprint` (a hash of its messages) stores nothing and gets the first
    post's ids; one with another fingerprint is refused (IdempotencyKeyReused)."""

    key: str
    fingerprint: str
    window_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Provenance of a dead-lettered message (docs/contract.md promise 6). Each field is a row of PROVENANCE,
    which says how it is shown, stored and exported."""

    source_queue: str
    reason: DeadLetterReason
    claim_count: int
    dead_lettered_at_ms: int
    first_enqueued_at_ms: int
    redrive_count: int = 0  # times a redrive moved it out of a DLQ (kept when it is dead-lettered again)
    rejection: Rejection | None = None  # reason "rejected": what the consumer said, if anything
    # the Client-ID of the consumer whose claim used up the last delivery (the last claimer, for "expired"
    # too), or that rejected it; None when no claim ever held it in the source queue
    consumer: str | None = None


@dataclass(frozen=True, slots=True)
class Rejection:
    """What a consumer gave when it dead-lettered a message itself (POST .../dead_letter)."""

    reason: str | None = None
    description: str | None = None


# How a provenance value is held and shown: text, a DeadLetterReason, a count, or a time (ms, shown as
# ISO 8601).
ProvenanceKind = Literal["text", "reason", "count", "time"]


@dataclass(frozen=True, slots=True)
class ProvenanceField:
    """One field of a dead letter's provenance (DeadLetter), as a row of PROVENANCE.

    `attr` is DeadLetter's attribute, or Rejection's when `rejection` (then it is shown in the provenance's
    `rejection` object, and left out while empty); `kind` says how it is held and shown; an `optional` one is
    left out while None. `field` is the short name the drivers store it under (storage/redis/keys.py and
    storage/mongodb/schema.py say how), `column` its name in the dead-letter export when that is not `key`.
    `description` is markdown for the published contract.
    """

    attr: str
    kind: ProvenanceKind
    field: str
    description: str | None = None
    optional: bool = False
    rejection: bool = False
    column: str = ""

    @property
    def wire(self) -> str:
        """Its name in Zaqar's JSON (core/wire.py, api/schemas.py): a time's without `_ms`."""
        return self.attr.removesuffix("_ms") if self.kind == "time" else self.attr

    @property
    def key(self) -> str:
        """The row's name: `attr`, a rejection's as `rejection_<attr>`."""
        return f"rejection_{self.attr}" if self.rejection else self.attr

    @property
    def export_column(self) -> str:
        return self.column or self.key


# Every field of the provenance, in the order the wire and the API's schema show them (the `rejection` object
# after the others) and the export has them. The wire dict (core/wire.py), the API's schema (api/schemas.py,
# so openapi.yaml), the drivers' stored names, reads and exports follow from these rows; a new field is a row
# (and DeadLetter's attribute) plus its behaviour: the moves that write it (lib.lua dead_letter(),
# storage/mongodb/moves.py).
PROVENANCE: tuple[ProvenanceField, ...] = (
    ProvenanceField("source_queue", "text", "src"),
    ProvenanceField("reason", "reason", "rsn"),
    ProvenanceField("claim_count", "count", "cc", column="dl_claim_count"),
    ProvenanceField("dead_lettered_at_ms", "time", "at"),
    ProvenanceField("first_enqueued_at_ms", "time", "first"),
    ProvenanceField("redrive_count", "count", "rc", "Times a redrive moved the message out of a DLQ."),
    ProvenanceField("reason", "text", "rr", rejection=True),
    ProvenanceField("description", "text", "rd", rejection=True),
    ProvenanceField(
        "consumer",
        "text",
        "cl",
        "EXT: the Client-ID of the consumer whose claim used up the last delivery (for `expired`: the last "
        "claimer in the source queue), or that rejected the message; absent when no claim held it.",
        optional=True,
    ),
)
# What a consumer gave, shown as the provenance's `rejection` object (only when it gave something).
REJECTION_DESCRIPTION = "For reason `rejected`: what the consumer gave."


def provenance_reader(
    names: Mapping[str, str], *, as_text: bool = False
) -> Callable[[Mapping[str, Any]], DeadLetter]:
    """A driver's reader of the provenance it stores: `names` maps each row's key to the name its value is
    stored under; `as_text`: counts and times are stored as decimal text (Redis), not numbers. A value absent
    is DeadLetter's default; a rejection none of whose fields is present is None.

    The reader is compiled from the rows (as dataclasses compiles an __init__) into what a hand-written one
    would be, one call on every dead letter a store reads (with a loop over the rows instead, reading a dead
    letter's hash took 1.3x the time).
    """
    defaults = {f.name: f.default for f in fields(DeadLetter)}

    def value(p: ProvenanceField) -> str:
        name = repr(names[p.key])
        default = None if p.rejection else defaults[p.attr]
        number = as_text and p.kind in ("count", "time")
        if default is MISSING:
            return f"int(f[{name}])" if number else f"f[{name}]"
        if number and default is not None:
            return f"int(f.get({name}, {default!r}))"
        if number:
            return f"(None if (x := f.get({name})) is None else int(x))"
        return f"f.get({name}, {default!r})"

    own = [p for p in PROVENANCE if not p.rejection]
    said = [p for p in PROVENANCE if p.rejection]
    present = " or ".join(f"{names[p.key]!r} in f" for p in said) or "False"
    source = "\n".join(
        [
            "def read(f):",
            "    return DeadLetter(",
            *(f"        {p.attr}={value(p)}," for p in own),
            "        rejection=Rejection(",
            *(f"            {p.attr}={value(p)}," for p in said),
            f"        ) if {present} else None,",
            "    )",
        ]
    )
    namespace: dict[str, Any] = {"DeadLetter": DeadLetter, "Rejection": Rejection}
    exec(source, namespace)  # noqa: S102 -- built from core's rows and the driver's names only
    read: Callable[[Mapping[str, Any]], DeadLetter] = namespace["read"]
    return read


@dataclass(frozen=True, slots=True)
class Message:
    id: MessageId
    queue: str
    body: Any
    ttl: int
    created_ms: int
    expires_ms: int
    claim_count: int = 0
    claim_id: ClaimId | None = None
    claim_expires_ms: int = 0
    client_id: str = ""
    dead_letter: DeadLetter | None = None
    dead_letter_eligible: bool = True

    def age(self, now_ms: int) -> int:
        return max(0, (now_ms - self.created_ms) // 1000)

    def is_claimed(self, now_ms: int) -> bool:
        return self.claim_id is not None and self.claim_expires_ms > now_ms


@dataclass(frozen=True, slots=True)
class Claim:
    id: ClaimId
    queue: str
    ttl: int
    grace: int
    created_ms: int
    expires_ms: int
    messages: list[Message] = field(default_factory=list)

    def age(self, now_ms: int) -> int:
        return max(0, (now_ms - self.created_ms) // 1000)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """What one claim call did: the claim (None when nothing was claimable) and what it moved on the way."""

    claim: Claim | None
    dead_lettered: int = 0
    discarded: int = 0
    # when nothing was claimable: the earliest time (ms) a message of the queue becomes claimable by time
    # alone (a delay or a backoff ends, a claim expires), None when none will; a long poll sleeps until then
    next_ms: int | None = None


# Why a bulk acknowledge did not delete a message (NotDeleted.reason).
NotDeletedReason = Literal[
    "not_claimed",  # no live claim holds it (the claim given for it has expired, or it was never claimed)
    "claimed_by_another",  # a live claim that is not among the given ones holds it
    "dead_lettered",  # its claim expired and a dead-letter move took it to the DLQ (it keeps its id there)
]


@dataclass(frozen=True, slots=True)
class NotDeleted:
    """A message a claim-safe bulk delete (`ids` with `claim_ids`) left in place, and why."""

    id: MessageId
    reason: NotDeletedReason


@dataclass(frozen=True, slots=True)
class MessageStamp:
    id: MessageId
    created_ms: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    free: int
    claimed: int
    total: int
    delayed: int = 0
    oldest: MessageStamp | None = None
    newest: MessageStamp | None = None
    dead_lettered: int = 0
    discarded: int = 0
    dead_letters_received: int = 0
    # dead_lettered split by DeadLetterReason (the keys present are those counted at least once)
    dead_lettered_by_reason: dict[str, int] = field(default_factory=dict)
    redriven: int = 0  # messages a redrive moved out of this queue (as a DLQ)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; `next_marker` is None when nothing follows."""

    items: list[T]
    next_marker: str | None


TaskId = NewType("TaskId", str)
TaskStatus = Literal["running", "succeeded", "cancelled"]


@dataclass(frozen=True, slots=True)
class RedriveSpec:
    """What a redrive moves out of a DLQ and where to: `destination` None sends each message back to its
    `source_queue`; the filters left None match everything."""

    destination: str | None = None
    source_queue: str | None = None
    reason: DeadLetterReason | None = None
    after_ms: int | None = None  # dead-lettered at or after
    before_ms: int | None = None  # dead-lettered before
    limit: int | None = None  # most messages to move
    max_per_second: int | None = None
    # only these messages (distinct, in the order given): the task looks each one up instead of walking the
    # DLQ, its cursor and end counting ids, not markers
    message_ids: tuple[MessageId, ...] | None = None
    # only the messages of this failure signature, as `charon insights` names it (core/signatures.py)
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}
        if self.message_ids is not None:
            out["message_ids"] = list(self.message_ids)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RedriveSpec:
        fields = {k: d[k] for k in cls.__slots__ if k in d}
        if fields.get("message_ids") is not None:
            fields["message_ids"] = tuple(MessageId(i) for i in fields["message_ids"])
        return cls(**fields)

    def matches(self, m: Message) -> bool:
        d = m.dead_letter
        if d is None:
            return False
        return (
            (self.message_ids is None or m.id in self.message_ids)
            and (self.source_queue is None or d.source_queue == self.source_queue)
            and (self.reason is None or d.reason == self.reason)
            and (self.after_ms is None or d.dead_lettered_at_ms >= self.after_ms)
            and (self.before_ms is None or d.dead_lettered_at_ms < self.before_ms)
            and (self.signature is None or signatures.of_message(m) == self.signature)
        )


@dataclass(frozen=True, slots=True)
class RedriveTask:
    """A redrive's durable record: it walks the DLQ's markers up to `end_marker` (the DLQ's last marker
    when it began, so it ends however busy the DLQ is); `cursor` is the last marker it has looked at."""

    id: TaskId
    queue: str
    spec: RedriveSpec
    status: TaskStatus
    created_ms: int
    updated_ms: int
    end_marker: int
    cursor: int = 0
    scanned: int = 0
    moved: int = 0
    skipped: int = 0  # matched but claimed, or without a source queue to go back to
    owner: str = ""  # the runner holding the task's lease


SubscriptionId = NewType("SubscriptionId", str)
DeliveryKind = Literal["notification", "confirmation", "unsubscribed"]


@dataclass(frozen=True, slots=True)
class Subscription:
    """A Zaqar subscription: `subscriber` (an http(s):// or mailto: URI) is told of every message posted to
    (or dead-lettered into) queue `queue` until `expires_ms`. `options` is the client's object as given
    (post_data, post_headers, _retry_policy, ...). An unconfirmed one (confirmation required and not yet
    given) is told nothing but its confirmation request."""

    id: SubscriptionId
    queue: str
    subscriber: str
    ttl: int
    options: dict[str, Any]
    created_ms: int
    expires_ms: int
    confirmed: bool

    def age(self, now_ms: int) -> int:
        return max(0, (now_ms - self.created_ms) // 1000)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification owed to one subscription (the outbox), leased to a notifier by
    Store.lease_deliveries. `message` is the message as it was posted or dead-lettered (its provenance with
    it), None for a confirmation request; `attempts` counts the failed tries so far."""

    id: str
    project: str
    subscription: Subscription
    kind: DeliveryKind
    message: Message | None
    attempts: int
    created_ms: int
