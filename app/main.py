"""create_app(): the FastAPI application, built by small functions: its typed state (`app_state`, read through
api/state.py `state_of`), its routes (`add_routes`), its OpenAPI document (`openapi`); and the lifespan, which
opens and closes the store and runs the background work (`lifespan`, `opened_store`, `background`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.routing import BaseRoute

from api import websocket
from api.access import AccessLog, RequestLog
from api.auth import Authenticator, AuthMode
from api.contract import refine
from api.cors import Cors
from api.errors import register_error_handlers
from api.head import HeadAsGet
from api.keystone import TokenValidator, Trustee
from api.metrics import HttpMetrics
from api.policy import Policy
from api.routes import (
    admin,
    claims,
    console,
    docs,
    health,
    messages,
    queues,
    quotas,
    redrive,
    subscriptions,
    topics,
)
from api.routes import metrics as metrics_route
from api.routing import App, PlainRoute, documented
from api.schemas import REQUEST_MODELS
from api.state import AppState, attach, state_of
from api.ws_notices import Notices
from app.embedded import EmbeddedRedis
from app.settings import Settings
from core import sealing
from core.clock import Clock, SystemClock
from core.quotas import READS, WRITES
from service.delivery import Deliverer
from service.gauges import StoreGauges
from service.notifier import Notifier
from service.ratelimit import RateLimiter
from service.redrive import RedriveRunner
from service.sweeper import run_sweeper
from service.waiting import LongPolls
from storage.base import Store
from storage.pooling.store import PooledStore
from storage.registry import open_catalogue, open_store
from storage.traced import traced

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
    from opentelemetry.trace import Tracer, TracerProvider

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


def authenticator(
    settings: Settings, clock: Clock, store: Callable[[], Store | None] | None = None
) -> Authenticator:
    """How the app identifies callers, checks its policy rules and the projects' request rates (api/auth.py),
    from the settings; `store`: the requests' store, where the rates' buckets are (None: no rate checked,
    for `charon serve`'s check of the settings)."""
    q = settings.quotas
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
        limiter=None
        if store is None
        else RateLimiter(
            store,
            clock=clock,
            defaults={READS: q.reads_per_second, WRITES: q.writes_per_second},
            burst_seconds=q.burst_seconds,
            cache_seconds=q.cache_seconds,
        ),
    )


def trustee(settings: Settings) -> Trustee | None:
    """The service user as trustee of trust+ subscribers' Keystone trusts; None without Keystone."""
    return Trustee(settings.keystone) if settings.auth is AuthMode.KEYSTONE else None


def deliverer(settings: Settings, trusts: Trustee | None) -> Deliverer:
    """The process's Deliverer, trust+ subscribers notified with tokens of `trusts`' trusts."""
    return Deliverer(settings.notifications, trust_tokens=None if trusts is None else trusts.token)


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
        management = open_store(uri, namespace=settings.namespace, clock=clock, timeout=timeout)  # quotas
        pooled = PooledStore(
            catalogue,
            namespace=settings.namespace,
            clock=clock,
            defaults=defaults,
            timeout=timeout,
            management=management,
            quotas=settings.quotas.counted(),
        )
        return pooled, embedded
    opened = open_store(
        uri,
        namespace=settings.namespace,
        clock=clock,
        defaults=defaults,
        timeout=timeout,
        quotas=settings.quotas.counted(),
    )
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
    sealing.use(settings.encryption.keyring())  # the process's keys: the drivers seal and open with them
    clock = clock or SystemClock()
    provider, exporting = tracer_providers(settings, tracer_provider)
    serving = Serving(settings, clock, store, notify, store_tracer(provider), exporting)
    app = App(
        title="Charon",
        version=VERSION,
        description="A Zaqar-v2-compatible message queue with first-class dead-letter queues.",
        lifespan=partial(lifespan, serving=serving),
        # No redirect from /x/ to /x: a 307 keeps its method, and DELETE .../messages/..%2f was sent on to
        # DELETE /v2/queues/<name>/ and then to the queue itself. A path that matches nothing is a JSON 404.
        redirect_slashes=False,
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry off: Charon's tracing is CHARON_TRACING's (app/tracing.py). Left on, it
        # asks the global providers on every request (three environment reads: 5 us of a 33 us ping) and,
        # with an SDK configured, would trace each request a second time.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    state = app_state(settings, clock)
    if store is not None:
        state.store = serving.requests_store(store)
    attach(app, state)
    register_error_handlers(app)
    declared = add_routes(app)
    if settings.cors.on:  # inside RequestLog: a preflight has a request id and an access line too
        c = settings.cors
        app.add_middleware(
            Cors,
            origins=c.allowed_origin,
            methods=c.allow_methods,
            headers=c.allow_headers,
            expose=c.expose_headers,
            credentials=c.allow_credentials,
            max_age=c.max_age,
        )
    # GET /metrics, and the HTTP series: counted inside HeadAsGet, which hides the matched route from outside
    app.add_middleware(RequestLog, log=state.access_log, metrics=HttpMetrics())
    app.add_middleware(HeadAsGet)  # outside RequestLog, which sees a HEAD as the GET it is served by
    if provider is not None:
        from app.tracing import instrument

        instrument(app, provider)
    app.openapi = partial(openapi, app, declared, settings)  # type: ignore[method-assign]
    return app


def tracer_providers(
    settings: Settings, given: TracerProvider | None
) -> tuple[TracerProvider | None, SDKTracerProvider | None]:
    """With CHARON_TRACING, where spans go: the caller's provider, else an OTLP exporter's (returned twice:
    the lifespan shuts that one down). (None, None) with tracing off."""
    if not settings.tracing:
        return None, None
    if given is not None:
        return given, None
    from app.tracing import exporting_provider

    made = exporting_provider(settings)
    return made, made


def store_tracer(provider: TracerProvider | None) -> Tracer | None:
    """The tracer of the store's spans, when tracing."""
    if provider is None:
        return None
    from app.tracing import STORE_TRACER

    return provider.get_tracer(STORE_TRACER)


def app_state(settings: Settings, clock: Clock) -> AppState:
    """What requests read (api/state.py), from the settings; without its store, which the caller or the
    lifespan sets. The background services reach the store through the state, so they use the one the
    requests use."""
    limits = settings.limits
    token = settings.metrics.bearer_token
    trusts = trustee(settings)
    sender = deliverer(settings, trusts)

    def store() -> Store:
        return state.store

    def opened_store() -> Store | None:  # None until the lifespan (or the caller) sets it
        return getattr(state, "store", None)

    state = AppState(
        clock=clock,
        limits=limits,
        defaults=settings.dead_letter_defaults(),
        quotas=settings.quotas.counted(),
        provenance=settings.provenance,
        checksum=settings.enable_checksum,
        insights_report_url=settings.insights_report_url,
        cors_origins=tuple(settings.cors.allowed_origin),
        strict_parameters=settings.strict_parameters,
        admin_mode=settings.admin_mode,
        idempotency_window_ms=settings.idempotency_window * 1000,
        storage_timeout=settings.storage_timeout,
        namespace=settings.namespace,
        notifications=settings.notifications,
        metrics_token=None if token is None else token.get_secret_value().encode(),
        metrics_loopback=settings.metrics.allow_loopback,
        auth=authenticator(settings, clock, opened_store),
        trustee=trusts,
        storage_check=health.StorageCheck(),
        long_polls=LongPolls(store, clock=clock, max_waiting=limits.max_waiting_claims),
        redrive=RedriveRunner(store, clock=clock, lease_ms=int(settings.redrive_lease * 1000)),
        deliverer=sender,
        ws_notices=Notices(max_body=limits.max_messages_post_size + limits.max_subscription_options + 65536),
        notifier=notifier(store, sender, settings, clock),
        gauges=StoreGauges(
            store,
            clock=clock,
            max_queues=settings.metrics.max_queues,
            max_read=settings.metrics.max_queues_read,
            cache_seconds=settings.metrics.cache_seconds,
            sweeping=settings.sweep_interval > 0,
            quotas=settings.quotas.counted(),
        ),
        access_log=AccessLog(text=settings.log_format == "text") if settings.access_log else None,
    )
    return state


# the routers of the OpenAPI document, in its order
DECLARED = (messages, claims, health, queues, subscriptions, redrive, quotas, admin)


def add_routes(app: FastAPI) -> list[BaseRoute]:
    """Every route on the app's one router; the routes the OpenAPI document shows, in the order declared."""
    declared = [r for m in DECLARED for r in m.router.routes]
    # The router tries routes in order, a regular expression each: the hot routes go first (no route
    # shadows another, so the order changes nothing else; tests/api/test_dispatch.py).
    hot = [r for r in declared if isinstance(r, PlainRoute)]
    app.router.routes[:0] = hot
    app.router.routes.extend(r for r in declared if r not in hot)
    topical = topics.topic_routes()  # after every queue route: a queue's request tries none of them
    app.router.routes += topical + metrics_route.router.routes + docs.router.routes + console.router.routes
    app.router.routes += websocket.ROUTES  # websocket scopes only: GET / is still the versions document
    return declared + topical + metrics_route.router.routes


def openapi(app: FastAPI, declared: list[BaseRoute], settings: Settings) -> dict[str, Any]:
    """The app's OpenAPI document (`app.openapi`), made on the first call."""
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


@dataclass(frozen=True, slots=True)
class Serving:
    """What the lifespan needs beside the app's state."""

    settings: Settings
    clock: Clock
    store: Store | None  # the caller's, who closes it; None: the configured one, opened and closed here
    notify: bool  # run a notifier in this process's event loop
    tracer: Tracer | None  # CHARON_TRACING: the store's spans
    exporting: SDKTracerProvider | None  # the provider made here, which the lifespan shuts down

    def requests_store(self, active: Store) -> Store:
        """The store requests use (AppState.store): with tracing, each call a span. The sweeper's calls
        are not traced: it runs every CHARON_SWEEP_INTERVAL, in no request."""
        return traced(active, self.tracer) if self.tracer is not None else active


@asynccontextmanager
async def lifespan(app: FastAPI, serving: Serving) -> AsyncIterator[None]:
    """From startup to shutdown: the store and the background work; at exit, the access log's last lines
    and the spans still batched."""
    state = state_of(app)
    try:
        async with opened_store(serving) as active:
            state.store = serving.requests_store(active)
            async with background(state, active, serving):
                yield
    finally:
        if state.access_log is not None:
            state.access_log.flush()  # the lines still waiting
        if serving.exporting is not None:
            serving.exporting.shutdown()  # sends the spans still batched


@asynccontextmanager
async def opened_store(serving: Serving) -> AsyncIterator[Store]:
    """The caller's store, or the configured one, opened here and closed at exit (and the embedded
    redis-server, when one was started for it, stopped after)."""
    if serving.store is not None:
        yield serving.store
        return
    opened, embedded = open_configured_store(serving.settings, serving.clock)
    try:
        yield opened
    finally:
        await opened.aclose()
        if embedded is not None:
            embedded.stop()


@asynccontextmanager
async def background(state: AppState, active: Store, serving: Serving) -> AsyncIterator[None]:
    """The background work of every process: the sweeper on `active` (unless turned off), redrive adoption
    and (with `notify`) the notifier; at exit, waiting claims answered first."""
    tasks = [asyncio.create_task(state.redrive.run_forever(), name="charon-redrive")]
    if serving.notify:
        tasks.append(asyncio.create_task(state.notifier.run(), name="charon-notifier"))
    interval = serving.settings.sweep_interval
    if interval > 0:
        tasks.append(asyncio.create_task(run_sweeper(active, interval), name="charon-sweeper"))
    try:
        with answer_long_polls_on_exit(state.long_polls):
            yield
    finally:
        await state.long_polls.aclose()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await state.deliverer.aclose()
        await state.ws_notices.aclose()
