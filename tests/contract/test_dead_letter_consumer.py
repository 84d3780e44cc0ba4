"""Who failed (issue 23): the provenance names the consumer whose claim used up the last delivery, or who
rejected the message, by its Client-ID."""

from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.models import QueueRef, RedriveSpec, Rejection
from storage.base import Store
from tests.contract.helpers import DLQ, Q, post, set_meta, set_policy
from tests.contract.test_redrive import run

pytestmark = pytest.mark.every_store

ALICE = "3381af92-2b9e-11e3-b191-71861300734c"
BOB = "4481af92-2b9e-11e3-b191-71861300734d"
CAROL = "5581af92-2b9e-11e3-b191-71861300734e"


async def claim_as(store: Store, client: str, q: QueueRef = Q, limit: int = 20) -> str:
    result = await store.claim(q, ttl=60, grace=60, limit=limit, client_id=client)
    assert result.claim is not None
    return result.claim.id


async def consumer_in(store: Store, mid: str, q: QueueRef = DLQ) -> str | None:
    [moved] = await store.get_messages(q, [mid])  # type: ignore[list-item]
    assert moved.dead_letter is not None
    return moved.dead_letter.consumer


async def test_the_last_claimer_is_the_consumer_of_a_max_claims_move(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=2, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    await store.release_claim(Q, await claim_as(store, ALICE))
    await store.release_claim(Q, await claim_as(store, BOB))  # Bob's claim used up the last delivery
    assert await consumer_in(store, mid) == BOB


async def test_a_lapsed_last_claim_names_its_claimer(store: Store, clock: ManualClock) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    await claim_as(store, ALICE)
    clock.advance(61)  # the consumer crashed: its claim lapses and the message moves
    await store.sweep()
    assert await consumer_in(store, mid) == ALICE


async def test_the_rejecter_is_the_consumer_of_a_rejection(store: Store) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    cid = await claim_as(store, ALICE)
    assert await store.dead_letter_message(Q, mid, claim_id=cid, rejection=Rejection("bad"), client_id=CAROL)
    assert await consumer_in(store, mid) == CAROL


async def test_an_expired_message_names_its_last_claimer_or_none(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _dead_letter_on_expiry=True)
    [claimed, never] = await post(store, Q, "claimed", "never", ttl=600)
    await store.release_claim(Q, await claim_as(store, ALICE, limit=1))
    clock.advance(600)
    await store.sweep()
    assert await consumer_in(store, claimed) == ALICE
    assert await consumer_in(store, never) is None


async def test_the_consumer_stays_while_the_dlq_is_consumed_and_redriven(
    store: Store, clock: ManualClock
) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    await store.release_claim(Q, await claim_as(store, ALICE))
    await store.release_claim(DLQ, await claim_as(store, BOB, q=DLQ))  # a DLQ reader is not the consumer
    assert await consumer_in(store, mid) == ALICE
    # sent back and dead-lettered again without being claimed: no stale consumer from the first time
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _dead_letter_on_expiry=True)
    assert (await run(store, RedriveSpec())).status == "succeeded"
    [back] = await store.get_messages(Q, [mid])  # type: ignore[list-item]
    clock.advance((back.expires_ms - clock.now_ms()) / 1000)
    await store.sweep()
    assert await consumer_in(store, mid) is None
