"""Queues: create (PUT), metadata (GET, PATCH json-patch), delete, list, stats, purge."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, Query, Request, Response

from api.deps import (
    ClientIdDep,
    ClockDep,
    DefaultsDep,
    LimitsDep,
    ProjectDep,
    QueueDep,
    StoreDep,
    read_json,
    read_object,
    validate_body,
)
from api.errors import JSON_PATCH
from api.params import CheckedRoute, open_query
from api.render import json_response, stamp
from api.schemas import ErrorOut, PatchOp, PurgeIn, QueuesPage, StatsOut, json_body
from core.errors import (
    Conflict,
    InvalidBody,
    InvalidInput,
    MetadataChanged,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from core.limits import Limits, check_json_depth, check_name, check_page_limit
from core.metadata import (
    DEAD_LETTER_QUEUE,
    FLAVOR,
    DeadLetterDefaults,
    QueuePolicy,
    check_dead_letter_chain,
    parse_policy,
    with_reserved_defaults,
)
from core.models import QueueInfo, QueueRef
from core.queue_filter import QueueFilter
from storage.base import Store
from storage.pooling.store import PooledStore

router = APIRouter(
    route_class=CheckedRoute, tags=["queues"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}}
)

T = TypeVar("T")
METADATA_WRITE_ATTEMPTS = 8
KEPT_CHANGING = "Queue metadata in this project kept changing while this write was being checked; retry it."

RESERVED_KEYS = (
    "Free-form metadata; keys starting with `_` are reserved and validated (400 naming the bound): "
    "`_default_message_ttl`, `_default_message_delay`, `_max_messages_post_size`, `_max_claim_count`, "
    "`_dead_letter_queue`, `_dead_letter_queue_messages_ttl`, `_flavor`, and (EXT) `_redelivery_delay`, "
    "`_redelivery_delay_multiplier`, `_max_redelivery_delay`, `_redelivery_jitter`, "
    "`_redelivery_delay_levels`, `_dead_letter_on_expiry`, `_max_message_ttl`. README.md describes each. "
    """E.g. `curl -X PUT ... $BASE/v2/queues/jobs -d '{"_redelivery_delay": 5, """
    """"_redelivery_delay_multiplier": 2, "_max_redelivery_delay": 15, "_max_claim_count": 5, """
    """"_dead_letter_queue": "jobs.dlq"}'`"""
)
METADATA_BODY = {
    "requestBody": {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/QueueMetadata"}}}
    }
}
PATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_PATCH: {
                "schema": {"type": "array", "items": {"$ref": "#/components/schemas/PatchOp"}, "minItems": 1}
            }
        },
    }
}


async def _checked(
    q: QueueRef, metadata: Any, limits: Limits, store: Store, defaults: DeadLetterDefaults
) -> QueuePolicy:
    if not isinstance(metadata, dict):
        raise InvalidBody("Queue metadata must be a JSON object.")
    check_json_depth(metadata, limits, "Queue metadata")
    size = len(orjson.dumps(metadata))
    if size > limits.max_queue_metadata:
        raise PayloadTooLarge(f"Queue metadata may be at most {limits.max_queue_metadata} bytes; got {size}.")
    policy = parse_policy(metadata, limits, queue=q.name)
    if metadata.get(FLAVOR) is not None and not isinstance(store, PooledStore):
        raise InvalidInput(
            f"{FLAVOR} chooses the pool a queue is placed in, and this service runs without pools "
            "(CHARON_POOLING=false): it would have no effect. Leave it out."
        )
    if policy.dead_letter_queue is not None:

        async def dead_letter_queue_of(name: str) -> str | None:
            value = (await store.get_metadata(QueueRef(q.project, name))).get(DEAD_LETTER_QUEUE)
            return value if isinstance(value, str) else defaults.dead_letter_queue_for(name)

        await check_dead_letter_chain(q.name, policy.dead_letter_queue, dead_letter_queue_of)
    return policy


async def _write_checked(
    q: QueueRef,
    store: Store,
    limits: Limits,
    defaults: DeadLetterDefaults,
    metadata_now: Callable[[], Awaitable[Any]],
    write: Callable[[dict[str, Any], QueuePolicy, int], Awaitable[T]],
) -> tuple[dict[str, Any], T]:
    """Compute the metadata to write, check it (DLQ chain included) and write it, unless another metadata
    write landed in the project in between: then all again. No lost update, and the DLQ cycle check always
    sees what the write lands on. Returns the metadata written and what `write` returned."""
    for _ in range(METADATA_WRITE_ATTEMPTS):
        version = await store.metadata_version(q)
        metadata = await metadata_now()
        policy = await _checked(q, metadata, limits, store, defaults)
        with contextlib.suppress(MetadataChanged):
            return metadata, await write(metadata, policy, version)
    raise MetadataChanged(KEPT_CHANGING)


LIST_QUERY = ("marker", "limit", "detailed", "name", "with_count")
SCAN_PAGE = 100  # queues read at a time when a filter picks among them


@router.get(
    "/v2/queues",
    response_model=QueuesPage,
    summary="List the project's queues (filters: `name`, and any other parameter `key=value` on metadata)",
    description="Any query parameter besides those listed is a metadata filter, as in Zaqar: `?team=red` "
    "lists the queues whose metadata has `team` equal to `red` (a value that spells a JSON number, "
    '`true`, `false` or `null` also matches that value: `?tier=1` matches 1 and "1"); at most 20 '
    "filters, keys and values at most 256 characters. A filtered listing (and `with_count`) reads the "
    "project's queues in pages of 100 until the page is full: its cost grows with the project's queues.",
)
@open_query
async def list_queues(
    request: Request,
    store: StoreDep,
    limits: LimitsDep,
    project: ProjectDep,
    _client: ClientIdDep,
    marker: Annotated[str | None, Query(description="Name of the last queue of the previous page.")] = None,
    limit: Annotated[int | None, Query(description="Page size, 1 to 20.")] = None,
    detailed: bool = False,
    name: Annotated[str | None, Query(description="Only queues whose name holds this text.")] = None,
    with_count: Annotated[
        bool, Query(description="Add `count`: how many of the project's queues the filters match.")
    ] = False,
) -> Response:
    size = check_page_limit(limit if limit is not None else limits.default_messages_per_page, limits)
    if marker is not None:
        check_name(marker, "marker (the name of the last queue of the previous page)")
    pairs = [(k, v) for k, v in request.query_params.multi_items() if k not in LIST_QUERY]
    chosen = QueueFilter.of(name, pairs)
    items, next_marker = await _queue_page(store, project, chosen, marker, size, detailed)
    queues = []
    for info in items:
        item: dict[str, Any] = {"name": info.name, "href": f"/v2/queues/{info.name}"}
        if detailed:
            item["metadata"] = info.metadata
        queues.append(item)
    links = []
    if next_marker is not None:
        query = [("marker", next_marker), ("limit", str(size)), ("detailed", str(detailed).lower())]
        query += [("name", name)] if name is not None else []
        query += [("with_count", "true")] if with_count else []
        links.append({"rel": "next", "href": f"/v2/queues?{urlencode(query + pairs)}"})
    body: dict[str, Any] = {"queues": queues, "links": links}
    if with_count:
        body["count"] = await _count(store, project, chosen)
    return json_response(body)


async def _queue_page(
    store: Store, project: str, chosen: QueueFilter, marker: str | None, size: int, detailed: bool
) -> tuple[list[QueueInfo], str | None]:
    """One page of the listing and the marker of the next (None at the end)."""
    if not chosen.active:
        page = await store.list_queues(project, marker=marker, limit=size, detailed=detailed)
        full = page.next_marker is not None and len(page.items) == size
        return page.items, page.next_marker if full else None
    found: list[QueueInfo] = []
    async for info in _scan(store, project, chosen, marker):
        found.append(info)
        if len(found) == size:
            return found, info.name
    return found, None


async def _scan(
    store: Store, project: str, chosen: QueueFilter, marker: str | None
) -> AsyncIterator[QueueInfo]:
    """The project's queues after `marker` that `chosen` matches, in name order, read SCAN_PAGE at a time."""
    while True:
        page = await store.list_queues(
            project, marker=marker, limit=SCAN_PAGE, detailed=bool(chosen.metadata)
        )
        for info in page.items:
            if chosen.matches(info.name, info.metadata):
                yield info
        if len(page.items) < SCAN_PAGE or page.next_marker is None:
            return
        marker = page.next_marker


async def _count(store: Store, project: str, chosen: QueueFilter) -> int:
    return sum([1 async for _ in _scan(store, project, chosen, None)])


@router.put(
    "/v2/queues/{queue_name}",
    status_code=201,
    summary="Create a queue (201), or leave an existing one as it is (204)",
    description=RESERVED_KEYS,
    responses={
        204: {"description": "The queue existed; its metadata is unchanged."},
        409: {"model": ErrorOut},
        413: {"model": ErrorOut},
    },
    openapi_extra=METADATA_BODY,
)
async def create_queue(
    q: QueueDep, store: StoreDep, limits: LimitsDep, defaults: DefaultsDep, request: Request
) -> Response:
    body = await read_object(request, max_size=limits.max_queue_metadata, what="Queue metadata")

    async def given() -> Any:
        return body

    async def create(meta: dict[str, Any], policy: QueuePolicy, version: int) -> bool:
        return await store.create_queue(q, metadata=meta, policy=policy, expected_version=version)

    _, created = await _write_checked(q, store, limits, defaults, given, create)
    return Response(status_code=201 if created else 204, headers={"Location": f"/v2/queues/{q.name}"})


@router.get("/v2/queues/{queue_name}", summary="Queue metadata, reserved keys filled with their defaults")
async def get_queue(q: QueueDep, store: StoreDep, limits: LimitsDep, defaults: DefaultsDep) -> dict[str, Any]:
    return with_reserved_defaults(await store.get_metadata(q), limits, defaults.apply(q.name, QueuePolicy()))


def _apply_patch(metadata: dict[str, Any], ops: list[PatchOp]) -> dict[str, Any]:
    patched = dict(metadata)
    for op in ops:
        pointer = op.path.removeprefix("/metadata/")
        if pointer == op.path or not pointer or "/" in pointer or re.search("~(?![01])", pointer):
            raise InvalidBody(
                "A patch path names one key of the metadata as a JSON Pointer, /metadata/<key>, with / in "
                f"the key written ~1 and ~ written ~0 (RFC 6901); got {op.path[:300]!r}."
            )
        key = pointer.replace("~1", "/").replace("~0", "~")
        reserved = key.startswith("_")
        if op.op in ("replace", "remove") and key not in patched and not reserved:
            raise Conflict(f"Cannot {op.op} metadata key {key!r}: the queue has no such key.")
        if op.op == "remove":
            patched.pop(key, None)
        else:
            patched[key] = op.value
    return patched


@router.patch(
    "/v2/queues/{queue_name}",
    summary="Change queue metadata with a JSON patch (add, replace, remove)",
    responses={409: {"model": ErrorOut}, 413: {"model": ErrorOut}, 415: {"model": ErrorOut}},
    openapi_extra=PATCH_BODY,
)
async def patch_queue(
    q: QueueDep, store: StoreDep, limits: LimitsDep, defaults: DefaultsDep, request: Request
) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != JSON_PATCH:
        raise UnsupportedMediaType(f"Queue metadata is patched with Content-Type {JSON_PATCH}.")
    raw = (await read_json(request, max_size=limits.max_queue_metadata, what="The patch")).value
    if not isinstance(raw, list) or not raw:
        raise InvalidBody("A patch is a non-empty JSON array of operations: add, replace or remove.")
    ops = [validate_body(PatchOp, item, f"Operation {i}") for i, item in enumerate(raw)]

    async def patched() -> Any:
        return _apply_patch(await store.get_metadata(q), ops)

    async def replace(meta: dict[str, Any], policy: QueuePolicy, version: int) -> None:
        await store.set_metadata(q, metadata=meta, policy=policy, expected_version=version)

    metadata, _ = await _write_checked(q, store, limits, defaults, patched, replace)
    return with_reserved_defaults(metadata, limits, defaults.apply(q.name, QueuePolicy()))


@router.delete("/v2/queues/{queue_name}", status_code=204, summary="Delete a queue and its messages")
async def delete_queue(q: QueueDep, store: StoreDep) -> Response:
    await store.delete_queue(q)
    return Response(status_code=204)


@router.get("/v2/queues/{queue_name}/stats", response_model=StatsOut, summary="Message counts")
async def queue_stats(q: QueueDep, store: StoreDep, clock: ClockDep) -> Response:
    s = await store.stats(q)
    now = clock.now_ms()
    counts: dict[str, Any] = {
        "free": s.free,
        "claimed": s.claimed,
        "total": s.total,
        "delayed": s.delayed,
        "dead_lettered": s.dead_lettered,
        "discarded": s.discarded,
        "dead_letters_received": s.dead_letters_received,
    }
    if s.oldest is not None:
        counts["oldest"] = stamp(q.name, s.oldest, now)
        counts["newest"] = stamp(q.name, s.newest, now)
    return json_response({"messages": counts})


@router.post(
    "/v2/queues/{queue_name}/purge",
    status_code=204,
    summary="Delete the queue's messages, keep the queue",
    openapi_extra=json_body(PurgeIn),
)
async def purge_queue(q: QueueDep, store: StoreDep, limits: LimitsDep, request: Request) -> Response:
    raw = await read_object(request, max_size=limits.max_queue_metadata, what="The purge body")
    body = validate_body(PurgeIn, raw)
    # Charon has no subscriptions, so only "messages" has anything to purge.
    if body.resource_types is None or "messages" in body.resource_types:
        await store.purge(q)
    return Response(status_code=204)
