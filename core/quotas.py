"""Per-project quotas (docs/quotas.md): the one table of them (QUOTAS), and the request-rate token buckets'
arithmetic.

A quota is a row of QUOTAS: its name (the key of `PUT /v2/quotas/{project}` and of the stored overrides),
its bounds and what it limits. The service-wide defaults are settings (app/settings.py QuotaSettings, one
field a row); a project's overrides are stored by the driver (storage/base.py QuotaStore) and win over the
defaults. The API's body model, which validates an override (api/schemas.py QuotaIn), is derived from the
rows; tests/api/test_quotas.py holds the settings' fields to them.

Counted quotas (`queues`, `messages_per_queue`, `message_bytes`, `subscriptions`) bound what a project keeps
in the store. They are counted by the driver in the same atomic step that would cross them, from what the
store holds (Redis: the project's queue index, a queue's expiry index, the project's subscriptions by
expiry, and for bytes the project's message sizes, whose sum each script that adds or removes a message
keeps in the same step; MongoDB: an index count or sum in a transaction), so nothing drifts. The driver
reads a project's overrides itself and gets the defaults at construction (Counted).

Rates: each project has two token buckets, `reads` (GET and HEAD) and `writes` (every other method), each
refilled at its rate a second up to `burst_seconds` of it (at least 1 token). The bucket lives in the store,
so every API process draws from the same one (service/ratelimit.py leases a few tokens at a time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from core.errors import QuotaExceeded

Bucket = Literal["reads", "writes"]
READS: Bucket = "reads"
WRITES: Bucket = "writes"
READ_METHODS = frozenset({"GET", "HEAD"})
MAX_RATE = 1_000_000.0  # requests a second
MAX_COUNT = 1_000_000_000  # the largest counted quota of things (queues, messages)
MAX_BYTES = 10**15  # the largest `message_bytes` (a petabyte; below 2^53, Lua's exact integers)
# How far apart the API processes' clocks may be for a bucket to believe a last take in its future (then it
# is kept, so the time between is not refilled twice); one further ahead is replaced by the taker's now.
MAX_SKEW_MS = 1000


@dataclass(frozen=True, slots=True)
class Quota:
    """One quota, as a row of QUOTAS."""

    name: str
    description: str
    lo: float
    hi: float
    unit: str
    bucket: Bucket | None = None  # a rate: the token bucket it refills
    counted: bool = False  # a whole number of things the store holds, checked by the driver (Counted)


QUOTAS: tuple[Quota, ...] = (
    Quota(
        "reads_per_second",
        "Requests a second the project may make that only read (GET, HEAD), over every API process; a "
        "burst of `burst_seconds` of them may come at once. Past it: 429 with Retry-After.",
        0.01,
        MAX_RATE,
        "requests a second",
        READS,
    ),
    Quota(
        "writes_per_second",
        "Requests a second the project may make that change something (POST, PUT, PATCH, DELETE: posts, "
        "claims, deletes), over every API process, with the same burst. Past it: 429 with Retry-After.",
        0.01,
        MAX_RATE,
        "requests a second",
        WRITES,
    ),
    Quota(
        "queues",
        "Queues the project may have. Creating one more (PUT, a metadata write, the first post or "
        "subscription to a new name, or a metadata write naming a DLQ that does not exist yet) answers 403. "
        "A dead-letter move that creates its DLQ is never refused, and that queue counts; a redrive skips "
        "the messages of a destination it may not create.",
        0,
        MAX_COUNT,
        "queues",
        counted=True,
    ),
    Quota(
        "messages_per_queue",
        "Messages each queue of the project may hold (claimed, delayed and dead letters included; expired "
        "ones not). A post that would pass it answers 403 and stores none of its messages. A dead-letter "
        "move into a full DLQ discards the message and counts it in the source's `discarded`; a redrive "
        "into a full queue skips the message, which stays in the DLQ.",
        0,
        MAX_COUNT,
        "messages",
        counted=True,
    ),
    Quota(
        "message_bytes",
        "Bytes the bodies of the project's messages may take, over all its queues and DLQs (each body as "
        "stored: its JSON text, or the sealed text where the queue encrypts; expired messages not). A post "
        "that would pass it answers 403 and stores none of its messages. Moves and redrives never add to "
        "it, but a message that expired into its DLQ lives, and counts, again.",
        0,
        MAX_BYTES,
        "bytes",
        counted=True,
    ),
    Quota(
        "subscriptions",
        "Subscriptions the project may have, over all its queues (expired ones not). Subscribing once more "
        "answers 403; a subscriber that is already subscribed to the queue is answered as before.",
        0,
        MAX_COUNT,
        "subscriptions",
        counted=True,
    ),
)
QUOTA = {q.name: q for q in QUOTAS}
SUBSCRIPTIONS = "subscriptions"
QUEUES = "queues"
MESSAGES_PER_QUEUE = "messages_per_queue"
MESSAGE_BYTES = "message_bytes"
COUNTED = tuple(q.name for q in QUOTAS if q.counted)
RATE_OF: dict[Bucket, str] = {q.bucket: q.name for q in QUOTAS if q.bucket is not None}


def bucket_of(method: str) -> Bucket:
    return READS if method in READ_METHODS else WRITES


def capacity(rate: float, burst_seconds: float) -> int:
    """A bucket's size: `burst_seconds` of its rate, at least one request."""
    return max(1, math.floor(rate * burst_seconds))


@dataclass(frozen=True, slots=True)
class Grant:
    """What a bucket gave: `granted` tokens of those asked; when none, `wait_ms` until the next one."""

    granted: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Counted:
    """The service's defaults of the counted quotas (None: no limit, but for projects an admin gave one),
    given to a driver when it is made; a project's overrides, which the driver reads itself, win."""

    queues: int | None = None
    messages_per_queue: int | None = None
    message_bytes: int | None = None
    subscriptions: int | None = None

    def of(self, overrides: Mapping[str, float]) -> dict[str, int | None]:
        """The project's counted quotas: its overrides over these defaults."""
        out: dict[str, int | None] = {}
        for name in COUNTED:
            value = overrides.get(name, getattr(self, name))
            out[name] = None if value is None else int(value)
        return out


def exceeded(name: str, *, use: int, adding: int, limit: int, where: str) -> QuotaExceeded:
    """The refusal of a change that would take `where` (the project, or a queue of it) past quota `name`."""
    quota = QUOTA[name]
    return QuotaExceeded(
        f"{where} holds {use} {quota.unit} and this would add {adding}; its quota {name!r} is {limit}. "
        f"Remove some first, or ask an administrator to raise the quota (PUT /v2/quotas/{{project}}).",
        name,
    )


def exceeded_reply(reply: str) -> QuotaExceeded:
    """exceeded() from a driver's terse refusal "name use adding limit where" (a Lua script's error)."""
    name, use, adding, limit, where = reply.split(" ", 4)
    return exceeded(name, use=int(use), adding=int(adding), limit=int(limit), where=where)
