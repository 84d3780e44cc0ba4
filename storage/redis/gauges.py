"""Store.queue_gauges on Redis: every queue of every project with its stats, for GET /metrics.

The projects come from the sweeper's registry (keys.projects_key, a SET of every project that has had a
queue), sorted here; each project's queues from its `queues` ZSET (score 0, so in name order), read a
pipeline of projects at a time until `limit` + 1 are found. Each queue's stats are stats.lua's, the script
`RedisStore.stats` runs (its housekeeping included), pipelined a batch of queues at a time on one
connection: one round trip a batch, and Redis, which runs a client's pipelined scripts one after another,
is held by one batch for a few milliseconds only (about 35 us of its CPU a queue: bench/RESULTS.md).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from core.models import QueueRef, QueueStats
from storage.redis.keys import ProjectKeys, projects_key
from storage.redis.runner import unavailable_as_domain_error
from storage.redis.scripts import Scripts, Target

PROJECTS_BATCH = 500  # projects whose queue names one pipeline reads
STATS_BATCH = 100  # queues whose stats.lua one pipeline runs


async def queue_gauges(
    client: aioredis.Redis | aioredis.RedisCluster,
    scripts: Scripts,
    namespace: str,
    *,
    now: int,
    limit: int,
) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
    queues = await _queues(client, namespace, limit + 1)
    more = len(queues) > limit
    queues = queues[:limit]
    gauges: list[tuple[QueueRef, QueueStats]] = []
    for i in range(0, len(queues), STATS_BATCH):
        batch = queues[i : i + STATS_BATCH]
        replies = await scripts.stats_each([Target.of(namespace, q) for q in batch], now=now)
        gauges += zip(batch, replies, strict=True)
    return gauges, more


async def _queues(
    client: aioredis.Redis | aioredis.RedisCluster, namespace: str, wanted: int
) -> list[QueueRef]:
    """The first `wanted` queues in (project, name) order."""
    found: list[QueueRef] = []
    async with unavailable_as_domain_error():
        projects = sorted(str(p) for p in await client.smembers(projects_key(namespace)))
        for i in range(0, len(projects), PROJECTS_BATCH):
            batch = projects[i : i + PROJECTS_BATCH]
            async with client.pipeline(transaction=False) as pipe:
                for project in batch:
                    pipe.zrange(ProjectKeys.of(namespace, project).queues, 0, wanted - len(found) - 1)
                names = await pipe.execute()
            for project, queue_names in zip(batch, names, strict=True):
                found += (QueueRef(project, str(n)) for n in queue_names)
            if len(found) >= wanted:
                break
    return found[:wanted]
