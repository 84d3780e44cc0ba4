"""Request dependencies: the store, the limits, and the checked Client-ID / X-Project-ID / queue name."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Depends, Header, Path, Query, Request
from pydantic import BaseModel, ValidationError

from app.redrive import RedriveRunner
from core.clock import Clock
from core.errors import InvalidBody, PayloadTooLarge
from core.limits import Limits, check_client_id, check_project, check_queue_name
from core.metadata import DeadLetterDefaults
from core.models import QueueRef
from storage.base import Store

M = TypeVar("M", bound=BaseModel)


def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def get_limits(request: Request) -> Limits:
    limits: Limits = request.app.state.limits
    return limits


def get_clock(request: Request) -> Clock:
    clock: Clock = request.app.state.clock
    return clock


def get_defaults(request: Request) -> DeadLetterDefaults:
    defaults: DeadLetterDefaults = request.app.state.defaults
    return defaults


def get_redrive(request: Request) -> RedriveRunner:
    runner: RedriveRunner = request.app.state.redrive
    return runner


def show_provenance(
    request: Request,
    provenance: Annotated[
        bool | None,
        Query(
            description="Show the `dead_letter` object on dead-lettered messages. Default: on, unless the "
            "service runs with CHARON_PROVENANCE=false (for python-zaqarclient consumers of DLQs)."
        ),
    ] = None,
) -> bool:
    default: bool = request.app.state.provenance
    return default if provenance is None else provenance


def project_id(x_project_id: Annotated[str | None, Header(alias="X-Project-ID")] = None) -> str:
    return check_project(x_project_id)


def client_id(client_id: Annotated[str | None, Header(alias="Client-ID")] = None) -> str:
    return check_client_id(client_id)


def queue_ref(
    queue_name: Annotated[str, Path(description="Queue name: letters, digits, '_', '-', '.'; 1 to 64.")],
    project: Annotated[str, Depends(project_id)],
    _client: Annotated[str, Depends(client_id)],
) -> QueueRef:
    return QueueRef(project=project, name=check_queue_name(queue_name))


StoreDep = Annotated[Store, Depends(get_store)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
ClockDep = Annotated[Clock, Depends(get_clock)]
ProjectDep = Annotated[str, Depends(project_id)]
ClientIdDep = Annotated[str, Depends(client_id)]
QueueDep = Annotated[QueueRef, Depends(queue_ref)]
ProvenanceDep = Annotated[bool, Depends(show_provenance)]
DefaultsDep = Annotated[DeadLetterDefaults, Depends(get_defaults)]
RedriveDep = Annotated[RedriveRunner, Depends(get_redrive)]


async def read_json(request: Request, *, max_size: int, what: str) -> tuple[Any, int]:
    """The parsed JSON body (None when empty) and its size in bytes; 413 past `max_size`."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_size:
        raise PayloadTooLarge(f"{what} may be at most {max_size} bytes; got {declared}.")
    raw = await request.body()
    if len(raw) > max_size:
        raise PayloadTooLarge(f"{what} may be at most {max_size} bytes; got {len(raw)}.")
    if not raw.strip():
        return None, 0
    try:
        return orjson.loads(raw), len(raw)
    except orjson.JSONDecodeError:
        raise InvalidBody("Request body could not be parsed: it is not valid JSON.") from None


def validate_body(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            parts.append(f"{where}: {err['msg']}" if where else err["msg"])
        raise InvalidBody("; ".join(parts)) from None
