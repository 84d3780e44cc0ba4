"""Wire shapes: request bodies (validated) and response bodies (documented in openapi.yaml)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageIn(_In):
    body: Any = Field(..., description="Any JSON value.")
    ttl: StrictInt | None = Field(None, description="Seconds the message lives; the queue default if absent.")
    delay: StrictInt | None = Field(None, description="Seconds before the message can be claimed.")


class PostMessagesIn(_In):
    messages: list[MessageIn] = Field(..., min_length=1)


class ClaimIn(_In):
    ttl: StrictInt | None = Field(None, description="Seconds the claim lasts.")
    grace: StrictInt | None = Field(None, description="Seconds the claimed messages outlive the claim.")


class PurgeIn(_In):
    resource_types: list[Literal["messages", "subscriptions"]] | None = None


class PatchOp(_In):
    op: Literal["add", "replace", "remove"]
    path: str = Field(..., description="/metadata/<key>")
    value: Any = None


REQUEST_MODELS: tuple[type[BaseModel], ...] = (PostMessagesIn, ClaimIn, PurgeIn, PatchOp)


class Link(BaseModel):
    rel: str
    href: str


class DeadLetterOut(BaseModel):
    source_queue: str
    reason: Literal["max_claims", "expired", "rejected"]
    claim_count: int
    dead_lettered_at: str
    first_enqueued_at: str


class MessageOut(BaseModel):
    id: str
    href: str
    ttl: int
    age: int
    body: Any
    claim_count: int
    dead_letter: DeadLetterOut | None = Field(None, description="Only on dead-lettered messages (EXT).")


class MessagesPage(BaseModel):
    messages: list[MessageOut]
    links: list[Link]


class MessagesOut(BaseModel):
    messages: list[MessageOut]


class PostedOut(BaseModel):
    resources: list[str]


class ClaimOut(BaseModel):
    age: int
    ttl: int
    grace: int
    href: str
    messages: list[MessageOut]


class QueueOut(BaseModel):
    name: str
    href: str
    metadata: dict[str, Any] | None = None


class QueuesPage(BaseModel):
    queues: list[QueueOut]
    links: list[Link]


class Stamp(BaseModel):
    href: str
    age: int
    created: str


class MessageCounts(BaseModel):
    free: int
    claimed: int
    total: int
    delayed: int
    dead_lettered: int = Field(..., description="Messages moved out of this queue to its DLQ (EXT).")
    discarded: int = Field(..., description="Exhausted messages dropped for want of a DLQ (EXT).")
    dead_letters_received: int = Field(
        ..., description="Messages other queues dead-lettered into this one, as their DLQ (EXT)."
    )
    oldest: Stamp | None = None
    newest: Stamp | None = None


class StatsOut(BaseModel):
    messages: MessageCounts


class HealthOut(BaseModel):
    storage_reachable: bool


class ErrorOut(BaseModel):
    title: str
    description: str
