"""The outbox (storage.base.SubscriptionStore): what a post or a dead-letter move owes to subscriptions,
leased to notifiers and finished by them, on every driver; and the dead-letter counters of QueueStats."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from core.clock import ManualClock
from core.models import Delivery, Idempotency, NewMessage, QueueRef, RedriveSpec, Rejection, TaskId
from storage.base import Store
from tests.contract.helpers import CLIENT, DLQ, Q, claim_ids, post, set_meta, set_policy
from tests.contract.test_subscriptions import HOOK, MAIL, subscribe

pytestmark = pytest.mark.every_store

LEASE_MS = 30_000
OTHER_PROJECT = QueueRef("project-b", Q.name)


async def drain(store: Store, owner: str = "notifier", *, finish: bool = True) -> list[Delivery]:
    """Every delivery due now, leased by `owner` (and finished as delivered, with `finish`)."""
    out: list[Delivery] = []
    for _ in range(100):
        got = await store.lease_deliveries(owner, lease_ms=LEASE_MS, limit=7)
        assert len(got) <= 7
        if not got:
            return out
        out += got
        if finish:
            for d in got:
                await store.finish_delivery(d, retry_at_ms=None)
    raise AssertionError("the outbox never ran dry")


def reason(d: Delivery) -> str | None:
    return d.message.dead_letter.reason if d.message and d.message.dead_letter else None


def owed(deliveries: list[Delivery]) -> Counter[tuple[str, str, str | None]]:
    """(subscriber, kind, message id) of each delivery, counted."""
    return Counter(
        (d.subscription.subscriber, d.kind, d.message.id if d.message else None) for d in deliveries
    )


def by_body(deliveries: list[Delivery]) -> list[Delivery]:
    return sorted(deliveries, key=lambda d: str(d.message.body if d.message else None))


async def post_of_two_leased(store: Store, owner: str = "n") -> list[Delivery]:
    """A post of "a" and "b" to a queue with one subscription: their notifications, leased by `owner`."""
    await subscribe(store, Q, HOOK)
    await post(store, Q, "a", "b")
    return by_body(await store.lease_deliveries(owner, lease_ms=LEASE_MS, limit=10))


async def test_a_post_notifies_every_live_confirmed_subscription_once_a_message(
    store: Store, clock: ManualClock
) -> None:
    hook, _ = await subscribe(store, Q, HOOK)
    mail, _ = await subscribe(store, Q, MAIL)
    gone, _ = await subscribe(store, Q, "https://expired.example.com", ttl=60)
    await subscribe(store, Q, "https://unconfirmed.example.com", confirmed=False)
    await subscribe(store, DLQ, "https://other-queue.example.com")
    clock.advance(60)
    assert {d.kind for d in await drain(store)} == {"confirmation"}  # the unconfirmed one's request
    posted = clock.now_ms()
    ids = await post(store, Q, {"n": 1}, {"n": 2}, ttl=300)
    got = await drain(store)
    assert owed(got) == Counter({(s, "notification", m): 1 for s in (HOOK, MAIL) for m in ids})
    for d in got:
        assert d.project == Q.project
        assert d.subscription == (hook if d.subscription.id == hook.id else mail)
        assert d.attempts == 0
        assert d.created_ms == posted
        m = d.message
        assert m is not None
        assert (m.queue, m.ttl, m.created_ms, m.expires_ms) == (Q.name, 300, posted, posted + 300_000)
        assert m.body == {"n": ids.index(m.id) + 1}
        assert m.dead_letter is None
    assert gone.id not in {d.subscription.id for d in got}
    assert await store.outbox_stats() == (0, None)


async def test_a_queue_without_subscriptions_owes_nothing(store: Store) -> None:
    await subscribe(store, DLQ, HOOK)
    await post(store, Q, "a", "b")
    await set_policy(store, Q, max_claim_count=1)  # no DLQ: used-up messages are discarded
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    assert await store.outbox_stats() == (0, None)
    assert await store.lease_deliveries("notifier", lease_ms=LEASE_MS, limit=10) == []


async def test_every_project_is_served(store: Store, clock: ManualClock) -> None:
    await subscribe(store, Q, HOOK)
    await subscribe(store, OTHER_PROJECT, HOOK)
    [a] = await post(store, Q, "a")
    [b] = await post(store, OTHER_PROJECT, "b")
    assert await store.outbox_stats() == (2, clock.now_ms())
    got = {d.project: d.message and d.message.id for d in await drain(store)}
    assert got == {Q.project: a, OTHER_PROJECT.project: b}


async def test_an_idempotent_replay_owes_nothing_again(store: Store) -> None:
    await subscribe(store, Q, HOOK)
    once = Idempotency(key="k-1", fingerprint="f" * 64, window_ms=60_000)
    posts = [
        await store.post_messages(
            Q,
            [NewMessage(body="x"), NewMessage(body="y")],
            client_id=CLIENT,
            default_ttl=3600,
            default_delay=0,
            body_size=10,
            idempotency=once,
        )
        for _ in range(2)
    ]
    assert posts[0] == posts[1]
    assert owed(await drain(store)) == Counter({(HOOK, "notification", m): 1 for m in posts[0]})


# -- dead-letter moves: each owes the DLQ's subscribers the message with its provenance ---------------------


async def owed_to_dlq(store: Store) -> Delivery:
    """The one delivery owed, to the DLQ's one subscriber (HOOK; MAIL subscribes to Q)."""
    [d] = await drain(store)
    assert (d.subscription.subscriber, d.subscription.queue, d.kind) == (HOOK, DLQ.name, "notification")
    assert d.message is not None
    return d


async def subscribed_pair(store: Store) -> None:
    await subscribe(store, DLQ, HOOK)
    await subscribe(store, Q, MAIL)


async def test_a_move_by_claim_owes_the_dlq_subscribers(store: Store, clock: ManualClock) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await subscribed_pair(store)
    [mid] = await post(store, Q, {"order": 7})
    assert owed(await drain(store)) == Counter({(MAIL, "notification", mid): 1})
    await claim_ids(store, Q)
    clock.advance(61)  # the claim ended: the next claim finds the message used up and moves it (a store
    # may move it while ending the lapsed claim, before picking: then the claim does not count it)
    result = await store.claim(Q, ttl=60, grace=60, limit=5)
    assert result.claim is None
    d = await owed_to_dlq(store)
    assert d.message is not None
    assert (d.message.id, d.message.queue, d.message.body) == (mid, DLQ.name, {"order": 7})
    dl = d.message.dead_letter
    assert dl is not None
    assert (dl.source_queue, dl.reason, dl.claim_count) == (Q.name, "max_claims", 1)
    assert dl.dead_lettered_at_ms == clock.now_ms()
    assert [m.id for m in await store.get_messages(DLQ, [mid])] == [mid]


async def test_a_move_by_release_owes_the_dlq_subscribers(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await subscribed_pair(store)
    ids = await post(store, Q, "a", "b")
    await drain(store)
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    got = await drain(store)
    assert owed(got) == Counter({(HOOK, "notification", m): 1 for m in ids})
    assert {reason(d) for d in got} == {"max_claims"}


async def test_a_move_by_sweep_owes_the_dlq_subscribers(store: Store, clock: ManualClock) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    await subscribed_pair(store)
    [mid] = await post(store, Q, "claimed once")
    await drain(store)
    await claim_ids(store, Q)
    clock.advance(61)
    await store.sweep()
    d = await owed_to_dlq(store)
    assert d.message is not None
    assert d.message.id == mid
    assert d.message.dead_letter is not None
    assert (d.message.dead_letter.source_queue, d.message.dead_letter.reason) == (Q.name, "max_claims")


async def test_an_expiry_by_sweep_owes_the_dlq_subscribers(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _dead_letter_on_expiry=True)
    await subscribed_pair(store)
    [mid] = await post(store, Q, "late", ttl=60)
    await drain(store)
    clock.advance(60)
    await store.sweep()
    d = await owed_to_dlq(store)
    assert d.message is not None
    assert (d.message.id, d.message.body) == (mid, "late")
    assert d.message.dead_letter is not None
    assert (d.message.dead_letter.source_queue, d.message.dead_letter.reason) == (Q.name, "expired")


async def test_a_reject_owes_the_dlq_subscribers(store: Store, clock: ManualClock) -> None:
    await set_meta(store, Q, _dead_letter_queue=DLQ.name)
    await subscribed_pair(store)
    [mid, kept] = await post(store, Q, "bad", "good")
    await drain(store)
    cid, _ = await claim_ids(store, Q)
    rejection = Rejection(reason="schema", description="no sku")
    assert await store.dead_letter_message(Q, mid, claim_id=cid, rejection=rejection)
    d = await owed_to_dlq(store)
    assert d.message is not None
    assert d.message.id == mid
    dl = d.message.dead_letter
    assert dl is not None
    assert (dl.source_queue, dl.reason, dl.rejection) == (Q.name, "rejected", rejection)
    assert await store.outbox_stats() == (0, None)
    assert [m.id for m in (await store.get_claim(Q, cid)).messages] == [kept]


async def test_unconfirmed_subscribers_get_only_their_requests(store: Store) -> None:
    await set_policy(store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    sub, _ = await subscribe(store, DLQ, HOOK, confirmed=False)
    again, created = await subscribe(store, DLQ, HOOK, confirmed=False)  # asked again: asked again
    assert (again.id, created) == (sub.id, False)
    await post(store, Q, "x")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)  # moved into the DLQ: not owed to an unconfirmed subscriber
    got = await drain(store)
    assert owed(got) == Counter({(HOOK, "confirmation", None): 2})
    assert all(d.subscription == sub for d in got)
    await store.confirm_subscription(DLQ, sub.id, confirmed=True)
    assert await drain(store) == []
    await store.confirm_subscription(DLQ, sub.id, confirmed=False)
    [bye] = await drain(store)
    assert (bye.kind, bye.message, bye.subscription.confirmed) == ("unsubscribed", None, False)


# -- leases ------------------------------------------------------------------------------------------------


async def test_a_lease_is_exclusive_until_it_ends(store: Store, clock: ManualClock) -> None:
    await subscribe(store, Q, HOOK)
    [mid] = await post(store, Q, "x")
    [d] = await store.lease_deliveries("a", lease_ms=10_000, limit=10)
    assert await store.lease_deliveries("b", lease_ms=10_000, limit=10) == []
    assert await store.lease_deliveries("a", lease_ms=10_000, limit=10) == []  # nor to its holder
    assert (await store.outbox_stats())[0] == 1
    clock.advance(9.999)
    assert await store.lease_deliveries("b", lease_ms=10_000, limit=10) == []
    clock.advance(0.001)  # "a" died holding it: it comes back
    [again] = await store.lease_deliveries("b", lease_ms=10_000, limit=10)
    assert (again.id, again.attempts) == (d.id, 0)
    assert again.message is not None
    assert again.message.id == mid
    await store.finish_delivery(again, retry_at_ms=None)
    assert await store.outbox_stats() == (0, None)


async def test_deliveries_finished_together_are_gone_in_every_project(
    store: Store, clock: ManualClock
) -> None:
    await subscribe(store, Q, HOOK)
    await subscribe(store, OTHER_PROJECT, HOOK)
    await post(store, Q, "a", "b", "c")
    await post(store, OTHER_PROJECT, "d")
    leased = await store.lease_deliveries("a", lease_ms=1000, limit=10)
    assert len(leased) == 4
    kept = next(d for d in leased if d.project == Q.project)
    await store.finish_deliveries([d for d in leased if d is not kept])
    await store.finish_deliveries([d for d in leased if d is not kept])  # gone: not an error
    await store.finish_deliveries([])
    clock.advance(1)  # the leases end: only the one not finished comes back
    assert [d.id for d in await store.lease_deliveries("b", lease_ms=1000, limit=10)] == [kept.id]
    assert await store.outbox_stats() == (1, clock.now_ms() + 1000)


async def test_concurrent_notifiers_never_share_a_delivery(store: Store, scale: float) -> None:
    await subscribe(store, Q, HOOK)
    await subscribe(store, Q, MAIL)
    n = max(10, int(40 * scale))
    await post(store, Q, *range(n))
    batches = await asyncio.gather(
        *(store.lease_deliveries(f"n{i}", lease_ms=LEASE_MS, limit=n // 2) for i in range(6))
    )
    ids = [d.id for batch in batches for d in batch]
    assert len(ids) == len(set(ids))
    # A notifier that looked while another had taken the project (Redis: SPOP of the touched set) leases
    # nothing this round; the next rounds lease the rest, still none twice.
    for _ in range(5):
        ids += [d.id for d in await store.lease_deliveries("next", lease_ms=LEASE_MS, limit=n)]
    assert len(ids) == len(set(ids)) == 2 * n


async def test_a_retry_is_due_at_its_time_with_one_more_attempt(store: Store, clock: ManualClock) -> None:
    await subscribe(store, Q, HOOK)
    await post(store, Q, "x")
    [d] = await store.lease_deliveries("a", lease_ms=LEASE_MS, limit=10)
    retry_at = clock.now_ms() + 5000
    await store.finish_delivery(d, retry_at_ms=retry_at)
    assert await store.outbox_stats() == (1, retry_at)
    clock.advance(4.999)
    assert await store.lease_deliveries("a", lease_ms=LEASE_MS, limit=10) == []
    clock.advance(0.001)
    [again] = await store.lease_deliveries("b", lease_ms=LEASE_MS, limit=10)
    assert (again.id, again.attempts, again.message) == (d.id, 1, d.message)
    await store.finish_delivery(again, retry_at_ms=clock.now_ms())
    [third] = await store.lease_deliveries("b", lease_ms=LEASE_MS, limit=10)
    assert third.attempts == 2
    await store.finish_delivery(third, retry_at_ms=None)
    await store.finish_delivery(third, retry_at_ms=None)  # gone: not an error
    await store.finish_delivery(third, retry_at_ms=clock.now_ms())  # gone: nothing comes back
    assert await store.outbox_stats() == (0, None)


async def test_each_message_of_a_post_is_finished_and_retried_on_its_own(
    store: Store, clock: ManualClock
) -> None:
    await subscribe(store, Q, HOOK)
    ids = await post(store, Q, "a", "b", "c", "d")
    leased = {
        d.message.id: d for d in await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10) if d.message
    }
    assert set(leased) == set(ids)
    a, b, c, d = (leased[i] for i in ids)
    retry_at = clock.now_ms() + 5000
    await store.finish_deliveries([a, c])
    await store.finish_delivery(b, retry_at_ms=retry_at)  # failed: one more attempt
    await store.finish_delivery(d, retry_at_ms=retry_at, attempted=False)  # put off, not tried
    assert await store.outbox_stats() == (2, retry_at)
    clock.advance(5)
    again = await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10)
    assert sorted((x.id, x.attempts, x.message.body if x.message else None) for x in again) == sorted(
        [(b.id, 1, "b"), (d.id, 0, "d")]
    )
    await store.finish_deliveries(again)
    await store.finish_deliveries([a, b, c, d])  # finished already: nothing comes back, nothing counts twice
    clock.advance(LEASE_MS / 1000)
    assert await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10) == []
    assert await store.outbox_stats() == (0, None)


async def test_a_retry_never_brings_back_a_message_still_in_flight(store: Store, clock: ManualClock) -> None:
    """A message retried soon while another of its post is still being sent: the one in flight is not
    leased again before its lease ends; the retried one comes back, once, by the time the other is done."""
    a, b = await post_of_two_leased(store)
    await store.finish_delivery(a, retry_at_ms=clock.now_ms() + 10)
    clock.advance(1)
    early = await store.lease_deliveries("m", lease_ms=LEASE_MS, limit=10)
    assert b.id not in {x.id for x in early}
    await store.finish_deliveries([b])
    later = await store.lease_deliveries("m", lease_ms=LEASE_MS, limit=10)
    assert [(x.id, x.attempts) for x in early + later] == [(a.id, 1)]


async def test_a_large_post_is_owed_a_notification_a_message_and_leased_within_the_limit(
    store: Store, clock: ManualClock
) -> None:
    await subscribe(store, Q, HOOK)
    await subscribe(store, Q, MAIL)
    n = 69  # more than two of the Redis driver's hashes of 32 a subscription
    ids = await post(store, Q, *range(n))
    assert await store.outbox_stats() == (2 * n, clock.now_ms())
    first = await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=1)
    assert len(first) == 1
    got = first + await drain(store)
    assert owed(got) == Counter({(s, "notification", m): 1 for s in (HOOK, MAIL) for m in ids})
    assert sorted(d.message.body for d in got if d.message) == sorted([*range(n)] * 2)
    await store.finish_deliveries(first)
    assert await store.outbox_stats() == (0, None)


async def test_a_lease_over_many_projects_keeps_to_its_limit(store: Store) -> None:
    projects = [QueueRef(f"project-{i}", Q.name) for i in range(4)]
    for q in projects:
        await subscribe(store, q, HOOK)
        await post(store, q, *range(32))
    got = await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=4)
    assert 1 <= len(got) <= 4
    rest = await drain(store)
    assert len({(d.project, d.id) for d in got + rest}) == len(got + rest) == 4 * 32


async def test_each_message_of_a_post_comes_back_at_its_own_retry_time(
    store: Store, clock: ManualClock
) -> None:
    a, b = await post_of_two_leased(store)
    now = clock.now_ms()
    await store.finish_delivery(a, retry_at_ms=now + 1_000)
    await store.finish_delivery(b, retry_at_ms=now + 600_000)  # b backs off for ten minutes
    clock.advance(2)
    again = await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10)
    assert [d.id for d in again] == [a.id]
    assert await store.outbox_stats() == (2, clock.now_ms() + LEASE_MS)
    await store.finish_deliveries(again)
    assert await store.outbox_stats() == (1, now + 600_000)
    clock.advance(600)
    assert [(d.id, d.attempts) for d in await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10)] == [
        (b.id, 1)
    ]


async def test_a_retry_is_due_at_its_time_when_the_rest_of_its_post_is_delivered(
    store: Store, clock: ManualClock
) -> None:
    a, b = await post_of_two_leased(store)
    await store.finish_delivery(a, retry_at_ms=clock.now_ms() + 1000)
    await store.finish_delivery(b, retry_at_ms=None)
    clock.advance(2)  # long before the lease would end
    assert [d.id for d in await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10)] == [a.id]


async def test_a_late_finish_by_a_lapsed_holder_touches_only_its_own_message(
    store: Store, clock: ManualClock
) -> None:
    a1, _ = await post_of_two_leased(store, "A")
    clock.advance(LEASE_MS / 1000 + 1)  # A's lease ran out; B takes both again
    a2, b2 = by_body(await store.lease_deliveries("B", lease_ms=LEASE_MS, limit=10))
    await store.finish_delivery(a1, retry_at_ms=clock.now_ms() + 1000)  # A, late
    await store.finish_delivery(a2, retry_at_ms=clock.now_ms() + 1000)
    clock.advance(2)
    taken = await store.lease_deliveries("C", lease_ms=LEASE_MS, limit=10)
    assert b2.id not in {d.id for d in taken}  # B is still sending b: its lease runs
    assert [d.id for d in taken] == [a2.id]


async def test_what_a_subscription_is_owed_goes_with_it(store: Store, clock: ManualClock) -> None:
    deleted, _ = await subscribe(store, Q, "https://deleted.example.com")
    await subscribe(store, Q, "https://expiring.example.com", ttl=60)
    await subscribe(store, Q, HOOK)
    await subscribe(store, DLQ, MAIL)
    await post(store, Q, "x")
    await post(store, DLQ, "y")
    await store.delete_subscription(Q, deleted.id)
    clock.advance(60)
    assert {d.subscription.subscriber for d in await drain(store)} == {HOOK, MAIL}
    await post(store, Q, "z")
    await post(store, DLQ, "w")
    await store.purge_subscriptions(Q)
    assert {d.subscription.subscriber for d in await drain(store)} == {MAIL}
    await subscribe(store, Q, HOOK)
    await post(store, Q, "v")
    await store.delete_queue(Q)
    assert await drain(store) == []
    assert await store.outbox_stats() == (0, None)


async def test_an_unsubscribe_notice_is_leased_behind_the_notifications_it_made_stale(store: Store) -> None:
    """Unsubscribing (confirmed false) leaves the subscription's owed notifications dead and owes it the
    notice: one lease meets both, drops the first and hands out the notice."""
    sub, _ = await subscribe(store, Q, HOOK)
    await post(store, Q, "a", "b")
    await store.confirm_subscription(Q, sub.id, confirmed=False)
    got = await store.lease_deliveries("n", lease_ms=LEASE_MS, limit=10)
    assert [(d.kind, d.subscription.id, d.subscription.subscriber) for d in got] == [
        ("unsubscribed", sub.id, HOOK)
    ]


# -- QueueStats: dead letters by reason, redriven ---------------------------------------------------------


async def test_stats_count_dead_letters_by_reason_and_redrives(store: Store, clock: ManualClock) -> None:
    assert ((await store.stats(Q)).dead_lettered_by_reason, (await store.stats(Q)).redriven) == ({}, 0)
    await set_meta(store, Q, _dead_letter_queue=DLQ.name, _max_claim_count=1, _dead_letter_on_expiry=True)
    await post(store, Q, "used up", "also used up")
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    assert (await store.stats(Q)).dead_lettered_by_reason == {"max_claims": 2}
    [rejected] = await post(store, Q, "rejected")
    cid, _ = await claim_ids(store, Q)
    await store.dead_letter_message(Q, rejected, claim_id=cid, rejection=Rejection())
    await post(store, Q, "late", ttl=60)
    clock.advance(60)
    await store.sweep()
    stats = await store.stats(Q)
    assert stats.dead_lettered_by_reason == {"max_claims": 2, "rejected": 1, "expired": 1}
    assert (stats.dead_lettered, stats.redriven) == (4, 0)
    assert (await store.stats(DLQ)).dead_letters_received == 4
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, RedriveSpec(limit=3), owner="r", lease_ms=LEASE_MS)
    for _ in range(10):
        task = await store.redrive_step(DLQ, task_id, owner="r", lease_ms=LEASE_MS, batch=2)
        if task.status != "running":
            break
    assert (task.status, task.moved) == ("succeeded", 3)
    dlq = await store.stats(DLQ)
    assert (dlq.redriven, dlq.total, dlq.dead_lettered_by_reason) == (3, 1, {})
    assert (await store.stats(Q)).redriven == 0
