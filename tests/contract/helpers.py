from __future__ import annotations

from typing import Any

from core.limits import Limits
from core.metadata import QueuePolicy, parse_policy
from core.models import ClaimId, Message, MessageId, NewMessage, QueueRef
from storage.base import Store

Q = QueueRef("project-a", "orders")
DLQ = QueueRef("project-a", "orders.dlq")
CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
OTHER_CLIENT = "77b2e8aa-2b9e-11e3-b191-71861300734c"


async def post(
    store: Store,
    q: QueueRef,
    *bodies: Any,
    ttl: int | None = None,
    delay: int | None = None,
    client_id: str = CLIENT,
    eligible: bool = True,
) -> list[MessageId]:
    return await store.post_messages(
        q,
        [NewMessage(body=b, ttl=ttl, delay=delay, dead_letter_eligible=eligible) for b in bodies],
        client_id=client_id,
        default_ttl=3600,
        default_delay=0,
        body_size=100,
    )


async def set_policy(store: Store, q: QueueRef, **policy: Any) -> None:
    keys = {
        "max_claim_count": "_max_claim_count",
        "dead_letter_queue": "_dead_letter_queue",
        "dead_letter_ttl": "_dead_letter_queue_messages_ttl",
    }
    await store.set_metadata(
        q, metadata={keys[k]: v for k, v in policy.items()}, policy=QueuePolicy(**policy)
    )


async def set_meta(store: Store, q: QueueRef, **metadata: Any) -> None:
    """Write reserved metadata as the API does: validated into the policy the driver acts on."""
    await store.set_metadata(q, metadata=metadata, policy=parse_policy(metadata, Limits(), queue=q.name))


async def claim_ids(
    store: Store, q: QueueRef, limit: int = 20, ttl: int = 60
) -> tuple[ClaimId, list[MessageId]]:
    """Claim and return (claim id, message ids); ("", []) when nothing was claimable."""
    result = await store.claim(q, ttl=ttl, grace=60, limit=limit)
    if result.claim is None:
        return ClaimId(""), []
    return result.claim.id, [m.id for m in result.claim.messages]


async def all_messages(store: Store, q: QueueRef, *, limit: int, **options: Any) -> list[Message]:
    """Every message `list_messages` shows, page by page (`limit` a page), with `options` (echo, client_id,
    include_claimed, include_delayed) on every call."""
    out: list[Message] = []
    marker = None
    while True:
        page = await store.list_messages(q, marker=marker, limit=limit, **options)
        out += page.items
        if page.next_marker is None:
            return out
        marker = int(page.next_marker)
