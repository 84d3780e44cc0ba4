"""Redrive (EXT, SQS's DLQ redrive / StartMessageMoveTask): move dead letters back, as a durable task."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Request, Response
from pydantic import Field

from api.deps import (
    ClockDep,
    LimitsDep,
    QueueDep,
    RedriveDep,
    ShownDep,
    StoreDep,
    read_object,
    validate_body,
)
from api.ids import TaskIdDep
from api.params import QUERY, QueryModel
from api.render import EPOCH, Shown, iso, json_response, messages
from api.routing import Router
from api.schemas import ErrorOut, RedriveIn, RedriveTaskOut, RedriveTasksOut, json_body
from core.errors import InvalidInput
from core.limits import check_page_limit, check_time_ms
from core.models import MessageId, QueueRef, RedriveSpec, RedriveTask
from service import redrive

router = Router(tags=["redrive"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}})


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
        message_ids=tuple(map(MessageId, dict.fromkeys(f.message_ids))) if f and f.message_ids else None,
        signature=f.signature if f else None,
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
        "message_ids": list(spec.message_ids) if spec.message_ids is not None else None,
        "signature": spec.signature,
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


def _preview_out(p: redrive.Preview, now: int, shown: Shown) -> dict[str, Any]:
    return {
        "dry_run": True,
        "scanned": p.scanned,
        "matched": p.matched,
        "would_move": p.would_move,
        "claimed": p.claimed,
        "by_source_queue": p.by_source_queue,
        "by_reason": p.by_reason,
        "by_signature": p.by_signature,
        "sample": messages(p.sample, now, shown),
        "complete": p.complete,
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
    shown: ShownDep,
    runner: RedriveDep,
    request: Request,
) -> Response:
    raw = await read_object(request, max_size=limits.max_queue_metadata, what="A redrive request")
    body = validate_body(RedriveIn, raw)
    spec = _spec(q, body)
    if body.dry_run:
        now = clock.now_ms()
        return json_response(_preview_out(await redrive.preview(store, q, spec, now=now), now, shown))
    task, done = await redrive.start(store, runner, q, spec)
    if done:
        return json_response(task_out(task))
    return json_response(task_out(task), status_code=202, headers={"Location": task_out(task)["href"]})


class ListQuery(QueryModel):
    limit: int | None = Field(None, description="Most tasks to list, 1 to 20.")


@router.get(
    "/v2/queues/{queue_name}/redrive",
    response_model=RedriveTasksOut,
    summary="The DLQ's redrive tasks, newest first (EXT; finished ones are kept 7 days)",
    description='`curl -H "Client-ID: $CID" -H "X-Project-ID: $P" "$BASE/v2/queues/orders.dlq/redrive"`',
)
async def list_redrives(
    q: QueueDep, store: StoreDep, limits: LimitsDep, params: Annotated[ListQuery, QUERY]
) -> Response:
    limit = params.limit
    size = check_page_limit(limit if limit is not None else limits.default_messages_per_page, limits)
    return json_response({"tasks": [task_out(t) for t in await store.list_redrives(q, limit=size)]})


@router.get(
    "/v2/queues/{queue_name}/redrive/{task_id}",
    response_model=RedriveTaskOut,
    summary="A redrive task's progress (EXT)",
    description='`curl -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/orders.dlq/redrive/$TASK"`',
    responses={404: {"model": ErrorOut}},
)
async def get_redrive(q: QueueDep, task_id: TaskIdDep, store: StoreDep) -> Response:
    return json_response(task_out(await store.get_redrive(q, task_id)))


@router.delete(
    "/v2/queues/{queue_name}/redrive/{task_id}",
    response_model=RedriveTaskOut,
    summary="Cancel a running redrive task; what it moved stays moved (EXT)",
    description='`curl -X DELETE -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/orders.dlq/redrive/$TASK"`',
    responses={404: {"model": ErrorOut}},
)
async def cancel_redrive(q: QueueDep, task_id: TaskIdDep, store: StoreDep) -> Response:
    return json_response(task_out(await store.cancel_redrive(q, task_id)))
