"""The background sweeper: every API process runs one; the store's lease lets one of them work a period."""

from __future__ import annotations

import asyncio
import logging

from core.errors import StorageUnavailable
from storage.base import Store

log = logging.getLogger("charon.sweeper")


async def run_sweeper(store: Store, interval: float) -> None:
    """Call store.sweep() every `interval` seconds until cancelled; storage outages are logged and ridden out.

    The lease lasts a little less than the interval, so across all processes the store is swept about once an
    interval, and a process that dies holding it delays the next sweep by less than one interval.
    """
    lease_ms = max(int(interval * 900), 1)
    task = asyncio.current_task()
    while True:
        try:
            await store.sweep(lease_ms=lease_ms)
        except StorageUnavailable as exc:
            log.warning("sweep skipped: %s", exc.description)
        except Exception:  # a bug must not stop eager dead-lettering for the life of the process
            log.exception("sweep failed")
        # A cancellation that lands inside the storage client can come out as an error, or not at all
        # (redis-py closes the connection and returns); honour it here so shutdown never hangs.
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        await asyncio.sleep(interval)
