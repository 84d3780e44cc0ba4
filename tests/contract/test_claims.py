from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.errors import ClaimNotFound
from core.models import ClaimId, QueueRef
from storage.base import Store
from tests.contract.helpers import Q, post

pytestmark = pytest.mark.every_store


async def test_claim_takes_oldest_first_and_counts(store: Store) -> None:
    await post(store, Q, *range(5))
    result = await store.claim(Q, ttl=60, grace=30, limit=3)
    assert result.claim is not None
    assert [m.body for m in result.claim.messages] == [0, 1, 2]
    assert all(m.claim_count == 1 and m.claim_id == result.claim.id for m in result.claim.messages)


async def test_active_claim_hides_messages_from_other_claims(store: Store) -> None:
    await post(store, Q, *range(3))
    first = await store.claim(Q, ttl=60, grace=60, limit=2)
    second = await store.claim(Q, ttl=60, grace=60, limit=5)
    assert first.claim is not None
    assert second.claim is not None
    assert [m.body for m in second.claim.messages] == [2]
    assert (await store.claim(Q, ttl=60, grace=60, limit=5)).claim is None


async def test_released_claim_returns_messages_in_order(store: Store) -> None:
    await post(store, Q, *range(3))
    first = await store.claim(Q, ttl=60, grace=60, limit=2)
    assert first.claim is not None
    await store.release_claim(Q, first.claim.id)
    again = await store.claim(Q, ttl=60, grace=60, limit=5)
    assert again.claim is not None
    assert [(m.body, m.claim_count) for m in again.claim.messages] == [(0, 2), (1, 2), (2, 1)]


async def test_expired_claim_returns_messages(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "x")
    first = await store.claim(Q, ttl=60, grace=60, limit=1)
    assert first.claim is not None
    clock.advance(59)
    assert (await store.claim(Q, ttl=60, grace=60, limit=1)).claim is None
    clock.advance(1)
    again = await store.claim(Q, ttl=60, grace=60, limit=1)
    assert again.claim is not None
    assert again.claim.messages[0].claim_count == 2
    with pytest.raises(ClaimNotFound):
        await store.get_claim(Q, first.claim.id)


async def test_get_claim_shows_held_messages(store: Store, clock: ManualClock) -> None:
    ids = await post(store, Q, "a", "b")
    result = await store.claim(Q, ttl=100, grace=60, limit=2)
    assert result.claim is not None
    clock.advance(10)
    await store.delete_message(Q, ids[0], claim_id=result.claim.id)
    claim = await store.get_claim(Q, result.claim.id)
    assert (claim.ttl, claim.grace, claim.age(clock.now_ms())) == (100, 60, 10)
    assert [m.body for m in claim.messages] == ["b"]


async def test_claim_is_scoped_to_its_queue(store: Store) -> None:
    await post(store, Q, "a")
    result = await store.claim(Q, ttl=60, grace=60, limit=1)
    assert result.claim is not None
    with pytest.raises(ClaimNotFound):
        await store.get_claim(QueueRef(Q.project, "other"), result.claim.id)
    with pytest.raises(ClaimNotFound):
        await store.get_claim(QueueRef("project-b", Q.name), result.claim.id)


async def test_renew_extends_claim_and_restarts_age(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "a", ttl=60)
    result = await store.claim(Q, ttl=60, grace=0, limit=1)
    assert result.claim is not None
    clock.advance(50)
    await store.renew_claim(Q, result.claim.id, ttl=120, grace=30)
    clock.advance(100)  # past the first claim's end and the message's own ttl: both extended by renew
    claim = await store.get_claim(Q, result.claim.id)
    assert (claim.ttl, claim.grace, claim.age(clock.now_ms())) == (120, 30, 100)
    assert [m.body for m in claim.messages] == ["a"]
    assert (await store.claim(Q, ttl=60, grace=60, limit=1)).claim is None


async def test_renew_unknown_or_expired_claim_is_not_found(store: Store, clock: ManualClock) -> None:
    with pytest.raises(ClaimNotFound):
        await store.renew_claim(Q, ClaimId("f" * 32), ttl=60, grace=60)
    await post(store, Q, "a")
    result = await store.claim(Q, ttl=60, grace=60, limit=1)
    assert result.claim is not None
    clock.advance(60)
    with pytest.raises(ClaimNotFound):
        await store.renew_claim(Q, result.claim.id, ttl=60, grace=60)


async def test_grace_keeps_claimed_message_alive(store: Store, clock: ManualClock) -> None:
    [mid] = await post(store, Q, "a", ttl=60)
    result = await store.claim(Q, ttl=100, grace=20, limit=1)
    assert result.claim is not None
    clock.advance(110)  # message ttl was 60, but it lives until the claim's end + grace = 120
    assert len(await store.get_messages(Q, [mid])) == 1
    clock.advance(10)
    assert await store.get_messages(Q, [mid]) == []


async def test_a_claims_messages_are_as_a_read_after_it_finds_them(store: Store) -> None:
    """What a claim returns of each message (its count, claim, claim's end, and an expiry the grace rule
    moved) is what reading the message just after finds: first claims and later ones, with the grace rule
    moving the expiry and not."""
    ids = await post(store, Q, "short", ttl=60)
    ids += await post(store, Q, "long", ttl=3600)
    for _ in range(2):
        result = await store.claim(Q, ttl=100, grace=20, limit=2)
        assert result.claim is not None
        assert result.claim.messages == await store.get_messages(Q, ids)
        assert [m.claim_count for m in result.claim.messages] == [1 + _] * 2
        await store.release_claim(Q, result.claim.id)


async def test_release_unknown_claim_is_a_no_op(store: Store) -> None:
    await store.release_claim(Q, ClaimId("a" * 32))
