"""The HTTP series of GET /metrics: every request counted by route template, method and status, and timed.

`HttpMetrics` is called by api.access.RequestLog (pure ASGI, inside HeadAsGet) when a request ends, with the
status and time that middleware already takes: no layer of its own. It reads the route the router matched
from the scope (a HEAD served by its GET route is counted as HEAD). Each (route, method, status) keeps its
two prometheus-client children, so a request costs a dict lookup, a counter increment and a histogram
observation (bench/README.md, "What GET /metrics costs").
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from starlette.types import Scope

from api.head import HEAD_KEY
from service.metrics import REGISTRY

UNMATCHED = "unmatched"  # the route label of a request no route matched (404, 405)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # the others: "other"

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
    """Counts each request; api.access.RequestLog, the one middleware that already waits for every answer
    (its status, its time), calls `count` when the request ends."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def count(self, scope: Scope, status: int, seconds: float) -> None:
        """`status`: the answer's, or for a request that ended before one began, 499 (cancelled) or 500."""
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
