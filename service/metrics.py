"""The service's Prometheus metrics (prometheus-client): the objects the code updates as it works, in one
registry of their own. GET /metrics (api/routes/metrics.py) exposes them with the series read from the
store when it is scraped (service/gauges.py); docs/operations.md "Metrics" says what each series means.

Several processes: `charon serve --workers N` (N > 1) points PROMETHEUS_MULTIPROC_DIR at a private
directory before any worker starts (app/workers.py), and prometheus-client, which looks at it when it is
first imported, keeps every process's values in files there. A scrape answered by any worker then adds up
every worker's counters and histograms (a worker that died included, so they never go back), and takes each
gauge as its `multiprocess_mode` says: `livemax`, `livesum` over the workers alive (the supervisor tells
prometheus-client of each worker that exits). Without it (one process, the tests) the values live in memory.

The notifier (service/notifier.py) updates NOTIFICATIONS and NOTIFICATION_LATENCY; the scrape reads its
backlog and lag from the store (Store.outbox_stats).
"""

from __future__ import annotations

import os
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from core.models import DeliveryKind

# Decided once, as prometheus-client decides where values live (when it is first imported).
MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None

REGISTRY = CollectorRegistry(auto_describe=True)
# No `_created` series beside each counter and histogram: the multiprocess collector has none, so one worker
# would expose series that several do not (and they double the series for nothing a dashboard reads).
disable_created_metrics()  # type: ignore[no-untyped-call]

# -- notifications (service/notifier.py) ---------------------------------------------------------------------

NOTIFICATION_RESULTS = ("delivered", "retried", "failed", "dropped")
NOTIFICATIONS = Counter(
    "charon_notifications_total",
    "Notification attempts by kind (notification, confirmation, unsubscribed) and result: delivered (the "
    "subscriber took it), retried (the attempt failed; due again later), failed (the attempt failed and "
    "the retry policy gives up), dropped (given up without an attempt, e.g. a subscriber the service "
    "refuses to call).",
    ["kind", "result"],
    registry=REGISTRY,
)
for _kind in get_args(DeliveryKind):  # every series from the start, so that rate() sees the first one
    for _result in NOTIFICATION_RESULTS:
        NOTIFICATIONS.labels(_kind, _result)

NOTIFICATION_LATENCY = Histogram(
    "charon_notification_latency_seconds",
    "Seconds from a message's post (or its move to a DLQ) to its notification's delivery.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)

# -- the sweeper (service/sweeper.py) ------------------------------------------------------------------------

SWEEPER_LAST_SWEEP_NAME = "charon_sweeper_last_sweep_timestamp_seconds"
SWEEPER_LAST_SWEEP = Gauge(
    SWEEPER_LAST_SWEEP_NAME,
    "Unix time this service's sweeper last finished a round: it swept, or another process held the "
    "sweeper's lease (0: not yet).",
    multiprocess_mode="livemax",
    registry=REGISTRY,
)

# -- redrive (service/redrive.py) ----------------------------------------------------------------------------

REDRIVE_MOVED = Counter(
    "charon_redrive_messages_moved_total",
    "Messages redrive tasks moved out of DLQs.",
    registry=REGISTRY,
)
REDRIVE_SCANNED = Counter(
    "charon_redrive_messages_scanned_total",
    "Messages redrive tasks looked at (moved, skipped or not matching).",
    registry=REGISTRY,
)
REDRIVE_RUNNING = Gauge(
    "charon_redrive_tasks_running",
    "Redrive tasks this service's processes are running now.",
    multiprocess_mode="livesum",
    registry=REGISTRY,
)

# -- request rates (service/ratelimit.py) --------------------------------------------------------------------

RATE_LIMITED = Counter(
    "charon_rate_limited_requests_total",
    "Requests refused with 429 because their project used up its request rate, by project and kind (reads: "
    "GET and HEAD; writes: the rest).",
    ["project", "kind"],
    registry=REGISTRY,
)


def collect_processes() -> list[Metric]:
    """What the processes of this service counted: every worker's, added up, in several processes; this
    process's alone otherwise."""
    if MULTIPROCESS_DIR is None:
        return list(REGISTRY.collect())
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=MULTIPROCESS_DIR)  # type: ignore[no-untyped-call]
    return list(registry.collect())
