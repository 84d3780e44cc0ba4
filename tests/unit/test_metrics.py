"""service/gauges.py on a stand-in store: one read shared by concurrent scrapes, the notifier's backlog and
lag from outbox_stats (when the store has it), a failing store, reasons the store did not count; and the
private directory `charon serve` gives prometheus-client's multiprocess mode."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric

from app.workers import share_metrics
from core.clock import ManualClock
from core.errors import StorageUnavailable
from core.models import MessageId, MessageStamp, QueueRef, QueueStats
from service.gauges import StoreGauges


class Stand:
    """What StoreGauges reads of a store."""

    def __init__(self, outbox: tuple[int, int | None] | None = None, fail: bool = False) -> None:
        self.reads = 0
        self.fail = fail
        self.gate = asyncio.Event()
        self.gate.set()
        if outbox is not None:
            self.outbox = outbox

            async def outbox_stats() -> tuple[int, int | None]:
                if self.fail:
                    raise StorageUnavailable("down")
                return self.outbox

            self.outbox_stats = outbox_stats

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            raise StorageUnavailable("down")
        stats = QueueStats(
            free=5,
            claimed=2,
            total=7,
            delayed=1,
            oldest=MessageStamp(MessageId("m"), 1_000),
            dead_lettered=6,
            dead_lettered_by_reason={"max_claims": 2, "rejected": 1},
            redriven=4,
        )
        return [(QueueRef("p", "q"), stats)], False


def gauges(store: Any, clock: ManualClock, **options: Any) -> StoreGauges:
    defaults = {"max_queues": 10, "max_read": 100, "cache_seconds": 60.0, "sweeping": False}
    return StoreGauges(lambda: store, clock=clock, **{**defaults, **options})


def values(families: list[Metric]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for f in families for s in f.samples}


async def test_concurrent_scrapes_share_one_read_and_reuse_it() -> None:
    clock = ManualClock()
    store = Stand()
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


async def test_the_values_of_a_queue() -> None:
    clock = ManualClock()
    clock.advance(3)
    got = values(await gauges(Stand(), clock).families())
    q = ("p", "q")
    assert got["charon_queue_messages_ready", q] == 4  # free less delayed
    assert got["charon_queue_messages_claimed", q] == 2
    assert got["charon_queue_messages_delayed", q] == 1
    assert got["charon_queue_oldest_message_age_seconds", q] == (clock.now_ms() - 1_000) / 1000
    reasons = {
        r: got["charon_queue_dead_lettered_total", (*q, r)] for r in ("max_claims", "expired", "rejected")
    }
    assert reasons == {"max_claims": 2, "expired": 0, "rejected": 1}
    assert got["charon_queue_dead_lettered_total", (*q, "unknown")] == 3  # counted without a reason
    assert got["charon_queue_redriven_total", q] == 4
    assert ("charon_sweeper_lag_seconds", ()) not in got  # the sweeper is off


async def test_the_notifier_backlog_and_lag_when_the_store_keeps_an_outbox() -> None:
    clock = ManualClock()
    assert ("charon_notifier_backlog", ()) not in values(await gauges(Stand(), clock).families())
    store = Stand(outbox=(7, clock.now_ms() - 2_500))
    got = values(await gauges(store, clock).families())
    assert (got["charon_notifier_backlog", ()], got["charon_notifier_lag_seconds", ()]) == (7, 2.5)
    store.outbox = (0, None)
    got = values(await gauges(store, clock).families())
    assert (got["charon_notifier_backlog", ()], got["charon_notifier_lag_seconds", ()]) == (0, 0)
    store.outbox = (1, clock.now_ms() + 60_000)  # due later: no lag
    assert values(await gauges(store, clock).families())["charon_notifier_lag_seconds", ()] == 0


async def test_a_failing_store_leaves_its_series_out_and_says_so() -> None:
    clock = ManualClock()
    got = values(await gauges(Stand(outbox=(1, 0), fail=True), clock, sweeping=True).families())
    assert got["charon_metrics_store_ok", ()] == 0
    assert not any(name.startswith("charon_queue_") for name, _ in got)
    assert ("charon_notifier_backlog", ()) not in got
    assert got["charon_sweeper_lag_seconds", ()] >= 0


async def test_a_read_that_raises_a_bug_does_not_stick() -> None:
    class Broken(Stand):
        async def queue_gauges(self, *, limit: int) -> Any:
            self.reads += 1
            raise RuntimeError("bug")

    store = Broken()
    g = gauges(store, ManualClock())
    for _ in range(2):
        with pytest.raises(RuntimeError, match="bug"):
            await g.families()
    assert store.reads == 2


def test_charon_serve_shares_metrics_between_workers_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/somewhere/else")
    assert share_metrics(1) is None
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # one worker: values in memory
    monkeypatch.setenv("CHARON_WORKERS", "1")
    assert share_metrics(None) is None
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
