"""A process's background loops (the sweeper, redrive adoption, a redrive run) end when cancelled, wherever
the cancellation lands, on every driver: otherwise a SIGTERM'd `charon serve` never finishes its shutdown.

redis-py sometimes swallows a cancellation that lands inside a command: the command returns normally and
the task is left marked as cancelling (1 to 3 in 100 cancels at a random instant of a call, measured on
redis-py 8.1). A loop that does not look at its task's state then goes on for ever; CI once waited in vain
for an API process to exit this way."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from core.clock import ManualClock
from core.models import RedriveSpec, TaskId
from service.redrive import RedriveRunner
from service.sweeper import run_sweeper
from storage.base import Store
from tests.contract.helpers import DLQ, Q, post, set_meta

# PyMongo leaves the socket of a connection it was opening when cancelled to the garbage collector
# (PYTHON-5867, https://github.com/mongodb/mongo-python-driver/pull/2858); it is closed then.
pytestmark = [
    pytest.mark.every_store,
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

TRIES = 150
WITHIN_S = 4.0  # longer than any one call; shorter than the loops' waits after a failed attempt


async def cancel_at_random_instants(start: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Start the loop, cancel it 0-4 ms later (inside its first calls to the store), TRIES times: each time
    it must end, as cancelled."""
    for attempt in range(TRIES):
        task = asyncio.create_task(start())
        await asyncio.sleep(random.random() * 0.004)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=WITHIN_S)
        if not done:
            task.cancel()
        assert done, f"attempt {attempt}: the loop was cancelled and went on running"
        assert task.cancelled(), f"attempt {attempt}: the loop ended without being cancelled: {task}"


async def test_the_sweeper_stops_when_cancelled(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "a")
    await cancel_at_random_instants(lambda: run_sweeper(store, 0.5))


async def test_redrive_adoption_stops_when_cancelled(store: Store, clock: ManualClock) -> None:
    runner = RedriveRunner(lambda: store, clock=clock)
    await cancel_at_random_instants(runner.run_forever)


async def test_a_redrive_run_stops_when_cancelled(store: Store, clock: ManualClock) -> None:
    """A task moving one message a second, run and cancelled again and again by the runner that holds it."""
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    for _ in range(TRIES // 10 + 1):
        await post(store, Q, *range(10))
        result = await store.claim(Q, ttl=60, grace=60, limit=10)
        assert result.claim is not None
        await store.release_claim(Q, result.claim.id)
    runner = RedriveRunner(lambda: store, clock=clock)
    task_id = TaskId(uuid.uuid4().hex)
    spec = RedriveSpec(max_per_second=1)
    await store.create_redrive(DLQ, task_id, spec, owner=runner.owner, lease_ms=runner.lease_ms)
    await cancel_at_random_instants(lambda: runner.run(DLQ, task_id))
    assert (await store.get_redrive(DLQ, task_id)).status == "running"
