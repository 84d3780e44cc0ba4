"""What one delivery came to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Result = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """`delivered`; `retry`: a temporary failure (no connection, no answer in time, HTTP 5xx, 408 or 429, an
    SMTP error), worth another try on the retry policy's schedule; `failed`: a permanent one (another 4xx,
    a redirect, a host the SSRF guard refuses, options a delivery cannot use), not worth one. `reason` is
    short, for logs. `attempted` is False when nothing was sent (no free slot in time): the subscriber did
    not fail, and a caller may try again without counting it."""

    result: Result
    reason: str
    attempted: bool = True

    @property
    def delivered(self) -> bool:
        return self.result == "delivered"


def delivered(reason: str) -> Outcome:
    return Outcome("delivered", reason)


def retry(reason: str, *, attempted: bool = True) -> Outcome:
    return Outcome("retry", reason, attempted)


def failed(reason: str) -> Outcome:
    return Outcome("failed", reason)
