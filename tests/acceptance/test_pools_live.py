"""Two live API processes over the same pools: a Redis pool, a second Redis pool and a Redis Cluster pool,
with the catalogue in the first Redis. Pools registered through one process serve through both; consumers
claim concurrently through both and no message is ever held by two live claims, in any pool."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from core.models import QueueRef
from storage.pooling.catalogue import Pool
from storage.pooling.store import home_pool
from storage.registry import open_store
from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess, RedisServer

pytestmark = pytest.mark.slow

ADMIN = {"X-Roles": "admin"}
POOL_NAMES = ("red", "blue", "cluster")


def three_projects_per_pool() -> list[str]:
    pools = [Pool(name, "unused", 1) for name in POOL_NAMES]
    chosen: dict[str, list[str]] = {name: [] for name in POOL_NAMES}
    for i in range(1000):
        project = f"tenant-{i}"
        home = home_pool(project, pools).name
        if len(chosen[home]) < 3:
            chosen[home].append(project)
    return sorted(p for names in chosen.values() for p in names)


PROJECTS = three_projects_per_pool()
PER_QUEUE = 120


@pytest.fixture(scope="module")
def services(
    redis_url: str, redis_cluster_url: str
) -> Iterator[tuple[CharonProcess, CharonProcess, dict[str, str], str]]:
    blue = RedisServer().start()
    namespace = f"t{uuid.uuid4().hex[:12]}"
    env = {"CHARON_POOLING": "true", "CHARON_MANAGEMENT_URI": redis_url, "CHARON_ADMIN_MODE": "true"}
    first = CharonProcess(None, namespace=namespace, env=env).start()
    second = CharonProcess(None, namespace=namespace, env=env).start()
    pools = dict(zip(POOL_NAMES, (redis_url, blue.url, redis_cluster_url), strict=True))
    yield first, second, pools, namespace
    first.stop()
    second.stop()
    blue.stop()


async def test_two_api_processes_share_pools_and_never_give_a_message_to_two_claims(
    services: tuple[CharonProcess, CharonProcess, dict[str, str], str],
) -> None:
    first, second, pools, namespace = services
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as admin:
        for name, uri in pools.items():
            r = await admin.put(f"/v2/pools/{name}", json={"uri": uri, "weight": 1}, headers=ADMIN)
            assert r.status_code == 201, r.text
    clients = [httpx.AsyncClient(base_url=p.url, timeout=30) for p in (first, second)]
    try:
        posted: set[str] = set()
        for i, project in enumerate(PROJECTS):  # posted through either process
            headers = {"Client-ID": CLIENT_ID, "X-Project-ID": project}
            for start in range(0, PER_QUEUE, 20):
                batch = [{"body": {"n": n}} for n in range(start, start + 20)]
                r = await clients[i % 2].post(
                    "/v2/queues/work/messages", json={"messages": batch}, headers=headers
                )
                assert r.status_code == 201
                posted |= {href.rsplit("/", 1)[1] for href in r.json()["resources"]}
        async with httpx.AsyncClient(base_url=first.url, timeout=30) as admin:
            health = (await admin.get("/v2/health", headers=ADMIN)).json()
        assert health["pools"] == {name: {"storage_reachable": True} for name in pools}
        pool_of = {}
        for project in PROJECTS:
            for name, uri in pools.items():  # read each backend directly
                driver = open_store(uri, namespace=namespace)
                if (await driver.stats(QueueRef(project, "work"))).total:
                    pool_of[project] = name
                await driver.aclose()
        assert sorted(set(pool_of.values())) == sorted(pools)
        assert len(pool_of) == len(PROJECTS)

        held: Counter[str] = Counter()

        async def consume(worker: int) -> None:
            client = clients[worker % 2]
            headers = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECTS[worker % len(PROJECTS)]}
            while True:
                r = await client.post("/v2/queues/work/claims?limit=7", json={"ttl": 300}, headers=headers)
                if r.status_code == 204:
                    return
                assert r.status_code == 201, r.text
                held.update(m["href"].split("/")[-1].split("?")[0] for m in r.json()["messages"])

        await asyncio.gather(*(consume(w) for w in range(24)))
        assert set(held) == posted
        assert set(held.values()) == {1}  # every message held by exactly one live claim
    finally:
        for c in clients:
            await c.aclose()
