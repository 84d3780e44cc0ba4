"""Crash safety of dead-lettering (ARCHITECTURE.md §3 promise 1), with a live service on its embedded Redis
(AOF on): a claim-and-release storm is interrupted by `kill -9` of the service twice, at random moments; the
service restarts on the same data dir and the storm finishes. Afterwards, read straight from storage, every
message is in the DLQ exactly once, with claim_count 3, and none is left in (or also in) the source."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import httpx
import pytest
import redis

from storage.redis.keys import project_prefix
from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

PROJECT = "crash"
HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}
MESSAGES = 2000
WORKERS = 50
MAX_CLAIMS = 3


def post_all(base: str) -> list[str]:
    policy = {"_max_claim_count": MAX_CLAIMS, "_dead_letter_queue": "storm.dlq"}
    assert httpx.put(f"{base}/v2/queues/storm", headers=HEADERS, json=policy).status_code == 201
    ids: list[str] = []
    with httpx.Client(base_url=base, headers=HEADERS) as c:
        for start in range(0, MESSAGES, 20):
            batch = [{"body": {"n": n}} for n in range(start, start + 20)]
            r = c.post("/v2/queues/storm/messages", json={"messages": batch})
            assert r.status_code == 201, r.text
            ids += [href.rsplit("/", 1)[1] for href in r.json()["resources"]]
    return ids


async def storm(service: CharonProcess, rng: random.Random) -> list[int]:
    """Claim-and-release until the source is empty, while the service is killed and restarted twice. A claim
    whose answer a kill swallowed is never released: it lapses after its 1 s ttl and the sweeper ends it.
    Returns how many claims had been answered at each kill, and in all (last)."""
    done = asyncio.Event()
    claims = [0]
    at_kill: list[int] = []

    async def worker(c: httpx.AsyncClient) -> None:
        while not done.is_set():
            try:
                r = await c.post("/v2/queues/storm/claims?limit=10", json={"ttl": 1, "grace": 0})
                if r.status_code == 201:
                    claims[0] += 1
                    await c.delete(r.headers["location"])
                else:
                    await asyncio.sleep(0.05)
            except httpx.TransportError:
                await asyncio.sleep(0.1)

    async def killer() -> None:
        for _ in range(2):
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            at_kill.append(claims[0])
            service.kill()
            await asyncio.to_thread(service.start)

    async def watch(c: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(0.25)
            try:
                stats = (await c.get("/v2/queues/storm/stats")).json()["messages"]
            except (httpx.TransportError, ValueError):
                continue
            if stats["total"] == 0 and kills.done():
                done.set()
                return

    async with httpx.AsyncClient(base_url=service.url, headers=HEADERS, timeout=10) as c:
        kills = asyncio.create_task(killer())
        await asyncio.wait_for(
            asyncio.gather(kills, watch(c), *(worker(c) for _ in range(WORKERS))), timeout=120
        )
    return [*at_kill, claims[0]]


def test_kill_9_during_a_dead_letter_storm_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"crash test seed {seed}")
    data = tmp_path / "data"
    env = {"CHARON_LIMITS__MIN_CLAIM_TTL": "1", "CHARON_SWEEP_INTERVAL": "0.2"}
    service = CharonProcess(None, data_dir=data, env=env).start()
    try:
        posted = post_all(service.url)
        first_kill, second_kill, in_all = asyncio.run(storm(service, random.Random(seed)))
        print(
            f"claims answered: {first_kill} at the first kill, {second_kill} at the second, {in_all} in all"
        )
        assert 0 < first_kill <= second_kill < in_all  # killed mid-storm, and the storm went on after

        # Straight from storage (the embedded redis-server, which restarted from its AOF twice).
        r = redis.Redis(unix_socket_path=str(data / "redis.sock"), decode_responses=True)
        prefix = project_prefix("charon", PROJECT)
        assert r.zcard(f"{prefix}q:storm:msgs") == 0
        in_dlq = r.zrange(f"{prefix}q:storm.dlq:msgs", 0, -1)
        assert sorted(in_dlq) == sorted(posted)
        with r.pipeline(transaction=False) as pipe:
            for mid in posted:
                pipe.hmget(f"{prefix}m:{mid}", "q", "dsrc", "dcc", "c")
            fields = pipe.execute()
        assert {tuple(f) for f in fields} == {("storm.dlq", "storm", str(MAX_CLAIMS), "")}
        assert r.hget(f"{prefix}q:storm", "n_dl") == str(MESSAGES)
        assert r.hget(f"{prefix}q:storm.dlq", "n_rcv") == str(MESSAGES)

        # And through the API: 2,000 distinct messages in the DLQ, each claimed 3 times at the source.
        seen: list[str] = []
        url: str | None = "/v2/queues/storm.dlq/messages?limit=20&echo=true"
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            while url:
                page = c.get(url).json()
                seen += [m["id"] for m in page["messages"] if m["dead_letter"]["claim_count"] == MAX_CLAIMS]
                url = next((link["href"] for link in page["links"] if link["rel"] == "next"), None)
                url = url if page["messages"] else None
        assert len(seen) == len(set(seen)) == MESSAGES
    finally:
        service.stop()


def test_sweepers_of_several_worker_processes_move_each_message_once(redis_url: str) -> None:
    """Two uvicorn workers, each with its sweeper: claims that lapse are ended and their messages moved
    once, with no request on the source queue after the claims."""
    env = {"CHARON_LIMITS__MIN_CLAIM_TTL": "1", "CHARON_SWEEP_INTERVAL": "0.1", "CHARON_WORKERS": "2"}
    service = CharonProcess(redis_url, namespace=f"w{os.urandom(4).hex()}", env=env).start()
    try:
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            c.put("/v2/queues/lapse", json={"_max_claim_count": 1, "_dead_letter_queue": "lapse.dlq"})
            for _ in range(10):
                c.post("/v2/queues/lapse/messages", json={"messages": [{"body": n} for n in range(20)]})
            for _ in range(10):
                assert (
                    c.post("/v2/queues/lapse/claims?limit=20", json={"ttl": 1, "grace": 0}).status_code == 201
                )
            stats: dict[str, int] = {}
            for _ in range(100):  # up to 10 s; the claims lapse after 1 s
                stats = c.get("/v2/queues/lapse.dlq/stats").json()["messages"]
                if stats["total"] == 200:
                    break
                time.sleep(0.1)
            assert (stats["total"], stats["dead_letters_received"]) == (200, 200)
    finally:
        service.stop()
