"""A project's quota overrides and request-rate token buckets (core/quotas.py), in its document of the
`quotas` collection: `quota` (overrides by quota name) and `rate` (a bucket by Bucket: tokens left and the
ms of the last take).

A take reads the bucket and writes it back guarded by what it read (compare-and-set on one document): of
takes racing on one bucket, one write lands and the others read again, so no more tokens are granted than
the bucket held. A process leases several tokens a take (service/ratelimit.py), so races are few."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from core.errors import ServiceBusy
from core.quotas import MAX_SKEW_MS, Bucket, Grant
from storage.mongodb.schema import BUCKET, PROJECT_QUOTA, Collections

TAKE_ATTEMPTS = 50  # reads of a bucket one take may make while other takes win the race
COUNTED_CACHE_S = 1.0  # how long a process keeps a project's counted quotas
MAX_CACHED = 10_000  # projects whose counted quotas a process keeps (then it forgets them all)


async def get(c: Collections, project: str) -> dict[str, float]:
    doc = await c.quotas.find_one({PROJECT_QUOTA.ID: project}, {PROJECT_QUOTA.QUOTA: 1})
    return {k: float(v) for k, v in ((doc or {}).get(PROJECT_QUOTA.QUOTA) or {}).items()}


async def counted(c: Collections, project: str) -> dict[str, int | None]:
    """The project's counted quotas (core/quotas.py): its overrides over the driver's defaults, read at most
    once every COUNTED_CACHE_S per process (a post or a move would read them every time): a change made
    through this process applies at once, one made through another within that time."""
    now = time.monotonic()
    cached = c.counted_cache.get(project)
    if cached is not None and cached[0] > now:
        return cached[1]
    quotas = c.counted.of(await get(c, project))
    if len(c.counted_cache) >= MAX_CACHED:
        c.counted_cache.clear()
    c.counted_cache[project] = (now + COUNTED_CACHE_S, quotas)
    return quotas


async def put(c: Collections, project: str, overrides: Mapping[str, float | None]) -> dict[str, float]:
    update: dict[str, Any] = {}
    setting = {f"{PROJECT_QUOTA.QUOTA}.{k}": v for k, v in overrides.items() if v is not None}
    removing = {f"{PROJECT_QUOTA.QUOTA}.{k}": "" for k, v in overrides.items() if v is None}
    if setting:
        update["$set"] = setting
    if not setting and not removing:
        return await get(c, project)
    update["$unset"] = {
        **removing,
        PROJECT_QUOTA.RATE: "",
    }  # a changed rate applies at once: buckets start full
    doc = await c.quotas.find_one_and_update(
        {PROJECT_QUOTA.ID: project},
        update,
        projection={PROJECT_QUOTA.QUOTA: 1},
        upsert=True,
        return_document=ReturnDocument.AFTER,
    )
    c.counted_cache.pop(project, None)  # after the write: a read meanwhile may have kept the old values
    return {k: float(v) for k, v in ((doc or {}).get(PROJECT_QUOTA.QUOTA) or {}).items()}


async def delete(c: Collections, project: str) -> None:
    await c.quotas.update_one(
        {PROJECT_QUOTA.ID: project}, {"$unset": {PROJECT_QUOTA.QUOTA: "", PROJECT_QUOTA.RATE: ""}}
    )
    c.counted_cache.pop(project, None)


async def take(
    c: Collections, project: str, bucket: Bucket, *, now: int, want: int, rate: float, capacity: int
) -> Grant:
    path = f"{PROJECT_QUOTA.RATE}.{bucket}"
    tokens_path, at_path = f"{path}.{BUCKET.TOKENS}", f"{path}.{BUCKET.AT}"
    for _ in range(TAKE_ATTEMPTS):
        doc = await c.quotas.find_one({PROJECT_QUOTA.ID: project}, {path: 1})
        held = ((doc or {}).get(PROJECT_QUOTA.RATE) or {}).get(bucket)
        ahead = 0
        if held is None:
            tokens: float = capacity
            at = now
            guard: dict[str, Any] = {PROJECT_QUOTA.ID: project, path: {"$exists": False}}
        else:
            last_tokens, at = held[BUCKET.TOKENS], held[BUCKET.AT]
            guard = {PROJECT_QUOTA.ID: project, tokens_path: last_tokens, at_path: at}
            if at > now + MAX_SKEW_MS:  # the clocks of API processes: as take_tokens.lua says
                at = now
            tokens = min(capacity, last_tokens + max(0, now - at) * rate / 1000)
            ahead = max(0, at - now)
            at = max(now, at)
        granted = min(want, math.floor(tokens))
        left = tokens - granted
        try:
            done = await c.quotas.update_one(
                guard, {"$set": {tokens_path: left, at_path: at}}, upsert=held is None
            )
        except DuplicateKeyError:  # the document exists (with another bucket, or made meanwhile): read again
            continue
        if done.matched_count or done.upserted_id is not None:
            wait = 0 if granted else ahead + math.ceil((1 - left) * 1000 / rate)
            return Grant(granted, wait)
    raise ServiceBusy(
        f"Project {project}'s request rate was contended by {TAKE_ATTEMPTS} takes at once; try again shortly."
    )
