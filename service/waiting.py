"""Long polling (`POST .../claims?wait=S`): a claim that finds nothing waits, up to S seconds, until the store
says a message of its queue became claimable, or until one does by time alone (a delay or backoff ends, a
claim expires: the store answers when), then claims again.

One `LongPolls` per process. Its waiters of a queue form a FIFO line: a wake-up for n messages wakes the n
first waiters that are not awake yet, so one message wakes one waiter here, not all (each API process
listening on the queue wakes one of its own). The store is listened to per queue while this process has a
waiter on it (Redis: a pub/sub channel; MongoDB: one change stream). At most `max_waiting` claims wait at
once (beyond, a claim that finds nothing is 503, ServiceBusy); `close()` (shutdown) answers every waiting
claim at once with what it has (nothing: 204) and makes new ones not wait.

Store calls: a long poll on a queue this process listens to already claims once (setting the store's
`waiting` flag when it finds nothing) and sleeps; only the first one on a queue claims before it subscribes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from core.clock import Clock
from core.errors import ServiceBusy
from core.models import ClaimResult, QueueRef
from storage.base import Store, Wakeups


class _Waiter:
    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = asyncio.Event()


class LongPolls:
    def __init__(self, store: Callable[[], Store], *, clock: Clock, max_waiting: int) -> None:
        self._store, self._clock, self._max = store, clock, max_waiting
        self._lines: dict[QueueRef, dict[_Waiter, None]] = {}  # insertion-ordered: the FIFO line
        self._listened: set[QueueRef] = set()
        self._wakeups: Wakeups | None = None
        self._subscribing = asyncio.Lock()
        self._closed = False

    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    async def claim(
        self, q: QueueRef, *, ttl: int, grace: int, limit: int, wait: int, client_id: str = ""
    ) -> ClaimResult:
        """Claim up to `limit` messages for `client_id`; when none is claimable, wait up to `wait` seconds
        for some."""
        store = self._store()
        if wait <= 0 or self._closed:
            return await store.claim(q, ttl=ttl, grace=grace, limit=limit, client_id=client_id)
        if self.waiting >= self._max or q not in self._listened:
            # a claim that cannot wait, or on a queue not listened to here yet: a busy queue answers without
            # a subscription (and its round trip)
            result = await store.claim(q, ttl=ttl, grace=grace, limit=limit, client_id=client_id)
            if result.claim is not None:
                return result
        if self.waiting >= self._max:  # looked at again: no await between it and joining the line
            raise ServiceBusy(
                f"{self._max} claims already wait in this process (CHARON_LIMITS__MAX_WAITING_CLAIMS); claim "
                "again without `wait`, or with it in a moment."
            )
        deadline = self._clock.now_ms() + wait * 1000  # from here: close enough to the request's start
        waiter = _Waiter()
        self._lines.setdefault(q, {})[waiter] = None
        try:
            while True:
                await self._listen(q)
                waiter.woken.clear()  # before the claim: a wake-up during it is not lost
                left_ms = deadline - self._clock.now_ms()
                result = await store.claim(
                    q,
                    ttl=ttl,
                    grace=grace,
                    limit=limit,
                    wait_ms=max(left_ms, 0) + 1000,
                    client_id=client_id,
                )
                if result.claim is not None or left_ms <= 0 or self._closed:
                    return result
                until = deadline if result.next_ms is None else min(deadline, result.next_ms)
                await self._sleep(waiter, (until - self._clock.now_ms()) / 1000)
        finally:
            line = self._lines.get(q)
            if line is not None:
                line.pop(waiter, None)
                if waiter.woken.is_set():
                    # woken while it claimed (or as it left): that wake-up was for a message its claim may
                    # not have taken, so it goes to the next in line, or it would be lost
                    self._on_wake(q, 1)
                if not line:
                    del self._lines[q]
                    await self._unlisten(q)

    async def _sleep(self, waiter: _Waiter, seconds: float) -> None:
        """Until `waiter` is woken, or `seconds` of the clock pass."""
        woken = asyncio.ensure_future(waiter.woken.wait())
        timer = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait((woken, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (woken, timer):
                task.cancel()

    async def _listen(self, q: QueueRef) -> None:
        if q in self._listened:
            return
        async with self._subscribing:
            if q in self._listened:
                return
            if self._wakeups is None:
                self._wakeups = self._store().wakeups(self._on_wake)
            await self._wakeups.listen(q)
            self._listened.add(q)

    async def _unlisten(self, q: QueueRef) -> None:
        """One at a time with _listen: a listen that starts as the last waiter leaves subscribes after the
        unsubscribe, not before it (and would then hear nothing)."""
        async with self._subscribing:
            if q in self._lines:  # a new waiter came meanwhile: keep listening
                return
            self._listened.discard(q)
            if self._wakeups is not None:
                with contextlib.suppress(Exception):  # the store is gone: nothing to stop
                    await self._wakeups.unlisten(q)

    def _on_wake(self, q: QueueRef | None, n: int) -> None:
        if q is None:  # the source may have missed some: everyone claims again and listens afresh
            self._listened.clear()
            self._wake_all()
            return
        for waiter in self._lines.get(q, ()):
            if n <= 0:
                break
            if not waiter.woken.is_set():
                waiter.woken.set()
                n -= 1

    def _wake_all(self) -> None:
        for line in self._lines.values():
            for waiter in line:
                waiter.woken.set()

    def close(self) -> None:
        """Shutdown: every waiting claim answers now; claims from now on do not wait."""
        self._closed = True
        self._wake_all()

    async def aclose(self) -> None:
        self.close()
        if self._wakeups is not None:
            await self._wakeups.aclose()
            self._wakeups = None
