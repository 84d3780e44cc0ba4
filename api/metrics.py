"""The HTTP series of GET /metrics: every request counted by route template, method and status, and timed.

`HttpMetrics` is plain ASGI (no BaseHTTPMiddleware, whose task and streams would cost every request far more
than the counting does), inside HeadAsGet: it reads the route the router matched from the scope (a HEAD
served by its GET route is counted as HEAD). Each (route, method, status) keeps its two prometheus-client
children, so a request costs a dict lookup, a counter increment and a histogram observation
(bench/README.md, "What GET /metrics costs").
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.head import HEAD_KEY
from service.metrics import REGISTRY

UNMATCHED = "unmatched"  # the route label of a request no route matched (404, 405)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # the others: "other"
CLIENT_GONE = 499  # nginx's "client closed request": cancelled before any answer

HTTP_REQUESTS = Counter(
    "charon_http_requests_total",
    "HTTP requests by route template (unmatched: none matched), method and status.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "charon_http_request_duration_seconds",
    "Seconds from a request's arrival to the end of its answer, by route template and method (long polls "
    "included: a claim with `wait` lasts up to its wait).",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)


class HttpMetrics:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        began = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            if not status:  # ServerErrorMiddleware, outside, answers 500
                status = CLIENT_GONE if isinstance(exc, asyncio.CancelledError) else 500
            raise
        finally:
            self._count(scope, status, time.perf_counter() - began)

    def _count(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or UNMATCHED
        method = "HEAD" if scope.get(HEAD_KEY) else scope["method"]
        if method not in METHODS:
            method = "other"
        key = (path, method, status)
        children = self._children.get(key)
        if children is None:
            children = (HTTP_REQUESTS.labels(path, method, str(status)), HTTP_DURATION.labels(path, method))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)
