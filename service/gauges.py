"""What GET /metrics reads from the store when it is scraped: every queue's depth, age and dead-letter
counters (Store.queue_gauges), the notifier's backlog and lag (Store.outbox_stats), and the sweeper's lag.

Cardinality: the first `max_queues` queues in (project, name) order get series of their own (labels project
and queue); the others read are added up into one series, project="_other", queue="_other" (its oldest age
is the oldest of them all). At most `max_read` queues are read; beyond that, charon_metrics_queues_truncated
is 1 and the rest are in no series. A queue's place in that order changes only when queues are created or
deleted, so series are stable; a counter of `_other` goes down when a queue leaves it (Prometheus reads
that as a reset).

The counted quotas (docs/quotas.md): for each project with a queue in a series of its own, its queues (all
of them, counted by the store), each quota in force and its use (for `messages_per_queue`, the fullest of
its queues with series of their own), from one read of the project's overrides and one count a scrape (and,
under a `message_bytes` quota, the bytes it holds: a sum over its messages on MongoDB).

Cost: one read is shared by the scrapes that arrive while it runs, and its answer is reused for
`cache_seconds`, so parallel scrapes (or several Prometheus servers) cost the store one read a period per
process.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from core.clock import Clock
from core.errors import CharonError
from core.models import DeadLetterReason, QueueRef, QueueStats
from core.quotas import MESSAGE_BYTES, MESSAGES_PER_QUEUE, QUEUES, Counted
from service.metrics import SWEEPER_LAST_SWEEP_NAME, collect_processes
from storage.base import Store

OTHER = "_other"  # the project and queue labels of the series that adds up the queues past max_queues
REASONS: tuple[DeadLetterReason, ...] = ("max_claims", "expired", "rejected")
UNKNOWN_REASON = "unknown"  # moves the store counted without their reason (before it counted reasons)
SWEEPER_LAG = "charon_sweeper_lag_seconds"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read of the store."""

    now_ms: int  # the store's clock when it was read
    queues: list[tuple[QueueRef, QueueStats]]
    truncated: bool
    outbox: tuple[int, int | None] | None  # (waiting, earliest due ms); None: the store keeps no outbox
    ok: bool  # every read succeeded
    # the counted quotas (core/quotas.py) of each project with a queue in a series of its own
    quotas: dict[str, dict[str, int | None]] = field(default_factory=dict)
    queues_held: dict[str, int] = field(default_factory=dict)  # each of those projects' queues, all counted
    bytes_held: dict[str, int] = field(default_factory=dict)  # those under a `message_bytes` quota: their use


@dataclass(slots=True)
class _Row:
    """A queue's values as exposed (a sum of several for `_other`)."""

    ready: int = 0
    claimed: int = 0
    delayed: int = 0
    oldest_age: float = 0.0
    dead_lettered: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    received: int = 0
    discarded: int = 0
    redriven: int = 0

    def add(self, stats: QueueStats, now_ms: int) -> None:
        self.ready += max(stats.free - stats.delayed, 0)
        self.claimed += stats.claimed
        self.delayed += stats.delayed
        if stats.oldest is not None:
            self.oldest_age = max(self.oldest_age, max(now_ms - stats.oldest.created_ms, 0) / 1000)
        reasons = self.dead_lettered
        for reason, n in stats.dead_lettered_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + n
        unknown = stats.dead_lettered - sum(stats.dead_lettered_by_reason.values())
        if unknown > 0:
            reasons[UNKNOWN_REASON] = reasons.get(UNKNOWN_REASON, 0) + unknown
        self.received += stats.dead_letters_received
        self.discarded += stats.discarded
        self.redriven += stats.redriven


class StoreGauges:
    def __init__(
        self,
        store: Callable[[], Store],
        *,
        clock: Clock,
        max_queues: int,
        max_read: int,
        cache_seconds: float,
        sweeping: bool,
        quotas: Counted | None = None,
    ) -> None:
        """`quotas`: the counted quotas' defaults (CHARON_QUOTAS__*), under each project's overrides."""
        self._store = store
        self._quotas = quotas or Counted()
        self._clock = clock
        self.max_queues = max_queues
        self.max_read = max_read
        self.cache_seconds = cache_seconds
        self._sweeping = sweeping
        self._started = time.time()
        self._last: Snapshot | None = None
        self._read_at = -math.inf
        self._running: asyncio.Future[Snapshot] | None = None

    async def families(self) -> list[Metric]:
        """Every series of a scrape: the processes' own, then the store's."""
        processes = collect_processes()
        snapshot = await self.snapshot()
        return [*processes, *self._sweeper(processes), *self._store_families(snapshot)]

    async def snapshot(self) -> Snapshot:
        if self._last is not None and time.monotonic() - self._read_at < self.cache_seconds:
            return self._last
        if self._running is None:
            self._running = asyncio.ensure_future(self._read())
        return await asyncio.shield(self._running)

    async def _read(self) -> Snapshot:
        try:
            store = self._store()
            ok = True
            try:
                queues, truncated = await store.queue_gauges(limit=self.max_read)
            except CharonError:
                ok, queues, truncated = False, [], False
            outbox: tuple[int, int | None] | None = None
            try:
                outbox = await store.outbox_stats()
            except CharonError:
                ok = False
            quotas: dict[str, dict[str, int | None]] = {}
            held: dict[str, int] = {}
            bytes_held: dict[str, int] = {}
            for project in dict.fromkeys(q.project for q, _ in queues[: self.max_queues]):
                try:
                    quotas[project] = self._quotas.of(await store.get_quota(project))
                    held[project] = await store.count_queues(project)
                    if quotas[project][MESSAGE_BYTES] is not None:  # a sum over its messages on MongoDB
                        bytes_held[project] = await store.held_bytes(project)
                except CharonError:
                    ok = False
                    break
            snapshot = Snapshot(self._clock.now_ms(), queues, truncated, outbox, ok, quotas, held, bytes_held)
            self._last, self._read_at = snapshot, time.monotonic()
            return snapshot
        finally:
            self._running = None

    def _sweeper(self, processes: list[Metric]) -> Iterator[Metric]:
        """Seconds since this service's sweeper last finished a round (since the process started, before
        its first); none when the sweeper is off (CHARON_SWEEP_INTERVAL=0)."""
        if not self._sweeping:
            return
        last = max(
            (s.value for m in processes if m.name == SWEEPER_LAST_SWEEP_NAME for s in m.samples),
            default=0.0,
        )
        lag = GaugeMetricFamily(
            SWEEPER_LAG,
            "Seconds since this service's sweeper last finished a round (since the service started, "
            "before its first).",
        )
        lag.add_metric([], max(time.time() - max(last, self._started), 0.0))
        yield lag

    def _store_families(self, snapshot: Snapshot) -> list[Metric]:
        labels = ["project", "queue"]
        ready = GaugeMetricFamily("charon_queue_messages_ready", "Messages claimable now.", labels=labels)
        claimed = GaugeMetricFamily(
            "charon_queue_messages_claimed", "Messages a live claim holds.", labels=labels
        )
        delayed = GaugeMetricFamily(
            "charon_queue_messages_delayed",
            "Messages not claimable yet (a delay, or a redelivery backoff).",
            labels=labels,
        )
        oldest = GaugeMetricFamily(
            "charon_queue_oldest_message_age_seconds",
            "Age of the queue's oldest live message (0 when empty).",
            labels=labels,
        )
        dead_lettered = CounterMetricFamily(
            "charon_queue_dead_lettered",
            "Messages moved out of the queue to its DLQ, by reason (max_claims, expired, rejected; unknown: "
            "counted before the store counted reasons).",
            labels=[*labels, "reason"],
        )
        received = CounterMetricFamily(
            "charon_queue_dead_letters_received",
            "Dead letters the queue received as a DLQ.",
            labels=labels,
        )
        discarded = CounterMetricFamily(
            "charon_queue_discarded",
            "Messages dropped where they would have moved to a DLQ (none set, the DLQ full, or posted not "
            "eligible).",
            labels=labels,
        )
        redriven = CounterMetricFamily(
            "charon_queue_redriven", "Messages a redrive moved out of the queue (as a DLQ).", labels=labels
        )
        rows: list[tuple[list[str], _Row]] = []
        other = _Row()
        for n, (q, stats) in enumerate(snapshot.queues):
            if n < self.max_queues:
                row = _Row()
                rows.append(([q.project, q.name], row))
            else:
                row = other
            row.add(stats, snapshot.now_ms)
        if len(snapshot.queues) > self.max_queues:
            rows.append(([OTHER, OTHER], other))
        for values, row in rows:
            ready.add_metric(values, row.ready)
            claimed.add_metric(values, row.claimed)
            delayed.add_metric(values, row.delayed)
            oldest.add_metric(values, row.oldest_age)
            for reason, count in row.dead_lettered.items():
                dead_lettered.add_metric([*values, reason], count)
            received.add_metric(values, row.received)
            discarded.add_metric(values, row.discarded)
            redriven.add_metric(values, row.redriven)
        return [
            ready,
            claimed,
            delayed,
            oldest,
            dead_lettered,
            received,
            discarded,
            redriven,
            *self._meta(snapshot),
            *self._quota_families(snapshot),
        ]

    def _quota_families(self, snapshot: Snapshot) -> Iterator[Metric]:
        """Each project's counted quotas in force, and its use of them (projects with series of their own)."""
        queues = GaugeMetricFamily(
            "charon_project_queues",
            "Queues the project has (its use of the `queues` quota).",
            labels=["project"],
        )
        limit = GaugeMetricFamily(
            "charon_quota_limit",
            "A counted quota in force for the project (queues, messages_per_queue, message_bytes); none: no "
            "limit.",
            labels=["project", "quota"],
        )
        use = GaugeMetricFamily(
            "charon_quota_use_ratio",
            "Use of a counted quota: queues over `queues`; the fullest queue's messages over "
            "`messages_per_queue`; the bytes of the project's messages over `message_bytes`. At 1, creations "
            "(or that queue's posts, or the project's) are refused.",
            labels=["project", "quota"],
        )
        held: dict[str, list[int]] = {}
        for q, stats in snapshot.queues[: self.max_queues]:
            held.setdefault(q.project, []).append(stats.total)
        for project, totals in held.items():
            n = snapshot.queues_held.get(project, len(totals))
            queues.add_metric([project], n)
            counted = snapshot.quotas.get(project, {})
            uses = [(QUEUES, n), (MESSAGES_PER_QUEUE, max(totals))]
            if project in snapshot.bytes_held:
                uses.append((MESSAGE_BYTES, snapshot.bytes_held[project]))
            for name, used in uses:
                value = counted.get(name)
                if value is None:
                    continue
                limit.add_metric([project, name], value)
                use.add_metric([project, name], used / value if value else 1.0)
        yield from (queues, limit, use)

    def _meta(self, snapshot: Snapshot) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            "charon_queues", "Queues in the store (those read: see charon_metrics_queues_truncated)."
        )
        count.add_metric([], len(snapshot.queues))
        truncated = GaugeMetricFamily(
            "charon_metrics_queues_truncated",
            "1 when the store holds more queues than CHARON_METRICS__MAX_QUEUES_READ: the rest are in no "
            "series.",
        )
        truncated.add_metric([], int(snapshot.truncated))
        ok = GaugeMetricFamily(
            "charon_metrics_store_ok", "1 when this scrape's reads of the store succeeded, 0 when one failed."
        )
        ok.add_metric([], int(snapshot.ok))
        yield from (count, truncated, ok)
        if snapshot.outbox is not None:
            waiting, due_ms = snapshot.outbox
            backlog = GaugeMetricFamily("charon_notifier_backlog", "Notifications waiting to be delivered.")
            backlog.add_metric([], waiting)
            lag = GaugeMetricFamily(
                "charon_notifier_lag_seconds",
                "Seconds since the earliest waiting notification came due (0 when none is overdue).",
            )
            lag.add_metric([], max(snapshot.now_ms - due_ms, 0) / 1000 if due_ms is not None else 0.0)
            yield from (backlog, lag)
