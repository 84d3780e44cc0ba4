"""Pools over HTTP: two real redis-servers and the MongoDB server as three pools behind one API.

Admin calls carry `X-Roles: admin`; the catalogue lives in the first Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from core.models import NewMessage, QueueRef, RedriveSpec, TaskId
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.pooling.store import PooledStore, home_pool
from storage.redis.store import RedisStore
from storage.registry import open_store
from tests.conftest import CLIENT_ID, SLOW_SERVER_TIMEOUT_S, api_client, close_pooled
from tests.servers import RedisServer, free_port

ADMIN = {"X-Roles": "member, admin"}
JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"


@pytest.fixture(scope="module")
def second_redis_url() -> Iterator[str]:
    server = RedisServer().start()
    yield server.url
    server.stop()


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def pooled(redis_url: str, namespace: str, clock: ManualClock) -> AsyncIterator[PooledStore]:
    catalogue = RedisCatalogue.from_url(redis_url, namespace=namespace)
    store = PooledStore(catalogue, namespace=namespace, clock=clock, timeout=SLOW_SERVER_TIMEOUT_S)
    yield store
    await close_pooled(store)


@pytest.fixture
async def client(pooled: PooledStore, clock: ManualClock) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(storage_uri="redis://unused", admin_mode=True, pooling=True)
    async with api_client(create_app(settings, store=pooled, clock=clock)) as c:
        yield c


@pytest.fixture
async def three_pools(
    client: httpx.AsyncClient, redis_url: str, second_redis_url: str, mongodb_uri: str
) -> dict[str, str]:
    uris = {"red": redis_url, "blue": second_redis_url, "docs": mongodb_uri}
    for name, uri in uris.items():
        r = await client.put(f"/v2/pools/{name}", json={"uri": uri, "weight": 10}, headers=ADMIN)
        assert r.status_code == 201, r.text
    return uris


def as_project(project: str) -> dict[str, str]:
    return {"X-Project-ID": project, "Client-ID": CLIENT_ID}


def project_in(pool: str, pools: list[Pool]) -> str:
    """A project whose queues the rendezvous hash places in `pool`."""
    for i in range(1000):
        project = f"p{i}"
        if home_pool(project, pools).name == pool:
            return project
    raise AssertionError(f"no project lands in {pool}")


# -- admin access --------------------------------------------------------------------------------------------


async def test_admin_calls_need_the_admin_role(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/pools")
    assert r.status_code == 403
    assert r.json()["rule"] == "pools:get_all"
    assert "'pools:get_all'" in r.json()["description"]
    assert "role:admin" in r.json()["description"]
    r = await client.put("/v2/pools/x", json={"uri": "redis://x", "weight": 1}, headers={"X-Roles": "member"})
    assert r.status_code == 403
    assert r.json()["rule"] == "pools:create"
    assert (await client.get("/v2/pools", headers=ADMIN)).json() == {"pools": [], "links": []}


async def test_a_roles_header_sent_twice_is_refused(client: httpx.AsyncClient) -> None:
    """A proxy that appends its X-Roles instead of replacing the client's must not let the client's count."""
    for method, url in [("GET", "/v2/pools"), ("GET", "/v2/health")]:
        request = client.build_request(method, url)
        request.headers = httpx.Headers(
            [*request.headers.multi_items(), ("X-Roles", "admin"), ("X-Roles", "x")]
        )
        r = await client.send(request)
        assert r.status_code == 400, r.text
        assert "X-Roles header is sent more than once" in r.json()["description"]


async def test_pool_and_flavor_names_and_free_form_fields_are_bounded(client: httpx.AsyncClient) -> None:
    for name in ("%2E%2E", "nl%0A", "x" * 65):
        r = await client.put(f"/v2/pools/{name}", json={"uri": "redis://x", "weight": 1}, headers=ADMIN)
        assert r.status_code == 400, r.text
        r = await client.put(f"/v2/flavors/{name}", json={}, headers=ADMIN)
        assert r.status_code == 400, r.text
    deep: object = 1
    for _ in range(65):
        deep = [deep]
    r = await client.put("/v2/flavors/f", json={"capabilities": {"x": deep}}, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert "capabilities nests" in r.json()["description"]
    r = await client.put("/v2/pools/p", content=b"null", headers=ADMIN)
    assert r.status_code == 400, r.text
    assert "JSON object" in r.json()["description"]
    r = await client.put("/v2/flavors/f", json={"pool_list": ["nl\n"]}, headers=ADMIN)
    assert r.status_code == 400, r.text


async def test_admin_mode_off_refuses_everyone(pooled: PooledStore, clock: ManualClock) -> None:
    app = create_app(Settings(storage_uri="redis://unused", admin_mode=False), store=pooled, clock=clock)
    async with api_client(app) as c:
        r = await c.get("/v2/flavors", headers=ADMIN)
    assert r.status_code == 403
    assert "CHARON_ADMIN_MODE=true" in r.json()["description"]


async def test_pool_calls_without_pooling_say_so(redis_store: RedisStore, clock: ManualClock) -> None:
    app = create_app(Settings(storage_uri="redis://unused", admin_mode=True), store=redis_store, clock=clock)
    async with api_client(app) as c:
        r = await c.get("/v2/pools", headers=ADMIN)
    assert r.status_code == 409
    assert "CHARON_POOLING=true" in r.json()["description"]


# -- pool resources ------------------------------------------------------------------------------------------


async def test_pool_lifecycle(client: httpx.AsyncClient, redis_url: str, second_redis_url: str) -> None:
    body = {"uri": redis_url, "weight": 5, "options": {"namespace": "elsewhere"}}
    assert (await client.put("/v2/pools/red", json=body, headers=ADMIN)).status_code == 201
    r = await client.put("/v2/pools/red", json=body, headers=ADMIN)
    assert r.status_code == 409
    assert "PATCH /v2/pools/red" in r.json()["description"]
    shown = (await client.get("/v2/pools/red?detailed=true", headers=ADMIN)).json()
    assert shown == {
        "name": "red",
        "href": "/v2/pools/red",
        "uri": redis_url,
        "weight": 5,
        "flavor": None,
        "options": {"namespace": "elsewhere"},
    }
    r = await client.patch("/v2/pools/red", json={"weight": 0, "uri": second_redis_url}, headers=ADMIN)
    assert r.status_code == 200
    assert (r.json()["weight"], r.json()["uri"]) == (0, second_redis_url)
    for name in ("a1", "a2", "a3"):
        await client.put(f"/v2/pools/{name}", json={"uri": redis_url, "weight": 1}, headers=ADMIN)
    first = (await client.get("/v2/pools?limit=2", headers=ADMIN)).json()
    assert [p["name"] for p in first["pools"]] == ["a1", "a2"]
    assert "options" not in first["pools"][0]
    second = (await client.get(first["links"][0]["href"], headers=ADMIN)).json()
    assert [p["name"] for p in second["pools"]] == ["a3", "red"]
    assert (await client.delete("/v2/pools/red", headers=ADMIN)).status_code == 204
    assert (await client.get("/v2/pools/red", headers=ADMIN)).status_code == 404
    assert (await client.delete("/v2/pools/red", headers=ADMIN)).status_code == 204


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"uri": "redis://127.0.0.1:1/0", "weight": 1}, "its uri does not answer"),
        ({"uri": "ftp://somewhere", "weight": 1}, "Unsupported storage URI scheme 'ftp'"),
        ({"uri": "redis+cluster://nohost", "weight": 1}, "host:port pairs"),
        ({"uri": "redis://x", "weight": -1}, "weight"),
        ({"uri": "redis://x", "weight": "heavy"}, "weight"),
        ({"weight": 1}, "uri"),
        ({"uri": "redis://x", "weight": 1, "group": "g"}, "group"),
        ({"uri": "redis://x", "weight": 1, "flavor": "unknown"}, "Flavor 'unknown' does not exist"),
        # URIs the drivers' own parsers refuse (each was a 500 before)
        ({"uri": "mongodb://", "weight": 1}, "its uri cannot be used"),
        ({"uri": "redis://:99999999", "weight": 1}, "its uri cannot be used"),
        ({"uri": "mongodb+srv://x", "weight": 1}, "its uri cannot be used"),
        ({"uri": "rediss://h:1?ssl_cert_reqs=bogus", "weight": 1}, "its uri cannot be used"),
    ],
)
async def test_bad_pools_are_refused_with_what_is_wrong(
    client: httpx.AsyncClient, body: dict[str, object], expected: str
) -> None:
    r = await client.put("/v2/pools/bad", json=body, headers=ADMIN)
    assert r.status_code == 400
    assert expected in r.json()["description"]
    assert (await client.get("/v2/pools/bad", headers=ADMIN)).status_code == 404


async def test_a_bad_pool_name_and_an_empty_patch_are_refused(
    client: httpx.AsyncClient, redis_url: str
) -> None:
    r = await client.put("/v2/pools/no%20spaces", json={"uri": redis_url, "weight": 1}, headers=ADMIN)
    assert r.status_code == 400
    await client.put("/v2/pools/red", json={"uri": redis_url, "weight": 1}, headers=ADMIN)
    assert (await client.patch("/v2/pools/red", json={}, headers=ADMIN)).status_code == 400
    assert (await client.patch("/v2/pools/none", json={"weight": 2}, headers=ADMIN)).status_code == 404


# -- placement and routing -----------------------------------------------------------------------------------


async def test_new_queues_are_spread_by_weight_and_weight_zero_takes_none(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str]
) -> None:
    await client.patch("/v2/pools/docs", json={"weight": 0}, headers=ADMIN)
    await client.patch("/v2/pools/blue", json={"weight": 30}, headers=ADMIN)
    for i in range(80):
        r = await client.post(
            "/v2/queues/q/messages", json={"messages": [{"body": i}]}, headers=as_project(f"p{i}")
        )
        assert r.status_code == 201
    placed = [await pooled.catalogue.lookup(QueueRef(f"p{i}", "q")) for i in range(80)]
    assert placed.count("docs") == 0
    assert placed.count("red") + placed.count("blue") == 80
    assert 5 <= placed.count("red") < placed.count("blue")  # 10 : 30


async def test_a_queue_is_served_from_its_pool_only(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str], namespace: str
) -> None:
    pools = await pooled.catalogue.list_pools()
    for pool_name in three_pools:
        headers = as_project(project_in(pool_name, pools))
        await client.post(
            "/v2/queues/jobs/messages", json={"messages": [{"body": pool_name}]}, headers=headers
        )
        claimed = await client.post("/v2/queues/jobs/claims", json={"ttl": 60}, headers=headers)
        assert [m["body"] for m in claimed.json()["messages"]] == [pool_name]
        # The backend itself holds it, and no other pool does (read straight from each server).
        q = QueueRef(headers["X-Project-ID"], "jobs")
        for other, uri in three_pools.items():
            driver = open_store(uri, namespace=namespace)
            stats = await driver.stats(q)
            await driver.aclose()
            assert (stats.total, stats.claimed) == ((1, 1) if other == pool_name else (0, 0)), other
        listed = (await client.get("/v2/queues", headers=headers)).json()
        assert [x["name"] for x in listed["queues"]] == ["jobs"]


# -- dead-letter queues stay in their source's pool ----------------------------------------------------------


async def test_a_dlq_in_another_pool_is_refused_naming_both(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str]
) -> None:
    r = await client.put("/v2/flavors/documents", json={"pool_list": ["docs"]}, headers=ADMIN)
    assert r.status_code == 201
    project = project_in("red", await pooled.catalogue.list_pools())
    headers = as_project(project)
    assert (
        await client.put("/v2/queues/archive", json={"_flavor": "documents"}, headers=headers)
    ).status_code == 201
    assert (await client.put("/v2/queues/orders", headers=headers)).status_code == 201
    op = [{"op": "add", "path": "/metadata/_dead_letter_queue", "value": "archive"}]
    r = await client.patch("/v2/queues/orders", json=op, headers={**headers, "Content-Type": JSON_PATCH})
    assert r.status_code == 400
    description = r.json()["description"]
    assert "'archive' lives in pool 'docs'" in description
    assert "'orders' in pool 'red'" in description
    assert "_dead_letter_queue" not in (await client.get("/v2/queues/orders", headers=headers)).json()
    # A new queue naming a placed DLQ joins the DLQ's pool instead.
    r = await client.put("/v2/queues/invoices", json={"_dead_letter_queue": "archive"}, headers=headers)
    assert r.status_code == 201
    assert await pooled.catalogue.lookup(QueueRef(project, "invoices")) == "docs"


async def test_a_new_dlq_is_made_in_its_source_pool_and_messages_move_there(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str], clock: ManualClock
) -> None:
    project = project_in("blue", await pooled.catalogue.list_pools())
    headers = as_project(project)
    meta = {"_max_claim_count": 1, "_dead_letter_queue": "orders.dlq"}
    assert (await client.put("/v2/queues/orders", json=meta, headers=headers)).status_code == 201
    assert await pooled.catalogue.lookup(QueueRef(project, "orders.dlq")) == "blue"
    await client.post("/v2/queues/orders/messages", json={"messages": [{"body": "poison"}]}, headers=headers)
    claim = await client.post("/v2/queues/orders/claims", json={"ttl": 60}, headers=headers)
    await client.delete(claim.headers["Location"], headers=headers)  # released: its last claim is used
    assert (
        await client.post("/v2/queues/orders/claims", json={"ttl": 60}, headers=headers)
    ).status_code == 204
    moved = await client.post(
        "/v2/queues/orders.dlq/claims?provenance=true", json={"ttl": 60}, headers=headers
    )
    assert [(m["body"], m["dead_letter"]["source_queue"]) for m in moved.json()["messages"]] == [
        ("poison", "orders")
    ]


async def test_a_deleted_dlq_that_is_still_named_keeps_its_pool(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str]
) -> None:
    project = project_in("red", await pooled.catalogue.list_pools())
    headers = as_project(project)
    dlq = QueueRef(project, "dead")
    await client.put("/v2/queues/src", json={"_dead_letter_queue": "dead"}, headers=headers)
    await client.delete("/v2/queues/dead", headers=headers)
    assert await pooled.catalogue.lookup(dlq) == "red"  # src's next move must land where routing looks
    op = [{"op": "remove", "path": "/metadata/_dead_letter_queue"}]
    await client.patch("/v2/queues/src", json=op, headers={**headers, "Content-Type": JSON_PATCH})
    await client.delete("/v2/queues/dead", headers=headers)
    assert await pooled.catalogue.lookup(dlq) is None


# -- deleting pools, flavors, health -------------------------------------------------------------------------


async def test_a_pool_holding_queues_cannot_be_deleted(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str]
) -> None:
    project = project_in("blue", await pooled.catalogue.list_pools())
    await client.put("/v2/queues/stays", headers=as_project(project))
    r = await client.delete("/v2/pools/blue", headers=ADMIN)
    assert r.status_code == 409
    assert f"{project}/stays" in r.json()["description"]
    await client.delete("/v2/queues/stays", headers=as_project(project))
    assert (await client.delete("/v2/pools/blue", headers=ADMIN)).status_code == 204


async def test_flavors_group_pools_and_place_queues(
    client: httpx.AsyncClient, pooled: PooledStore, three_pools: dict[str, str]
) -> None:
    body = {"pool_list": ["blue", "docs"], "capabilities": {"durable": True}}
    assert (await client.put("/v2/flavors/gold", json=body, headers=ADMIN)).status_code == 201
    assert (await client.put("/v2/flavors/gold", json=body, headers=ADMIN)).status_code == 409
    shown = (await client.get("/v2/flavors/gold", headers=ADMIN)).json()
    assert shown == {
        "name": "gold",
        "href": "/v2/flavors/gold",
        "pool_list": ["blue", "docs"],
        "capabilities": {"durable": True},
    }
    for i in range(10):
        await client.put("/v2/queues/vip", json={"_flavor": "gold"}, headers=as_project(f"f{i}"))
        assert await pooled.catalogue.lookup(QueueRef(f"f{i}", "vip")) in {"blue", "docs"}
        await client.put("/v2/queues/plain", headers=as_project(f"f{i}"))
        assert await pooled.catalogue.lookup(QueueRef(f"f{i}", "plain")) == "red"  # the only flavorless pool
    r = await client.put("/v2/queues/x", json={"_flavor": "tin"}, headers=as_project("f0"))
    assert r.status_code == 400
    assert "'tin' is not a flavor" in r.json()["description"]
    r = await client.patch("/v2/flavors/gold", json={"pool_list": ["blue", "nope"]}, headers=ADMIN)
    assert r.status_code == 400
    assert "nope" in r.json()["description"]
    r = await client.patch("/v2/flavors/gold", json={"pool_list": ["docs"]}, headers=ADMIN)
    assert r.json()["pool_list"] == ["docs"]
    listed = (await client.get("/v2/flavors", headers=ADMIN)).json()
    assert [f["name"] for f in listed["flavors"]] == ["gold"]
    assert (await client.delete("/v2/flavors/gold", headers=ADMIN)).status_code == 204
    assert (await client.get("/v2/pools/docs", headers=ADMIN)).json()["flavor"] is None


async def test_no_pool_for_a_new_queue_is_a_clear_503(client: httpx.AsyncClient, redis_url: str) -> None:
    r = await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]})
    assert r.status_code == 503
    assert "PUT /v2/pools/{name}" in r.json()["description"]
    await client.put("/v2/pools/off", json={"uri": redis_url, "weight": 0}, headers=ADMIN)
    assert (await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]})).status_code == 503
    assert (await client.get("/v2/queues/q/stats")).status_code == 200  # a queue never placed reads empty


async def test_admins_see_each_pool_in_health(client: httpx.AsyncClient, three_pools: dict[str, str]) -> None:
    detailed = await client.get("/v2/health", headers=ADMIN)
    assert detailed.status_code == 200
    assert detailed.json() == {
        "storage_reachable": True,
        "catalog_reachable": True,
        "pools": {name: {"storage_reachable": True} for name in ("blue", "docs", "red")},
    }
    assert (await client.get("/v2/health")).json() == {"storage_reachable": True, "storage_writable": True}


async def test_redrive_tasks_run_while_another_pool_is_down(
    pooled: PooledStore, client: httpx.AsyncClient, three_pools: dict[str, str]
) -> None:
    """A task whose runner died is adopted from the pools that answer, even with an unreachable pool listed
    first: one pool's outage does not stop the others' redrives."""
    project = project_in("red", await pooled.catalogue.list_pools())
    dlq = QueueRef(project, "jobs.dlq")
    await pooled.post_messages(
        dlq, [NewMessage(body=1)], client_id=CLIENT_ID, default_ttl=3600, default_delay=0, body_size=1
    )
    await pooled.create_redrive(dlq, TaskId("a" * 32), RedriveSpec(), owner="dead", lease_ms=0)
    await pooled.catalogue.put_pool(Pool("aaa-down", f"redis://127.0.0.1:{free_port()}", weight=0))
    assert await pooled.lease_redrives("heir", lease_ms=10_000, limit=4) == [(dlq, TaskId("a" * 32))]
