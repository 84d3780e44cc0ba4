"""The background sweeper: every API process runs one; the store's lease lets one of them work a period."""

from __future__ import annotations

import asyncio
import logging
import time

from service.metrics import SWEEPER_LAST_SWEEP
from service.outage import Outage, stop_if_cancelled
from storage.base import Store

log = logging.getLogger("charon.sweeper")


async def run_sweeper(store: Store, interval: float) -> None:
    """Call store.sweep() every `interval` seconds until cancelled. While the store fails, the sweeper logs
    one line when it starts failing and one when it recovers (service.outage.Outage), and waits longer between
    attempts (doubling, up to 30 s); a bug is logged the same way, with its traceback once.

    The lease lasts a little less than the interval, so across all processes the store is swept about once an
    interval, and a process that dies holding it delays the next sweep by less than one interval.
    """
    lease_ms = max(int(interval * 900), 1)
    outage = Outage(log, "sweeper", interval)
    while True:
        try:
            await store.sweep(lease_ms=lease_ms)
            SWEEPER_LAST_SWEEP.set(time.time())  # swept, or another process holds the lease and sweeps
            wait = outage.ok()
        except Exception as exc:  # a bug must not stop eager dead-lettering for the life of the process
            wait = outage.failed(exc)
        stop_if_cancelled()
        await asyncio.sleep(wait)
