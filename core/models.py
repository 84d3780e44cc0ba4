"""Domain values passed between the API layer and the storage drivers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NewType, TypeVar

MessageId = NewType("MessageId", str)
ClaimId = NewType("ClaimId", str)
DeadLetterReason = Literal["max_claims", "expired", "rejected"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A queue inside a project; every storage call is scoped by it."""

    project: str
    name: str


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message as posted. `ttl`/`delay` of None take the queue's defaults."""

    body: Any
    ttl: int | None = None
    delay: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Provenance of a dead-lettered message (ARCHITECTURE.md §3 promise 6)."""

    source_queue: str
    reason: DeadLetterReason
    claim_count: int
    dead_lettered_at_ms: int
    first_enqueued_at_ms: int


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


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; `next_marker` is None when nothing follows."""

    items: list[T]
    next_marker: str | None
