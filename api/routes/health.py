"""Versions, home document, ping and health."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from api.deps import StoreDep
from api.render import json_response
from api.routes.admin import is_admin
from api.schemas import HealthOut
from core.errors import StorageUnavailable
from storage.pooling.store import PooledStore

router = APIRouter(tags=["service"])

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


@router.get("/v2/ping", status_code=204, summary="204 when the storage answers, 503 when not")
@router.head("/v2/ping", status_code=204, operation_id="ping_head", include_in_schema=False)
async def ping(store: StoreDep) -> Response:
    await store.ping()
    return Response(status_code=204)


@router.get(
    "/v2/health",
    response_model=HealthOut,
    summary="Storage status",
    responses={503: {"description": "The storage does not answer."}},
)
async def health(store: StoreDep, request: Request) -> Response:
    """Zaqar's health: whether the storage answers; with pooling, an admin also sees the catalogue and each
    pool."""
    if isinstance(store, PooledStore) and is_admin(request):
        return await _pooled_health(store)
    try:
        await store.ping()
    except StorageUnavailable:
        return json_response({"storage_reachable": False}, status_code=503)
    return json_response({"storage_reachable": True})


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
