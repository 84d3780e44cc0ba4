"""Per-project request rates (core/quotas.py `reads_per_second`, `writes_per_second`), enforced on every
request after identity and policy (api/auth.py): past its rate, a request answers 429 with Retry-After and
does nothing.

The token buckets are in the store, shared by every API process; a process does not ask the store on every
request. It leases a few tokens at a time (LEASE_SHARE of a second's rate), spends them on the project's
next requests, and lets what it did not spend within LEASE_S lapse (never more than the bucket gave out,
so the rate over every process is never exceeded; a lapsed token is a request refused that a single
process would have served). Once the store says the bucket is empty, the process refuses that bucket's
requests itself until the next token is due, so a flood of refused requests costs the store nothing. One
take per bucket is in flight at a time; requests arriving meanwhile wait for it.

A project's limits are the settings' defaults under its overrides (`PUT /v2/quotas/{p}`), read from the store
at most once per `cache_seconds` per process: a change takes effect everywhere within that time."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from core.clock import Clock
from core.errors import CharonError, RateLimited, ServiceBusy
from core.quotas import RATE_OF, Bucket, Grant, bucket_of, capacity
from service.metrics import RATE_LIMITED
from storage.base import QuotaStore

LEASE_S = 0.25  # how long a leased token may wait to be spent
LEASE_SHARE = 0.05  # a lease: this share of a second's rate (at least one token, at most the bucket)
MAX_PROJECTS = 10_000  # projects whose limits and leases a process keeps (then it forgets them all)
OPEN_S = 1.0  # after the store failed a rate's read or take: how long the project's requests pass unchecked
OPEN = 1 << 62  # a lease's tokens while the store fails: as many as come
MAX_LABELLED = 1000  # projects with series of their own in charon_rate_limited_requests_total
OTHER = "_other"  # the project label of the rest


@dataclass(slots=True)
class _Lease:
    tokens: int
    until: float  # s (the clock's)


class RateLimiter:
    def __init__(
        self,
        store: Callable[[], QuotaStore | None],
        *,
        clock: Clock,
        defaults: Mapping[Bucket, float | None],
        burst_seconds: float,
        cache_seconds: float,
    ) -> None:
        self._store = store
        self._clock = clock
        self._defaults = dict(defaults)
        self._burst_seconds = burst_seconds
        self._cache_seconds = cache_seconds
        self._limits: dict[str, tuple[float, dict[str, float]]] = {}  # project -> (until, overrides)
        self._leases: dict[tuple[str, Bucket], _Lease] = {}
        self._refused: dict[tuple[str, Bucket], float] = {}  # until (s): the bucket is empty
        self._locks: dict[tuple[str, Bucket], asyncio.Lock] = {}
        self._labelled: set[str] = set()  # projects with a series of RATE_LIMITED

    @property
    def defaults(self) -> dict[Bucket, float | None]:
        """The service's rate of each bucket (None: no limit but a project's override)."""
        return dict(self._defaults)

    async def rate(self, project: str, bucket: Bucket) -> float | None:
        """The project's rate of `bucket` (requests a second), None when unlimited."""
        overrides = self._cached(project, self._now())
        if overrides is None:
            overrides = await self._read(project)
        return overrides.get(RATE_OF[bucket], self._defaults[bucket])

    def _cached(self, project: str, now: float) -> dict[str, float] | None:
        cached = self._limits.get(project)
        return cached[1] if cached is not None and cached[0] > now else None

    async def _read(self, project: str) -> dict[str, float]:
        """The project's overrides from the store, kept `cache_seconds`. When the store cannot say (it does
        not answer, or is not open yet), the project's requests pass unchecked for OPEN_S: each meets the
        store's failure itself (GET /v2/health must still report it)."""
        if len(self._limits) >= MAX_PROJECTS:
            self._limits.clear()
        store = self._store()
        try:
            overrides = {} if store is None else await store.get_quota(project)
        except CharonError:  # unreachable, slow: the request meets that itself, unchecked (OPEN_S)
            now = self._now()
            self._limits[project] = (now + OPEN_S, {})
            for bucket in RATE_OF:
                self._leases[(project, bucket)] = _Lease(OPEN, now + OPEN_S)
            return {}
        self._limits[project] = (self._now() + self._cache_seconds, overrides)
        return overrides

    def _now(self) -> float:
        return self._clock.now_ms() / 1000

    def forget(self, project: str) -> None:
        """Read the project's limits afresh at its next request (this process changed them)."""
        self._limits.pop(project, None)
        for bucket in RATE_OF:
            self._leases.pop((project, bucket), None)
            self._refused.pop((project, bucket), None)

    def admit(self, project: str, method: str) -> Awaitable[None] | None:
        """Let one request of `project` by `method` through, or raise RateLimited (429). None: let through
        at once (what most requests get: no coroutine made); else await what it returns, which lets the
        request through or raises."""
        bucket = bucket_of(method)
        overrides = self._cached(project, self._now())
        if overrides is None:
            return self._admit(project, bucket)
        rate = overrides.get(RATE_OF[bucket], self._defaults[bucket])
        if rate is None or self._spend((project, bucket), rate, capacity(rate, self._burst_seconds)):
            return None
        return self._admit(project, bucket)

    async def _admit(self, project: str, bucket: Bucket) -> None:
        rate = await self.rate(project, bucket)
        if rate is None:
            return
        key = (project, bucket)
        size = capacity(rate, self._burst_seconds)
        if self._spend(key, rate, size):
            return
        if len(self._locks) >= MAX_PROJECTS:
            self._locks.clear()
            self._leases.clear()
            self._refused.clear()
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self._spend(key, rate, size):  # the take this request waited for leased enough
                return
            want = max(1, min(size, math.floor(rate * LEASE_SHARE)))
            store = self._store()
            if store is None:
                return
            try:
                grant = await store.take_tokens(project, bucket, want=want, rate=rate, capacity=size)
            except ServiceBusy:  # the bucket is contended (MongoDB): by the project's own flood, so no token
                grant = Grant(0, 1000)
            except CharonError:
                # the store does not answer or is full (a take writes: the reads and deletes that free it
                # must still pass): let the bucket's requests through for OPEN_S, so that those queued
                # behind this take do not each wait out the store's timeout
                self._leases[key] = _Lease(OPEN, self._now() + OPEN_S)
                return
            now = self._now()
            if grant.granted:
                self._leases[key] = _Lease(grant.granted - 1, now + LEASE_S)
                return
            self._refused[key] = now + grant.wait_ms / 1000
        self._refuse(key, rate, size)

    def _spend(self, key: tuple[str, Bucket], rate: float, size: int) -> bool:
        """Spend a leased token; raise RateLimited while the bucket is known empty; False: ask the store."""
        now = self._now()
        lease = self._leases.get(key)
        if lease is not None and lease.tokens > 0 and lease.until > now:
            lease.tokens -= 1
            return True
        refused = self._refused.get(key)
        if refused is not None:
            if refused > now:
                self._refuse(key, rate, size)
            del self._refused[key]
        return False

    def _refuse(self, key: tuple[str, Bucket], rate: float, size: int) -> None:
        project, bucket = key
        name = RATE_OF[bucket]
        wait = max(0.0, self._refused.get(key, 0.0) - self._now())
        retry = max(1, math.ceil(wait))
        if project not in self._labelled and len(self._labelled) >= MAX_LABELLED:
            project_label = OTHER  # a caller cannot make the metric's series grow without bound
        else:
            self._labelled.add(project)
            project_label = project
        RATE_LIMITED.labels(project=project_label, kind=bucket).inc()
        raise RateLimited(
            f"Project {project} made more {bucket} than its rate allows ({name} {rate:g}, in bursts of up to "
            f"{size}); this request was not served. "
            f"Retry after {retry} s, spread the requests out, or ask an admin to raise {name} (PUT "
            f"/v2/quotas/{project}).",
            retry,
        )
