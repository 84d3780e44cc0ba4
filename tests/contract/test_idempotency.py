"""A post with an Idempotency-Key is stored once, on every driver: its messages and the key's record are
written in one atomic step, a repeat within the window answers the first post's ids, a repeat with other
messages is refused, and the record ends with its window."""

from __future__ import annotations

import asyncio

import pytest

from core.clock import ManualClock
from core.errors import IdempotencyKeyReused
from core.models import Idempotency, MessageId, NewMessage, QueueRef
from storage.base import Store
from tests.contract.helpers import CLIENT, Q
from tests.contract.helpers import all_messages as listed

pytestmark = pytest.mark.every_store

WINDOW_MS = 60_000


async def all_messages(store: Store, q: QueueRef) -> list[object]:
    return await listed(
        store, q, limit=20, echo=True, client_id=CLIENT, include_claimed=True, include_delayed=True
    )


async def post_once(
    store: Store, q: QueueRef, key: str, fingerprint: str, *bodies: object
) -> list[MessageId]:
    return await store.post_messages(
        q,
        [NewMessage(body=b) for b in bodies],
        client_id=CLIENT,
        default_ttl=3600,
        default_delay=0,
        body_size=100,
        idempotency=Idempotency(key, fingerprint, WINDOW_MS),
    )


async def test_a_repeated_post_is_stored_once_and_answers_the_first_ids(store: Store) -> None:
    first = await post_once(store, Q, "k-1", "fp-a", "a", "b")
    again = await post_once(store, Q, "k-1", "fp-a", "a", "b")
    assert again == first
    assert [m.body for m in await all_messages(store, Q)] == ["a", "b"]
    other = await post_once(store, Q, "k-2", "fp-a", "a", "b")  # a new key is a new post
    assert set(other).isdisjoint(first)
    assert len(await all_messages(store, Q)) == 4


async def test_a_key_reused_for_other_messages_is_refused(store: Store) -> None:
    await post_once(store, Q, "k", "fp-a", "a")
    with pytest.raises(IdempotencyKeyReused):
        await post_once(store, Q, "k", "fp-b", "b")
    assert [m.body for m in await all_messages(store, Q)] == ["a"]


async def test_keys_are_per_queue(store: Store) -> None:
    other = QueueRef(Q.project, "other")
    a = await post_once(store, Q, "k", "fp-a", "a")
    b = await post_once(store, other, "k", "fp-a", "a")
    assert a != b
    assert len(await all_messages(store, other)) == 1


async def test_the_record_ends_with_its_window(store: Store, clock: ManualClock) -> None:
    first = await post_once(store, Q, "k", "fp-a", "a")
    clock.advance(WINDOW_MS / 1000 + 1)
    later = await post_once(store, Q, "k", "fp-b", "b")  # a new post: the key's window is over
    assert later != first
    assert [m.body for m in await all_messages(store, Q)] == ["a", "b"]


async def test_concurrent_repeats_store_once(store: Store) -> None:
    """Ten copies of one post at once (a client retrying eagerly): one is stored, all answer its ids."""
    results = await asyncio.gather(
        *(post_once(store, Q, "k", "fp-a", "a", "b") for _ in range(10)), return_exceptions=True
    )
    answers = [r for r in results if isinstance(r, list)]
    assert answers, results
    assert all(a == answers[0] for a in answers)
    assert [m.body for m in await all_messages(store, Q)] == ["a", "b"]
