"""GET /metrics: Prometheus' text format (or OpenMetrics, when the scraper asks for it), every worker's series
added up (service/metrics.py) with those read from the store at scrape time (service/gauges.py).

Who may scrape: the policy rule `metrics:get`, admin only by default, as Zaqar's operator-facing routes (the
series name every project's queues). Prometheus scrapes without a Keystone token, so an operator may also
let in a scraper by a bearer token of its own (CHARON_METRICS__BEARER_TOKEN) or by its loopback address
(CHARON_METRICS__ALLOW_LOOPBACK); anything else is asked the rule like any route.
"""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from api.routing import Router
from api.schemas import ErrorOut
from api.state import state_of
from core.errors import NotAuthorized

router = Router(tags=["service"])


async def authorize_scrape(request: Request, rule: str) -> None:
    """In: a matching bearer token, or a loopback address when allowed; otherwise the rule decides."""
    state = state_of(request)
    if state.metrics_token is not None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            if not hmac.compare_digest(token.strip().encode(), state.metrics_token):
                raise NotAuthorized("The bearer token is not the one CHARON_METRICS__BEARER_TOKEN sets.")
            return
    if state.metrics_loopback and request.client is not None and _loopback(request.client.host):
        return
    await state.auth.authorize(request, rule)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Families:
    """What prometheus-client's encoders read: something with collect()."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


@router.plain(
    "GET",
    "/metrics",
    guard=authorize_scrape,
    response_class=PlainTextResponse,
    summary="Prometheus metrics: queues, dead letters, HTTP, sweeper, redrive, notifier (docs/operations.md)",
    description="Prometheus' text format (OpenMetrics when the `Accept` header asks for it): per queue "
    "(labels project and queue) messages ready, claimed and delayed, the oldest message's age and the "
    "dead-letter counters; requests by route template, method and status with their latency; the "
    "sweeper's, redrive's and notifier's progress. Admin only by default (`metrics:get`); see "
    "CHARON_METRICS__BEARER_TOKEN and CHARON_METRICS__ALLOW_LOOPBACK for a scraper without a token.",
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, 403: {"model": ErrorOut}},
)
async def metrics(request: Request) -> Response:
    gauges = state_of(request).gauges
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body: bytes = encoder(_Families(await gauges.families()))
    return Response(body, media_type=content_type)
