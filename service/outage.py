"""How a background loop (the sweeper, redrive adoption) rides out a failing store: one log line when it
starts failing, one when it recovers, and a wait that doubles while it fails, up to a cap."""

from __future__ import annotations

import asyncio
import logging
import time

from core.errors import CharonError

BACKOFF_CAP_S = 30.0


class Outage:
    def __init__(self, log: logging.Logger, what: str, interval: float, cap: float = BACKOFF_CAP_S) -> None:
        self.log = log
        self.what = what
        self.interval = interval
        self.cap = max(cap, interval)
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: BaseException) -> float:
        """Note a failed attempt; the seconds to wait before the next."""
        if self.failures == 0:
            self.since = time.monotonic()
            if isinstance(exc, CharonError):  # the store: unreachable, stalled, full
                self.log.warning("%s failing: %s (retrying, backing off)", self.what, exc.description)
            else:  # a bug: its traceback, once
                self.log.exception("%s failing (retrying, backing off)", self.what, exc_info=exc)
        self.failures += 1
        return float(min(self.interval * 2 ** min(self.failures, 30), self.cap))

    def ok(self) -> float:
        """Note a successful attempt; the seconds to wait before the next."""
        if self.failures:
            took = time.monotonic() - self.since
            self.log.warning("%s recovered after %d failed attempts (%.1f s)", self.what, self.failures, took)
            self.failures = 0
        return self.interval


def stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop. A cancellation that lands inside a storage
    client can come out as an error, or not at all: redis-py sometimes returns the command's answer and
    leaves the task marked as cancelling (tests/contract/test_shutdown.py). A loop that did not look would
    run on, and a SIGTERM'd process would never finish its shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
