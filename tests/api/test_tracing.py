"""CHARON_TRACING (app/tracing.py, storage/traced.py): a request is a span named by its route template, plain
Starlette routes as well as FastAPI ones, and each storage call a child span of it; off, nothing is
instrumented. Spans go to the SDK's in-memory exporter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.pooling.store import PooledStore
from storage.traced import TRACED, TracedStore, unwrapped
from tests.conftest import PROJECT, api_client

TRACING = Settings(storage_uri="redis://unused", tracing=True)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def children(spans: tuple[ReadableSpan, ...], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_a_request_is_a_span_of_its_route_with_a_child_span_per_storage_call(
    store: Store, clock: ManualClock, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = create_app(TRACING, store=store, clock=clock, tracer_provider=provider)
    async with api_client(app) as c:
        posted = await c.post("/v2/queues/traced/messages", json={"messages": [{"body": 1}]})  # plain route
        stats = await c.get("/v2/queues/traced/stats")  # a FastAPI route
        missing = await c.get("/v2/nowhere")
    assert (posted.status_code, stats.status_code, missing.status_code) == (201, 200, 404)
    spans = exporter.get_finished_spans()
    post, get, unrouted = [s for s in spans if s.kind is SpanKind.SERVER]
    assert post.name == "POST /v2/queues/{queue_name}/messages"
    assert post.attributes is not None
    assert post.attributes["http.route"] == "/v2/queues/{queue_name}/messages"
    assert get.name == "GET /v2/queues/{queue_name}/stats"
    assert unrouted.name == "GET"  # no route: not the raw path
    # the project's first request reads its quota overrides (service/ratelimit.py), then posts
    quota, stored = children(spans, post)
    assert (quota.name, stored.name) == ("store.get_quota", "store.post_messages")
    assert stored.kind is SpanKind.CLIENT
    assert stored.context is not None
    assert post.context is not None
    assert stored.context.trace_id == post.context.trace_id
    assert dict(stored.attributes or {}) == {"charon.project": PROJECT, "charon.queue": "traced"}
    assert "store.stats" in [s.name for s in children(spans, get)]
    assert children(spans, unrouted) == []


async def test_off_nothing_is_instrumented(
    store: Store, clock: ManualClock, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    settings = Settings(storage_uri="redis://unused")
    assert settings.tracing is False  # the default
    app = create_app(settings, store=store, clock=clock, tracer_provider=provider)
    assert not getattr(app, "_is_instrumented_by_opentelemetry", False)
    assert state_of(app).store is store
    async with api_client(app) as c:
        assert (await c.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]})).status_code == 201
    assert exporter.get_finished_spans() == ()


def test_every_coroutine_of_the_store_interface_is_traced() -> None:
    """Read from the protocol: a method added to storage.base.Store is traced without a change."""
    assert {"post_messages", "claim", "delete_message", "stats", "ping", "create_subscription"} <= set(TRACED)
    assert "wakeups" not in TRACED  # not a coroutine: the wrapped store's own
    for name in TRACED:
        assert name in TracedStore.__dict__, name


async def test_tracing_keeps_the_admin_api_of_a_pooled_redis_store(
    redis_url: str, clock: ManualClock, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """What asks for a PooledStore asks the store inside the traced one (storage.traced.unwrapped)."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    catalogue = RedisCatalogue.from_url(redis_url, namespace=namespace)
    await catalogue.put_pool(Pool("one", redis_url, weight=1, options={"namespace": namespace}))
    pooled = PooledStore(catalogue, namespace=namespace, clock=clock)
    settings = Settings(storage_uri="redis://unused", tracing=True, admin_mode=True)
    app = create_app(settings, store=pooled, clock=clock, tracer_provider=provider)
    assert isinstance(state_of(app).store, TracedStore)
    assert unwrapped(state_of(app).store) is pooled
    try:
        async with api_client(app) as c:
            pools = await c.get("/v2/pools", headers={"X-Roles": "admin"})
            flavored = await c.put("/v2/queues/f", json={"_flavor": "none-such"})
    finally:
        await pooled.aclose()
    assert pools.status_code == 200, pools.text
    assert [p["name"] for p in pools.json()["pools"]] == ["one"]
    # the pooled store's answer (no such flavor), not that the service runs without pools
    assert flavored.status_code == 400
    assert "is not a flavor of this service" in flavored.text
    assert any(s.name.startswith("store.") for s in exporter.get_finished_spans())
