"""How soon after its expiry a message reaches the DLQ with `_dead_letter_on_expiry` (issue 7: within 1 s).

A live `charon serve` on a redis-server started here, one run per sweep interval. 300 messages are posted
with ttls spread over 1-4 s (CHARON_LIMITS__MIN_MESSAGE_TTL=1 allows that); a poller lists the DLQ every
10 ms and notes when each message first shows there. Latency = first seen - (posted + ttl), measured from
the client's clock before the post, so it slightly over-states the service's part. The ratio of interest is
the worst latency against Solace's 1 s quantum.

Run: .venv/bin/python -m bench.studies.expiry_latency
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

import httpx

from tests.servers import CharonProcess, RedisServer

HEADERS = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": "bench"}
MESSAGES = 300


async def run(server: RedisServer, interval: str) -> list[float]:
    env = {"CHARON_LIMITS__MIN_MESSAGE_TTL": "1", "CHARON_SWEEP_INTERVAL": interval}
    service = CharonProcess(server.url, namespace=f"e{uuid.uuid4().hex[:8]}", env=env).start()
    try:
        async with httpx.AsyncClient(base_url=service.url, headers=HEADERS) as c:
            meta = {"_dead_letter_queue": "late", "_dead_letter_on_expiry": True}
            assert (await c.put("/v2/queues/src", json=meta)).status_code == 201
            due: dict[str, float] = {}
            for n in range(MESSAGES):
                ttl = 1 + n % 4
                sent = time.time()
                r = await c.post("/v2/queues/src/messages", json={"messages": [{"body": n, "ttl": ttl}]})
                due[r.json()["resources"][0].rsplit("/", 1)[1]] = sent + ttl
            seen: dict[str, float] = {}
            deadline = time.time() + 15
            while len(seen) < MESSAGES and time.time() < deadline:
                marker = None
                while True:
                    url = "/v2/queues/late/messages?limit=20&echo=true"
                    url += f"&marker={marker}" if marker else ""
                    page = (await c.get(url)).json()
                    now = time.time()
                    for m in page["messages"]:
                        seen.setdefault(m["id"], now)
                    nxt = [link["href"] for link in page["links"] if link["rel"] == "next"]
                    if not nxt or not page["messages"]:
                        break
                    marker = nxt[0].split("marker=")[1].split("&")[0]
                await asyncio.sleep(0.01)
            assert len(seen) == MESSAGES, f"only {len(seen)} of {MESSAGES} reached the DLQ"
            return sorted(seen[i] - due[i] for i in due)
    finally:
        service.stop()


async def main() -> None:
    server = RedisServer().start()
    try:
        for interval in ("1.0", "0.5", "0.25"):
            lat = await run(server, interval)
            p50, p95 = statistics.median(lat), lat[int(len(lat) * 0.95)]
            print(
                f"sweep_interval {interval} s: latency p50 {p50:.3f} s, p95 {p95:.3f} s, max {lat[-1]:.3f} s "
                f"(max / Solace's 1 s quantum: {lat[-1]:.2f})"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
