"""Claim-safe bulk acknowledge (`ids` with `claim_ids`) and acknowledging a whole claim, on every store."""

from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.errors import ClaimMismatch, ClaimNotFound
from core.models import ClaimId, MessageId, NotDeleted
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_meta

pytestmark = pytest.mark.every_store

UNKNOWN = MessageId("0" * 32)


async def left(store: Store) -> list[object]:
    return sorted(m.body for m in await store.get_messages(Q, await all_ids(store)))


async def all_ids(store: Store) -> list[MessageId]:
    page = await store.list_messages(
        Q, marker=None, limit=20, echo=True, client_id="", include_claimed=True, include_delayed=True
    )
    return [m.id for m in page.items]


async def test_the_claims_own_messages_are_deleted(store: Store) -> None:
    await post(store, Q, *range(4))
    cid, ids = await claim_ids(store, Q, limit=3)
    assert await store.delete_messages(Q, ids, claim_ids=[cid]) == []
    assert await left(store) == [3]


async def test_a_wrong_claim_deletes_nothing_it_does_not_hold(store: Store) -> None:
    await post(store, Q, "a", "b")
    cid, ids = await claim_ids(store, Q, limit=2)
    stranger = ClaimId("f" * 32)
    refused = await store.delete_messages(Q, ids, claim_ids=[stranger])
    assert refused == [NotDeleted(ids[0], "claimed_by_another"), NotDeleted(ids[1], "claimed_by_another")]
    assert await left(store) == ["a", "b"]
    assert (await store.get_claim(Q, cid)).messages  # the claim still holds them


async def test_an_unclaimed_message_is_not_deleted_with_claim_ids(store: Store) -> None:
    free, held = await post(store, Q, "free", "held")
    cid, ids = await claim_ids(store, Q, limit=1)
    assert ids == [free]
    await store.release_claim(Q, cid)
    cid2, _ = await claim_ids(store, Q, limit=1)
    refused = await store.delete_messages(Q, [free, held], claim_ids=[cid2])
    # cid2 took `free` again (the oldest); `held` was never claimed
    assert refused == [NotDeleted(held, "not_claimed")]
    assert await left(store) == ["held"]


async def test_an_expired_claim_deletes_nothing(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "a", "b")
    cid, ids = await claim_ids(store, Q, limit=2, ttl=60)
    clock.advance(61)
    refused = await store.delete_messages(Q, ids, claim_ids=[cid])
    assert refused == [NotDeleted(i, "not_claimed") for i in ids]
    assert await left(store) == ["a", "b"]
    # claimed again by someone else: still not the expired claim's to delete
    other, _ = await claim_ids(store, Q, limit=2)
    assert await store.delete_messages(Q, ids, claim_ids=[cid]) == [
        NotDeleted(i, "claimed_by_another") for i in ids
    ]
    assert await store.delete_messages(Q, ids, claim_ids=[other]) == []
    assert await left(store) == []


async def test_mixed_claims_delete_what_each_holds_and_say_why_not_for_the_rest(store: Store) -> None:
    await post(store, Q, *range(5))
    first, ids1 = await claim_ids(store, Q, limit=2)
    second, ids2 = await claim_ids(store, Q, limit=2)
    third, ids3 = await claim_ids(store, Q, limit=1)
    # the first and second claims are given, the third is not; one id names no message at all
    refused = await store.delete_messages(Q, [*ids1, *ids2, *ids3, UNKNOWN], claim_ids=[second, first])
    assert refused == [NotDeleted(ids3[0], "claimed_by_another")]
    assert await left(store) == [4]
    assert [m.id for m in (await store.get_claim(Q, third)).messages] == ids3


async def test_without_claim_ids_bulk_delete_ignores_claims_as_zaqar_does(store: Store) -> None:
    await post(store, Q, "a", "b", "c")
    _, ids = await claim_ids(store, Q, limit=2)
    assert await store.delete_messages(Q, [*ids, UNKNOWN]) == []
    assert await left(store) == ["c"]


async def test_acknowledging_a_claim_deletes_what_it_holds_and_the_claim(store: Store) -> None:
    await post(store, Q, *range(4))
    cid, ids = await claim_ids(store, Q, limit=3)
    await store.release_message(Q, ids[0], claim_id=cid, delay=0)  # no longer the claim's
    assert await store.acknowledge_claim(Q, cid) == 2
    assert await left(store) == [0, 3]
    with pytest.raises(ClaimNotFound):
        await store.get_claim(Q, cid)
    with pytest.raises(ClaimNotFound):  # twice: nothing left to acknowledge
        await store.acknowledge_claim(Q, cid)


async def test_an_expired_or_unknown_claim_cannot_be_acknowledged(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "a")
    cid, _ = await claim_ids(store, Q, limit=1, ttl=60)
    clock.advance(61)
    with pytest.raises(ClaimNotFound):
        await store.acknowledge_claim(Q, cid)
    with pytest.raises(ClaimNotFound):
        await store.acknowledge_claim(Q, ClaimId("e" * 32))
    assert await left(store) == ["a"]


async def test_a_message_its_expired_claim_lost_to_the_dlq_is_not_acknowledged(
    store: Store, clock: ManualClock
) -> None:
    """A consumer whose claim expired while it worked, and whose messages went to the DLQ meanwhile, is told
    (`dead_lettered`): they will be processed again from there. One deleted since is skipped, as ever."""
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _max_claim_count=1)
    await post(store, Q, "a", "b", "c")
    cid, ids = await claim_ids(store, Q, limit=3, ttl=60)
    clock.advance(61)
    await store.sweep()  # the claim's end moved its used-up messages to the DLQ
    assert sorted(m.id for m in await store.get_messages(DLQ, ids)) == sorted(ids)
    await store.delete_messages(DLQ, ids[2:])  # the DLQ's consumer handled one already
    refused = await store.delete_messages(Q, ids, claim_ids=[cid])
    assert refused == [NotDeleted(ids[0], "dead_lettered"), NotDeleted(ids[1], "dead_lettered")]
    with pytest.raises(ClaimMismatch, match="dead_lettered"):
        await store.delete_message(Q, ids[0], claim_id=cid)
    await store.delete_message(Q, ids[2], claim_id=cid)  # gone for good: nothing to say
    assert sorted(m.id for m in await store.get_messages(DLQ, ids)) == sorted(ids[:2])
