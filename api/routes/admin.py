"""The admin API, as in Zaqar v2: pools (storage backends) and flavors (groups of pools). Admin role only."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode

from fastapi import Depends, Request, Response
from pydantic import BaseModel, Field

from api.deps import LimitsDep, read_object, validate_body
from api.params import QUERY, QueryModel, path_value
from api.render import json_response
from api.routing import Router
from api.schemas import (
    ErrorOut,
    FlavorIn,
    FlavorOut,
    FlavorPatch,
    FlavorsPage,
    PoolIn,
    PoolOut,
    PoolPatch,
    PoolsPage,
    json_body,
)
from api.state import state_of
from core.errors import CharonError, Conflict, InvalidInput, NotAuthorized, NotFound
from core.limits import check_json_depth, check_name, check_page_limit
from storage.base import Store
from storage.pooling.catalogue import Flavor, Pool
from storage.pooling.store import PooledStore, pool_namespace
from storage.registry import open_store
from storage.traced import unwrapped

M = TypeVar("M", bound=BaseModel)

URI_CHECK_TIMEOUT_S = 10
ADMIN_BODY_LIMIT = 65_536


async def require_admin_mode(request: Request) -> None:
    """403 while the admin API is off. Who may call each route is its policy rule's business (api/policy.py:
    Zaqar's defaults, the admin role for every change)."""
    if not state_of(request).admin_mode:
        raise NotAuthorized("The admin API is off; an operator turns it on with CHARON_ADMIN_MODE=true.")


async def pooled_store(request: Request) -> PooledStore:
    store = unwrapped(state_of(request).store)  # the pool catalogue's calls are not traced
    if not isinstance(store, PooledStore):
        raise Conflict(
            "Pooling is off: the service stores every queue in CHARON_STORAGE_URI. Start it with "
            "CHARON_POOLING=true (and CHARON_MANAGEMENT_URI) to manage pools and flavors."
        )
    return store


PoolsDep = Annotated[PooledStore, Depends(pooled_store)]
PoolName = Annotated[str, path_value("pool_name")]
FlavorName = Annotated[str, path_value("flavor_name")]

router = Router(
    tags=["admin"],
    dependencies=[Depends(require_admin_mode)],
    responses={
        400: {"model": ErrorOut},
        403: {"model": ErrorOut},
        409: {"model": ErrorOut},
        503: {"model": ErrorOut},
    },
)


def _page(items: list[Any], marker: str | None, limit: int) -> list[Any]:
    if marker is not None:
        check_name(marker, "marker (the name of the last item of the previous page)")
    return [i for i in items if marker is None or i.name > marker][:limit]


def _links(path: str, page: list[Any], limit: int, **extra: str) -> list[dict[str, str]]:
    if len(page) < limit:
        return []
    return [
        {"rel": "next", "href": f"{path}?{urlencode({'marker': page[-1].name, 'limit': limit, **extra})}"}
    ]


async def _patch_body(request: Request, model: type[M], what: str) -> M:
    """The validated PATCH body; 400 when it changes nothing."""
    raw = await read_object(request, max_size=ADMIN_BODY_LIMIT, what=f"The {what} patch")
    body = validate_body(model, raw)
    if not body.model_fields_set:
        raise InvalidInput(f"A {what} patch changes at least one of {', '.join(model.model_fields)}.")
    for free_form in ("options", "capabilities"):
        check_json_depth(getattr(body, free_form, None), state_of(request).limits, free_form)
    return body


# -- pools ---------------------------------------------------------------------------------------------------


def _pool_out(pool: Pool, *, detailed: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": pool.name,
        "href": f"/v2/pools/{pool.name}",
        "uri": pool.uri,
        "weight": pool.weight,
        "flavor": pool.flavor,
    }
    if detailed:
        out["options"] = pool.options
    return out


async def _check_reachable(pool: Pool, request: Request) -> None:
    """400 unless the pool's URI opens a driver that answers within the storage timeout, so a typo never
    becomes a pool. The URI is the client's: anything its parsing raises (a port out of range, an option
    redis-py or PyMongo refuses) is a reason to refuse it, not a failure of the service."""
    state = state_of(request)
    timeout = min(state.storage_timeout, URI_CHECK_TIMEOUT_S)
    store: Store | None = None
    try:
        store = open_store(pool.uri, namespace=pool_namespace(pool, state.namespace), timeout=timeout)
        await asyncio.wait_for(store.ping(), timeout)
    except CharonError as exc:
        raise InvalidInput(f"Pool {pool.name!r}: its uri does not answer ({exc}).") from None
    except TimeoutError:
        raise InvalidInput(f"Pool {pool.name!r}: its uri does not answer within {timeout:g} s.") from None
    except Exception as exc:
        raise InvalidInput(f"Pool {pool.name!r}: its uri cannot be used ({str(exc)[:200]}).") from None
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                await store.aclose()


async def _flavor_exists(store: PooledStore, flavor: str | None) -> None:
    if flavor is not None and await store.catalogue.get_flavor(flavor) is None:
        raise InvalidInput(
            f"Flavor {flavor!r} does not exist; create it first with PUT /v2/flavors/{flavor}."
        )


async def _existing_pool(store: PooledStore, name: str) -> Pool:
    pool = await store.catalogue.get_pool(_name(name, "pool"))
    if pool is None:
        raise NotFound(f"Pool {name!r} does not exist.")
    return pool


class PoolsQuery(QueryModel):
    marker: str | None = Field(None, description="Name of the last pool of the previous page.")
    limit: int | None = Field(None, description="Page size, 1 to 20.")
    detailed: bool = False


class PoolQuery(QueryModel):
    detailed: bool = False


@router.get("/v2/pools", response_model=PoolsPage, summary="List pools (admin)")
async def list_pools(store: PoolsDep, limits: LimitsDep, params: Annotated[PoolsQuery, QUERY]) -> Response:
    marker, limit, detailed = params.marker, params.limit, params.detailed
    size = check_page_limit(limit if limit is not None else 10, limits)
    page = _page(await store.catalogue.list_pools(), marker, size)
    links = _links("/v2/pools", page, size, detailed=str(detailed).lower())
    return json_response({"pools": [_pool_out(p, detailed=detailed) for p in page], "links": links})


@router.put(
    "/v2/pools/{pool_name}",
    status_code=201,
    summary="Register a pool (admin)",
    openapi_extra=json_body(PoolIn, required=True),
)
async def create_pool(pool_name: PoolName, store: PoolsDep, request: Request) -> Response:
    raw = await read_object(request, max_size=ADMIN_BODY_LIMIT, what="The pool")
    if not raw:
        raise InvalidInput("A pool is registered with a body: uri and weight (flavor and options optional).")
    body = validate_body(PoolIn, raw)
    check_json_depth(body.options, state_of(request).limits, "options")
    pool = Pool(_name(pool_name, "pool"), body.uri, body.weight, body.flavor, body.options or {})
    if await store.catalogue.get_pool(pool.name) is not None:
        raise Conflict(f"Pool {pool.name!r} exists; change it with PATCH /v2/pools/{pool.name}.")
    await _flavor_exists(store, pool.flavor)
    await _check_reachable(pool, request)
    await store.catalogue.put_pool(pool)
    return Response(status_code=201, headers={"Location": f"/v2/pools/{pool.name}"})


@router.get("/v2/pools/{pool_name}", response_model=PoolOut, summary="Show a pool (admin)")
async def get_pool(pool_name: PoolName, store: PoolsDep, params: Annotated[PoolQuery, QUERY]) -> Response:
    return json_response(_pool_out(await _existing_pool(store, pool_name), detailed=params.detailed))


@router.patch(
    "/v2/pools/{pool_name}",
    response_model=PoolOut,
    summary="Change a pool's uri, weight, flavor or options (admin)",
    openapi_extra=json_body(PoolPatch, required=True),
)
async def patch_pool(pool_name: PoolName, store: PoolsDep, request: Request) -> Response:
    body = await _patch_body(request, PoolPatch, "pool")
    given = body.model_fields_set
    pool = await _existing_pool(store, pool_name)
    changed = Pool(
        pool.name,
        body.uri if body.uri is not None else pool.uri,
        body.weight if body.weight is not None else pool.weight,
        body.flavor if "flavor" in given else pool.flavor,
        (body.options or {}) if "options" in given else pool.options,
    )
    await _flavor_exists(store, changed.flavor)
    if (changed.uri, changed.options) != (pool.uri, pool.options):
        await _check_reachable(changed, request)
    await store.catalogue.put_pool(changed)
    return json_response(_pool_out(changed, detailed=True))


@router.delete("/v2/pools/{pool_name}", status_code=204, summary="Remove a pool that holds no queue (admin)")
async def delete_pool(pool_name: PoolName, store: PoolsDep) -> Response:
    await store.catalogue.delete_pool(_name(pool_name, "pool"))
    return Response(status_code=204)


# -- flavors -------------------------------------------------------------------------------------------------


def _flavor_out(flavor: Flavor, pools: list[Pool], *, detailed: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": flavor.name,
        "href": f"/v2/flavors/{flavor.name}",
        "pool_list": [p.name for p in pools if p.flavor == flavor.name],
    }
    if detailed:
        out["capabilities"] = flavor.capabilities
    return out


async def _set_pool_list(store: PooledStore, flavor: str, pool_list: list[str]) -> None:
    """Put exactly the pools of `pool_list` in `flavor` (each must exist); others in it leave it."""
    pools = {p.name: p for p in await store.catalogue.list_pools()}
    missing = sorted(set(pool_list) - set(pools))
    if missing:
        raise InvalidInput(f"pool_list names pools that do not exist: {', '.join(missing)}.")
    for pool in pools.values():
        wanted = flavor if pool.name in pool_list else (None if pool.flavor == flavor else pool.flavor)
        if wanted != pool.flavor:
            await store.catalogue.put_pool(Pool(pool.name, pool.uri, pool.weight, wanted, pool.options))


class FlavorsQuery(QueryModel):
    marker: str | None = Field(None, description="Name of the last flavor of the previous page.")
    limit: int | None = Field(None, description="Page size, 1 to 20.")
    detailed: bool = Field(False, description="Show each flavor's capabilities (as Zaqar).")


@router.get("/v2/flavors", response_model=FlavorsPage, summary="List flavors (admin)")
async def list_flavors(
    store: PoolsDep, limits: LimitsDep, params: Annotated[FlavorsQuery, QUERY]
) -> Response:
    marker, limit, detailed = params.marker, params.limit, params.detailed
    size = check_page_limit(limit if limit is not None else 10, limits)
    page = _page(await store.catalogue.list_flavors(), marker, size)
    pools = await store.catalogue.list_pools()
    flavors = [_flavor_out(f, pools, detailed=detailed) for f in page]
    links = _links("/v2/flavors", page, size, detailed=str(detailed).lower())
    return json_response({"flavors": flavors, "links": links})


@router.put(
    "/v2/flavors/{flavor_name}",
    status_code=201,
    summary="Create a flavor, optionally putting pools in it (admin)",
    openapi_extra=json_body(FlavorIn),
)
async def create_flavor(flavor_name: FlavorName, store: PoolsDep, request: Request) -> Response:
    raw = await read_object(request, max_size=ADMIN_BODY_LIMIT, what="The flavor")
    body = validate_body(FlavorIn, raw)
    check_json_depth(body.capabilities, state_of(request).limits, "capabilities")
    name = _name(flavor_name, "flavor")
    if await store.catalogue.get_flavor(name) is not None:
        raise Conflict(f"Flavor {name!r} exists; change it with PATCH /v2/flavors/{name}.")
    await store.catalogue.put_flavor(Flavor(name, body.capabilities or {}))
    if body.pool_list is not None:
        await _set_pool_list(store, name, body.pool_list)
    return Response(status_code=201, headers={"Location": f"/v2/flavors/{name}"})


async def _existing_flavor(store: PooledStore, name: str) -> Flavor:
    flavor = await store.catalogue.get_flavor(_name(name, "flavor"))
    if flavor is None:
        raise NotFound(f"Flavor {name!r} does not exist.")
    return flavor


@router.get("/v2/flavors/{flavor_name}", response_model=FlavorOut, summary="Show a flavor (admin)")
async def get_flavor(flavor_name: FlavorName, store: PoolsDep) -> Response:
    flavor = await _existing_flavor(store, flavor_name)
    return json_response(_flavor_out(flavor, await store.catalogue.list_pools()))


@router.patch(
    "/v2/flavors/{flavor_name}",
    response_model=FlavorOut,
    summary="Change a flavor's pools or capabilities (admin)",
    openapi_extra=json_body(FlavorPatch, required=True),
)
async def patch_flavor(flavor_name: FlavorName, store: PoolsDep, request: Request) -> Response:
    body = await _patch_body(request, FlavorPatch, "flavor")
    flavor = await _existing_flavor(store, flavor_name)
    if body.capabilities is not None:
        flavor = Flavor(flavor.name, body.capabilities)
        await store.catalogue.put_flavor(flavor)
    if body.pool_list is not None:
        await _set_pool_list(store, flavor.name, body.pool_list)
    return json_response(_flavor_out(flavor, await store.catalogue.list_pools()))


@router.delete(
    "/v2/flavors/{flavor_name}",
    status_code=204,
    summary="Delete a flavor; its pools become flavorless (admin)",
)
async def delete_flavor(flavor_name: FlavorName, store: PoolsDep) -> Response:
    flavor_name = _name(flavor_name, "flavor")
    if await store.catalogue.get_flavor(flavor_name) is not None:
        await _set_pool_list(store, flavor_name, [])
        await store.catalogue.delete_flavor(flavor_name)
    return Response(status_code=204)


def _name(name: str, what: str) -> str:
    return check_name(name, f"A {what} name")
