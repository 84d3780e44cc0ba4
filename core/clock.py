"""Time as an injected dependency: drivers and background runners take a Clock so tests move time instead of
sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time (0 or less: only let other tasks run)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told to (tests). `sleep` waits until `advance` reaches its end, and
    `sleepers` lets a test wait until something is asleep on the clock (it then knows where that is)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = start_ms if start_ms is not None else SystemClock().now_ms()
        self._sleeping: list[tuple[int, asyncio.Future[None]]] = []
        self._watchers: list[asyncio.Future[None]] = []

    def now_ms(self) -> int:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += round(seconds * 1000)
        for until, woken in self._sleeping:
            if until <= self._now and not woken.done():
                woken.set_result(None)

    async def sleep(self, seconds: float) -> None:
        until = self._now + round(seconds * 1000)
        if until <= self._now:
            await asyncio.sleep(0)
            return
        entry = (until, asyncio.get_running_loop().create_future())
        self._sleeping.append(entry)
        for watcher in self._watchers:
            if not watcher.done():
                watcher.set_result(None)
        self._watchers.clear()
        try:
            await entry[1]
        finally:
            self._sleeping.remove(entry)

    @property
    def asleep(self) -> int:
        """How many tasks wait on this clock now."""
        return sum(1 for _, woken in self._sleeping if not woken.done())

    async def sleepers(self, count: int = 1) -> None:
        """Return once at least `count` tasks wait on this clock."""
        while self.asleep < count:
            watcher = asyncio.get_running_loop().create_future()
            self._watchers.append(watcher)
            await watcher
