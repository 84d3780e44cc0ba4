"""The dead-letter export (storage/export.py) on every store flavour, Redis Cluster included: every message of
a DLQ read exactly once, in marker order, across pages and slices, with what the driver lists for it;
expired messages and messages deleted before the read skipped."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import pytest

from core.clock import ManualClock
from core.errors import StorageUnavailable
from core.limits import Limits
from core.metadata import parse_policy
from core.models import NewMessage, QueueRef
from storage.base import Store
from storage.export import PAGE_SIZE, DeadLetterExport
from storage.mongodb.store import MongoStore
from storage.registry import open_export, open_store
from tests.pipeline.conftest import listed
from tests.servers import RedisServer

PROJECT = "exported"
DLQ = "orders.dlq"
MESSAGES = PAGE_SIZE + 700  # more than one page
SHORT_TTL_S = 60


@dataclass
class Filled:
    store: Store
    export: DeadLetterExport
    clock: ManualClock
    kept: dict[str, dict[str, object]]  # id -> body of the messages the export must read
    posted_ms: int


@pytest.fixture(params=["redis", "redis-resp2", "cluster", "mongo"])
async def filled(request: pytest.FixtureRequest) -> AsyncIterator[Filled]:
    fixture = {"cluster": "redis_cluster_url", "mongo": "mongodb_uri"}.get(request.param, "redis_url")
    uri: str = request.getfixturevalue(fixture)
    if request.param == "redis-resp2":  # the export reads replies as sent, so both protocols
        uri += "?protocol=2"
    namespace = f"x{uuid.uuid4().hex[:10]}"
    clock = ManualClock()
    store = open_store(uri, namespace=namespace, clock=clock)
    q = QueueRef(PROJECT, DLQ)
    await store.create_queue(q, metadata={}, policy=parse_policy({}, Limits(), queue=DLQ))
    posted_ms = clock.now_ms()
    bodies = [{"n": n, "text": f"message {n} ü"} for n in range(MESSAGES)]
    ids = await store.post_messages(
        q,
        [NewMessage(b, ttl=SHORT_TTL_S if n % 10 == 3 else 3600) for n, b in enumerate(bodies)],
        client_id="test",
        default_ttl=3600,
        default_delay=0,
        body_size=0,
    )
    gone = {ids[n] for n in range(0, MESSAGES, 97)}
    await store.delete_messages(q, sorted(gone))
    kept = {i: b for n, (i, b) in enumerate(zip(ids, bodies, strict=True)) if n % 10 != 3 and i not in gone}
    try:
        yield Filled(store, open_export(uri, namespace=namespace), clock, kept, posted_ms)
    finally:
        if isinstance(store, MongoStore):
            await store.drop_collections()
        await store.aclose()


async def test_every_message_is_read_once_in_marker_order(filled: Filled) -> None:
    [extent] = filled.export.extents(PROJECT, [DLQ])
    now_ms = filled.posted_ms + (SHORT_TTL_S + 1) * 1000  # the short-lived ones have expired
    pages = [page for s in extent.cut(3, now_ms=now_ms) for page in filled.export.read(s)]
    read = [
        (_text(i), int(m), _text(b))
        for p in pages
        for i, m, b in zip(p.columns["id"], p.columns["marker"], p.columns["body"], strict=True)
    ]
    assert all(len(p) <= PAGE_SIZE for p in pages)
    assert [m for _, m, _ in read] == sorted({m for _, m, _ in read})  # in order, none twice
    assert {i for i, _, _ in read} == set(filled.kept)
    filled.clock.advance(SHORT_TTL_S + 1)
    assert {m.id for m in await listed(filled.store, QueueRef(PROJECT, DLQ))} == set(filled.kept)
    assert all(orjson.loads(b) == filled.kept[i] for i, _, b in read)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


async def test_a_server_gone_during_the_read_is_named() -> None:
    """The Redis server stops between two pages: the read fails with the store named, not with a page cut
    short or a redis-py error."""
    server = RedisServer().start()
    try:
        store = open_store(server.url, namespace="gone")
        q = QueueRef(PROJECT, DLQ)
        await store.create_queue(q, metadata={}, policy=parse_policy({}, Limits(), queue=DLQ))
        await store.post_messages(
            q,
            [NewMessage({"n": n}, ttl=3600) for n in range(MESSAGES)],
            client_id="test",
            default_ttl=3600,
            default_delay=0,
            body_size=0,
        )
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
