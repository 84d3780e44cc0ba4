"""Store.queue_gauges over pools: each pool's first `limit` queues, merged in (project, name) order (the
first `limit` of all pools are among them).

A queue found in two pools (left behind in one by a post racing its deletion, as `list_queues` says) is
counted in the pool the catalogue places it in.
"""

from __future__ import annotations

import asyncio

from core.models import QueueRef, QueueStats
from storage.base import Store
from storage.pooling.catalogue import Catalogue


async def queue_gauges(
    pools: list[tuple[str, Store]], catalogue: Catalogue, *, limit: int
) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
    answers = await asyncio.gather(*(store.queue_gauges(limit=limit) for _, store in pools))
    found: dict[QueueRef, list[tuple[str, QueueStats]]] = {}
    for (pool, _), (gauges, _more) in zip(pools, answers, strict=True):
        for q, stats in gauges:
            found.setdefault(q, []).append((pool, stats))
    merged: list[tuple[QueueRef, QueueStats]] = []
    for q in sorted(found, key=lambda q: (q.project, q.name)):
        held = found[q]
        if len(held) > 1:
            placed = await catalogue.lookup(q)
            held = [h for h in held if h[0] == placed] or held[:1]
        merged.append((q, held[0][1]))
    more = len(merged) > limit or any(more for _, more in answers)
    return merged[:limit], more
