from __future__ import annotations

import asyncio
from collections import Counter

from core.models import MessageId
from storage.base import Store
from tests.contract.helpers import Q, post


async def test_50_claimers_each_message_delivered_and_deleted_once(store: Store) -> None:
    posted: list[MessageId] = []
    for start in range(0, 2000, 100):
        posted += await post(store, Q, *range(start, start + 100))
    delivered: Counter[str] = Counter()

    async def claimer() -> None:
        while True:
            result = await store.claim(Q, ttl=300, grace=60, limit=10)
            if result.claim is None:
                return
            for m in result.claim.messages:
                delivered[m.id] += 1
                await store.delete_message(Q, m.id, claim_id=result.claim.id)  # raises if not held

    await asyncio.gather(*(claimer() for _ in range(50)))
    assert len(delivered) == 2000
    assert set(delivered) == set(posted)
    assert max(delivered.values()) == 1
    assert (await store.stats(Q)).total == 0
