"""Long polling (service/waiting.py's LongPolls) on every store: what wakes a waiting claim (a post, a
release, a delay that ends, a dead-letter move, a redrive), that one message wakes one waiter, the bound on
waiting claims, the wait running out, and shutdown answering at once.

The stores run on a ManualClock: a waiter's timers (its wait, the next delay that ends) move only when a test
advances it, so a waiter that returns was woken by the store. Each wait for an answer is bounded by
ANSWER_S of real time only so that a defect fails instead of hanging.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.clock import ManualClock
from core.errors import ServiceBusy
from core.models import ClaimResult, QueueRef, RedriveSpec, TaskId
from service.waiting import LongPolls
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_policy

pytestmark = pytest.mark.every_store

ANSWER_S = 10.0
WAIT = 20


class Counting:
    """The store, with its claim calls counted (everything else passes through)."""

    def __init__(self, store: Store) -> None:
        self.store, self.claims = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def claim(self, q: QueueRef, **kwargs: Any) -> ClaimResult:
        self.claims += 1
        return await self.store.claim(q, **kwargs)


@pytest.fixture
async def polls(store: Store, clock: ManualClock) -> Any:
    counting = Counting(store)
    polls = LongPolls(lambda: counting, clock=clock, max_waiting=3)  # type: ignore[arg-type,return-value]
    polls.counting = counting  # type: ignore[attr-defined]
    yield polls
    await polls.aclose()


def waiting_claim(
    polls: LongPolls, q: QueueRef = Q, wait: int = WAIT, limit: int = 5
) -> asyncio.Task[ClaimResult]:
    return asyncio.create_task(polls.claim(q, ttl=60, grace=60, limit=limit, wait=wait))


async def asleep(clock: ManualClock, n: int = 1) -> None:
    """Until n waiters sleep on the clock (each has claimed, found nothing, and listens)."""
    await asyncio.wait_for(clock.sleepers(n), ANSWER_S)


async def answer(task: asyncio.Task[ClaimResult]) -> list[Any]:
    result = await asyncio.wait_for(task, ANSWER_S)
    return [] if result.claim is None else [m.body for m in result.claim.messages]


async def test_a_post_wakes_a_waiting_claim(polls: LongPolls, clock: ManualClock, store: Store) -> None:
    task = waiting_claim(polls)
    await asleep(clock)
    await post(store, Q, "hello")
    assert await answer(task) == ["hello"]
    assert polls.waiting == 0


async def test_a_claim_with_messages_there_does_not_wait(polls: LongPolls, store: Store) -> None:
    await post(store, Q, "ready")
    assert await answer(waiting_claim(polls)) == ["ready"]


async def test_a_release_wakes_a_waiting_claim(polls: LongPolls, clock: ManualClock, store: Store) -> None:
    await post(store, Q, "again")
    cid, _ = await claim_ids(store, Q)
    task = waiting_claim(polls)
    await asleep(clock)
    await store.release_claim(Q, cid, delay=0)
    assert await answer(task) == ["again"]


async def test_a_delay_that_ends_wakes_a_waiting_claim(
    polls: LongPolls, clock: ManualClock, store: Store
) -> None:
    task = waiting_claim(polls)
    await asleep(clock)
    await post(store, Q, "later", delay=5)  # woken: claims, finds it delayed, sleeps until it is due
    await asyncio.sleep(0.2)
    await asleep(clock)
    assert not task.done()
    clock.advance(5)
    assert await answer(task) == ["later"]


async def test_a_claim_that_expires_wakes_a_waiting_claim(
    polls: LongPolls, clock: ManualClock, store: Store
) -> None:
    await post(store, Q, "lapsed")
    await claim_ids(store, Q, ttl=60)
    task = waiting_claim(polls)
    await asleep(clock)
    clock.advance(60)
    assert await answer(task) == ["lapsed"]


async def test_a_dead_letter_move_wakes_a_claim_waiting_on_the_dlq(
    polls: LongPolls, clock: ManualClock, store: Store
) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await post(store, Q, "poison")
    cid, _ = await claim_ids(store, Q)
    task = waiting_claim(polls, DLQ)
    await asleep(clock)
    await store.release_claim(Q, cid)  # used up its one claim: moves to the DLQ now
    assert await answer(task) == ["poison"]


async def test_a_redrive_wakes_a_claim_waiting_on_the_source(
    polls: LongPolls, clock: ManualClock, store: Store
) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await post(store, Q, "fixed")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    task = waiting_claim(polls, Q)
    await asleep(clock)
    task_id = TaskId("a" * 32)
    await store.create_redrive(DLQ, task_id, RedriveSpec(), owner="me", lease_ms=60_000)
    await store.redrive_step(DLQ, task_id, owner="me", lease_ms=60_000, batch=10)
    assert await answer(task) == ["fixed"]


async def test_one_message_wakes_one_waiter_first_come_first_served(
    polls: LongPolls, clock: ManualClock, store: Store
) -> None:
    counting: Counting = polls.counting  # type: ignore[attr-defined]
    tasks = []
    for n in range(3):
        tasks.append(waiting_claim(polls, limit=1))
        await asleep(clock, n + 1)
    before = counting.claims
    await post(store, Q, "one")
    assert await answer(tasks[0]) == ["one"]  # the first to wait
    await asyncio.sleep(0.3)
    assert counting.claims == before + 1  # nobody else was woken to claim in vain
    assert not tasks[1].done()
    assert not tasks[2].done()
    await post(store, Q, "two", "three")  # one post of two messages wakes the two waiters
    assert sorted([*await answer(tasks[1]), *await answer(tasks[2])]) == ["three", "two"]


async def test_claims_beyond_the_bound_are_refused_not_queued(polls: LongPolls, clock: ManualClock) -> None:
    tasks = [waiting_claim(polls) for _ in range(3)]
    await asleep(clock, 3)
    with pytest.raises(ServiceBusy, match="3 claims already wait"):
        await polls.claim(Q, ttl=60, grace=60, limit=5, wait=WAIT)
    polls.close()
    for task in tasks:
        assert await answer(task) == []


async def test_the_wait_runs_out_with_nothing(polls: LongPolls, clock: ManualClock) -> None:
    task = waiting_claim(polls, wait=5)
    await asleep(clock)
    clock.advance(4)
    await asyncio.sleep(0.1)
    assert not task.done()
    clock.advance(1)
    assert await answer(task) == []
    assert polls.waiting == 0


async def test_shutdown_answers_waiting_claims_at_once_and_later_ones_do_not_wait(
    polls: LongPolls, clock: ManualClock
) -> None:
    task = waiting_claim(polls)
    await asleep(clock)
    polls.close()
    assert await answer(task) == []
    assert await answer(waiting_claim(polls)) == []  # returns without waiting: the clock never moved
