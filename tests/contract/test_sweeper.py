"""The background sweep (docs/contract.md promise 7): a message whose last allowed claim expires moves to
its DLQ then, without anyone touching the source queue again, and concurrent sweeps never move one twice."""

from __future__ import annotations

import asyncio

import pytest

from core.clock import ManualClock
from core.models import Claim, MessageId, QueueRef
from storage.base import Store
from tests.contract.helpers import DLQ, Q, post, set_policy

pytestmark = pytest.mark.every_store


async def last_claim(store: Store, q: QueueRef = Q, dlq: str = DLQ.name) -> tuple[MessageId, Claim]:
    """One message in `q` (1 claim at most, then `dlq`), claimed for 60 s: its last allowed delivery."""
    await set_policy(store, q, max_claim_count=1, dead_letter_queue=dlq)
    [mid] = await post(store, q, q.project)
    held = await store.claim(q, ttl=60, grace=0, limit=1)
    assert held.claim is not None
    return mid, held.claim


async def test_sweep_moves_a_message_when_its_last_claim_expires(store: Store, clock: ManualClock) -> None:
    mid, _ = await last_claim(store)
    clock.advance(61)
    await store.sweep()
    # Read the DLQ only: nothing but the sweep can have moved the message there.
    [moved] = await store.get_messages(DLQ, [mid])
    assert moved.dead_letter is not None
    assert (moved.dead_letter.reason, moved.dead_letter.claim_count) == ("max_claims", 1)
    assert moved.dead_letter.dead_lettered_at_ms == clock.now_ms()
    assert moved.claim_id is None


async def test_sweep_leaves_claims_that_have_not_expired(store: Store, clock: ManualClock) -> None:
    mid, claim = await last_claim(store)
    clock.advance(59)
    await store.sweep()
    assert await store.get_messages(DLQ, [mid]) == []
    assert (await store.get_claim(Q, claim.id)).messages[0].id == mid


async def test_sweep_reaches_every_project(store: Store, clock: ManualClock) -> None:
    queues = [QueueRef(f"tenant-{i}", "jobs") for i in range(3)]
    for q in queues:
        await last_claim(store, q, dlq="jobs.dlq")
    clock.advance(61)
    await store.sweep()
    for q in queues:
        stats = await store.stats(QueueRef(q.project, "jobs.dlq"))
        assert (stats.total, stats.dead_letters_received) == (1, 1)


async def test_concurrent_sweeps_move_each_message_exactly_once(
    store: Store, clock: ManualClock, scale: float
) -> None:
    sources = [QueueRef(Q.project, f"src-{i}") for i in range(4)]
    claims = max(1, round(5 * scale))
    for q in sources:
        await set_policy(store, q, max_claim_count=1, dead_letter_queue=DLQ.name)
        for _ in range(claims):
            await post(store, q, *range(20))
            assert (await store.claim(q, ttl=60, grace=0, limit=20)).claim is not None
    clock.advance(61)
    await asyncio.gather(*(store.sweep() for _ in range(16)))
    dlq = await store.stats(DLQ)
    assert (dlq.total, dlq.dead_letters_received) == (80 * claims, 80 * claims)
    for q in sources:
        stats = await store.stats(q)
        assert (stats.total, stats.dead_lettered) == (0, 20 * claims)


async def test_sweep_lease_lets_one_caller_work_a_period(store: Store, clock: ManualClock) -> None:
    assert await store.sweep(lease_ms=60_000) is not None
    assert await store.sweep(lease_ms=60_000) is None  # the lease is held: the work would repeat
    assert await store.sweep() is not None  # without a lease the caller always works


async def test_later_sweeps_find_new_work_and_work_that_comes_due(store: Store, clock: ManualClock) -> None:
    await store.sweep()  # a namespace's first sweep may walk every project; the next ones look at less
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, "x")
    await store.sweep()  # the project's next work: the message expires in an hour
    assert (await store.claim(Q, ttl=60, grace=0, limit=1)).claim is not None
    await store.sweep()  # sees that the claim made it sooner, not yet due
    clock.advance(61)
    await store.sweep()  # nothing touched the project since: found because it came due
    assert len(await store.get_messages(DLQ, [mid])) == 1
