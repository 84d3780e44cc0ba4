"""Redelivery backoff and release with a delay (issue 7): when a released or expired claim's messages can be
claimed again, on every driver, with the clock moved instead of slept."""

from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.errors import ClaimMismatch, MessageNotFound
from core.metadata import Backoff
from core.models import ClaimId, MessageId
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_meta

pytestmark = pytest.mark.every_store


async def claimable_after(store: Store, clock: ManualClock, wait: float) -> ClaimId:
    """Move the clock `wait` seconds on: the message of Q must not be claimable a millisecond before, and
    must be then. Returns the claim that took it."""
    clock.advance(wait - 0.001)
    _, early = await claim_ids(store, Q)
    assert not early, f"claimable before its {wait} s wait was over"
    clock.advance(0.001)
    cid, ids = await claim_ids(store, Q)
    assert ids, f"not claimable once its {wait} s wait was over"
    return cid


async def test_artemis_example_waits_5_10_15(store: Store, clock: ManualClock) -> None:
    """Artemis' documented example: delay 5 s, multiplier 2, max 15 s -> waits of 5, 10, 15 (and 15) s."""
    await set_meta(store, Q, _redelivery_delay=5, _redelivery_delay_multiplier=2, _max_redelivery_delay=15)
    await post(store, Q, "job")
    cid, _ = await claim_ids(store, Q)
    for wait in (5, 10, 15, 15):
        await store.release_claim(Q, cid)
        cid = await claimable_after(store, clock, wait)


async def test_backoff_counts_from_the_end_of_an_expired_claim(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _redelivery_delay=5, _redelivery_delay_multiplier=3)
    await post(store, Q, "job")
    await claim_ids(store, Q, ttl=60)
    await store.sweep()  # a sweep before the claim ends changes nothing
    await claimable_after(store, clock, 60 + 5)  # claim count 1: 5 s after the claim ended
    clock.advance(60)
    await store.sweep()
    await claimable_after(store, clock, 15)  # claim count 2: 5 * 3, counted from that claim's end


async def test_default_cap_is_ten_times_the_delay(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _redelivery_delay=2, _redelivery_delay_multiplier=100)
    await post(store, Q, "job")
    cid, _ = await claim_ids(store, Q)
    for wait in (2, 20, 20):
        await store.release_claim(Q, cid)
        cid = await claimable_after(store, clock, wait)


async def test_delay_levels_then_the_last_repeats(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _redelivery_delay_levels=["1s", "5s", "1m"])
    await post(store, Q, "job")
    cid, _ = await claim_ids(store, Q)
    for wait in (1, 5, 60, 60):
        await store.release_claim(Q, cid)
        cid = await claimable_after(store, clock, wait)


async def test_jitter_spreads_messages_released_together(store: Store, clock: ManualClock) -> None:
    """With jitter each message waits delay x [1 - j, 1 + j], the same on every driver (computed from its id
    and claim count), so messages released together come back spread out."""
    await set_meta(store, Q, _redelivery_delay=10, _redelivery_jitter=0.5)
    ids = await post(store, Q, *range(12))
    cid, claimed = await claim_ids(store, Q)
    assert sorted(claimed) == sorted(ids)
    await store.release_claim(Q, cid)
    waits = sorted(Backoff(delay_ms=10_000, max_ms=100_000, jitter=0.5).wait_ms(i, 1) for i in ids)
    assert all(5000 <= w <= 15000 for w in waits)
    # spread out (random ids: two of the twelve may share a millisecond now and then)
    assert len(set(waits)) >= len(waits) - 2, waits
    assert waits[-1] - waits[0] >= 3000, waits
    released_at = clock.now_ms()
    for wait in sorted(set(waits)):  # each message is claimable again exactly when its own wait ends
        clock.advance((released_at + wait - 1 - clock.now_ms()) / 1000)
        assert (await store.stats(Q)).delayed == sum(1 for w in waits if w >= wait)
        clock.advance(0.001)
        assert (await store.stats(Q)).delayed == sum(1 for w in waits if w > wait)


async def test_release_with_a_delay_overrides_the_backoff(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _redelivery_delay=5)
    await post(store, Q, "job")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid, delay=30)
    cid = await claimable_after(store, clock, 30)
    await store.release_claim(Q, cid, delay=0)
    _, ids = await claim_ids(store, Q)
    assert ids, "delay=0 makes the message claimable at once, backoff or not"


async def test_release_without_backoff_is_immediate(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "job")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    assert (await claim_ids(store, Q))[1]


async def test_release_one_message_of_a_claim(store: Store, clock: ManualClock) -> None:
    first, second = await post(store, Q, "a", "b")
    cid, ids = await claim_ids(store, Q)
    assert ids == [first, second]
    await store.release_message(Q, first, claim_id=cid, delay=10)
    claim = await store.get_claim(Q, cid)
    assert [m.id for m in claim.messages] == [second]  # the claim keeps the other message
    with pytest.raises(ClaimMismatch):
        await store.release_message(Q, first, claim_id=cid)  # no longer held by it
    clock.advance(9.999)
    assert (await claim_ids(store, Q))[1] == []
    clock.advance(0.001)
    assert (await claim_ids(store, Q))[1] == [first]


async def test_release_message_errors(store: Store, clock: ManualClock) -> None:
    [mid] = await post(store, Q, "a")
    cid, _ = await claim_ids(store, Q)
    with pytest.raises(MessageNotFound):
        await store.release_message(Q, MessageId("0" * 32), claim_id=cid)
    with pytest.raises(ClaimMismatch):
        await store.release_message(Q, mid, claim_id=ClaimId("f" * 32))
    clock.advance(61)  # the claim expired: it holds nothing any more
    with pytest.raises(ClaimMismatch):
        await store.release_message(Q, mid, claim_id=cid)


async def test_exhausted_message_moves_at_release_whatever_the_delay(
    store: Store, clock: ManualClock
) -> None:
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name, _redelivery_delay=60)
    [mid] = await post(store, Q, "a")
    cid, _ = await claim_ids(store, Q)
    await store.release_message(Q, mid, claim_id=cid, delay=300)
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.dead_letter is not None
    assert moved.dead_letter.reason == "max_claims"
