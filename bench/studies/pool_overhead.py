"""What routing through the pool catalogue costs, on a real redis-server started here (ratio, same process).

A post + claim + delete cycle on one queue, through RedisStore directly and through a PooledStore whose only
pool is that same server (catalogue in it too): pooled time / plain time. Every pooled call adds one
catalogue read (HGET) to the driver's one script call.

Run: .venv/bin/python -m bench.studies.pool_overhead
"""

from __future__ import annotations

import asyncio
import time
import uuid

from core.models import NewMessage, QueueRef
from storage.base import Store
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.pooling.store import PooledStore
from storage.redis.store import RedisStore
from tests.servers import RedisServer

Q = QueueRef("bench", "q")
CYCLES = 1000


async def cycles(store: Store, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await store.post_messages(
            Q, [NewMessage(body={"n": 1})], client_id="c", default_ttl=3600, default_delay=0, body_size=10
        )
        claimed = (await store.claim(Q, ttl=60, grace=60, limit=1)).claim
        assert claimed is not None
        await store.delete_message(Q, claimed.messages[0].id, claim_id=claimed.id)
    return time.perf_counter() - start


async def main() -> None:
    server = RedisServer().start()
    try:
        namespace = f"b{uuid.uuid4().hex[:8]}"
        plain = RedisStore.from_url(server.url, namespace=namespace)
        catalogue = RedisCatalogue.from_url(server.url, namespace=namespace)
        await catalogue.put_pool(Pool("only", server.url, 1))
        pooled = PooledStore(catalogue, namespace=namespace)
        await cycles(plain, 100)
        await cycles(pooled, 100)
        for round_ in range(3):
            a, b = await cycles(plain, CYCLES), await cycles(pooled, CYCLES)
            print(f"round {round_}: plain {a:.2f}s, pooled {b:.2f}s, pooled/plain {b / a:.2f}")
        await pooled.aclose()
        await plain.aclose()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
