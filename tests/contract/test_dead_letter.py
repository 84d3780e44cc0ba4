"""Dead-lettering in the claim path (docs/contract.md): the basics every driver must do atomically."""

from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.models import QueueRef
from storage.base import Store
from tests.contract.helpers import DLQ, Q, post, set_policy

pytestmark = pytest.mark.every_store


async def claim_release(store: Store, limit: int = 20, q: QueueRef = Q) -> int:
    result = await store.claim(q, ttl=60, grace=60, limit=limit)
    if result.claim is None:
        return 0
    await store.release_claim(q, result.claim.id)
    return len(result.claim.messages)


async def test_message_moves_after_max_claims_with_provenance(store: Store, clock: ManualClock) -> None:
    await set_policy(store, Q, max_claim_count=2, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, {"order": 7})
    posted_at = clock.now_ms()
    assert await claim_release(store) == 1
    clock.advance(5)
    assert await claim_release(store) == 1  # the second release used up the last delivery: moved now
    assert await store.get_messages(Q, [mid]) == []
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.body == {"order": 7}
    assert moved.claim_id is None
    assert moved.claim_count == 0
    assert moved.dead_letter is not None
    d = moved.dead_letter
    assert (d.source_queue, d.reason, d.claim_count) == (Q.name, "max_claims", 2)
    assert d.first_enqueued_at_ms == posted_at
    assert d.dead_lettered_at_ms == clock.now_ms()
    dlq_claim = await store.claim(DLQ, ttl=60, grace=60, limit=5)
    assert dlq_claim.claim is not None
    assert [m.id for m in dlq_claim.claim.messages] == [mid]
    assert ((await store.stats(Q)).dead_lettered, (await store.stats(Q)).total) == (1, 0)


async def test_claim_moves_exhausted_and_keeps_filling(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "old1", "old2")
    first = await store.claim(Q, ttl=60, grace=60, limit=2)
    assert first.claim is not None
    clock.advance(60)  # claim expires: both messages were delivered once
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await post(store, Q, "new1", "new2")
    result = await store.claim(Q, ttl=60, grace=60, limit=2)
    assert result.claim is not None
    assert [m.body for m in result.claim.messages] == ["new1", "new2"]
    assert (await store.stats(DLQ)).total == 2


async def test_dead_letter_ttl_applies_to_expiry(store: Store, clock: ManualClock) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name, dead_letter_ttl=120)
    [mid] = await post(store, Q, "x", ttl=3600)
    assert await claim_release(store) == 1
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.ttl == 120
    clock.advance(120)
    assert await store.get_messages(DLQ, [mid]) == []


async def test_no_dlq_discards_and_counts(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=1)
    await post(store, Q, "x", "y")
    assert await claim_release(store) == 2
    stats = await store.stats(Q)
    assert (stats.total, stats.discarded, stats.dead_lettered) == (0, 2, 0)
    assert (await store.stats(DLQ)).dead_letters_received == 0


async def test_chained_dead_letter_queues_keep_the_first_enqueue_time(
    store: Store, clock: ManualClock
) -> None:
    dlq2 = QueueRef(Q.project, "orders.dlq2")
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await set_policy(store, DLQ, max_claim_count=1, dead_letter_queue=dlq2.name)
    [mid] = await post(store, Q, "x")
    posted_at = clock.now_ms()
    assert await claim_release(store) == 1  # Q -> DLQ
    clock.advance(10)
    assert await claim_release(store, q=DLQ) == 1  # DLQ -> DLQ2: its claim count started again at 0
    [moved] = await store.get_messages(dlq2, [mid])
    assert moved.dead_letter is not None
    d = moved.dead_letter
    assert (d.source_queue, d.claim_count, d.first_enqueued_at_ms) == (DLQ.name, 1, posted_at)
    assert d.dead_lettered_at_ms == clock.now_ms()
    stats = await store.stats(DLQ)
    assert (stats.dead_letters_received, stats.dead_lettered, stats.total) == (1, 1, 0)


async def test_listing_a_dlq_with_include_claimed_shows_claimed_dead_letters(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    assert await claim_release(store) == 1
    held = await store.claim(DLQ, ttl=60, grace=60, limit=5)
    assert held.claim is not None
    page = await store.list_messages(
        DLQ, marker=None, limit=10, echo=True, client_id="c", include_claimed=True, include_delayed=False
    )
    [listed] = page.items
    assert (listed.id, listed.claim_id) == (mid, held.claim.id)
    assert listed.dead_letter is not None
    assert listed.dead_letter.source_queue == Q.name


async def test_removing_the_keys_turns_dead_lettering_off(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await set_policy(store, Q)
    [mid] = await post(store, Q, "x")
    for _ in range(3):
        assert await claim_release(store) == 1
    [kept] = await store.get_messages(Q, [mid])
    assert kept.claim_count == 3
    assert (await store.stats(DLQ)).total == 0
