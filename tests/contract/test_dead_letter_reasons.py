"""Dead-lettering beyond used-up claims (issue 7): rejection by the consumer, expiry to the DLQ, the queue's
max ttl and messages that are not DLQ-eligible, on every driver."""

from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.errors import ClaimMismatch, Conflict, MessageNotFound
from core.models import ClaimId, MessageId, QueueRef, Rejection
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_meta

pytestmark = pytest.mark.every_store


async def test_reject_moves_a_claimed_message_now_with_its_reason(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _max_claim_count=10)
    first, second = await post(store, Q, {"n": 1}, {"n": 2})
    cid, _ = await claim_ids(store, Q)
    clock.advance(3)
    rejection = Rejection(reason="bad schema", description="field 'sku' missing")
    assert await store.dead_letter_message(Q, first, claim_id=cid, rejection=rejection)
    assert await store.get_messages(Q, [first]) == []
    [moved] = await store.get_messages(DLQ, [first])
    assert moved.claim_id is None
    assert moved.claim_count == 0
    d = moved.dead_letter
    assert d is not None
    assert (d.source_queue, d.reason, d.claim_count, d.rejection) == (Q.name, "rejected", 1, rejection)
    assert d.dead_lettered_at_ms == clock.now_ms()
    assert [m.id for m in (await store.get_claim(Q, cid)).messages] == [second]  # the rest stays claimed
    assert (await claim_ids(store, DLQ))[1] == [first]  # claimable in the DLQ at once
    stats = await store.stats(Q)
    assert (stats.dead_lettered, stats.total) == (1, 1)


async def test_reject_without_text_and_errors(store: Store, clock: ManualClock) -> None:
    [mid] = await post(store, Q, "x")
    cid, _ = await claim_ids(store, Q)
    with pytest.raises(Conflict, match="_dead_letter_queue"):
        await store.dead_letter_message(Q, mid, claim_id=cid, rejection=Rejection())
    await set_meta(store, Q, _dead_letter_queue=DLQ.name)
    with pytest.raises(ClaimMismatch):
        await store.dead_letter_message(Q, mid, claim_id=ClaimId("e" * 32), rejection=Rejection())
    with pytest.raises(MessageNotFound):
        await store.dead_letter_message(Q, MessageId("0" * 32), claim_id=cid, rejection=Rejection())
    assert await store.dead_letter_message(Q, mid, claim_id=cid, rejection=Rejection())
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.dead_letter is not None
    assert moved.dead_letter.rejection is None
    [other] = await post(store, Q, "y")
    cid, _ = await claim_ids(store, Q)
    clock.advance(61)  # the claim expired
    with pytest.raises(ClaimMismatch):
        await store.dead_letter_message(Q, other, claim_id=cid, rejection=Rejection())


async def test_expired_messages_move_to_the_dlq(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _dead_letter_on_expiry=True)
    [mid] = await post(store, Q, {"late": True}, ttl=60)
    posted = clock.now_ms()
    clock.advance(59.999)
    await store.sweep()
    assert await store.get_messages(DLQ, [mid]) == []
    clock.advance(0.001)
    await store.sweep()
    [moved] = await store.get_messages(DLQ, [mid])
    d = moved.dead_letter
    assert d is not None
    assert (d.reason, d.source_queue, d.first_enqueued_at_ms) == ("expired", Q.name, posted)
    assert moved.ttl == 3600  # no DLQ ttl set: the service's default message ttl, counted from the move
    assert moved.expires_ms == clock.now_ms() + 3600 * 1000
    assert (await store.stats(Q)).dead_lettered == 1


async def test_expired_to_dlq_takes_the_dlq_ttl(store: Store, clock: ManualClock) -> None:
    await set_meta(
        store,
        Q,
        _dead_letter_queue=DLQ.name,
        _dead_letter_on_expiry=True,
        _dead_letter_queue_messages_ttl=120,
    )
    [mid] = await post(store, Q, "x", ttl=60)
    clock.advance(60)
    await store.sweep()
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.ttl == 120


async def test_without_the_flag_expired_messages_vanish(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x", ttl=60)
    clock.advance(60)
    await store.sweep()
    assert await store.get_messages(DLQ, [mid]) == []
    assert (await store.stats(DLQ)).total == 0


async def test_max_message_ttl_caps_posted_ttls(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _max_message_ttl=120)
    capped, kept, default = (
        await post(store, Q, "a", ttl=600) + await post(store, Q, "b", ttl=90) + await post(store, Q, "c")
    )
    got = {m.id: m.ttl for m in await store.get_messages(Q, [capped, kept, default])}
    assert got == {capped: 120, kept: 90, default: 120}


async def test_not_eligible_messages_are_discarded_and_counted(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _max_claim_count=1, _dead_letter_on_expiry=True)
    [spent] = await post(store, Q, "spent", eligible=False)
    [kept] = await post(store, Q, "kept")
    [shown] = await store.get_messages(Q, [spent])
    assert not shown.dead_letter_eligible
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)  # both used up their one claim: one moves, one is discarded
    assert [m.id for m in await store.get_messages(DLQ, [spent, kept])] == [kept]
    [late] = await post(store, Q, "late", ttl=60, eligible=False)
    [rejected] = await post(store, Q, "rejected", eligible=False)
    clock.advance(60)
    await store.sweep()
    cid, ids = await claim_ids(store, Q)
    assert ids == [rejected]
    assert not await store.dead_letter_message(Q, rejected, claim_id=cid, rejection=Rejection())
    assert await store.get_messages(DLQ, [late, rejected]) == []
    stats = await store.stats(Q)
    assert (stats.discarded, stats.dead_lettered, stats.total) == (3, 1, 0)


async def test_solace_delayed_consumption_recipe(store: Store, clock: ManualClock) -> None:
    """Solace's "delayed message consumption": producers post to a holding queue B that nobody reads, with
    max ttl = the delay, expiry to DLQ and DLQ = the work queue A; each message reaches A after the delay."""
    work, holding = QueueRef(Q.project, "work"), QueueRef(Q.project, "work.in-5m")
    await set_meta(
        store,
        holding,
        _max_message_ttl=300,
        _dead_letter_on_expiry=True,
        _dead_letter_queue=work.name,
        _dead_letter_queue_messages_ttl=3600,
    )
    [mid] = await post(store, holding, {"remind": "tea"}, ttl=86400)
    clock.advance(299)
    await store.sweep()
    assert (await claim_ids(store, work))[1] == []
    clock.advance(1)
    await store.sweep()
    cid, ids = await claim_ids(store, work)
    assert ids == [mid]
    [m] = (await store.get_claim(work, cid)).messages
    assert m.body == {"remind": "tea"}
    assert m.ttl == 3600
