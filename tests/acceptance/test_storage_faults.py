"""A failing store never turns into a 500, a false answer or a lost message (issue 18).

Each test runs the app against a private server of its own (the faults would disturb the session's servers):
a redis-server stopped with SIGSTOP (a stall), killed with SIGKILL and restarted on its AOF, or filled up to
its `maxmemory`; a SecantusDB server stopped with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.redis.store import RedisStore
from tests.conftest import api_client
from tests.servers import CharonProcess, MongoServer, RedisServer

pytestmark = pytest.mark.slow

TIMEOUT = 1.0  # CHARON_STORAGE_TIMEOUT for these tests
BOUND = 4 * TIMEOUT  # an answer within this, generous for a loaded machine
NOT_APPLIED = "Nothing was changed"
UNKNOWN = "may or may not have been"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(data_dir=tmp_path, fsync="everysec").start()  # the embedded store's durability
    yield server
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


async def app_on(store: Store, **settings: Any) -> httpx.AsyncClient:
    app = create_app(
        Settings(storage_uri="redis://unused", sweep_interval=0, storage_timeout=TIMEOUT, **settings),
        store=store,
    )
    return api_client(app)


@pytest.fixture
async def redis_store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_server.url, namespace="faults", timeout=TIMEOUT)
    yield store
    await store.aclose()


def outcome(r: httpx.Response) -> str:
    """'stored', 'not applied' or 'unknown', from the answer alone; anything else fails the test."""
    if r.status_code == 201:
        return "stored"
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/json"
    description = r.json()["description"]
    if UNKNOWN in description:
        assert "Idempotency-Key" in description, description
        return "unknown"
    assert NOT_APPLIED in description, description
    return "not applied"


async def stored_bodies(c: httpx.AsyncClient, queue: str) -> list[Any]:
    bodies, url = [], f"/v2/queues/{queue}/messages?echo=true&limit=20&include_claimed=true"
    while url:
        page = (await c.get(url)).json()
        bodies += [m["body"] for m in page["messages"]]
        url = page["links"][0]["href"] if page["links"] else ""
    return bodies


async def post_batch(c: httpx.AsyncClient, queue: str, n: int, key: str) -> tuple[float, httpx.Response]:
    start = time.monotonic()
    r = await c.post(
        f"/v2/queues/{queue}/messages",
        json={"messages": [{"body": {"key": key, "i": i}} for i in range(n)]},
        headers={"Idempotency-Key": key},
    )
    return time.monotonic() - start, r


# -- stalls --------------------------------------------------------------------------------------------------


async def test_a_stalled_redis_answers_503_in_time_and_never_hides_a_success(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    """SIGSTOP redis-server while posts are in flight: every answer comes within the bound, says whether the
    post may have been applied, and after SIGCONT retrying the unknown ones with their Idempotency-Key stores
    each batch exactly once; no batch refused as not applied is stored."""
    assert redis_server.proc is not None
    async with await app_on(redis_store) as c:
        assert (
            await c.post("/v2/queues/stall/messages", json={"messages": [{"body": 0}]})
        ).status_code == 201

        stop = asyncio.Event()

        async def producer(n: int) -> list[tuple[str, float, httpx.Response]]:
            out, j = [], 0
            while not stop.is_set():
                key = f"p{n}-{j}"
                took, r = await post_batch(c, "stall", 2, key)
                out.append((key, took, r))
                j += 1
            return out

        tasks = [asyncio.create_task(producer(n)) for n in range(8)]
        await asyncio.sleep(0.2)
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        ping = await c.get("/v2/ping")
        ping_took = time.monotonic() - start
        health = await c.get("/v2/health")
        await asyncio.sleep(TIMEOUT)  # every producer meets the stall
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        stop.set()
        results = [x for t in await asyncio.gather(*tasks) for x in t]

        assert ping.status_code == 503, ping.text
        assert ping_took < BOUND
        assert health.status_code == 503
        assert max(took for _, took, _ in results) < BOUND
        outcomes = {key: outcome(r) for key, _, r in results}
        assert "not applied" in outcomes.values() or "unknown" in outcomes.values()
        for key, state in outcomes.items():
            if state == "unknown":  # the client's recovery: the same request with the same key
                _, r = await post_batch(c, "stall", 2, key)
                assert r.status_code == 201, r.text
        stored = await stored_bodies(c, "stall")
        counts: dict[str, int] = {}
        for body in stored[1:]:
            counts[body["key"]] = counts.get(body["key"], 0) + 1
        for key, state in outcomes.items():
            expected = 0 if state == "not applied" else 2
            assert counts.get(key, 0) == expected, (key, state, counts.get(key))


def test_sigterm_during_a_stall_stops_the_service_within_its_shutdown_timeout(
    redis_server: RedisServer,
) -> None:
    """A request stuck on a stalled store (a storage timeout of 60 s) does not hold the shutdown longer than
    CHARON_SHUTDOWN_TIMEOUT: the container runtime's grace period can be reckoned from it."""
    assert redis_server.proc is not None
    env = {"CHARON_STORAGE_TIMEOUT": "60", "CHARON_SHUTDOWN_TIMEOUT": "2"}
    service = CharonProcess(redis_server.url, namespace="shutdown", env=env).start()
    headers = {"Client-ID": "3381af92-2b9e-11e3-b191-71861300734c", "X-Project-ID": "shutdown"}
    answers: list[object] = []

    def post() -> None:
        try:
            answers.append(
                httpx.post(
                    f"{service.url}/v2/queues/q/messages",
                    json={"messages": [{"body": 1}]},
                    headers=headers,
                    timeout=90,
                )
            )
        except httpx.TransportError as e:
            answers.append(e)

    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    poster = threading.Thread(target=post)
    poster.start()
    time.sleep(1)  # the post waits on the store
    assert answers == []
    start = time.monotonic()
    service.stop()  # fails if the process is not gone 15 s after SIGTERM
    assert time.monotonic() - start < 10
    poster.join(30)
    assert len(answers) == 1


async def test_a_stalled_mongodb_answers_503_in_time(tmp_path: Path) -> None:
    server = MongoServer().start()
    store = MongoStore.from_url(f"{server.url}charon_faults", namespace="faults", timeout=TIMEOUT)
    assert server.proc is not None
    try:
        async with await app_on(store) as c:
            assert (
                await c.post("/v2/queues/m/messages", json={"messages": [{"body": 0}]})
            ).status_code == 201
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                for method, url, body in [
                    ("POST", "/v2/queues/m/messages", {"messages": [{"body": 1}]}),
                    ("POST", "/v2/queues/m/claims", {}),
                    ("GET", "/v2/queues/m/stats", None),
                    ("GET", "/v2/ping", None),
                ]:
                    start = time.monotonic()
                    r = await c.request(method, url, json=body)
                    assert time.monotonic() - start < BOUND, (method, url)
                    assert r.status_code == 503, r.text
                    assert r.headers["content-type"] == "application/json"
                    if method == "POST":
                        assert UNKNOWN in r.json()["description"] or NOT_APPLIED in r.json()["description"]
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert (
                await c.post("/v2/queues/m/messages", json={"messages": [{"body": 2}]})
            ).status_code == 201
    finally:
        await store.aclose()
        server.stop()


# -- crash and restart ---------------------------------------------------------------------------------------


async def test_redis_killed_and_restarted_on_its_aof_keeps_every_acknowledged_post(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    """kill -9 of redis-server mid-load (appendfsync everysec, the embedded store's setting): every post that
    was answered 201 is there after the restart on the same AOF; the service answers again without help."""
    assert redis_server.proc is not None
    acknowledged: list[str] = []
    enough = asyncio.Event()
    async with await app_on(redis_store) as c:

        async def producer(n: int) -> None:
            for j in range(400):
                key = f"k{n}-{j}"
                _, r = await post_batch(c, "crash", 1, key)
                if r.status_code == 201:
                    acknowledged.append(key)
                    if len(acknowledged) >= 200:
                        enough.set()
                else:
                    assert r.status_code == 503, r.text
                    await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(producer(n)) for n in range(4)]
        await enough.wait()
        redis_server.proc.kill()
        redis_server.proc.wait(10)
        await asyncio.sleep(0.3)
        redis_server.start()
        await asyncio.gather(*tasks)
        stored = {body["key"] for body in await stored_bodies(c, "crash")}
    assert len(acknowledged) >= 200
    assert [k for k in acknowledged if k not in stored] == []


# -- storage full --------------------------------------------------------------------------------------------


async def test_a_full_redis_refuses_writes_with_json_and_consumers_free_it(
    redis_server: RedisServer, redis_store: RedisStore
) -> None:
    """maxmemory reached with noeviction: posts and queue creation answer 507 JSON saying the store refuses
    writes (nothing stored), health says so while ping stays 204, claims, deletes and the sweeper still work
    (they free memory), and posts work again once there is room."""
    admin = aioredis.Redis.from_url(redis_server.url)
    clock = ManualClock()
    store = RedisStore.from_url(redis_server.url, namespace="full", timeout=TIMEOUT, clock=clock)
    try:
        async with await app_on(store) as c:
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", used + 2_000_000)
            big = "x" * 20_000
            posted = 0
            while True:
                r = await c.post(
                    "/v2/queues/full/messages", json={"messages": [{"body": big, "ttl": 60}] * 5}
                )
                if r.status_code != 201:
                    break
                posted += 5
                assert posted < 2000, "maxmemory never refused a post"
            assert r.status_code == 507, r.text
            assert r.headers["content-type"] == "application/json"
            assert "refuses writes" in r.json()["description"]
            stats = (await c.get("/v2/queues/full/stats")).json()["messages"]
            assert stats["total"] == posted  # the refused post stored nothing
            # The refused post was over the limit with its 100 KB; without them the store may be just under
            # it, where a small write still fits (a script loaded meanwhile decided which). The limit below
            # what is used: full for every write that follows, until the consumers free it.
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory", used - 200_000)
            r = await c.put(f"/v2/queues/new-{uuid.uuid4().hex[:6]}", json={"a": 1})
            assert r.status_code == 507, r.text
            assert (await c.get("/v2/ping")).status_code == 204
            health = await c.get("/v2/health")
            assert (health.status_code, health.json()) == (
                503,
                {"storage_reachable": True, "storage_writable": False},
            )
            # a full store: not ready (a load balancer sends its writes elsewhere), but alive
            ready = await c.get("/readyz")
            assert ready.status_code == 503
            assert "refuses writes" in ready.json()["description"]
            assert (await c.get("/livez")).status_code == 204

            claimed = await c.post("/v2/queues/full/claims?limit=5", json={"ttl": 60})
            assert claimed.status_code == 201, claimed.text
            for m in claimed.json()["messages"]:
                assert (await c.delete(m["href"])).status_code == 204
            clock.advance(120)  # every message's ttl (60 s) is over: the sweeper deletes them all
            await store.sweep()
            assert (await c.get("/v2/queues/full/stats")).json()["messages"]["total"] == 0
            await admin.config_set("maxmemory", 0)
            r = await c.post("/v2/queues/full/messages", json={"messages": [{"body": big}]})
            assert r.status_code == 201, r.text
            assert (await c.get("/v2/health")).json() == {"storage_reachable": True, "storage_writable": True}
            assert (await c.get("/readyz")).status_code == 204
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()
        await store.aclose()


async def test_a_full_redis_with_request_rates_still_serves_the_reads_and_deletes_that_free_it(
    redis_server: RedisServer,
) -> None:
    """A rate's take is a write: on a full Redis it is refused, and the request is let through (never a 507
    for a GET, nor for the claim and delete that free the store), as is every request of the bucket for a
    second after, without asking the store again."""
    admin = aioredis.Redis.from_url(redis_server.url)
    store = RedisStore.from_url(redis_server.url, namespace="full-rate", timeout=TIMEOUT)
    rates = {"reads_per_second": 1000, "writes_per_second": 1000, "burst_seconds": 0.01}  # 10 a take
    try:
        async with await app_on(store, quotas=rates) as c:
            assert (
                await c.post("/v2/queues/q/messages", json={"messages": [{"body": 1}] * 3})
            ).status_code == 201
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", used + 1_000_000)
            big = "x" * 20_000
            while (
                await c.post("/v2/queues/q/messages", json={"messages": [{"body": big}] * 5})
            ).status_code != 507:
                pass
            for _ in range(5):
                assert (await c.get("/v2/queues/q/stats")).status_code == 200
            claimed = await c.post("/v2/queues/q/claims?limit=2", json={"ttl": 60})
            assert claimed.status_code == 201, claimed.text
            for m in claimed.json()["messages"]:
                assert (await c.delete(m["href"])).status_code == 204
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()
        await store.aclose()


async def test_a_claim_that_succeeded_is_answered_even_when_bookkeeping_after_it_fails(
    redis_server: RedisServer,
) -> None:
    """The claim script succeeds on a full Redis (it frees before it writes), but the sweeper's mark after it
    is a write Redis refuses: the claim must still be answered 201 with its messages, not 500 or 503."""
    admin = aioredis.Redis.from_url(redis_server.url)
    store = RedisStore.from_url(redis_server.url, namespace="after", timeout=TIMEOUT)
    try:
        async with await app_on(store) as c:
            r = await c.post("/v2/queues/q/messages", json={"messages": [{"body": i} for i in range(3)]})
            assert r.status_code == 201
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", used - 100_000)  # already over: every growing write refused
            await admin.delete("after:touched")  # the mark the claim will want to add
            claimed = await c.post("/v2/queues/q/claims?limit=3", json={"ttl": 60})
            assert claimed.status_code == 201, claimed.text
            assert sorted(m["body"] for m in claimed.json()["messages"]) == [0, 1, 2]
            assert (await c.get(claimed.headers["location"])).status_code == 200
    finally:
        await admin.config_set("maxmemory", 0)
        await admin.aclose()
        await store.aclose()
