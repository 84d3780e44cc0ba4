"""Redrive (EXT, SQS's DLQ redrive / StartMessageMoveTask): move dead letters back, as a durable task."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from api.deps import (
    ClockDep,
    LimitsDep,
    ProvenanceDep,
    QueueDep,
    RedriveDep,
    StoreDep,
    read_object,
    validate_body,
)
from api.params import CheckedRoute
from api.render import EPOCH, iso, json_response, messages
from api.schemas import ErrorOut, RedriveIn, RedriveTaskOut, RedriveTasksOut, json_body
from core.errors import InvalidInput, NotFound
from core.limits import check_page_limit, check_time_ms, is_valid_id
from core.models import Message, QueueRef, RedriveSpec, RedriveTask, TaskId
from storage.base import Store

router = APIRouter(
    route_class=CheckedRoute, tags=["redrive"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}}
)

INLINE_LIMIT = 100  # a redrive of at most this many messages, unthrottled, is done before the answer
PREVIEW_PAGE = 500
PREVIEW_SCAN_CAP = 100_000  # messages a dry run looks at, at most
SAMPLE = 10


def _ms(value: datetime | None, what: str) -> int | None:
    """A filter's time as ms since the epoch, within the range every driver can store and the API write back
    (a zone offset can push a date at either end of the calendar out of it)."""
    if value is None:
        return None
    return check_time_ms((value - EPOCH) // timedelta(milliseconds=1), f"filter.{what}")


def _spec(q: QueueRef, body: RedriveIn) -> RedriveSpec:
    f = body.filter
    spec = RedriveSpec(
        destination=body.destination,
        source_queue=f.source_queue if f else None,
        reason=f.reason if f else None,
        after_ms=_ms(f.dead_lettered_after, "dead_lettered_after") if f else None,
        before_ms=_ms(f.dead_lettered_before, "dead_lettered_before") if f else None,
        limit=body.limit,
        max_per_second=body.max_per_second,
    )
    if spec.destination == q.name:
        raise InvalidInput(f"destination must be another queue than the DLQ {q.name!r} itself.")
    if spec.after_ms is not None and spec.before_ms is not None and spec.after_ms >= spec.before_ms:
        raise InvalidInput("filter.dead_lettered_after must be earlier than filter.dead_lettered_before.")
    return spec


def _request(spec: RedriveSpec) -> dict[str, Any]:
    """The task's request as it was given (times in ISO 8601)."""
    filters = {
        "source_queue": spec.source_queue,
        "reason": spec.reason,
        "dead_lettered_after": iso(spec.after_ms) if spec.after_ms is not None else None,
        "dead_lettered_before": iso(spec.before_ms) if spec.before_ms is not None else None,
    }
    out: dict[str, Any] = {
        "destination": spec.destination,
        "filter": {k: v for k, v in filters.items() if v is not None},
        "limit": spec.limit,
        "max_per_second": spec.max_per_second,
    }
    return {k: v for k, v in out.items() if v}


def task_out(t: RedriveTask) -> dict[str, Any]:
    return {
        "id": t.id,
        "href": f"/v2/queues/{t.queue}/redrive/{t.id}",
        "queue": t.queue,
        "status": t.status,
        "created": iso(t.created_ms),
        "updated": iso(t.updated_ms),
        "request": _request(t.spec),
        "progress": {"scanned": t.scanned, "moved": t.moved, "skipped": t.skipped},
    }


async def _preview(
    store: Store, q: QueueRef, spec: RedriveSpec, now: int, provenance: bool
) -> dict[str, Any]:
    """What a redrive would move now: the DLQ read page by page (nothing changes), counted and sampled."""
    scanned = matched = claimed = 0
    by_source: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    sample: list[Message] = []
    marker: int | None = None
    complete = False
    while scanned < PREVIEW_SCAN_CAP:
        page = await store.list_messages(
            q,
            marker=marker,
            limit=PREVIEW_PAGE,
            echo=True,
            client_id="",
            include_claimed=True,
            include_delayed=True,
        )
        scanned += len(page.items)
        for m in page.items:
            if not spec.matches(m) or m.dead_letter is None:
                continue
            matched += 1
            by_source[m.dead_letter.source_queue] += 1
            by_reason[m.dead_letter.reason] += 1
            if m.is_claimed(now):
                claimed += 1
            elif len(sample) < SAMPLE:
                sample.append(m)
        if page.next_marker is None:
            complete = True
            break
        marker = int(page.next_marker)
    movable = matched - claimed
    return {
        "dry_run": True,
        "scanned": scanned,
        "matched": matched,
        "would_move": movable if spec.limit is None else min(movable, spec.limit),
        "claimed": claimed,
        "by_source_queue": dict(by_source),
        "by_reason": dict(by_reason),
        "sample": messages(sample, now, provenance=provenance),
        "complete": complete,
    }


@router.post(
    "/v2/queues/{queue_name}/redrive",
    status_code=202,
    response_model=RedriveTaskOut,
    summary="Move dead letters back to their source queue, or to a destination (EXT)",
    description="Each move is atomic; a moved message gets claim count 0 and its provenance's "
    "`redrive_count` + 1. `dry_run` counts and samples what would move. A redrive of `limit` <= 100 without "
    "`max_per_second` is done before the answer (200); any other runs as a durable task (202 with its "
    "Location), resumed by another API process if the one running it dies.\n\n"
    '`curl -X POST -H "Client-ID: $CID" -H "X-Project-ID: $P" "$BASE/v2/queues/orders.dlq/redrive" '
    """-d '{"filter": {"reason": "rejected"}, "max_per_second": 100}'`""",
    responses={
        200: {
            "description": "A dry run (RedrivePreviewOut), or a small redrive done before the answer "
            "(RedriveTaskOut).",
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/RedrivePreviewOut"},
                            {"$ref": "#/components/schemas/RedriveTaskOut"},
                        ]
                    }
                }
            },
        },
    },
    openapi_extra=json_body(RedriveIn),
)
async def start_redrive(
    q: QueueDep,
    store: StoreDep,
    limits: LimitsDep,
    clock: ClockDep,
    provenance: ProvenanceDep,
    runner: RedriveDep,
    request: Request,
) -> Response:
    raw = await read_object(request, max_size=limits.max_queue_metadata, what="A redrive request")
    body = validate_body(RedriveIn, raw)
    spec = _spec(q, body)
    if body.dry_run:
        return json_response(await _preview(store, q, spec, clock.now_ms(), provenance))
    task_id = TaskId(uuid.uuid4().hex)
    task = await store.create_redrive(q, task_id, spec, owner=runner.owner, lease_ms=runner.lease_ms)
    if spec.limit is not None and spec.limit <= INLINE_LIMIT and spec.max_per_second is None:
        done = await runner.run(q, task_id, raise_errors=True)
        return json_response(task_out(done or await store.get_redrive(q, task_id)))
    runner.start(q, task_id)
    return json_response(task_out(task), status_code=202, headers={"Location": task_out(task)["href"]})


@router.get(
    "/v2/queues/{queue_name}/redrive",
    response_model=RedriveTasksOut,
    summary="The DLQ's redrive tasks, newest first (EXT; finished ones are kept 7 days)",
    description='`curl -H "Client-ID: $CID" -H "X-Project-ID: $P" "$BASE/v2/queues/orders.dlq/redrive"`',
)
async def list_redrives(
    q: QueueDep,
    store: StoreDep,
    limits: LimitsDep,
    limit: Annotated[int | None, Query(description="Most tasks to list, 1 to 20.")] = None,
) -> Response:
    size = check_page_limit(limit if limit is not None else limits.default_messages_per_page, limits)
    return json_response({"tasks": [task_out(t) for t in await store.list_redrives(q, limit=size)]})


def _task_id(task_id: str, q: QueueRef) -> TaskId:
    if not is_valid_id(task_id):
        raise NotFound(f"Queue {q.name} has no redrive task {task_id[:40]}.")
    return TaskId(task_id)


@router.get(
    "/v2/queues/{queue_name}/redrive/{task_id}",
    response_model=RedriveTaskOut,
    summary="A redrive task's progress (EXT)",
    description='`curl -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/orders.dlq/redrive/$TASK"`',
    responses={404: {"model": ErrorOut}},
)
async def get_redrive(q: QueueDep, task_id: str, store: StoreDep) -> Response:
    return json_response(task_out(await store.get_redrive(q, _task_id(task_id, q))))


@router.delete(
    "/v2/queues/{queue_name}/redrive/{task_id}",
    response_model=RedriveTaskOut,
    summary="Cancel a running redrive task; what it moved stays moved (EXT)",
    description='`curl -X DELETE -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/orders.dlq/redrive/$TASK"`',
    responses={404: {"model": ErrorOut}},
)
async def cancel_redrive(q: QueueDep, task_id: str, store: StoreDep) -> Response:
    return json_response(task_out(await store.cancel_redrive(q, _task_id(task_id, q))))
