"""Counted quotas (core/quotas.py `queues`, `messages_per_queue`, `message_bytes`) on every store: a change
that would pass one is refused whole (QuotaExceeded, naming the quota and the use) by every path that creates
a queue or posts, racing writers never pass it together, expired messages do not count, and the moves that
may not fail (a dead-letter move, a redrive) discard or skip instead, counted."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from core.clock import ManualClock
from core.errors import QuotaExceeded
from core.metadata import QueuePolicy
from core.models import QueueRef, RedriveSpec, SubscriptionId, TaskId
from storage.base import Store
from tests.contract.helpers import DLQ, Q, claim_ids, post, set_meta

pytestmark = pytest.mark.every_store

P = Q.project


def q(name: str) -> QueueRef:
    return QueueRef(P, name)


async def names(store: Store, project: str = P) -> list[str]:
    page = await store.list_queues(project, marker=None, limit=100, detailed=False)
    return sorted(i.name for i in page.items)


async def test_no_path_creates_a_queue_past_the_project_quota(store: Store) -> None:
    await store.set_quota(P, {"queues": 2})
    assert await store.create_queue(q("a"), metadata={}, policy=QueuePolicy())
    await post(store, q("b"), "lazily made")
    with pytest.raises(QuotaExceeded) as refused:
        await store.create_queue(q("c"), metadata={}, policy=QueuePolicy())
    assert refused.value.quota == "queues"
    assert "holds 2 queues" in str(refused.value)
    assert "'queues' is 2" in str(refused.value)
    with pytest.raises(QuotaExceeded):
        await post(store, q("d"), "nowhere to go")
    with pytest.raises(QuotaExceeded):
        await set_meta(store, q("e"), _max_claim_count=3)
    with pytest.raises(QuotaExceeded):
        await store.create_subscription(
            q("f"),
            SubscriptionId(uuid.uuid4().hex),
            subscriber="http://x.example/",
            ttl=60,
            options={},
            confirmed=True,
            max_per_queue=9,
        )
    assert await names(store) == ["a", "b"]  # none of the refused ones was made
    assert await store.count_queues(P) == 2
    await post(store, q("a"), "an existing queue takes posts")
    await set_meta(store, q("b"), _max_claim_count=3)
    await post(store, QueueRef("other-project", "x"), "another project has its own count")
    await store.delete_queue(q("a"))
    await store.create_queue(q("c"), metadata={}, policy=QueuePolicy())
    assert await names(store) == ["b", "c"]


async def test_creations_racing_to_the_queue_quota_make_exactly_that_many(store: Store) -> None:
    await store.set_quota(P, {"queues": 3})
    results = await asyncio.gather(
        *(post(store, q(f"race-{i}"), i) for i in range(10)), return_exceptions=True
    )
    assert [type(r) for r in results if isinstance(r, BaseException)] == [QuotaExceeded] * 7
    assert len(await names(store)) == 3


async def test_a_post_past_the_message_quota_stores_none_of_its_messages(
    store: Store, clock: ManualClock
) -> None:
    await store.set_quota(P, {"messages_per_queue": 5})
    await post(store, Q, "1", "2", "3")
    with pytest.raises(QuotaExceeded) as refused:
        await post(store, Q, "4", "5", "6")
    assert refused.value.quota == "messages_per_queue"
    assert "holds 3 messages and this would add 3" in str(refused.value)
    assert (await store.stats(Q)).total == 3
    await post(store, Q, "4", "5")
    with pytest.raises(QuotaExceeded):
        await post(store, Q, "6")
    cid, ids = await claim_ids(store, Q, limit=1)
    await store.delete_message(Q, ids[0], claim_id=cid)  # a removal makes room at once
    await post(store, Q, "6")
    await post(store, q("another-queue"), *"12345")  # the quota is each queue's
    clock.advance(3601)  # all expired: not counted, though the sweeper has not deleted them
    await post(store, Q, *"abcde")
    assert (await store.stats(Q)).total == 5


async def test_producers_racing_to_the_message_quota_never_pass_it(store: Store) -> None:
    await store.set_quota(P, {"messages_per_queue": 7})
    results = await asyncio.gather(*(post(store, Q, i) for i in range(20)), return_exceptions=True)
    assert [type(r) for r in results if isinstance(r, BaseException)] == [QuotaExceeded] * 13
    assert (await store.stats(Q)).total == 7


async def test_a_full_dlq_discards_the_moves_and_counts_them(store: Store) -> None:
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    await post(store, DLQ, "already dead")
    await store.set_quota(P, {"messages_per_queue": 2})
    await post(store, Q, "m1", "m2")
    cid, ids = await claim_ids(store, Q)
    assert len(ids) == 2
    await store.release_claim(Q, cid)  # both used their one claim: both go, but the DLQ has room for one
    assert (await store.stats(DLQ)).total == 2
    stats = await store.stats(Q)
    assert (stats.total, stats.dead_lettered, stats.discarded) == (0, 1, 1)


async def test_a_redrive_into_a_full_queue_skips_what_does_not_fit(store: Store) -> None:
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    ids = await post(store, Q, "r1", "r2", "r3")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    assert (await store.stats(DLQ)).total == 3
    await store.set_quota(P, {"messages_per_queue": 3})
    await post(store, Q, "new one")  # the source now has room for two
    task_id = TaskId(uuid.uuid4().hex)
    task = await store.create_redrive(DLQ, task_id, RedriveSpec(), owner="o", lease_ms=10_000)
    for _ in range(10):
        task = await store.redrive_step(DLQ, task_id, owner="o", lease_ms=10_000, batch=10)
        if task.status != "running":
            break
    assert (task.status, task.moved, task.skipped) == ("succeeded", 2, 1)
    assert (await store.stats(Q)).total == 3
    assert len(await store.get_messages(DLQ, ids)) == 1  # the one that did not fit is still a dead letter


async def test_without_a_quota_nothing_is_counted(store: Store) -> None:
    await store.set_quota(P, {"queues": 1, "messages_per_queue": 1})
    await store.set_quota(P, {"queues": None, "messages_per_queue": None})
    await post(store, Q, *range(5))
    await post(store, q("second"), "and a second queue")
    assert (await store.stats(Q)).total == 5


async def test_subscriptions_past_the_project_quota_are_refused_and_expired_ones_do_not_count(
    store: Store, clock: ManualClock
) -> None:
    await store.set_quota(P, {"subscriptions": 2})

    async def subscribe(name: str, url: str, ttl: int = 3600) -> SubscriptionId:
        sid = SubscriptionId(uuid.uuid4().hex)
        made, _ = await store.create_subscription(
            q(name), sid, subscriber=url, ttl=ttl, options={}, confirmed=True, max_per_queue=9
        )
        return made.id

    first = await subscribe("a", "https://one.example/", ttl=60)
    await subscribe("b", "https://two.example/")  # the quota is the project's, over its queues
    with pytest.raises(QuotaExceeded) as refused:
        await subscribe("c", "https://three.example/")
    assert (refused.value.quota, "holds 2 subscriptions" in str(refused.value)) == ("subscriptions", True)
    assert await subscribe("b", "https://two.example/")  # the same subscriber again: answered as it is
    await store.update_subscription(q("a"), first, ttl=120)  # renewed: it counts until its new end
    clock.advance(61)
    with pytest.raises(QuotaExceeded):
        await subscribe("c", "https://three.example/")
    clock.advance(60)  # the first expired: it no longer counts
    third = await subscribe("c", "https://three.example/")
    with pytest.raises(QuotaExceeded):
        await subscribe("d", "https://four.example/")
    await store.delete_subscription(q("c"), third)  # a deletion frees its place at once
    await subscribe("d", "https://four.example/")
    await store.create_subscription(
        QueueRef("other-project", "a"),
        SubscriptionId(uuid.uuid4().hex),
        subscriber="https://one.example/",
        ttl=60,
        options={},
        confirmed=True,
        max_per_queue=9,
    )  # another project has its own count


async def test_subscriptions_racing_to_the_quota_make_exactly_that_many(store: Store) -> None:
    await store.set_quota(P, {"subscriptions": 3})
    results = await asyncio.gather(
        *(
            store.create_subscription(
                q(f"s{i % 3}"),
                SubscriptionId(uuid.uuid4().hex),
                subscriber=f"https://{i}.example/",
                ttl=3600,
                options={},
                confirmed=True,
                max_per_queue=20,
            )
            for i in range(10)
        ),
        return_exceptions=True,
    )
    assert [type(r) for r in results if isinstance(r, BaseException)] == [QuotaExceeded] * 7


async def test_a_caller_cannot_make_queues_past_the_quota_through_a_dlq_or_a_redrive(store: Store) -> None:
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    ids = await post(store, Q, "r1")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)  # dead-lettered: the DLQ is made by the move
    assert await names(store) == sorted([Q.name, DLQ.name])
    await store.set_quota(P, {"queues": 3})
    with pytest.raises(QuotaExceeded) as refused:  # a new queue naming a new DLQ: two to make, room for one
        await set_meta(store, q("other"), _dead_letter_queue="other.dlq")
    assert "would add 2" in str(refused.value)
    await set_meta(store, q("third"), _max_claim_count=2)  # the last place
    with pytest.raises(QuotaExceeded):  # an existing queue naming a new DLQ: no room for it
        await set_meta(store, Q, _dead_letter_queue="elsewhere.dlq")
    await set_meta(store, Q, _max_claim_count=1, _dead_letter_queue=DLQ.name)  # an existing DLQ: fine
    assert await names(store) == sorted([Q.name, DLQ.name, "third"])
    task_id = TaskId(uuid.uuid4().hex)  # a redrive to a queue it may not make: skipped, kept in the DLQ
    await store.create_redrive(DLQ, task_id, RedriveSpec(destination="new-one"), owner="o", lease_ms=10_000)
    task = await store.redrive_step(DLQ, task_id, owner="o", lease_ms=10_000, batch=10)
    assert (task.status, task.moved, task.skipped) == ("succeeded", 0, 1)
    assert len(await store.get_messages(DLQ, ids)) == 1
    assert await names(store) == sorted([Q.name, DLQ.name, "third"])


async def test_a_post_refused_for_its_size_against_the_quota_makes_no_queue(store: Store) -> None:
    await store.set_quota(P, {"messages_per_queue": 2})
    with pytest.raises(QuotaExceeded) as refused:
        await post(store, q("fresh"), "1", "2", "3")
    assert "holds 0 messages and this would add 3" in str(refused.value)
    assert await names(store) == []


B = "x" * 98  # a body of 100 bytes as stored (its JSON text)


async def test_a_post_past_the_byte_quota_stores_none_of_its_messages(
    store: Store, clock: ManualClock
) -> None:
    await store.set_quota(P, {"message_bytes": 1000})
    await post(store, Q, *[B] * 4)
    await post(store, q("other"), *[B] * 4)  # the quota is the project's, over its queues
    assert await store.held_bytes(P) == 800
    with pytest.raises(QuotaExceeded) as refused:
        await post(store, Q, *[B] * 3)
    assert refused.value.quota == "message_bytes"
    assert "This project holds 800 bytes and this would add 300; its quota 'message_bytes' is 1000" in str(
        refused.value
    )
    assert (await store.stats(Q)).total == 4
    await post(store, Q, B, B)
    with pytest.raises(QuotaExceeded):
        await post(store, Q, "")  # 2 bytes
    cid, ids = await claim_ids(store, Q, limit=1)
    await store.delete_message(Q, ids[0], claim_id=cid)  # a removal makes room at once
    await post(store, Q, B)
    await store.purge(q("other"))
    assert await store.held_bytes(P) == 600
    await store.delete_queue(Q)
    assert await store.held_bytes(P) == 0
    await post(store, Q, *[B] * 10, ttl=60)
    clock.advance(61)  # all expired: not counted, though the sweeper has not deleted them
    assert await store.held_bytes(P) == 0
    await post(store, Q, *[B] * 10)
    await post(store, QueueRef("other-project", "x"), *[B] * 20)  # another project has its own
    with pytest.raises(QuotaExceeded) as refused:
        await post(store, q("fresh"), B)
    assert await names(store) == [Q.name, "other"]  # the refused post made no queue


async def test_producers_racing_to_the_byte_quota_never_pass_it(store: Store) -> None:
    await store.set_quota(P, {"message_bytes": 700})
    results = await asyncio.gather(
        *(post(store, q(f"race-{i % 3}"), B) for i in range(20)), return_exceptions=True
    )
    assert [type(r) for r in results if isinstance(r, BaseException)] == [QuotaExceeded] * 13
    assert await store.held_bytes(P) == 700


async def test_moves_keep_the_bytes_counted_and_an_expired_dead_letter_counts_again(
    store: Store, clock: ManualClock
) -> None:
    await set_meta(
        store,
        Q,
        _max_claim_count=1,
        _dead_letter_queue=DLQ.name,
        _dead_letter_on_expiry=True,
        _dead_letter_queue_messages_ttl=86400,
    )
    await store.set_quota(P, {"message_bytes": 300})
    await post(store, Q, B, B)
    cid, _ = await claim_ids(store, Q, limit=1)
    await store.release_claim(Q, cid)  # its one claim used: to the DLQ, still the project's bytes
    assert (await store.stats(DLQ)).total == 1
    assert await store.held_bytes(P) == 200
    with pytest.raises(QuotaExceeded):
        await post(store, Q, B, B)
    clock.advance(3601)  # the one left expires: not counted (a count forgets it) until it moves
    assert await store.held_bytes(P) == 100
    await store.sweep()
    assert (await store.stats(DLQ)).total == 2  # it expired into the DLQ, where it lives again
    assert await store.held_bytes(P) == 200
    await post(store, Q, B)
    with pytest.raises(QuotaExceeded):
        await post(store, Q, B)
