from __future__ import annotations

import pytest

from core.errors import MetadataChanged
from core.metadata import QueuePolicy
from core.models import QueueRef
from storage.base import Store
from tests.contract.helpers import Q, post

pytestmark = pytest.mark.every_store


async def test_never_created_queue_reads_as_empty(store: Store) -> None:
    assert await store.get_metadata(Q) == {}
    stats = await store.stats(Q)
    assert (stats.free, stats.claimed, stats.total, stats.oldest) == (0, 0, 0, None)
    assert (await store.claim(Q, ttl=60, grace=60, limit=5)).claim is None
    assert (await store.list_queues(Q.project, marker=None, limit=10, detailed=False)).items == []


async def test_create_is_true_once_and_keeps_first_metadata(store: Store) -> None:
    assert await store.create_queue(Q, metadata={"a": 1}, policy=QueuePolicy()) is True
    assert await store.create_queue(Q, metadata={"b": 2}, policy=QueuePolicy()) is False
    assert await store.get_metadata(Q) == {"a": 1}


async def test_set_metadata_replaces_it(store: Store) -> None:
    await store.create_queue(Q, metadata={"a": 1}, policy=QueuePolicy())
    await store.set_metadata(Q, metadata={"b": [1, "x"]}, policy=QueuePolicy())
    assert await store.get_metadata(Q) == {"b": [1, "x"]}


async def test_posting_creates_the_queue_lazily(store: Store) -> None:
    await post(store, Q, "hello")
    page = await store.list_queues(Q.project, marker=None, limit=10, detailed=True)
    assert [(i.name, i.metadata) for i in page.items] == [(Q.name, {})]


async def test_list_queues_pages_in_name_order(store: Store) -> None:
    for name in ["c", "a", "e", "b", "d"]:
        await store.create_queue(QueueRef(Q.project, name), metadata={}, policy=QueuePolicy())
    first = await store.list_queues(Q.project, marker=None, limit=2, detailed=False)
    assert [i.name for i in first.items] == ["a", "b"]
    assert first.items[0].metadata is None
    second = await store.list_queues(Q.project, marker=first.next_marker, limit=10, detailed=False)
    assert [i.name for i in second.items] == ["c", "d", "e"]


async def test_delete_queue_removes_it_and_its_messages(store: Store) -> None:
    ids = await post(store, Q, *range(30))
    await store.delete_queue(Q)
    assert await store.get_messages(Q, ids) == []
    assert (await store.list_queues(Q.project, marker=None, limit=10, detailed=False)).items == []
    assert (await store.stats(Q)).total == 0
    await store.delete_queue(Q)  # deleting again is not an error


async def test_purge_keeps_queue_and_metadata(store: Store) -> None:
    await store.create_queue(Q, metadata={"keep": True}, policy=QueuePolicy())
    await post(store, Q, *range(1200))
    await store.purge(Q)
    assert (await store.stats(Q)).total == 0
    assert await store.get_metadata(Q) == {"keep": True}


async def test_stats_count_free_claimed_delayed(store: Store) -> None:
    first = await post(store, Q, 1, 2, 3)
    await post(store, Q, 4, delay=60)
    await store.claim(Q, ttl=60, grace=60, limit=2)
    stats = await store.stats(Q)
    assert (stats.total, stats.claimed, stats.free, stats.delayed) == (4, 2, 2, 1)
    assert stats.oldest is not None
    assert stats.oldest.id == first[0]
    assert stats.newest is not None
    assert stats.newest.id != first[0]


async def test_a_write_against_a_stale_metadata_version_changes_nothing(store: Store) -> None:
    before = await store.metadata_version(Q)
    await store.set_metadata(Q, metadata={"a": 1}, policy=QueuePolicy(), expected_version=before)
    after = await store.metadata_version(Q)
    assert after != before
    with pytest.raises(MetadataChanged):
        await store.set_metadata(Q, metadata={"a": 2}, policy=QueuePolicy(), expected_version=before)
    # A queue whose DLQ is Q shares Q's backend (its pool, in a pooled store), so Q's write counts there.
    other = QueueRef(Q.project, "other")
    meta = {"b": 1, "_dead_letter_queue": Q.name}
    with pytest.raises(MetadataChanged):
        await store.create_queue(
            other, metadata=meta, policy=QueuePolicy(dead_letter_queue=Q.name), expected_version=before
        )
    assert await store.get_metadata(Q) == {"a": 1}
    listed = await store.list_queues(Q.project, marker=None, limit=10, detailed=False)
    assert [info.name for info in listed.items] == [Q.name]
    assert await store.metadata_version(QueueRef("elsewhere", "q")) == 0
