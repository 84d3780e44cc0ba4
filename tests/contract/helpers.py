from __future__ import annotations

from typing import Any

from core.metadata import QueuePolicy
from core.models import MessageId, NewMessage, QueueRef
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
) -> list[MessageId]:
    return await store.post_messages(
        q,
        [NewMessage(body=b, ttl=ttl, delay=delay) for b in bodies],
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
