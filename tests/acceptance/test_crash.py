"""Crash safety of dead-lettering (docs/contract.md promise 1), with a live service on each driver: a
claim-and-release storm is interrupted by `kill -9` of the service twice, at random moments; the service
restarts and the storm finishes. On Redis the service runs its embedded store (AOF on), which dies and
restarts with it; on MongoDB the service dies while the database lives on. Afterwards, read straight from
storage, every message is in the DLQ exactly once, with claim_count 3, and none is left in (or also in) the
source."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pymongo
import pytest
import redis

from storage.redis.keys import project_prefix
from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

PROJECT = "crash"
HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}
MAX_CLAIMS = 3
ENV = {"CHARON_LIMITS__MIN_CLAIM_TTL": "1", "CHARON_SWEEP_INTERVAL": "0.2"}


def check_redis(data: Path, posted: list[str]) -> None:
    """Straight from the embedded redis-server, which restarted from its AOF twice."""
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
    assert r.hget(f"{prefix}q:storm", "n_dl") == str(len(posted))
    assert r.hget(f"{prefix}q:storm.dlq", "n_rcv") == str(len(posted))


def check_mongo(uri: str, namespace: str, workers: int, posted: list[str]) -> None:
    """Straight from the database."""
    with pymongo.MongoClient(uri) as client:
        db = client.get_default_database()
        messages, counters = db[f"{namespace}.messages"], db[f"{namespace}.counters"]
        assert messages.count_documents({"p": PROJECT, "q": "storm"}) == 0
        moved = list(messages.find({"p": PROJECT, "q": "storm.dlq"}))
        assert sorted(m["_id"] for m in moved) == sorted(posted)
        assert {(m["dl"]["src"], m["dl"]["cc"], "c" in m) for m in moved} == {("storm", MAX_CLAIMS, False)}
        # The counters follow each move in a write of their own: a kill between the two leaves them short
        # by at most the moves in flight (a claim of 10 per worker, at each kill), never long.
        n_dl = counters.find_one({"_id": {"p": PROJECT, "q": "storm"}})["n_dl"]
        n_rcv = counters.find_one({"_id": {"p": PROJECT, "q": "storm.dlq"}})["n_rcv"]
        for n in (n_dl, n_rcv):
            assert len(posted) - 2 * workers * 10 <= n <= len(posted)


@dataclass
class Storm:
    service: CharonProcess  # not started yet
    messages: int
    workers: int
    check_storage: Callable[[list[str]], None]


@pytest.fixture(params=["redis", "mongo"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Storm:
    if request.param == "redis":
        data = tmp_path / "data"
        service = CharonProcess(None, data_dir=data, env=ENV)
        return Storm(service, 2000, 50, lambda posted: check_redis(data, posted))
    uri: str = request.getfixturevalue("mongodb_uri")
    namespace = f"crash{os.urandom(4).hex()}"
    service = CharonProcess(uri, namespace=namespace, env=ENV)
    # SecantusDB, a Python server whose throughput drops as contention grows, gets a smaller storm (with 10
    # workers it ran past the test's 120 s in a loaded CI).
    return Storm(service, 200, 4, lambda posted: check_mongo(uri, namespace, 4, posted))


def post_all(base: str, messages: int) -> list[str]:
    policy = {"_max_claim_count": MAX_CLAIMS, "_dead_letter_queue": "storm.dlq"}
    assert httpx.put(f"{base}/v2/queues/storm", headers=HEADERS, json=policy).status_code == 201
    ids: list[str] = []
    with httpx.Client(base_url=base, headers=HEADERS) as c:
        for start in range(0, messages, 20):
            batch = [{"body": {"n": n}} for n in range(start, start + 20)]
            r = c.post("/v2/queues/storm/messages", json={"messages": batch})
            assert r.status_code == 201, r.text
            ids += [href.rsplit("/", 1)[1] for href in r.json()["resources"]]
    return ids


async def storm(service: CharonProcess, messages: int, workers: int, rng: random.Random) -> list[int]:
    """Claim-and-release until the source is empty, while the service is killed and restarted twice. A claim
    whose answer a kill swallowed is never released: it lapses after its 1 s ttl and the sweeper ends it.
    The kills come once a random share of the storm's claims (10 messages each, MAX_CLAIMS times) has been
    answered: the first within 10-40 %, the second within 50-80 %, so both land mid-storm on any machine.
    Returns how many claims had been answered at each kill, and in all (last)."""
    done = asyncio.Event()
    claims = [0]
    expected = messages * MAX_CLAIMS // 10
    kill_at = [int(expected * rng.uniform(0.1, 0.4)), int(expected * rng.uniform(0.5, 0.8))]
    reached = asyncio.Event()  # set when the claims answered reach the next kill_at
    at_kill: list[int] = []

    async def worker(c: httpx.AsyncClient) -> None:
        while not done.is_set():
            try:
                r = await c.post("/v2/queues/storm/claims?limit=10", json={"ttl": 1, "grace": 0})
                if r.status_code == 201:
                    claims[0] += 1
                    if kill_at and claims[0] >= kill_at[0]:
                        reached.set()
                    await c.delete(r.headers["location"])
                else:
                    await asyncio.sleep(0.05)
            except httpx.TransportError:
                await asyncio.sleep(0.1)

    async def killer() -> None:
        while kill_at:
            await reached.wait()
            reached.clear()
            kill_at.pop(0)
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
            asyncio.gather(kills, watch(c), *(worker(c) for _ in range(workers))), timeout=120
        )
    return [*at_kill, claims[0]]


def test_kill_9_during_a_dead_letter_storm_loses_and_duplicates_nothing(backend: Storm) -> None:
    service, messages = backend.service, backend.messages
    seed = int.from_bytes(os.urandom(4), "big")
    print(f"crash test seed {seed}")
    service.start()
    try:
        posted = post_all(service.url, messages)
        first_kill, second_kill, in_all = asyncio.run(
            storm(service, messages, backend.workers, random.Random(seed))
        )
        print(
            f"claims answered: {first_kill} at the first kill, {second_kill} at the second, {in_all} in all"
        )
        assert 0 < first_kill < second_kill < in_all  # killed mid-storm, and the storm went on after
        backend.check_storage(posted)

        # And through the API: every message once in the DLQ, each claimed 3 times at the source.
        seen: list[str] = []
        url: str | None = "/v2/queues/storm.dlq/messages?limit=20&echo=true&provenance=true"
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            while url:
                page = c.get(url).json()
                seen += [m["id"] for m in page["messages"] if m["dead_letter"]["claim_count"] == MAX_CLAIMS]
                url = next((link["href"] for link in page["links"] if link["rel"] == "next"), None)
                url = url if page["messages"] else None
        assert len(seen) == len(set(seen)) == messages
    finally:
        service.stop()


def test_sweepers_of_several_worker_processes_move_each_message_once(storage_uri: str) -> None:
    """Two uvicorn workers, each with its sweeper: claims that lapse are ended and their messages moved
    once, with no request on the source queue after the claims."""
    env = {"CHARON_LIMITS__MIN_CLAIM_TTL": "1", "CHARON_SWEEP_INTERVAL": "0.1", "CHARON_WORKERS": "2"}
    service = CharonProcess(storage_uri, namespace=f"w{os.urandom(4).hex()}", env=env).start()
    try:
        # two workers' sweepers every 0.1 s on the Python wire server: a claim may take seconds
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=30) as c:
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
