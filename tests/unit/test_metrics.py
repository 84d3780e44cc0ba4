"""service/gauges.py on a real store: one read shared by concurrent scrapes, the notifier's backlog and lag
from outbox_stats, a store that does not answer; and the private directory `charon serve` gives
prometheus-client's multiprocess mode. (The per-queue values after real traffic are
tests/api/test_metrics.py's.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric

from app.workers import share_metrics
from core.clock import ManualClock
from core.models import NewMessage, QueueRef, QueueStats, SubscriptionId
from service.gauges import StoreGauges
from storage.base import Store
from storage.redis.store import RedisStore
from tests.servers import free_port


class Counted:
    """A real store whose queue_gauges calls are counted (everything else goes straight to it)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        self.reads += 1
        await self.gate.wait()
        return await self.store.queue_gauges(limit=limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def gauges(store: Any, clock: ManualClock, **options: Any) -> StoreGauges:
    defaults = {"max_queues": 10, "max_read": 100, "cache_seconds": 60.0, "sweeping": False}
    return StoreGauges(lambda: store, clock=clock, **{**defaults, **options})


def values(families: list[Metric]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}


async def test_concurrent_scrapes_share_one_read_and_reuse_it(redis_store: Store, clock: ManualClock) -> None:
    store = Counted(redis_store)
    g = gauges(store, clock)
    store.gate.clear()
    scrapes = [asyncio.ensure_future(g.families()) for _ in range(5)]
    await asyncio.sleep(0)
    store.gate.set()
    answers = await asyncio.gather(*scrapes)
    assert store.reads == 1
    await g.families()
    assert store.reads == 1  # within cache_seconds
    assert all(values(a) == values(answers[0]) for a in answers)
    uncached = gauges(store, clock, cache_seconds=0)
    await uncached.families()
    await uncached.families()
    assert store.reads == 3


async def test_the_notifier_backlog_and_lag(redis_store: Store, clock: ManualClock) -> None:
    q = QueueRef("p", "orders")
    got = values(await gauges(redis_store, clock, cache_seconds=0).families())
    assert (got["charon_notifier_backlog", ()], got["charon_notifier_lag_seconds", ()]) == (0, 0)
    await redis_store.create_subscription(
        q,
        SubscriptionId(uuid.uuid4().hex),
        subscriber="https://hooks.example.com/",
        ttl=3600,
        options={},
        confirmed=True,
        max_per_queue=10,
    )
    await redis_store.post_messages(
        q, [NewMessage(1), NewMessage(2)], client_id="c", default_ttl=3600, default_delay=0, body_size=2
    )
    clock.advance(2.5)
    got = values(await gauges(redis_store, clock, cache_seconds=0).families())
    assert (got["charon_notifier_backlog", ()], got["charon_notifier_lag_seconds", ()]) == (2, 2.5)


async def test_a_failing_store_leaves_its_series_out_and_says_so(clock: ManualClock) -> None:
    port = free_port()  # nothing listens there
    store = RedisStore.from_url(f"redis://127.0.0.1:{port}", namespace="down", clock=clock, timeout=1)
    try:
        got = values(await gauges(store, clock, sweeping=True).families())
    finally:
        await store.aclose()
    assert got["charon_metrics_store_ok", ()] == 0
    assert not any(name.startswith("charon_queue_") for name, _ in got)
    assert ("charon_notifier_backlog", ()) not in got
    assert got["charon_sweeper_lag_seconds", ()] >= 0


def test_charon_serve_shares_metrics_between_its_processes_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/somewhere/else")
    monkeypatch.setenv("CHARON_NOTIFICATIONS__PROCESS", "false")
    assert share_metrics(1) is None
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # one process: values in memory
    monkeypatch.setenv("CHARON_WORKERS", "1")
    assert share_metrics(None) is None
    monkeypatch.setenv("CHARON_NOTIFICATIONS__PROCESS", "true")  # one worker and the notifier's process
    one = Path(share_metrics(None) or "")
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(one)
    shutil.rmtree(one)
    monkeypatch.setenv("CHARON_NOTIFICATIONS__EXTERNAL", "true")  # the notifier runs elsewhere: one process
    assert share_metrics(None) is None
    monkeypatch.delenv("CHARON_NOTIFICATIONS__EXTERNAL")
    gone = tmp_path / "charon-metrics-999999999-x"  # a PID no process has
    gone.mkdir()
    kept = tmp_path / f"charon-metrics-{os.getpid()}-x"
    kept.mkdir()
    monkeypatch.setenv("CHARON_WORKERS", "3")
    path = Path(share_metrics(None) or "")
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(path)
    assert path.parent == tmp_path
    assert path.name.startswith(f"charon-metrics-{os.getpid()}-")
    assert (path.stat().st_mode & 0o777, list(path.iterdir())) == (0o700, [])
    assert (gone.exists(), kept.exists()) == (False, True)
    shutil.rmtree(path)


def test_a_stale_metrics_directory_removed_meanwhile_does_not_stop_a_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two services started at once after a kill -9 both remove a dead one's directory: the one that finds it
    gone between listing and looking goes on starting (a dangling link is such an entry)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("CHARON_WORKERS", "2")
    (tmp_path / "charon-metrics-999999999-gone").symlink_to(tmp_path / "removed-meanwhile")
    path = Path(share_metrics(None) or "")
    assert path.parent == tmp_path
    shutil.rmtree(path)
