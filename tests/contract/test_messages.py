from __future__ import annotations

import pytest

from core.clock import ManualClock
from core.errors import ClaimMismatch, PayloadTooLarge
from core.metadata import QueuePolicy
from core.models import ClaimId, NewMessage, QueueRef
from storage.base import Store
from tests.contract.helpers import CLIENT, OTHER_CLIENT, Q, all_messages, post

pytestmark = pytest.mark.every_store


async def list_all(store: Store, q: QueueRef = Q, **kw: object) -> list[object]:
    opts = {"echo": True, "client_id": CLIENT, "include_claimed": False, "include_delayed": False, **kw}
    return [m.body for m in await all_messages(store, q, limit=3, **opts)]


async def test_post_then_get_keeps_body_and_ttl(store: Store) -> None:
    body = {"event": "created", "n": [1, 2.5, None, True], "s": "ü"}
    [mid] = await post(store, Q, body, ttl=120)
    [m] = await store.get_messages(Q, [mid])
    assert (m.id, m.body, m.ttl, m.claim_count, m.claim_id) == (mid, body, 120, 0, None)


async def test_one_post_of_thousands_of_messages_keeps_them_all_in_order(store: Store) -> None:
    """5,000 small messages in one post (256 KB allows ~25,000): past what one Lua unpack() takes, so the
    Redis script writes its sets in chunks; every message is there, in posted order."""
    ids = await post(store, Q, *range(5000))
    await post(store, Q, "late", delay=60)
    stats = await store.stats(Q)
    assert (stats.total, stats.claimed, stats.delayed) == (5001, 0, 1)
    claim = (await store.claim(Q, ttl=60, grace=60, limit=20)).claim
    assert claim is not None
    assert [m.body for m in claim.messages] == list(range(20))
    assert [m.id for m in await store.get_messages(Q, [ids[0], ids[-1]])] == [ids[0], ids[-1]]


async def test_default_ttl_from_queue_metadata_then_service(store: Store) -> None:
    [a] = await post(store, Q, "a")
    await store.set_metadata(
        Q, metadata={"_default_message_ttl": 90}, policy=QueuePolicy(default_message_ttl=90)
    )
    [b] = await post(store, Q, "b")
    assert [m.ttl for m in await store.get_messages(Q, [a, b])] == [3600, 90]


async def test_listing_is_fifo_and_pages_with_marker(store: Store) -> None:
    await post(store, Q, *range(10))
    await post(store, Q, *range(10, 14))
    assert await list_all(store) == list(range(14))


async def test_echo_false_hides_own_messages(store: Store) -> None:
    await post(store, Q, "mine")
    await post(store, Q, "theirs", client_id=OTHER_CLIENT)
    assert await list_all(store, echo=False) == ["theirs"]


async def test_claimed_and_delayed_hidden_unless_asked(store: Store) -> None:
    await post(store, Q, "a", "b")
    await post(store, Q, "later", delay=30)
    await store.claim(Q, ttl=60, grace=60, limit=1)
    assert await list_all(store) == ["b"]
    assert await list_all(store, include_claimed=True, include_delayed=True) == ["a", "b", "later"]


async def test_listing_scans_past_many_hidden_messages(store: Store) -> None:
    await post(store, Q, *range(1500), client_id=OTHER_CLIENT)
    await post(store, Q, "visible")
    # 1,500 of the other client's messages hidden by echo=False come first; paging still reaches ours
    assert await list_all(store, echo=False, client_id=OTHER_CLIENT) == ["visible"]


async def test_expired_messages_never_appear(store: Store, clock: ManualClock) -> None:
    [short] = await post(store, Q, "short", ttl=60)
    [long] = await post(store, Q, "long", ttl=120)
    clock.advance(60)
    assert await list_all(store) == ["long"]
    assert [m.id for m in await store.get_messages(Q, [short, long])] == [long]
    result = await store.claim(Q, ttl=60, grace=0, limit=5)
    assert result.claim is not None
    assert [m.body for m in result.claim.messages] == ["long"]
    assert (await store.stats(Q)).total == 1


async def test_delay_holds_a_message_back(store: Store, clock: ManualClock) -> None:
    await post(store, Q, "delayed", delay=10)
    assert (await store.claim(Q, ttl=60, grace=60, limit=5)).claim is None
    clock.advance(10)
    result = await store.claim(Q, ttl=60, grace=60, limit=5)
    assert result.claim is not None
    assert [m.body for m in result.claim.messages] == ["delayed"]


async def test_get_messages_is_scoped_to_queue(store: Store) -> None:
    [mid] = await post(store, Q, "x")
    assert await store.get_messages(QueueRef(Q.project, "other"), [mid]) == []
    assert await store.get_messages(QueueRef("project-b", Q.name), [mid]) == []


async def test_delete_unclaimed_message(store: Store) -> None:
    [mid] = await post(store, Q, "x")
    await store.delete_message(Q, mid, claim_id=None)
    assert await store.get_messages(Q, [mid]) == []
    await store.delete_message(Q, mid, claim_id=None)  # idempotent


async def test_claimed_message_needs_its_claim_id(store: Store) -> None:
    [mid] = await post(store, Q, "x")
    claim = (await store.claim(Q, ttl=60, grace=60, limit=1)).claim
    assert claim is not None
    with pytest.raises(ClaimMismatch):
        await store.delete_message(Q, mid, claim_id=None)
    with pytest.raises(ClaimMismatch):
        await store.delete_message(Q, mid, claim_id=ClaimId("0" * 32))
    await store.delete_message(Q, mid, claim_id=claim.id)
    assert await store.get_messages(Q, [mid]) == []


async def test_delete_with_an_expired_claim_is_refused(store: Store, clock: ManualClock) -> None:
    [mid] = await post(store, Q, "x")
    claim = (await store.claim(Q, ttl=60, grace=60, limit=1)).claim
    assert claim is not None
    clock.advance(61)
    with pytest.raises(ClaimMismatch):
        await store.delete_message(Q, mid, claim_id=claim.id)
    assert len(await store.get_messages(Q, [mid])) == 1


async def test_bulk_delete_and_pop(store: Store) -> None:
    ids = await post(store, Q, *range(6))
    await store.delete_messages(Q, ids[:2])
    popped = await store.pop_messages(Q, limit=3)
    assert [m.body for m in popped] == [2, 3, 4]
    assert [m.body for m in await store.get_messages(Q, ids)] == [5]


async def test_queue_post_size_limit(store: Store) -> None:
    await store.set_metadata(
        Q, metadata={"_max_messages_post_size": 50}, policy=QueuePolicy(max_messages_post_size=50)
    )
    with pytest.raises(PayloadTooLarge):
        await store.post_messages(
            Q, [NewMessage("x" * 60)], client_id=CLIENT, default_ttl=3600, default_delay=0, body_size=70
        )
    assert (await store.stats(Q)).total == 0
