"""What a scrape of GET /metrics costs over many queues, on a real redis-server started here.

N queues (in N / 100 projects, each queue with 3 messages, one of them claimed) are made once; then, for
each size, `--rounds` times each, and the median printed:

- `queue_gauges`: Store.queue_gauges(limit=N) alone (the project registry, the queue names, stats.lua per
  queue pipelined), wall time and this process's CPU;
- `scrape`: the whole GET /metrics through the app's ASGI callable (the store's read uncached, the process
  series, the text encoding), with CHARON_METRICS__MAX_QUEUES at its default (1,000 series of their own, the
  rest in `_other`) and at N (every queue its own series), wall time, CPU and the answer's size;
- redis-server's CPU for one `queue_gauges` (from /proc).

With `--http`, instead: what counting each request (api/metrics.py HttpMetrics) costs, the app with it
against the same app without it (its middleware taken out), in one process on one store, the two taking
turns every 100 requests (post of 10 messages, claim of 10, delete with a claim id); this process's CPU a
request, the median and quartiles of each round's ratio. Run it with PROMETHEUS_MULTIPROC_DIR set to an
empty directory to measure prometheus-client's multiprocess values (what `charon serve` uses).

Run: .venv/bin/python -m bench.studies.metrics_cost [--queues 10000] [--rounds 5] [--http]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

from api.access import RequestLog
from app.main import create_app
from app.settings import MetricsSettings, Settings
from bench.cpu import cpu_seconds
from bench.request_cost import HEADERS, POST, call, claim_and_delete
from core.models import NewMessage, QueueRef
from storage.redis.store import RedisStore
from tests.servers import RedisServer

ADMIN = [*HEADERS, (b"x-roles", b"admin")]


async def fill(store: RedisStore, queues: int) -> None:
    async def one(i: int) -> None:
        q = QueueRef(f"p{i // 100:04d}", f"q{i % 100:03d}")
        await store.post_messages(
            q,
            [NewMessage(body={"n": n}) for n in range(3)],
            client_id="c",
            default_ttl=3600,
            default_delay=0,
            body_size=30,
        )
        await store.claim(q, ttl=600, grace=60, limit=1)

    for start in range(0, queues, 200):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 200, queues))))


async def timed(work: Any, rounds: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of `work()` over `rounds`, and its last result."""
    walls, cpus, result = [], [], None
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        result = await work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


async def main(queues: int, rounds: int) -> None:
    server = RedisServer().start()
    try:
        store = RedisStore.from_url(server.url, namespace=f"m{uuid.uuid4().hex[:6]}")
        began = time.perf_counter()
        await fill(store, queues)
        print(f"{queues:,} queues made in {time.perf_counter() - began:.1f} s\n")
        print("| what | queues read | series of their own | wall ms | this process CPU ms | answer KiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for size in sorted({queues // 10, queues}):
            wall, cpu, (gauges, _) = await timed(lambda s=size: store.queue_gauges(limit=s), rounds)
            assert len(gauges) == size
            print(f"| queue_gauges | {size:,} | - | {wall * 1000:.0f} | {cpu * 1000:.0f} | - |")
            for own in sorted({min(MetricsSettings().max_queues, size), size}):
                metrics = MetricsSettings(max_queues=own, max_queues_read=size, cache_seconds=0)
                app = create_app(
                    Settings(storage_uri="redis://unused", sweep_interval=0, metrics=metrics), store=store
                )

                async def scrape(app: Any = app) -> bytes:
                    status, body = await call(app, "GET", "/metrics", headers=ADMIN)
                    assert status == 200, status
                    return body

                wall, cpu, body = await timed(scrape, rounds)
                print(
                    f"| scrape | {size:,} | {own:,} | {wall * 1000:.0f} | {cpu * 1000:.0f} | "
                    f"{len(body) / 1024:.0f} |"
                )
        assert server.proc is not None
        before = cpu_seconds(server.proc.pid)
        for _ in range(rounds):
            await store.queue_gauges(limit=queues)
        server_ms = (cpu_seconds(server.proc.pid) - before) / rounds * 1000
        print(f"\nredis-server CPU for one queue_gauges over {queues:,} queues: {server_ms:.0f} ms")
        await store.aclose()
    finally:
        server.stop()


async def turn(app: Any, spent: dict[str, float], requests: int = 100) -> None:
    """`requests` posts of 10 messages, then claims of 10 and deletes of each claimed message until as
    many messages are consumed; CPU seconds added to `spent` per kind."""
    for _ in range(requests // 10):
        t0 = time.process_time()
        status, _ = await call(app, "POST", "/v2/queues/h/messages", POST)
        t1 = time.process_time()
        assert status == 201, status
        claim, delete = await claim_and_delete(app, "h")
        spent["post of 10 messages"] += t1 - t0
        spent["claim of 10"] += claim
        spent["delete with claim_id"] += delete / 10


async def http(rounds: int) -> None:
    server = RedisServer().start()
    try:
        store = RedisStore.from_url(server.url, namespace=f"h{uuid.uuid4().hex[:6]}")
        apps = {}
        for name in ("without", "with"):
            app = apps[name] = create_app(
                Settings(storage_uri="redis://unused", sweep_interval=0), store=store
            )
            if name == "without":  # RequestLog counts nothing
                for m in app.user_middleware:
                    if m.cls is RequestLog:
                        m.kwargs["metrics"] = None
        kinds = ("post of 10 messages", "claim of 10", "delete with claim_id")
        for app in apps.values():
            await turn(app, dict.fromkeys(kinds, 0.0), 300)  # warm
        ratios: dict[str, list[float]] = {k: [] for k in kinds}
        per_request: dict[str, dict[str, list[float]]] = {n: {k: [] for k in kinds} for n in apps}
        for _ in range(rounds):
            spent = {n: dict.fromkeys(kinds, 0.0) for n in apps}
            for i in range(30):
                for name in list(apps)[:: 1 if i % 2 else -1]:
                    await turn(apps[name], spent[name])
            for k in kinds:
                ratios[k].append(spent["with"][k] / spent["without"][k])
                for n in apps:
                    per_request[n][k].append(spent[n][k] / 300 * 1e6)
        mode = "multiprocess" if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else "in memory"
        print(
            f"HttpMetrics, values {mode}: {rounds} rounds of 300 posts, 300 claims, 3,000 deletes each way\n"
        )
        print("| request | without CPU us | with CPU us | with / without (quartiles) |")
        print("| --- | --- | --- | --- |")
        for k in kinds:
            q = statistics.quantiles(ratios[k], n=4)
            without, with_ = (statistics.median(per_request[n][k]) for n in ("without", "with"))
            ratio = f"{statistics.median(ratios[k]):.3f}x ({q[0]:.3f}-{q[2]:.3f})"
            print(f"| {k} | {without:.0f} | {with_:.0f} | {ratio} |")
        await store.aclose()
    finally:
        server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="bench.studies.metrics_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--http", action="store_true", help="what counting each HTTP request costs")
    args = p.parse_args()
    asyncio.run(http(args.rounds) if args.http else main(args.queues, args.rounds))
