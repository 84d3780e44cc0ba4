"""Subscriptions (storage.base.SubscriptionStore): create, read, list, change, confirm, delete and expire, on
every driver. What they are owed is tests/contract/test_outbox.py's."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from core.clock import ManualClock
from core.errors import Conflict, SubscriptionExists, SubscriptionNotFound
from core.models import QueueRef, Subscription, SubscriptionId
from storage.base import Store
from tests.contract.helpers import DLQ, Q, post

pytestmark = pytest.mark.every_store

HOOK = "https://hooks.example.com/orders"
MAIL = "mailto:ops@example.com"
# Options as a client may send them: nesting, unicode, floats, keys MongoDB or JSON treat specially.
OPTIONS: dict[str, Any] = {
    "post_data": {"event": "$zaqar_message$", "n": [1, 2.5, None, True], "a.b": {"$c": "é\u2603"}},
    "post_headers": {"X-Token": "t"},
    "_retry_policy": {"retries_with_no_delay": 3, "minimum_delay": 5, "maximum_delay": 3600.5},
    "": 0,
}


def new_id() -> SubscriptionId:
    return SubscriptionId(uuid.uuid4().hex)


async def subscribe(
    store: Store,
    q: QueueRef,
    subscriber: str,
    *,
    ttl: int = 3600,
    options: dict[str, Any] | None = None,
    confirmed: bool = True,
    max_per_queue: int = 100,
    subscription_id: SubscriptionId | None = None,
) -> tuple[Subscription, bool]:
    return await store.create_subscription(
        q,
        subscription_id or new_id(),
        subscriber=subscriber,
        ttl=ttl,
        options={} if options is None else options,
        confirmed=confirmed,
        max_per_queue=max_per_queue,
    )


async def all_subscriptions(store: Store, q: QueueRef, *, limit: int) -> list[Subscription]:
    """Every subscription list_subscriptions shows, `limit` a page."""
    out: list[Subscription] = []
    marker = None
    for _ in range(100):
        page = await store.list_subscriptions(q, marker=marker, limit=limit)
        assert len(page.items) <= limit
        out += page.items
        if not page.items or page.next_marker is None:
            return out
        marker = page.next_marker
    raise AssertionError("the listing never ended")


async def test_create_and_get_round_trip(store: Store, clock: ManualClock) -> None:
    sid = new_id()
    sub, created = await subscribe(store, Q, HOOK, ttl=600, options=OPTIONS, subscription_id=sid)
    assert created
    now = clock.now_ms()
    assert sub == Subscription(
        id=sid,
        queue=Q.name,
        subscriber=HOOK,
        ttl=600,
        options=OPTIONS,
        created_ms=now,
        expires_ms=now + 600_000,
        confirmed=True,
    )
    assert list(sub.options) == list(OPTIONS)  # key order too
    clock.advance(5)
    assert await store.get_subscription(Q, sid) == sub
    queues = await store.list_queues(Q.project, marker=None, limit=10, detailed=False)
    assert Q.name in [info.name for info in queues.items]  # the queue was created with it
    with pytest.raises(SubscriptionNotFound):
        await store.get_subscription(Q, new_id())
    with pytest.raises(SubscriptionNotFound):
        await store.get_subscription(DLQ, sid)  # another queue's


async def test_a_subscriber_subscribes_once_per_queue(store: Store, clock: ManualClock) -> None:
    first, created = await subscribe(store, Q, HOOK, ttl=600, options={"a": 1})
    assert created
    clock.advance(10)
    again, created = await subscribe(store, Q, HOOK, ttl=60, options={"b": 2})
    assert (again, created) == (first, False)  # returned as it is: nothing changed
    assert await all_subscriptions(store, Q, limit=10) == [first]
    elsewhere, created = await subscribe(store, DLQ, HOOK)
    assert created
    assert elsewhere.id != first.id
    other, created = await subscribe(store, Q, MAIL)
    assert created
    assert {s.id for s in await all_subscriptions(store, Q, limit=10)} == {first.id, other.id}


async def test_list_pages_by_marker_in_id_order(store: Store, clock: ManualClock) -> None:
    ids = [SubscriptionId(f"{n:02x}" + uuid.uuid4().hex[2:]) for n in (7, 3, 9, 1, 5)]
    for n, sid in enumerate(ids):
        await subscribe(store, Q, f"{HOOK}/{n}", subscription_id=sid)
    await subscribe(store, DLQ, HOOK)  # not Q's
    listed = await all_subscriptions(store, Q, limit=2)
    assert [s.id for s in listed] == sorted(ids)
    first = await store.list_subscriptions(Q, marker=None, limit=2)
    assert [s.id for s in first.items] == sorted(ids)[:2]
    assert first.next_marker is not None
    rest = await store.list_subscriptions(Q, marker=first.next_marker, limit=10)
    assert [s.id for s in rest.items] == sorted(ids)[2:]
    assert (await store.list_subscriptions(QueueRef(Q.project, "none"), marker=None, limit=5)).items == []


async def test_expired_subscriptions_are_gone(store: Store, clock: ManualClock) -> None:
    short, _ = await subscribe(store, Q, HOOK, ttl=60)
    long, _ = await subscribe(store, Q, MAIL, ttl=120)
    clock.advance(59.999)
    assert await store.get_subscription(Q, short.id) == short
    clock.advance(0.001)
    with pytest.raises(SubscriptionNotFound):
        await store.get_subscription(Q, short.id)
    assert await all_subscriptions(store, Q, limit=10) == [long]
    for change in (
        store.update_subscription(Q, short.id, ttl=600),
        store.confirm_subscription(Q, short.id, confirmed=True),
    ):
        with pytest.raises(SubscriptionNotFound):
            await change
    again, created = await subscribe(store, Q, HOOK, ttl=60)  # its subscriber is free again
    assert created
    assert again.id != short.id
    assert {s.id for s in await all_subscriptions(store, Q, limit=10)} == {again.id, long.id}


async def test_update_changes_what_is_given(store: Store, clock: ManualClock) -> None:
    sub, _ = await subscribe(store, Q, HOOK, ttl=60, options={"a": 1})
    other, _ = await subscribe(store, Q, MAIL)
    clock.advance(50)
    await store.update_subscription(Q, sub.id, ttl=60)  # counts from now
    now = clock.now_ms()
    got = await store.get_subscription(Q, sub.id)
    assert (got.ttl, got.expires_ms, got.created_ms) == (60, now + 60_000, sub.created_ms)
    clock.advance(30)
    await store.update_subscription(Q, sub.id, options=OPTIONS)
    assert (await store.get_subscription(Q, sub.id)).options == OPTIONS
    await store.update_subscription(Q, sub.id, subscriber="https://new.example.com")
    got = await store.get_subscription(Q, sub.id)
    assert (got.subscriber, got.options, got.ttl, got.expires_ms) == (
        "https://new.example.com",
        OPTIONS,
        60,
        now + 60_000,
    )
    with pytest.raises(SubscriptionExists):
        await store.update_subscription(Q, sub.id, subscriber=MAIL)
    assert (await store.get_subscription(Q, other.id)).subscriber == MAIL
    await store.update_subscription(Q, sub.id, subscriber="https://new.example.com")  # its own: no conflict
    await store.update_subscription(Q, sub.id)  # nothing given: nothing changes
    assert (await store.get_subscription(Q, sub.id)).subscriber == "https://new.example.com"
    with pytest.raises(SubscriptionNotFound):
        await store.update_subscription(Q, new_id(), ttl=60)


async def test_update_may_take_the_subscriber_of_an_expired_one(store: Store, clock: ManualClock) -> None:
    old, _ = await subscribe(store, Q, MAIL, ttl=60)
    sub, _ = await subscribe(store, Q, HOOK, ttl=600)
    clock.advance(60)
    await store.update_subscription(Q, sub.id, subscriber=MAIL)
    assert (await store.get_subscription(Q, sub.id)).subscriber == MAIL
    assert [s.id for s in await all_subscriptions(store, Q, limit=10)] == [sub.id]
    with pytest.raises(SubscriptionNotFound):
        await store.get_subscription(Q, old.id)


async def test_confirm_and_unconfirm(store: Store) -> None:
    sub, _ = await subscribe(store, Q, HOOK, confirmed=False)
    assert not sub.confirmed
    await store.confirm_subscription(Q, sub.id, confirmed=True)
    assert (await store.get_subscription(Q, sub.id)).confirmed
    await store.confirm_subscription(Q, sub.id, confirmed=False)
    assert not (await store.get_subscription(Q, sub.id)).confirmed
    with pytest.raises(SubscriptionNotFound):
        await store.confirm_subscription(Q, new_id(), confirmed=True)


async def test_delete_purge_and_delete_queue(store: Store) -> None:
    a, _ = await subscribe(store, Q, HOOK)
    b, _ = await subscribe(store, Q, MAIL)
    kept, _ = await subscribe(store, DLQ, HOOK)
    await store.delete_subscription(Q, a.id)
    await store.delete_subscription(Q, a.id)  # missing: not an error
    await store.delete_subscription(DLQ, b.id)  # another queue's: not deleted
    with pytest.raises(SubscriptionNotFound):
        await store.get_subscription(Q, a.id)
    assert await all_subscriptions(store, Q, limit=10) == [b]
    again, created = await subscribe(store, Q, HOOK)  # its subscriber is free again
    assert created
    await store.purge_subscriptions(Q)
    assert await all_subscriptions(store, Q, limit=10) == []
    await store.purge_subscriptions(Q)
    for sid in (b.id, again.id):
        with pytest.raises(SubscriptionNotFound):
            await store.get_subscription(Q, sid)
    await subscribe(store, Q, HOOK)
    await post(store, Q, "x")
    await store.delete_queue(Q)
    assert await all_subscriptions(store, Q, limit=10) == []
    _, created = await subscribe(store, Q, HOOK)  # a new queue, a new subscription
    assert created
    assert await all_subscriptions(store, DLQ, limit=10) == [kept]


async def test_max_per_queue_counts_live_subscriptions(store: Store, clock: ManualClock) -> None:
    await subscribe(store, Q, "https://a.example.com", max_per_queue=2, ttl=60)
    await subscribe(store, Q, "https://b.example.com", max_per_queue=2)
    with pytest.raises(Conflict, match="CHARON_LIMITS__MAX_SUBSCRIPTIONS_PER_QUEUE") as raised:
        await subscribe(store, Q, "https://c.example.com", max_per_queue=2)
    assert not isinstance(raised.value, SubscriptionExists)
    assert len(await all_subscriptions(store, Q, limit=10)) == 2
    _, created = await subscribe(store, DLQ, "https://c.example.com", max_per_queue=2)  # per queue
    assert created
    clock.advance(60)  # the first expired: room for one
    _, created = await subscribe(store, Q, "https://c.example.com", max_per_queue=2)
    assert created
    with pytest.raises(Conflict):
        await subscribe(store, Q, "https://d.example.com", max_per_queue=2)
