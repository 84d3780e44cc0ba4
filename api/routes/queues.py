"""Queues: create (PUT), metadata (GET, PATCH json-patch), delete, list, stats, purge."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Request, Response
from pydantic import Field

from api.deps import (
    ClientIdDep,
    ClockDep,
    DefaultsDep,
    LimitsDep,
    ProjectDep,
    QueueDep,
    StoreDep,
    in_topics,
    read_json,
    read_object,
    validate_body,
)
from api.errors import JSON_PATCH
from api.params import QUERY, QueryModel
from api.render import json_response, stamp
from api.routing import Router
from api.schemas import ErrorOut, PatchOp, PurgeIn, QueuesPage, ShareIn, ShareOut, StatsOut, json_body
from api.signed import SignedGrant, format_expires
from api.state import state_of
from core.errors import (
    InvalidBody,
    NotAuthorized,
    UnsupportedMediaType,
)
from core.limits import check_name, check_page_limit
from core.metadata import (
    RESERVED_KEYS,
    QueuePolicy,
    with_reserved_defaults,
)
from core.queue_filter import QueueFilter
from service import queues as queue_cases

router = Router(tags=["queues"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}})


def _keys(ext: bool) -> str:
    return ", ".join(f"`{k.name}`" for k in RESERVED_KEYS if k.ext == ext)


# The reserved keys' names from their rows (core.metadata.RESERVED_KEYS); the QueueMetadata schema has each
# one's type, bounds, meaning and default.
METADATA_DESCRIPTION = (
    "Free-form metadata; keys starting with `_` are reserved and validated (400 naming the bound): "
    f"{_keys(ext=False)}, and (EXT) {_keys(ext=True)}. docs/dead-letter-queues.md describes each. "
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


class ListQuery(QueryModel):
    """The listing's own parameters; any other is a metadata filter (as in Zaqar)."""

    open_query = True

    marker: str | None = Field(None, description="Name of the last queue of the previous page.")
    limit: int | None = Field(None, description="Page size, 1 to 20.")
    detailed: bool = False
    name: str | None = Field(None, description="Only queues whose name holds this text.")
    with_count: bool = Field(
        False, description="Add `count`: how many of the project's queues the filters match."
    )


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
async def list_queues(
    request: Request,
    store: StoreDep,
    limits: LimitsDep,
    project: ProjectDep,
    _client: ClientIdDep,
    params: Annotated[ListQuery, QUERY],
) -> Response:
    marker, limit, detailed = params.marker, params.limit, params.detailed
    name, with_count = params.name, params.with_count
    size = check_page_limit(limit if limit is not None else limits.default_messages_per_page, limits)
    if marker is not None:
        check_name(marker, "marker (the name of the last queue of the previous page)")
    pairs = [(k, v) for k, v in request.query_params.multi_items() if k not in ListQuery.model_fields]
    chosen = QueueFilter.of(name, pairs)
    items, next_marker = await queue_cases.page(store, project, chosen, marker, size, detailed)
    kind = "topics" if in_topics(request) else "queues"  # the topics' listing is this one (routes/topics.py)
    queues = []
    for info in items:
        item: dict[str, Any] = {"name": info.name, "href": f"/v2/{kind}/{info.name}"}
        if detailed:
            item["metadata"] = info.metadata
        queues.append(item)
    links = []
    if next_marker is not None:
        query = [("marker", next_marker), ("limit", str(size)), ("detailed", str(detailed).lower())]
        query += [("name", name)] if name is not None else []
        query += [("with_count", "true")] if with_count else []
        links.append({"rel": "next", "href": f"/v2/{kind}?{urlencode(query + pairs)}"})
    body: dict[str, Any] = {kind: queues, "links": links}
    if with_count:
        body["count"] = await queue_cases.count(store, project, chosen)
    return json_response(body)


@router.put(
    "/v2/queues/{queue_name}",
    status_code=201,
    summary="Create a queue (201), or leave an existing one as it is (204)",
    description=METADATA_DESCRIPTION,
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
    created = await queue_cases.create(store, q, body, limits=limits, defaults=defaults)
    return Response(status_code=201 if created else 204, headers={"Location": q.href})


@router.get("/v2/queues/{queue_name}", summary="Queue metadata, reserved keys filled with their defaults")
async def get_queue(q: QueueDep, store: StoreDep, limits: LimitsDep, defaults: DefaultsDep) -> dict[str, Any]:
    return with_reserved_defaults(await store.get_metadata(q), limits, defaults.apply(q.name, QueuePolicy()))


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
    changes = [(op.op, op.path, op.value) for op in ops]
    metadata = await queue_cases.patch(store, q, changes, limits=limits, defaults=defaults)
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
        counts["oldest"] = stamp(q.name, s.oldest, now, q.kind)
        counts["newest"] = stamp(q.name, s.newest, now, q.kind)
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
    if body.resource_types is None or "messages" in body.resource_types:
        await store.purge(q)
    if body.resource_types is None or "subscriptions" in body.resource_types:
        await store.purge_subscriptions(q)
    return Response(status_code=204)


@router.post(
    "/v2/queues/{queue_name}/share",
    response_model=ShareOut,
    summary="Create a pre-signed URL for the queue (Zaqar's)",
    description="The answer's fields are what a client sends, as headers, instead of a token: "
    "`URL-Signature`, `URL-Expires`, `URL-Methods` and `URL-Paths` (comma-separated) and `X-Project-ID` "
    "(the `project`). Such a request is allowed the signed methods on the signed paths of this queue (and "
    "what is under them, e.g. one message) until it expires; anything else is 403. python-zaqarclient's "
    "`signed-url` auth backend takes the answer as it is. 403 when the service has no "
    "CHARON_SIGNED_URL_KEY.",
    openapi_extra=json_body(ShareIn),
    responses={403: {"model": ErrorOut}},
)
async def share_queue(q: QueueDep, clock: ClockDep, limits: LimitsDep, request: Request) -> Response:
    raw = await read_object(request, max_size=limits.max_queue_metadata, what="The share body")
    body = validate_body(ShareIn, raw)
    now = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    expires = _expires(body.expires, now, limits.max_share_seconds)
    key = state_of(request).auth.signing_key
    if key is None:
        raise NotAuthorized(
            "Pre-signed URLs are off on this service (an operator turns them on with CHARON_SIGNED_URL_KEY)."
        )
    base = f"/v2/queues/{q.name}/"
    grant = SignedGrant(
        paths=tuple(base + p for p in sorted(set(body.paths or ["messages"]))),
        methods=tuple(sorted(set(body.methods or ["GET"]))),
        project=q.project,
        expires=format_expires(expires),
    )
    return json_response(grant.document(key))


def _expires(sent: str | None, now: datetime, max_seconds: int) -> datetime:
    if sent is None:
        return now + timedelta(days=1)
    try:
        if sent.strip().lstrip("+-").isdigit():
            raise ValueError
        moment = datetime.fromisoformat(sent.strip())
    except ValueError:
        raise InvalidBody(
            f"expires must be an ISO 8601 time such as 2026-01-01T00:00:00 (UTC); got {sent[:64]!r}."
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment.replace(microsecond=0) <= now:
        raise InvalidBody(f"expires must be in the future; got {sent[:64]!r}.")
    if moment > now + timedelta(seconds=max_seconds):
        raise InvalidBody(
            f"expires may be at most {max_seconds} seconds ahead (CHARON_LIMITS__MAX_SHARE_SECONDS); "
            f"got {sent[:64]!r}."
        )
    return moment
