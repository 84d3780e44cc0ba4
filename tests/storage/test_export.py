"""The dead-letter export (storage/export.py) on every store flavour, Redis Cluster included: every message of
a DLQ read exactly once, in marker order, across pages and slices, with what the driver lists for it;
expired messages, messages deleted before the read and (Redis) messages whose hash is gone skipped, a whole
page of them included; a cluster slot that moves during the read followed; failures named."""

from __future__ import annotations

import gc
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest
import redis
import redis.asyncio as aioredis

from core.clock import ManualClock
from core.errors import StorageUnavailable
from core.limits import Limits
from core.metadata import parse_policy
from core.models import NewMessage, QueueRef
from storage.base import Store
from storage.export import PAGE_SIZE, DeadLetterExport, Page, Slice
from storage.mongodb.store import MongoStore
from storage.redis.keys import ProjectKeys
from storage.redis.store import cluster_options
from storage.registry import open_export, open_store
from tests.conftest import SLOW_SERVER_TIMEOUT_S
from tests.pipeline.conftest import listed
from tests.servers import RedisCluster, RedisServer

PROJECT = "exported"
DLQ = "orders.dlq"
MESSAGES = 2 * PAGE_SIZE + 300  # three pages read as one slice
EXPIRED = PAGE_SIZE + 10  # the first of them expire: the whole first page
SHORT_TTL_S = 60


@dataclass
class Filled:
    store: Store
    export: DeadLetterExport
    clock: ManualClock
    kept: dict[str, dict[str, object]]  # id -> body of the messages the export must read
    posted_ms: int


async def post(store: Store, n: int, ttl: dict[int, int] | None = None) -> list[str]:
    q = QueueRef(PROJECT, DLQ)
    await store.create_queue(q, metadata={}, policy=parse_policy({}, Limits(), queue=DLQ))
    return list(
        await store.post_messages(
            q,
            [NewMessage({"n": i, "text": f"message {i} ü"}, ttl=(ttl or {}).get(i, 3600)) for i in range(n)],
            client_id="test",
            default_ttl=3600,
            default_delay=0,
            body_size=0,
        )
    )


@pytest.fixture(params=["redis", "redis-resp2", "cluster", "mongo"])
async def filled(request: pytest.FixtureRequest) -> AsyncIterator[Filled]:
    fixture = {"cluster": "redis_cluster_url", "mongo": "mongodb_uri"}.get(request.param, "redis_url")
    uri: str = request.getfixturevalue(fixture)
    if request.param == "redis-resp2":  # the export reads replies as sent, so both protocols
        uri += "?protocol=2"
    namespace = f"x{uuid.uuid4().hex[:10]}"
    clock = ManualClock()
    # the fill is one post of 2,300 messages: on the Python wire server near 5 s when busy
    store = open_store(uri, namespace=namespace, clock=clock, timeout=SLOW_SERVER_TIMEOUT_S)
    posted_ms = clock.now_ms()
    ids = await post(store, MESSAGES, dict.fromkeys(range(EXPIRED), SHORT_TTL_S))
    deleted = {ids[i] for i in range(EXPIRED, MESSAGES, 97)}
    await store.delete_messages(QueueRef(PROJECT, DLQ), sorted(deleted))
    gone = set()  # (Redis) the hash gone, the id still in the queue: a message leaving during the read
    if request.param != "mongo":
        gone = {ids[i] for i in range(EXPIRED + 1, MESSAGES, 89)} - deleted
        client = (
            aioredis.RedisCluster(**cluster_options(uri))
            if request.param == "cluster"
            else aioredis.Redis.from_url(uri)
        )
        keys = ProjectKeys.of(namespace, PROJECT)
        for i in gone:
            await client.delete(keys.message(i))
        await client.aclose()
    kept = {
        i: {"n": n, "text": f"message {n} ü"}
        for n, i in enumerate(ids)
        if n >= EXPIRED and i not in deleted and i not in gone
    }
    try:
        yield Filled(store, open_export(uri, namespace=namespace), clock, kept, posted_ms)
    finally:
        if isinstance(store, MongoStore):
            await store.drop_collections()
        await store.aclose()


def rows(pages: list[Page]) -> list[tuple[str, int, str]]:
    return [
        (_text(i), int(m), _text(b))
        for p in pages
        for i, m, b in zip(p.columns["id"], p.columns["marker"], p.columns["body"], strict=True)
    ]


@pytest.mark.parametrize("slices", [1, 3])
async def test_every_message_is_read_once_in_marker_order(filled: Filled, slices: int) -> None:
    [extent] = filled.export.extents(PROJECT, [DLQ])
    now_ms = filled.posted_ms + (SHORT_TTL_S + 1) * 1000  # the short-lived ones have expired
    pages = [page for s in extent.cut(slices, now_ms=now_ms) for page in filled.export.read(s)]
    read = rows(pages)
    assert all(0 < len(p) <= PAGE_SIZE for p in pages)
    assert [m for _, m, _ in read] == sorted({m for _, m, _ in read})  # in order, none twice
    assert {i for i, _, _ in read} == set(filled.kept)
    assert all(orjson.loads(b) == filled.kept[i] for i, _, b in read)
    assert gc.isenabled()  # the export turns it off only while it parses a page
    filled.clock.advance(SHORT_TTL_S + 1)
    listed_ids = {m.id for m in await listed(filled.store, QueueRef(PROJECT, DLQ))}
    assert set(filled.kept) <= listed_ids


async def test_a_slot_moved_during_the_read_is_followed() -> None:
    """A reshard moves the queue's slot to another primary between two pages (as `redis-cli --cluster
    reshard` does): the read goes on from the new owner, every message once."""
    cluster = RedisCluster().start()
    try:
        store = open_store(cluster.url, namespace="moving")
        ids = await post(store, 3 * PAGE_SIZE)
        await store.aclose()
        export = open_export(cluster.url, namespace="moving")
        [extent] = export.extents(PROJECT, [DLQ])
        [part] = extent.cut(1, now_ms=0)
        pages = export.read(part)
        first = [next(pages)]
        move_slot(cluster, ProjectKeys.of("moving", PROJECT).messages(DLQ))
        read = rows(first + list(pages))
    finally:
        cluster.stop()
    assert [i for i, _, _ in read] == ids


def move_slot(cluster: RedisCluster, key: str) -> None:
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    slot = client.keyslot(key)
    source = client.get_node_from_key(key)
    target = next(n for n in client.get_primaries() if n.name != source.name)
    client.close()
    src = redis.Redis(host=source.host, port=source.port)
    dst = redis.Redis(host=target.host, port=target.port)
    src_id, dst_id = (c.execute_command("CLUSTER MYID").decode() for c in (src, dst))
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000):
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
    for node in cluster.nodes:
        redis.Redis(port=node.port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


async def test_a_server_gone_during_the_read_is_named() -> None:
    """The Redis server stops between two pages: the read fails with the store named, not with a page cut
    short or a redis-py error."""
    server = RedisServer().start()
    try:
        store = open_store(server.url, namespace="gone")
        await post(store, MESSAGES)
        await store.aclose()
        export = open_export(server.url, namespace="gone")
        [extent] = export.extents(PROJECT, [DLQ])
        [part] = extent.cut(1, now_ms=0)
        pages = export.read(part)
        assert len(next(pages)) == PAGE_SIZE
    finally:
        server.stop()
    with pytest.raises(StorageUnavailable, match=f"Cannot read Redis at {server.url}"):
        next(pages)


@pytest.mark.parametrize("uri", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"])
def test_an_unreachable_store_is_named(uri: str) -> None:
    export = open_export(uri, namespace="none")
    with pytest.raises(StorageUnavailable, match=re.escape(f"Cannot read Redis at {uri}")):
        export.extents(PROJECT, None)
    with pytest.raises(StorageUnavailable, match=re.escape(f"Cannot read Redis at {uri}")):
        next(iter(export.read(Slice(PROJECT, DLQ, 1, 10, 0))))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
