"""Redrive tasks (issue 7): moving dead letters back out of a DLQ, a batch at a time, exactly once, on every
driver; and the operator's auto-named DLQs."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from core import signatures
from core.clock import ManualClock
from core.metadata import DeadLetterDefaults
from core.models import MessageId, QueueRef, RedriveSpec, RedriveTask, Rejection, TaskId
from service.redrive import RedriveRunner
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_meta

pytestmark = pytest.mark.every_store

OTHER = QueueRef(Q.project, "billing")
OWNER = "runner-a"
LEASE_MS = 10_000


async def dead_letter(store: Store, q: QueueRef, *bodies: object) -> list[MessageId]:
    """Post `bodies` to `q` and dead-letter them (max_claims) into DLQ."""
    await set_meta(store, q, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    ids = await post(store, q, *bodies)
    cid, claimed = await claim_ids(store, q)
    assert sorted(claimed) == sorted(ids)
    await store.release_claim(q, cid)
    assert len(await store.get_messages(DLQ, ids)) == len(ids)
    return ids


async def run(store: Store, spec: RedriveSpec, batch: int = 2) -> RedriveTask:
    task_id = TaskId(uuid.uuid4().hex)
    task = await store.create_redrive(DLQ, task_id, spec, owner=OWNER, lease_ms=LEASE_MS)
    assert task.status == "running"
    return await run_on(store, task_id, batch)


async def run_on(store: Store, task_id: TaskId, batch: int = 2) -> RedriveTask:
    """Step an existing task to its end."""
    for _ in range(100):
        task = await store.redrive_step(DLQ, task_id, owner=OWNER, lease_ms=LEASE_MS, batch=batch)
        if task.status != "running":
            return task
    raise AssertionError("the task never ended")


async def test_redrive_sends_each_message_back_to_its_source(store: Store, clock: ManualClock) -> None:
    orders = await dead_letter(store, Q, "o1", "o2", "o3")
    billing = await dead_letter(store, OTHER, "b1")
    clock.advance(1)
    task = await run(store, RedriveSpec())
    assert (task.status, task.scanned, task.moved, task.skipped) == ("succeeded", 4, 4, 0)
    assert await store.get_messages(DLQ, orders + billing) == []
    back = await store.get_messages(Q, orders)
    assert [m.body for m in back] == ["o1", "o2", "o3"]
    for m in back:
        assert m.claim_count == 0
        assert m.dead_letter is not None
        assert m.dead_letter.redrive_count == 1
    assert [m.body for m in await store.get_messages(OTHER, billing)] == ["b1"]
    _, ids = await claim_ids(store, Q)  # claimable again, in their old order
    assert ids == orders


async def test_filters_destination_and_limit(store: Store, clock: ManualClock) -> None:
    early = await dead_letter(store, Q, "early")
    clock.advance(10)
    cut = clock.now_ms()
    late = await dead_letter(store, Q, "late1", "late2")
    billing = await dead_letter(store, OTHER, "b1")
    parked = QueueRef(Q.project, "parked")
    task = await run(store, RedriveSpec(source_queue=Q.name, after_ms=cut, destination=parked.name, limit=1))
    assert (task.status, task.moved) == ("succeeded", 1)
    assert [m.id for m in await store.get_messages(parked, late)] == late[:1]
    task = await run(store, RedriveSpec(before_ms=cut))
    assert task.moved == 1
    assert [m.id for m in await store.get_messages(Q, early)] == early
    task = await run(store, RedriveSpec(reason="expired"))
    assert task.moved == 0
    assert len(await store.get_messages(DLQ, late[1:] + billing)) == 2


async def test_listed_ids_move_exactly_those(store: Store, clock: ManualClock) -> None:
    ids = await dead_letter(store, Q, *(f"m{i}" for i in range(7)))
    billing = await dead_letter(store, OTHER, "b1")
    not_here = await post(store, OTHER, "a message of another queue, not dead")
    wanted = (ids[5], ids[1], MessageId(uuid.uuid4().hex), not_here[0], billing[0], ids[3], ids[1])
    spec = RedriveSpec(message_ids=tuple(dict.fromkeys(wanted)))
    task = await run(store, spec)  # two ids a step
    assert task.end_marker == 6  # ids to look up, not the DLQ's markers
    assert (task.status, task.scanned, task.moved, task.skipped) == ("succeeded", 6, 4, 0)
    assert {m.body for m in await store.get_messages(Q, ids)} == {"m1", "m3", "m5"}
    assert [m.body for m in await store.get_messages(OTHER, billing)] == ["b1"]
    left = await store.get_messages(DLQ, ids)
    assert sorted(m.body for m in left) == ["m0", "m2", "m4", "m6"]
    assert [m.body for m in await store.get_messages(OTHER, not_here)] == [
        "a message of another queue, not dead"
    ]
    # the other filters still apply, and a limit stops the task
    task = await run(store, RedriveSpec(message_ids=(ids[0], ids[2], ids[4]), source_queue=OTHER.name))
    assert (task.scanned, task.moved) == (3, 0)
    task = await run(store, RedriveSpec(message_ids=(ids[0], ids[2], ids[4]), limit=1), batch=10)
    assert (task.status, task.moved) == ("succeeded", 1)
    assert [m.body for m in await store.get_messages(Q, [ids[0]])] == ["m0"]
    assert task.spec.message_ids == (ids[0], ids[2], ids[4])  # kept with the task, in order


async def test_listed_ids_dead_lettered_again_after_the_task_began_are_left(
    store: Store, clock: ManualClock
) -> None:
    """A task that looks at a message again (resumed after its process died between moving it and recording
    that; here: the message listed twice) must not move it again once it has died again: it was
    dead-lettered after the task began."""
    [first, second] = await dead_letter(store, Q, "first", "second")
    task_id = TaskId(uuid.uuid4().hex)
    spec = RedriveSpec(message_ids=(first, first, second))
    await store.create_redrive(DLQ, task_id, spec, owner=OWNER, lease_ms=LEASE_MS)
    clock.advance(1)
    await store.redrive_step(DLQ, task_id, owner=OWNER, lease_ms=LEASE_MS, batch=1)  # moves `first`
    assert [m.id for m in await store.get_messages(Q, [first])] == [first]
    cid, claimed = await claim_ids(store, Q)  # `first` dies again (its queue's _max_claim_count is 1)
    assert claimed == [first]
    await store.release_claim(Q, cid)
    assert [m.id for m in await store.get_messages(DLQ, [first])] == [first]
    task = await run_on(store, task_id, batch=1)
    assert (task.status, task.moved) == ("succeeded", 2)
    assert [m.id for m in await store.get_messages(DLQ, [first])] == [first]  # left in the DLQ
    assert [m.id for m in await store.get_messages(Q, [second])] == [second]
    # the task's own record says where it stops by ids; a walk by markers up to its stored end finds nothing
    assert task.end_marker == 3


async def test_claimed_messages_are_skipped_and_later_ones_left(store: Store, clock: ManualClock) -> None:
    [held, free] = await dead_letter(store, Q, "held", "free")
    await set_meta(store, DLQ)  # the DLQ's own consumers
    _, ids = await claim_ids(store, DLQ, limit=1)
    assert ids == [held]
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, RedriveSpec(), owner=OWNER, lease_ms=LEASE_MS)
    later = await dead_letter(store, Q, "after the task began")
    task = await store.redrive_step(DLQ, task_id, owner=OWNER, lease_ms=LEASE_MS, batch=100)
    assert (task.status, task.moved, task.skipped) == ("succeeded", 1, 1)
    assert [m.id for m in await store.get_messages(Q, [free])] == [free]
    assert len(await store.get_messages(DLQ, [held, *later])) == 2  # claimed, and not the task's business


async def test_cancel_and_leases(store: Store, clock: ManualClock) -> None:
    ids = await dead_letter(store, Q, *range(6))
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, RedriveSpec(), owner=OWNER, lease_ms=LEASE_MS)
    task = await store.redrive_step(DLQ, task_id, owner="intruder", lease_ms=LEASE_MS, batch=2)
    assert (task.moved, task.owner) == (0, OWNER)  # only the holder steps a task
    assert await store.lease_redrives("intruder", lease_ms=LEASE_MS, limit=5) == []
    task = await store.redrive_step(DLQ, task_id, owner=OWNER, lease_ms=LEASE_MS, batch=2)
    assert task.moved == 2
    clock.advance(LEASE_MS / 1000)  # OWNER died: its lease lapses and another runner takes the task over
    assert await store.lease_redrives("heir", lease_ms=LEASE_MS, limit=5) == [(DLQ, task_id)]
    task = await store.redrive_step(DLQ, task_id, owner=OWNER, lease_ms=LEASE_MS, batch=2)
    assert task.moved == 2  # the old owner is out
    task = await store.redrive_step(DLQ, task_id, owner="heir", lease_ms=LEASE_MS, batch=2)
    assert (task.moved, task.owner) == (4, "heir")
    task = await store.cancel_redrive(DLQ, task_id)
    assert task.status == "cancelled"
    task = await store.redrive_step(DLQ, task_id, owner="heir", lease_ms=LEASE_MS, batch=2)
    assert (task.status, task.moved) == ("cancelled", 4)
    assert len(await store.get_messages(DLQ, ids)) == 2
    assert (await store.get_redrive(DLQ, task_id)).status == "cancelled"


async def test_provenance_survives_a_second_death(store: Store, clock: ManualClock) -> None:
    [mid] = await dead_letter(store, Q, "twice")
    await run(store, RedriveSpec())
    cid, _ = await claim_ids(store, Q)
    assert await store.dead_letter_message(Q, mid, claim_id=cid, rejection=Rejection(reason="still bad"))
    [m] = await store.get_messages(DLQ, [mid])
    assert m.dead_letter is not None
    assert (m.dead_letter.reason, m.dead_letter.redrive_count) == ("rejected", 1)
    await run(store, RedriveSpec())
    [m] = await store.get_messages(Q, [mid])
    assert m.dead_letter is not None
    assert m.dead_letter.redrive_count == 2


def test_defaults_name_the_dead_letter_queue() -> None:
    d = DeadLetterDefaults(max_claim_count=3, template="{queue}.DLQ")
    assert d.dead_letter_queue_for("orders") == "orders.DLQ"
    assert d.dead_letter_queue_for("orders.DLQ") is None  # a DLQ gets no DLQ of its own
    assert d.dead_letter_queue_for("x" * 64) == "x" * 60 + ".DLQ"
    assert DeadLetterDefaults(template="DLQ.{queue}").dead_letter_queue_for("a") == "DLQ.a"


async def test_auto_named_dlq_for_queues_that_set_nothing(defaulted_store: Store, clock: ManualClock) -> None:
    """default_max_claim_count 2 and template "{queue}.DLQ": a queue with no dead-letter metadata moves a
    message to <name>.DLQ after 2 claims; the auto DLQ itself gets no defaults; a queue's own keys win."""
    store = defaulted_store
    auto_dlq = QueueRef(Q.project, f"{Q.name}.DLQ")
    [mid] = await post(store, Q, "x")
    for _ in range(2):
        cid, _ = await claim_ids(store, Q)
        await store.release_claim(Q, cid)
    [moved] = await store.get_messages(auto_dlq, [mid])
    assert moved.dead_letter is not None
    assert moved.dead_letter.source_queue == Q.name
    for _ in range(3):  # in the auto DLQ no claim limit applies: it keeps its message
        cid, ids = await claim_ids(store, auto_dlq)
        assert ids == [mid]
        await store.release_claim(auto_dlq, cid)
    own = QueueRef(Q.project, "own")
    await set_meta(store, own, _max_claim_count=1, _dead_letter_queue="own-dlq")
    [mine] = await post(store, own, "y")
    cid, _ = await claim_ids(store, own)
    await store.release_claim(own, cid)
    assert [m.id for m in await store.get_messages(QueueRef(Q.project, "own-dlq"), [mine])] == [mine]


async def test_tasks_are_listed_newest_first(store: Store, clock: ManualClock) -> None:
    assert await store.list_redrives(DLQ, limit=10) == []
    await dead_letter(store, Q, "a")
    first = await run(store, RedriveSpec())
    clock.advance(1)
    second_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, second_id, RedriveSpec(limit=5), owner=OWNER, lease_ms=LEASE_MS)
    listed = await store.list_redrives(DLQ, limit=10)
    assert [(t.id, t.status) for t in listed] == [(second_id, "running"), (first.id, "succeeded")]
    assert [t.id for t in await store.list_redrives(DLQ, limit=1)] == [second_id]
    assert await store.list_redrives(Q, limit=10) == []  # per DLQ


async def run_out(runner: RedriveRunner, task_id: TaskId, clock: ManualClock) -> None:
    """Let `runner` run the task to its end, moving the clock on each time it waits between batches."""
    finished = asyncio.ensure_future(runner.finished(task_id))
    while not finished.done():
        asleep = asyncio.ensure_future(clock.sleepers())
        await asyncio.wait([finished, asleep], return_when=asyncio.FIRST_COMPLETED)
        asleep.cancel()
        clock.advance(1)


async def test_a_runner_that_stops_hands_its_tasks_over_at_once(store: Store, clock: ManualClock) -> None:
    """A process shutting down (RedriveRunner.stop) ends its leases: another runner adopts the task at once,
    without waiting for the lease to lapse, and finishes it."""
    ids = await dead_letter(store, Q, *range(6))
    leaving = RedriveRunner(lambda: store, clock=clock)
    staying = RedriveRunner(lambda: store, clock=clock)
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(
        DLQ, task_id, RedriveSpec(max_per_second=3), owner=leaving.owner, lease_ms=leaving.lease_ms
    )
    assert await store.lease_redrives("other", lease_ms=LEASE_MS, limit=5) == []
    await store.release_redrive(DLQ, task_id, owner="other")  # only the holder can end its lease
    assert await store.lease_redrives("other", lease_ms=LEASE_MS, limit=5) == []
    leaving.start(DLQ, task_id)
    # it moves a batch of 3, then waits a second on the clock (max_per_second 3): stop it there
    await asyncio.wait_for(clock.sleepers(), timeout=30)
    assert (await store.get_redrive(DLQ, task_id)).moved == 3
    await leaving.stop()
    assert await staying.adopt() == 1
    await asyncio.wait_for(run_out(staying, task_id, clock), timeout=60)
    task = await store.get_redrive(DLQ, task_id)
    assert (task.status, task.moved, task.owner) == ("succeeded", 6, staying.owner)
    assert len(await store.get_messages(Q, ids)) == 6


def _declined(i: int) -> dict[str, object]:
    return {"order": i, "error": f"card cus_{uuid.uuid4().hex[:14]}X declined at 2026-11-2{i % 10}T10:00:00Z"}


async def _two_causes(store: Store) -> tuple[list[MessageId], set[MessageId]]:
    """Dead letters of two causes interleaved, and two without error text; their ids, and the card ones'."""
    declined = [_declined(i) for i in range(9)]
    timeouts = [{"error": {"message": f"upstream timed out after {i}s", "code": i}} for i in range(5)]
    bodies: list[object] = []
    for i, d in enumerate(declined):
        bodies += [d, timeouts[i]] if i < len(timeouts) else [d]
    ids = await dead_letter(store, Q, *bodies, "not an object", {"no": "error field"})
    return ids, {ids[bodies.index(d)] for d in declined}


async def test_a_signature_moves_every_message_of_its_cause_and_no_other(
    store: Store, clock: ManualClock
) -> None:
    """`charon insights` names a cause by its signature; a redrive by signature moves that cause's dead
    letters however their ids are spelled, whatever the batch, and nothing else (core/signatures.py)."""
    card = signatures.signature("card <*> declined at <*>")
    in_dlq = 0
    for batch in (1, 3, 100):  # batches ending inside a run of either cause, and one reading them all
        ids, want = await _two_causes(store)
        in_dlq += len(ids)
        found = await store.get_messages(DLQ, ids)
        assert {m.id for m in found if signatures.of_message(m) == card} == want  # 9 spellings, one cause
        clock.advance(1)
        fixed = QueueRef(Q.project, f"fixed-{batch}")
        task = await run(store, RedriveSpec(signature=card, destination=fixed.name), batch=batch)
        assert (task.status, task.scanned, task.moved) == ("succeeded", in_dlq, len(want))
        in_dlq -= len(want)
        assert {m.id for m in await store.get_messages(fixed, ids)} == want
        assert {m.id for m in await store.get_messages(DLQ, ids)} == set(ids) - want
    # listed ids: only the listed ones of the signature
    ids, want = await _two_causes(store)
    listed = tuple(ids[:4])  # declined, timeout, declined, timeout
    task = await run(store, RedriveSpec(signature=card, message_ids=listed), batch=1)
    assert (task.scanned, task.moved) == (4, 2)
    assert {m.id for m in await store.get_messages(Q, list(listed))} == {ids[0], ids[2]}
    # a limit counts moves; no error text: the signature of where and how they died
    timeout = signatures.signature("upstream timed out after <*>")
    task = await run(store, RedriveSpec(signature=timeout, limit=3), batch=2)
    assert (task.status, task.moved) == ("succeeded", 3)
    task = await run(store, RedriveSpec(signature=signatures.signature(None, Q.name, "max_claims")))
    assert task.moved == 8  # "not an object" and {"no": ...} of each of the four loads
    task = await run(store, RedriveSpec(signature="0" * 16))
    assert (task.status, task.moved) == ("succeeded", 0)


async def test_a_body_longer_than_insights_reads_is_signed_by_its_death(
    store: Store, clock: ManualClock
) -> None:
    """As `charon insights` at its default --max-body-bytes: a longer body is not read for its error text."""
    big = {"error": "boom", "pad": "x" * signatures.DEFAULT_MAX_BODY_BYTES}
    [long, short] = await dead_letter(store, Q, big, {"error": "boom"})
    [m, n] = await store.get_messages(DLQ, [long, short])
    assert signatures.of_message(m) == signatures.signature(None, Q.name, "max_claims")
    assert signatures.of_message(n) == signatures.signature("boom")
    assert signatures.of_message(m, max_body_bytes=10**6) == signatures.signature("boom")
    task = await run(store, RedriveSpec(signature=signatures.signature("boom")))
    assert task.moved == 1
    assert [x.id for x in await store.get_messages(Q, [long, short])] == [short]
