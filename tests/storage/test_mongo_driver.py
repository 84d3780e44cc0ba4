"""MongoDB driver internals: the hot queries use their index (explain), a server that cannot run
transactions is refused with a clear error, a cancellation does not cut a redrive step in two, and a post
or a move owing notifications writes them in its transaction (and one owing none runs none)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from core.clock import ManualClock
from core.errors import StorageUnavailable
from core.models import ClaimId, QueueRef, RedriveSpec, TaskId
from service.redrive import RedriveRunner
from storage.mongodb import outbox
from storage.mongodb import store as store_module
from storage.mongodb.queries import claim_candidates, held_by, lapsed, listing, notified
from storage.mongodb.schema import (
    CLAIM_INDEX,
    CLAIMABLE_INDEX,
    LAPSED_INDEX,
    MARKER_INDEX,
    SUBSCRIPTIONS_INDEX,
    TASK,
)
from storage.mongodb.store import MongoStore
from tests.contract.helpers import CLIENT, DLQ, Q, claim_ids, post, set_policy
from tests.contract.test_redrive import dead_letter
from tests.contract.test_subscriptions import subscribe
from tests.servers import MongoServer


def plan_stages(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(stage, index name) of every stage of an explain() winning plan, classic or slot-based engine."""
    out = [(plan.get("stage", ""), plan.get("indexName"))]
    for key in ("inputStage", "queryPlan"):
        if isinstance(plan.get(key), dict):
            out += plan_stages(plan[key])
    for child in plan.get("inputStages", []):
        out += plan_stages(child)
    return out


async def stages(cursor: Any) -> list[tuple[str, str | None]]:
    explained = await cursor.explain()
    return plan_stages(explained["queryPlanner"]["winningPlan"])


@pytest.fixture
async def busy(mongo_store: MongoStore, clock: ManualClock) -> MongoStore:
    """A queue with claimed, free and delayed messages, and a claim that has lapsed."""
    await post(mongo_store, Q, *range(30))
    await post(mongo_store, Q, "later", delay=60)
    await mongo_store.claim(Q, ttl=30, grace=0, limit=5)
    clock.advance(31)
    await mongo_store.claim(Q, ttl=60, grace=0, limit=5)
    return mongo_store


@pytest.mark.parametrize(
    ("query", "index"),
    [
        pytest.param(lambda c, now: claim_candidates(c, Q, now, 10), CLAIMABLE_INDEX, id="claim"),
        pytest.param(
            lambda c, now: listing(
                c,
                Q,
                now=now,
                marker=3,
                limit=10,
                echo=False,
                client_id=CLIENT,
                include_claimed=False,
                include_delayed=False,
            ),
            MARKER_INDEX,
            id="list",
        ),
        pytest.param(lambda c, now: held_by(c, Q, ClaimId("0" * 32), now), CLAIM_INDEX, id="claim-held"),
        pytest.param(lambda c, now: lapsed(c, now, limit=100), LAPSED_INDEX, id="sweep-lapsed"),
        pytest.param(lambda c, now: notified(c, Q, now), SUBSCRIPTIONS_INDEX, id="post-owes"),
    ],
)
async def test_hot_queries_use_their_index(
    busy: MongoStore, clock: ManualClock, query: Any, index: str
) -> None:
    plan = await stages(query(busy.collections, clock.now_ms()))
    assert ("IXSCAN", index) in plan, plan
    assert all(stage != "COLLSCAN" for stage, _ in plan), plan


async def test_a_standalone_server_is_refused_with_what_to_do() -> None:
    server = MongoServer(standalone=True).start()
    store = MongoStore.from_url(server.url, namespace="standalone")
    try:
        with pytest.raises(StorageUnavailable, match="needs a replica set"):
            await store.ping()
    finally:
        await store.aclose()
        server.stop()


async def test_a_runner_stopped_in_the_middle_of_a_step_keeps_what_the_step_moved(
    mongo_store: MongoStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's moves are update_ones and the task's progress one more write after them: a runner stopped
    (RedriveRunner.stop, a rolling restart) between the two must still record what the step moved. Else the
    task taken over resumes behind the moves, ends "succeeded" short of them (as the hand-over in
    tests/contract/test_redrive.py once did on a loaded machine: 3 of 6) and goes past its limit."""
    store = mongo_store
    ids = await dead_letter(store, Q, *range(6))
    moved, go_on = asyncio.Event(), asyncio.Event()
    batch = store_module.redrive_batch

    async def pausing_after_the_moves(*args: Any, **kwargs: Any) -> Any:
        step = await batch(*args, **kwargs)
        moved.set()
        await go_on.wait()
        return step

    monkeypatch.setattr(store_module, "redrive_batch", pausing_after_the_moves)
    leaving = RedriveRunner(lambda: store, clock=clock)
    staying = RedriveRunner(lambda: store, clock=clock)
    task_id = TaskId(uuid.uuid4().hex)
    spec = RedriveSpec(limit=5)  # one step: the runner's batch is 100
    await store.create_redrive(DLQ, task_id, spec, owner=leaving.owner, lease_ms=leaving.lease_ms)
    leaving.start(DLQ, task_id)
    await asyncio.wait_for(moved.wait(), timeout=30)
    stopping = asyncio.create_task(leaving.stop())
    await asyncio.sleep(0)  # stop() has cancelled the run, now waiting after its moves
    go_on.set()
    await stopping
    await staying.adopt()  # none left, or the rest of a step cut short (it never is now)
    await staying.finished(task_id)
    task = await store.get_redrive(DLQ, task_id)
    assert (task.status, task.moved) == ("succeeded", 5)
    assert len(await store.get_messages(Q, ids)) == 5  # the limit holds
    assert len(await store.get_messages(DLQ, ids)) == 1


class Crash(Exception):
    """A failure between a write and the deliveries it owes (a process dying there, as far as the server
    can tell: the transaction never commits)."""


async def crashing(*args: Any, **kwargs: Any) -> None:
    raise Crash


async def test_a_move_and_its_deliveries_are_one_transaction(
    mongo_store: MongoStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = mongo_store
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await subscribe(store, DLQ, "https://hooks.example.com")
    [mid] = await post(store, Q, "x")
    cid, _ = await claim_ids(store, Q)
    monkeypatch.setattr(outbox, "owe", crashing)
    with pytest.raises(Crash):
        await store.release_claim(Q, cid)
    assert [m.id for m in await store.get_messages(Q, [mid])] == [mid]  # not moved
    assert await store.get_messages(DLQ, [mid]) == []
    assert await store.outbox_stats() == (0, None)
    monkeypatch.undo()
    clock.advance(61)
    await store.sweep()  # the claim lapsed: moved now, with its delivery
    assert [m.id for m in await store.get_messages(DLQ, [mid])] == [mid]
    [d] = await store.lease_deliveries("n", lease_ms=1000, limit=5)
    assert d.message is not None
    assert d.message.id == mid


async def test_a_post_and_its_deliveries_are_one_transaction(
    mongo_store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = mongo_store
    await subscribe(store, Q, "https://hooks.example.com")
    monkeypatch.setattr(outbox, "owe", crashing)
    with pytest.raises(Crash):
        await post(store, Q, "x")
    assert (await store.stats(Q)).total == 0
    assert await store.outbox_stats() == (0, None)


async def test_without_subscriptions_posts_and_moves_run_no_transaction(
    mongo_store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue none subscribes to pays nothing for the outbox: no transaction, no read of subscriptions."""
    store = mongo_store
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await subscribe(store, QueueRef(Q.project, "elsewhere"), "https://hooks.example.com")
    await subscribe(store, DLQ, "https://gone.example.com")
    await store.purge_subscriptions(DLQ)
    monkeypatch.setattr(outbox, "in_transaction", crashing)
    monkeypatch.setattr(outbox, "notified", crashing)
    [mid] = await post(store, Q, "x")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    assert [m.id for m in await store.get_messages(DLQ, [mid])] == [mid]
    assert await store.outbox_stats() == (0, None)


async def test_a_signature_task_is_nothing_to_an_earlier_version(mongo_store: MongoStore) -> None:
    """An earlier version walks a task's markers up to END and knows no signature: END is 0 for a task with
    a signature filter (as for one of listed ids), its own end kept apart."""
    await dead_letter(mongo_store, Q, {"error": "boom"}, {"error": "other"})
    task_id = TaskId(uuid.uuid4().hex)
    spec = RedriveSpec(signature="0123456789abcdef")
    task = await mongo_store.create_redrive(DLQ, task_id, spec, owner="o", lease_ms=1_000)
    doc = await mongo_store._c.tasks.find_one({TASK.ID: task_id})
    assert doc is not None
    assert (doc[TASK.END], doc[TASK.SIGNATURE_END]) == (0, task.end_marker) != (0, 0)
    assert (await mongo_store.get_redrive(DLQ, task_id)).end_marker == task.end_marker
