"""What the background sweeper costs, on a real redis-server started here (ratios, same process and server).

1. One sweep over P idle projects (nothing due): time at P=2,000 / time at P=200 — linear would be 10.
2. Claim-and-release throughput while a sweeper runs every 50 ms (20x the default rate) over 2,000 idle
   projects / throughput with no sweeper — 1.0 means the sweeper costs the API nothing.
3. Claim-and-release throughput of the driver / the same driver never marking projects touched (what
   finding new work in O(touched projects) costs: a flag in the scripts, a SADD when the flag is set).

Run: .venv/bin/python -m bench.studies.sweep_cost
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from core.models import NewMessage, QueueRef
from service.sweeper import run_sweeper
from storage.redis.store import RedisStore
from tests.servers import RedisServer


class UnmarkedStore(RedisStore):
    """The driver as if it never marked projects touched."""

    async def _call_scheduling(self, name: str, q: QueueRef, *args: Any) -> list[Any]:
        _, *result = await self._call(name, q, *args)
        return result


async def idle_projects(store: RedisStore, n: int) -> None:
    for i in range(n):
        q = QueueRef(f"p{i}", "q")
        await store.post_messages(
            q, [NewMessage(body=i)], client_id="c", default_ttl=3600, default_delay=0, body_size=1
        )


async def sweep_time(store: RedisStore, rounds: int = 20) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        await store.sweep()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


async def claim_release_rate(store: RedisStore, seconds: float = 3.0) -> float:
    q = QueueRef("hot", "work")
    await store.post_messages(
        q,
        [NewMessage(body=i) for i in range(20)],
        client_id="c",
        default_ttl=3600,
        default_delay=0,
        body_size=1,
    )
    done, deadline = 0, time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            result = await store.claim(q, ttl=60, grace=60, limit=1)
            if result.claim is not None:
                await store.release_claim(q, result.claim.id)
                done += 1

    await asyncio.gather(*(worker() for _ in range(8)))
    return done / seconds


async def main() -> None:
    server = RedisServer().start()
    try:
        small = RedisStore.from_url(server.url, namespace=f"b{uuid.uuid4().hex[:6]}")
        large = RedisStore.from_url(server.url, namespace=f"b{uuid.uuid4().hex[:6]}")
        await idle_projects(small, 200)
        await idle_projects(large, 2000)
        t_small, t_large = await sweep_time(small), await sweep_time(large)
        print(
            f"sweep over idle projects: 2,000 / 200 = {t_large / t_small:.1f}x "
            f"({t_small * 1000:.2f} ms vs {t_large * 1000:.2f} ms)"
        )
        ratios = []
        for _ in range(3):
            off = await claim_release_rate(large)
            sweeper = asyncio.create_task(run_sweeper(large, 0.05))
            on = await claim_release_rate(large)
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)
            ratios.append(on / off)
        print(
            "claim+release throughput, sweeper every 50 ms over 2,000 projects / no sweeper: "
            + ", ".join(f"{r:.2f}" for r in ratios)
        )
        unmarked = UnmarkedStore.from_url(server.url, namespace=f"b{uuid.uuid4().hex[:6]}")
        marks = []
        for _ in range(3):
            marks.append(await claim_release_rate(large) / await claim_release_rate(unmarked))
        print(
            "claim+release throughput, driver / driver without the touched mark: "
            + ", ".join(f"{r:.2f}" for r in marks)
        )
        for store in (small, large, unmarked):
            await store.aclose()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
