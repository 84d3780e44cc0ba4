"""Per-project quotas (docs/quotas.md): the one table of them (QUOTAS), and the request-rate token buckets'
arithmetic.

A quota is a row of QUOTAS: its name (the key of `PUT /v2/quotas/{project}` and of the stored overrides),
its bounds and what it limits. The service-wide defaults are settings (app/settings.py QuotaSettings, one
field a row); a project's overrides are stored by the driver (storage/base.py QuotaStore) and win over the
defaults. The API's body model, which validates an override (api/schemas.py QuotaIn), is derived from the
rows; tests/api/test_quotas.py holds the settings' fields to them.

Rates: each project has two token buckets, `reads` (GET and HEAD) and `writes` (every other method), each
refilled at its rate a second up to `burst_seconds` of it (at least 1 token). The bucket lives in the store,
so every API process draws from the same one (service/ratelimit.py leases a few tokens at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Bucket = Literal["reads", "writes"]
READS: Bucket = "reads"
WRITES: Bucket = "writes"
READ_METHODS = frozenset({"GET", "HEAD"})
MAX_RATE = 1_000_000.0  # requests a second
# How far apart the API processes' clocks may be for a bucket to believe a last take in its future (then it
# is kept, so the time between is not refilled twice); one further ahead is replaced by the taker's now.
MAX_SKEW_MS = 1000


@dataclass(frozen=True, slots=True)
class Quota:
    """One quota, as a row of QUOTAS."""

    name: str
    description: str
    lo: float
    hi: float
    unit: str
    bucket: Bucket | None = None  # a rate: the token bucket it refills


QUOTAS: tuple[Quota, ...] = (
    Quota(
        "reads_per_second",
        "Requests a second the project may make that only read (GET, HEAD), over every API process; a "
        "burst of `burst_seconds` of them may come at once. Past it: 429 with Retry-After.",
        0.01,
        MAX_RATE,
        "requests a second",
        READS,
    ),
    Quota(
        "writes_per_second",
        "Requests a second the project may make that change something (POST, PUT, PATCH, DELETE: posts, "
        "claims, deletes), over every API process, with the same burst. Past it: 429 with Retry-After.",
        0.01,
        MAX_RATE,
        "requests a second",
        WRITES,
    ),
)
QUOTA = {q.name: q for q in QUOTAS}
RATE_OF: dict[Bucket, str] = {q.bucket: q.name for q in QUOTAS if q.bucket is not None}


def bucket_of(method: str) -> Bucket:
    return READS if method in READ_METHODS else WRITES


def capacity(rate: float, burst_seconds: float) -> int:
    """A bucket's size: `burst_seconds` of its rate, at least one request."""
    return max(1, math.floor(rate * burst_seconds))


@dataclass(frozen=True, slots=True)
class Grant:
    """What a bucket gave: `granted` tokens of those asked; when none, `wait_ms` until the next one."""

    granted: int
    wait_ms: int
