"""How fast a redrive task moves dead letters back, against the moves that put them in the DLQ (ratio, same
process, same redis-server started here).

10,000 messages are dead-lettered by claim-and-release (limit 20, `_max_claim_count` 1: one move per message,
20 a script call), then moved back by one redrive task stepped in batches of 100 (the API's runner does the
same, with no throttle). Both are timed at the driver, so the ratio is what one script call per 100 moves
buys against one per 20. Each round then does it again with a redrive by failure signature (every body
carries an error of one cause, so it moves the same 10,000): the driver reads each batch and signs it in
Python before the script (core/signatures.py), and the ratio to the plain redrive is what that costs.

Run: .venv/bin/python -m bench.studies.redrive_rate
"""

from __future__ import annotations

import asyncio
import time
import uuid

from core import signatures
from core.limits import Limits
from core.metadata import parse_policy
from core.models import NewMessage, QueueRef, RedriveSpec, TaskId
from storage.redis.store import RedisStore
from tests.servers import RedisServer

N = 10_000
Q, DLQ = QueueRef("bench", "src"), QueueRef("bench", "src.dlq")


SIGNATURE = signatures.signature("order <*> failed: card <*> declined")


async def one_round(store: RedisStore, spec: RedriveSpec) -> tuple[float, float]:
    meta = {"_max_claim_count": 1, "_dead_letter_queue": DLQ.name}
    await store.set_metadata(Q, metadata=meta, policy=parse_policy(meta, Limits(), queue=Q.name))
    for _ in range(N // 20):
        await store.post_messages(
            Q,
            [
                NewMessage(body={"n": i, "error": f"order {i} failed: card cus_{i}x{i} declined"})
                for i in range(20)
            ],
            client_id="c",
            default_ttl=3600,
            default_delay=0,
            body_size=200,
        )
    start = time.perf_counter()
    while (claim := (await store.claim(Q, ttl=60, grace=60, limit=20)).claim) is not None:
        await store.release_claim(Q, claim.id)
    dead_lettering = time.perf_counter() - start
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, spec, owner="b", lease_ms=60_000)
    start = time.perf_counter()
    while (await store.redrive_step(DLQ, task_id, owner="b", lease_ms=60_000, batch=100)).status == "running":
        pass
    redrive = time.perf_counter() - start
    assert (await store.stats(Q)).total == N
    await store.purge(Q)
    return dead_lettering, redrive


async def main() -> None:
    server = RedisServer().start()
    try:
        store = RedisStore.from_url(server.url, namespace=f"b{uuid.uuid4().hex[:8]}")
        for round_ in range(3):
            dl, rd = await one_round(store, RedriveSpec())
            _, by_signature = await one_round(store, RedriveSpec(signature=SIGNATURE))
            print(
                f"round {round_}: dead-lettering {N / dl:,.0f} moves/s, redrive {N / rd:,.0f} moves/s, "
                f"redrive/dead-lettering {dl / rd:.2f}; by signature {N / by_signature:,.0f} moves/s, "
                f"signature/plain {rd / by_signature:.2f}"
            )
        await store.aclose()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
