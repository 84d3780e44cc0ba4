"""Quota overrides and request-rate token buckets (storage/base.py QuotaStore) on every store: overrides set,
merged, removed and read back per project; a bucket starts full, refills at its rate up to its size, says
how long until the next token, and never grants more than it held, however many take at once."""

from __future__ import annotations

import asyncio

import pytest

from core.clock import ManualClock
from core.models import QueueRef
from core.quotas import READS, WRITES, Grant
from storage.base import Store
from tests.contract.helpers import set_meta

pytestmark = pytest.mark.every_store


async def test_overrides_are_set_merged_removed_and_kept_per_project(store: Store) -> None:
    assert await store.get_quota("p") == {}
    assert await store.set_quota("p", {"writes_per_second": 10.0}) == {"writes_per_second": 10.0}
    after = await store.set_quota("p", {"reads_per_second": 2.5})
    assert after == {"writes_per_second": 10.0, "reads_per_second": 2.5}
    assert await store.get_quota("other") == {}
    assert await store.set_quota("p", {"writes_per_second": None}) == {"reads_per_second": 2.5}
    assert await store.get_quota("p") == {"reads_per_second": 2.5}
    await store.delete_quota("p")
    assert await store.get_quota("p") == {}
    await store.delete_quota("never-had-one")


async def test_a_bucket_starts_full_refills_at_its_rate_and_says_when(
    store: Store, clock: ManualClock
) -> None:
    take = store.take_tokens
    assert await take("p", WRITES, want=3, rate=2.0, capacity=4) == Grant(3, 0)
    assert await take("p", WRITES, want=3, rate=2.0, capacity=4) == Grant(1, 0)
    assert await take("p", WRITES, want=1, rate=2.0, capacity=4) == Grant(0, 500)  # 2 a second: one in 0.5 s
    assert await take("p", READS, want=1, rate=2.0, capacity=4) == Grant(1, 0)  # its own bucket
    assert await take("q", WRITES, want=1, rate=2.0, capacity=4) == Grant(1, 0)  # and each project its own
    clock.advance(0.25)
    assert await take("p", WRITES, want=1, rate=2.0, capacity=4) == Grant(0, 250)
    clock.advance(0.25)
    assert await take("p", WRITES, want=5, rate=2.0, capacity=4) == Grant(1, 0)
    clock.advance(60)  # refilled, but never past its size
    assert await take("p", WRITES, want=9, rate=2.0, capacity=4) == Grant(4, 0)


async def test_takes_at_once_never_get_more_than_the_bucket_held(store: Store) -> None:
    grants = await asyncio.gather(
        *(store.take_tokens("p", WRITES, want=3, rate=0.01, capacity=20) for _ in range(16))
    )
    assert sum(g.granted for g in grants) == 20  # the clock stands still: no refill
    assert all(g.wait_ms > 0 for g in grants if g.granted == 0)


async def test_deleting_the_quota_refills_the_buckets(store: Store) -> None:
    assert (await store.take_tokens("p", WRITES, want=5, rate=1.0, capacity=5)).granted == 5
    assert (await store.take_tokens("p", WRITES, want=1, rate=1.0, capacity=5)).granted == 0
    await store.delete_quota("p")
    assert (await store.take_tokens("p", WRITES, want=1, rate=1.0, capacity=5)).granted == 1


async def test_a_rate_taken_before_a_projects_first_queue_leaves_its_metadata_writes_alone(
    store: Store,
) -> None:
    """A project's first request may take a token before any of its queues exists: its metadata version
    must read 0 after that, and the first metadata write must land (MongoDB once kept both in one
    document, and a queue could no longer be created: KeyError, then MetadataChanged forever)."""
    q = QueueRef("fresh", "orders")
    await store.take_tokens("fresh", WRITES, want=1, rate=1.0, capacity=5)
    await store.set_quota("fresh", {"writes_per_second": 5.0})
    assert await store.metadata_version(q) == 0
    await set_meta(store, q, _max_claim_count=3)
    assert (await store.get_metadata(q))["_max_claim_count"] == 3


async def test_a_clock_behind_another_never_moves_the_last_take_back(
    store: Store, clock: ManualClock
) -> None:
    """Two API processes whose clocks disagree by 0.5 s take in turn: the one behind refills nothing, leaves
    the last take's time where the one ahead put it and is told to wait for it too; so the one ahead is
    not refilled twice for the time between. A last take 10 s ahead is not believed: it cannot stop the
    refill for 10 s."""
    assert (await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4)).granted == 4
    clock.advance(-0.5)  # the process behind
    assert await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4) == Grant(0, 500 + 500)
    clock.advance(1.5)  # the process ahead, 1 s after its take: 2 tokens, not 3 (0.5 s counted twice)
    assert (await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4)).granted == 2
    clock.advance(10)  # a process 10 s ahead takes the bucket empty
    assert (await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4)).granted == 4
    clock.advance(-10 + 1)  # back to the others' time, 1 s later: told to wait 0.5 s, not 9.5 s
    assert await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4) == Grant(0, 500)
    clock.advance(1)
    assert (await store.take_tokens("p", WRITES, want=4, rate=2.0, capacity=4)).granted == 2
