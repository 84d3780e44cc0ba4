"""Time as an injected dependency: drivers take a Clock so tests move time instead of sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = start_ms if start_ms is not None else SystemClock().now_ms()

    def now_ms(self) -> int:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += round(seconds * 1000)
