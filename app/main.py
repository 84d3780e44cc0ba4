"""create_app(): the FastAPI application, its store opened and closed by the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.access import AccessLog, RequestLog
from api.auth import Authenticator, AuthMode
from api.contract import refine
from api.errors import register_error_handlers
from api.head import HeadAsGet
from api.keystone import TokenValidator
from api.metrics import HttpMetrics
from api.policy import Policy
from api.routes import admin, claims, docs, health, messages, queues, redrive, subscriptions
from api.routes import metrics as metrics_route
from api.routing import PlainRoute, documented
from api.schemas import REQUEST_MODELS
from app.embedded import EmbeddedRedis
from app.settings import Settings
from core.clock import Clock, SystemClock
from service.delivery import Deliverer
from service.gauges import StoreGauges
from service.notifier import Notifier
from service.redrive import RedriveRunner
from service.sweeper import run_sweeper
from service.waiting import LongPolls
from storage.base import Store
from storage.pooling.store import PooledStore
from storage.registry import open_catalogue, open_store
from storage.traced import traced

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.trace import TracerProvider

VERSION = "0.1.0"

log = logging.getLogger("charon")


@contextlib.contextmanager
def answer_long_polls_on_exit(polls: LongPolls) -> Iterator[None]:
    """Uvicorn finishes the requests in flight before the lifespan ends, so a claim waiting 20 s would hold
    the shutdown that long: on SIGTERM/SIGINT, waiting claims answer at once, then uvicorn's own handler
    runs. (Only where signals can be caught: the main thread of a process that serves.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_exit(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(polls.close)
        handler = previous[signal.Signals(sig)]
        if callable(handler):
            handler(sig, frame)
        elif handler == signal.SIG_DFL:
            signal.default_int_handler(sig, frame) if sig == signal.SIGINT else sys.exit(0)

    for sig in previous:
        signal.signal(sig, on_exit)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is on_exit:
                signal.signal(sig, handler)


def authenticator(settings: Settings, clock: Clock) -> Authenticator:
    """How the app identifies callers and checks its policy rules (api/auth.py), from the settings."""
    rules = Policy(settings.admin_role, settings.policy_file)
    if rules.unknown_rules:
        log.warning("the policy file names rules no operation checks: %s", ", ".join(rules.unknown_rules))
    key = settings.signed_url_key.get_secret_value().encode() if settings.signed_url_key else None
    validator = TokenValidator(settings.keystone) if settings.auth is AuthMode.KEYSTONE else None
    return Authenticator(
        settings.auth,
        rules,
        roles_header=settings.roles_header,
        clock=clock,
        validator=validator,
        signing_key=key,
        authenticate_uri=settings.keystone.authenticate_uri,
    )


NOTIFIER_INTERVAL_S = 0.1  # how often a notifier looks for due deliveries when the last look found few


def notifier(
    store: Any, deliverer: Deliverer, settings: Settings, clock: Clock, busy: Callable[[], bool] | None = None
) -> Notifier:
    """The notifier of `store` (a Store, or a callable giving the current one), sending by `deliverer`;
    `busy`: service/notifier.py Notifier's."""
    n = settings.notifications
    key = settings.signed_url_key
    return Notifier(
        store,
        deliverer,
        clock=clock,
        # a lease outlives a delivery's longest try (its slot wait and its request), with room to finish it
        lease_ms=int((2 * n.webhook_timeout + 10) * 1000),
        batch=n.max_concurrent,
        interval=NOTIFIER_INTERVAL_S,
        signing_key=None if key is None else key.get_secret_value().encode(),
        notice_ttl=settings.limits.default_subscription_ttl,
        busy=busy,
    )


def open_configured_store(settings: Settings, clock: Clock) -> tuple[Store, EmbeddedRedis | None]:
    """The store the settings name (pooled with CHARON_POOLING), or an embedded redis-server started here when
    none is named (returned too: the caller stops it after closing the store)."""
    embedded = None
    uri = settings.store_uri()
    if uri is None:
        embedded = EmbeddedRedis(settings.data_dir, settings.redis_server)
        uri = embedded.start()
    timeout, defaults = settings.storage_timeout, settings.dead_letter_defaults()
    if settings.pooling:
        catalogue = open_catalogue(uri, namespace=settings.namespace, timeout=timeout)
        pooled = PooledStore(
            catalogue, namespace=settings.namespace, clock=clock, defaults=defaults, timeout=timeout
        )
        return pooled, embedded
    opened = open_store(uri, namespace=settings.namespace, clock=clock, defaults=defaults, timeout=timeout)
    return opened, embedded


def api_app() -> FastAPI:
    """What `charon serve`'s workers run when the notifier is a process of its own
    (CHARON_NOTIFICATIONS__PROCESS): the app without a notifier."""
    return create_app(notify=False)


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    tracer_provider: TracerProvider | None = None,
    notify: bool = True,
) -> FastAPI:
    """Build the app. With `store` given the caller owns it; otherwise the lifespan opens the configured one
    (an embedded redis-server when no storage URI is set) and closes it at shutdown. With CHARON_TRACING,
    spans go to `tracer_provider` (the caller's), else to an OTLP exporter the lifespan shuts down. With
    `notify`, the process runs a notifier in its event loop (app/notify.py runs one in a process of its
    own)."""
    settings = settings or Settings()
    clock = clock or SystemClock()
    exporting: SDKTracerProvider | None = None
    if settings.tracing and tracer_provider is None:
        from app.tracing import exporting_provider

        tracer_provider = exporting = exporting_provider(settings)

    defaults = settings.dead_letter_defaults()

    @asynccontextmanager
    async def sweeping(active: Store) -> AsyncIterator[None]:
        """The background work of every process: the sweeper (unless turned off), redrive adoption and (with
        `notify`) the notifier."""
        tasks = [asyncio.create_task(app.state.redrive.run_forever(), name="charon-redrive")]
        if notify:
            tasks.append(asyncio.create_task(app.state.notifier.run(), name="charon-notifier"))
        if settings.sweep_interval > 0:
            sweeper = run_sweeper(active, settings.sweep_interval)
            tasks.append(asyncio.create_task(sweeper, name="charon-sweeper"))
        try:
            with answer_long_polls_on_exit(app.state.long_polls):
                yield
        finally:
            await app.state.long_polls.aclose()
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app.state.deliverer.aclose()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with serving():
                yield
        finally:
            if access_log is not None:
                access_log.flush()  # the lines still waiting
            if exporting is not None:
                exporting.shutdown()  # sends the spans still batched

    @asynccontextmanager
    async def serving() -> AsyncIterator[None]:
        if store is not None:
            app.state.store = requests_store(store)
            async with sweeping(store):
                yield
            return
        opened, embedded = open_configured_store(settings, clock)
        app.state.store = requests_store(opened)
        try:
            async with sweeping(opened):
                yield
        finally:
            await opened.aclose()
            if embedded is not None:
                embedded.stop()

    app = FastAPI(
        title="Charon",
        version=VERSION,
        description="A Zaqar-v2-compatible message queue with first-class dead-letter queues.",
        lifespan=lifespan,
        # No redirect from /x/ to /x: a 307 keeps its method, and DELETE .../messages/..%2f was sent on to
        # DELETE /v2/queues/<name>/ and then to the queue itself. A path that matches nothing is a JSON 404.
        redirect_slashes=False,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.limits = settings.limits
    app.state.provenance = settings.provenance
    app.state.clock = clock
    app.state.defaults = defaults
    app.state.storage_check = health.StorageCheck()
    app.state.auth = authenticator(settings, clock)
    app.state.redrive = RedriveRunner(
        lambda: app.state.store, clock=clock, lease_ms=int(settings.redrive_lease * 1000)
    )
    app.state.deliverer = Deliverer(settings.notifications)
    app.state.notifier = notifier(lambda: app.state.store, app.state.deliverer, settings, clock)
    app.state.long_polls = LongPolls(
        lambda: app.state.store, clock=clock, max_waiting=settings.limits.max_waiting_claims
    )
    register_error_handlers(app)
    declared = [
        r for m in (messages, claims, health, queues, subscriptions, redrive, admin) for r in m.router.routes
    ]
    # The router tries routes in order, a regular expression each: the hot routes go first (no route
    # shadows another, so the order changes nothing else; tests/api/test_dispatch.py).
    hot = [r for r in declared if isinstance(r, PlainRoute)]
    app.router.routes[:0] = hot
    app.router.routes.extend(r for r in declared if r not in hot)
    # GET /metrics, and the HTTP series: counted inside HeadAsGet, which hides the matched route from outside
    app.state.metrics = StoreGauges(
        lambda: app.state.store,
        clock=clock,
        max_queues=settings.metrics.max_queues,
        max_read=settings.metrics.max_queues_read,
        cache_seconds=settings.metrics.cache_seconds,
        sweeping=settings.sweep_interval > 0,
    )
    declared += metrics_route.router.routes
    app.router.routes += metrics_route.router.routes + docs.router.routes  # /docs, /redoc: not documented
    access_log = app.state.access_log = (
        AccessLog(text=settings.log_format == "text") if settings.access_log else None
    )
    app.add_middleware(RequestLog, log=access_log, metrics=HttpMetrics())
    app.add_middleware(HeadAsGet)  # outside RequestLog, which sees a HEAD as the GET it is served by
    tracer = None
    if settings.tracing:
        from app.tracing import instrument

        assert tracer_provider is not None
        tracer = instrument(app, tracer_provider)

    def requests_store(active: Store) -> Store:
        """The store requests use (app.state.store): with tracing, each call a span. The sweeper's calls
        are not traced: it runs every CHARON_SWEEP_INTERVAL, in no request."""
        return traced(active, tracer) if tracer is not None else active

    if store is not None:
        app.state.store = requests_store(store)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=documented(declared),  # in the order declared, not dispatched
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in REQUEST_MODELS:  # bodies parsed by hand (size limit first) still get documented
                doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(doc.pop("$defs", {}))
                components[model.__name__] = doc
            refine(schema, settings.limits, settings.auth.value)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
