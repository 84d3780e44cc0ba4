"""Versions, home document, ping, health, and the probes a container runtime asks (/livez, /readyz)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson
from fastapi import Request, Response

from api.auth import may
from api.deps import StoreDep
from api.render import json_response
from api.routing import Router
from api.schemas import ErrorOut, HealthOut
from api.state import state_of
from core.errors import StorageFull, StorageUnavailable
from storage.base import Store
from storage.pooling.store import PooledStore
from storage.traced import unwrapped

router = Router(tags=["service"])

DETAILED = "health:get_detailed"  # the pool catalogue in the health answer: admins (api/policy.py)

VERSIONS = {
    "versions": [
        {
            "id": "2",
            "status": "CURRENT",
            "updated": "2026-11-22T00:00:00Z",
            "media-types": [
                {"base": "application/json", "type": "application/vnd.openstack.messaging-v2+json"}
            ],
            "links": [{"href": "/v2/", "rel": "self"}],
        }
    ]
}


def _rel(template: str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    rel: dict[str, Any] = {
        "href-template": template,
        "hints": {"allow": [method], "formats": {"application/json": {}}},
    }
    if params:
        rel["href-vars"] = params
    return rel


HOME = {
    "resources": {
        "rel/queues": _rel("/v2/queues{?marker,limit,detailed}", "GET"),
        "rel/queue": _rel("/v2/queues/{queue_name}", "PUT", {"queue_name": "param/queue_name"}),
        "rel/queue_stats": _rel("/v2/queues/{queue_name}/stats", "GET"),
        "rel/post_messages": _rel("/v2/queues/{queue_name}/messages", "POST"),
        "rel/messages": _rel("/v2/queues/{queue_name}/messages{?marker,limit,echo,include_claimed}", "GET"),
        "rel/messages_delete": _rel("/v2/queues/{queue_name}/messages{?ids,pop}", "DELETE"),
        "rel/message": _rel("/v2/queues/{queue_name}/messages/{message_id}", "GET"),
        "rel/post_claim": _rel("/v2/queues/{queue_name}/claims{?limit}", "POST"),
        "rel/claim": _rel("/v2/queues/{queue_name}/claims/{claim_id}", "GET"),
        "rel/ping": _rel("/v2/ping", "GET"),
        "rel/health": _rel("/v2/health", "GET"),
    }
}


HOME_BODY = orjson.dumps(HOME)  # encoded once: the document never changes


@router.get("/", status_code=300, summary="API versions")
async def versions() -> Response:
    return json_response(VERSIONS, status_code=300)


@router.get("/v2", summary="JSON home document")
@router.get("/v2/", include_in_schema=False)
async def home() -> Response:
    return Response(
        content=HOME_BODY,
        media_type="application/json-home",
        headers={"Cache-Control": "max-age=86400"},
    )


class StorageCheck:
    """Ping's view of the storage: one storage ping shared by the pings that arrive while it runs, and its
    answer reused for `fresh_s` seconds. A load balancer (or a benchmark) pinging thousands of times a second
    then costs the store one round trip a second, and a ping about what a bare route costs. /v2/health
    always asks the storage."""

    def __init__(self, fresh_s: float = 1.0) -> None:
        self.fresh_s = fresh_s
        self._checked_at = -math.inf
        self._ok = False
        self._running: asyncio.Future[bool] | None = None

    async def ok(self, store: Store) -> bool:
        if time.monotonic() - self._checked_at < self.fresh_s:
            return self._ok
        if self._running is None:
            self._running = asyncio.ensure_future(self._check(store))
        return await asyncio.shield(self._running)

    async def _check(self, store: Store) -> bool:
        try:
            await store.ping()
            self._ok = True
        except StorageUnavailable:
            self._ok = False
        finally:
            self._checked_at = time.monotonic()
            self._running = None
        return self._ok


@router.plain(
    "GET",
    "/v2/ping",
    status_code=204,
    summary="204 when the storage answers, 503 when not (checked at most once a second)",
    responses={503: {"model": ErrorOut}},
)
async def ping(request: Request) -> Response:
    state = state_of(request)
    if not await state.storage_check.ok(state.store):
        raise StorageUnavailable("The storage did not answer the last check.")
    return Response(status_code=204)


@router.get(
    "/v2/health",
    response_model=HealthOut,
    summary="Storage status: reachable, and writable (a full store refuses writes)",
    description="Zaqar's health, plus `storage_writable`: the storage takes a write now (a probe key). "
    "503 when it does not answer or refuses writes. `GET /v2/ping` answers only whether it is reachable, "
    "so a load balancer keeps a service whose store is full (reads, claims and deletes still work, and "
    "consumers free the space).",
    responses={503: {"description": "The storage does not answer, or refuses writes."}},
)
async def health(store: StoreDep, request: Request) -> Response:
    """Zaqar's health: whether the storage answers; with pooling, an admin also sees the catalogue and each
    pool."""
    pooled = unwrapped(store)
    if isinstance(pooled, PooledStore) and state_of(request).admin_mode and may(request, DETAILED):
        return await _pooled_health(pooled)
    state = await storage_state(store)
    return json_response(state, status_code=200 if state.get("storage_writable") else 503)


async def storage_state(store: Store) -> dict[str, bool]:
    """Whether the storage answers, and whether it takes a write now (a probe key): /v2/health's body, and
    what /readyz asks."""
    try:
        await store.ping()
    except StorageUnavailable:
        return {"storage_reachable": False}
    try:
        await store.check_writable()
    except StorageFull:
        return {"storage_reachable": True, "storage_writable": False}
    except StorageUnavailable:
        return {"storage_reachable": False}
    return {"storage_reachable": True, "storage_writable": True}


@router.plain(
    "GET",
    "/livez",
    status_code=204,
    summary="Liveness: 204 while the process serves requests; no storage call (EXT)",
    description="For a container's HEALTHCHECK or a Kubernetes liveness probe: a store outage must not get "
    "the API restarted, since it answers 503 and recovers by itself. Needs no credentials.",
)
async def livez(request: Request) -> Response:
    return Response(status_code=204)


@router.plain(
    "GET",
    "/readyz",
    status_code=204,
    summary="Readiness: 204 when the storage answers and takes a write now, 503 when not (EXT)",
    description="For a load balancer or a Kubernetes readiness probe: asks the storage every time, as "
    "/v2/health does, and needs no credentials.",
    responses={503: {"model": ErrorOut}},
)
async def readyz(request: Request) -> Response:
    state = await storage_state(state_of(request).store)
    if not state["storage_reachable"]:
        raise StorageUnavailable("The storage is not reachable.")
    if not state.get("storage_writable"):
        raise StorageUnavailable("The storage answers but refuses writes (it is full).")
    return Response(status_code=204)


async def _pooled_health(store: PooledStore) -> Response:
    try:
        await store.catalogue.ping()
        pools = await store.pool_health()
    except StorageUnavailable:
        return json_response({"storage_reachable": False, "catalog_reachable": False}, status_code=503)
    healthy = all(pools.values())
    body = {
        "storage_reachable": healthy,
        "catalog_reachable": True,
        "pools": {name: {"storage_reachable": ok} for name, ok in pools.items()},
    }
    return json_response(body, status_code=200 if healthy else 503)
