"""Per-project quotas (EXT; docs/quotas.md): `GET /v2/quotas/{project}` shows what the project may do (its
overrides over the service's defaults); `PUT` sets overrides and `DELETE` removes them, admin only by
default (policy rules `quotas:update`, `quotas:delete`). A project reads its own quotas under
`quotas:get`; another project's needs `quotas:get_any` too (the admin role by default). The counted quotas
an admin sets apply to the project's topics too, counted apart from its queues (the drivers read them in
the topics' own space)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Request, Response

from api.auth import identity_of, may
from api.deps import read_object, validate_body
from api.params import path_value
from api.render import json_response
from api.routing import Router
from api.schemas import ErrorOut, QuotaIn, QuotaOut, json_body
from api.state import state_of
from core.errors import InvalidInput, PolicyDenied
from core.limits import check_project
from core.models import topics_of
from core.quotas import MESSAGE_BYTES, QUEUES, QUOTA, QUOTAS, RATE_OF

QUOTA_BODY_LIMIT = 4096
READ_ANY = "quotas:get_any"

router = Router(
    tags=["quotas"],
    responses={400: {"model": ErrorOut}, 403: {"model": ErrorOut}, 503: {"model": ErrorOut}},
)
Project = Annotated[str, path_value("project")]


def _project(project: str) -> str:
    try:
        return check_project(project)
    except InvalidInput as e:
        raise InvalidInput(str(e).replace("X-Project-ID", "The project in the path")) from None


def _shown(request: Request, project: str, overrides: dict[str, float]) -> dict[str, Any]:
    state = state_of(request)
    limiter = state.auth.limiter
    defaults: dict[str, float | None] = {q.name: None for q in QUOTAS}
    if limiter is not None:
        defaults.update({RATE_OF[b]: rate for b, rate in limiter.defaults.items()})
    defaults.update(state.quotas.of({}))
    overrides = {k: int(v) if QUOTA[k].counted else v for k, v in overrides.items() if k in QUOTA}
    return {
        "project": project,
        "quotas": {name: overrides.get(name, default) for name, default in defaults.items()},
        "overrides": overrides,
        "defaults": defaults,
    }


@router.get("/v2/quotas/{project}", response_model=QuotaOut, summary="Get a project's quotas (EXT)")
async def get_quotas(request: Request, project: Project) -> Response:
    project = _project(project)
    caller = identity_of(request).project
    if project != caller and not may(request, READ_ANY):
        raise PolicyDenied(
            f"Policy rule {READ_ANY} does not let this caller read the quotas of another project than its "
            "own; it may read its own.",
            READ_ANY,
        )
    store = state_of(request).store
    overrides = await store.get_quota(project)
    shown = _shown(request, project, overrides)
    shown["use"] = {QUEUES: await store.count_queues(project)}
    if shown["quotas"][MESSAGE_BYTES] is not None:  # a sum over the project's messages on MongoDB
        shown["use"][MESSAGE_BYTES] = await store.held_bytes(project)
    return json_response(shown)


@router.put(
    "/v2/quotas/{project}",
    response_model=QuotaOut,
    summary="Set a project's quotas (EXT; admin)",
    openapi_extra=json_body(QuotaIn, required=True),
)
async def put_quotas(request: Request, project: Project) -> Response:
    project = _project(project)
    raw = await read_object(request, max_size=QUOTA_BODY_LIMIT, what="The quotas")
    body = validate_body(QuotaIn, raw)
    if not body.model_fields_set:
        raise InvalidInput(f"Name at least one quota to set: {', '.join(q.name for q in QUOTAS)}.")
    state = state_of(request)
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    overrides = await state.store.set_quota(project, changes)
    if counted := {name: value for name, value in changes.items() if QUOTA[name].counted}:
        await state.store.set_quota(topics_of(project), counted)  # its topics are counted alike, apart
    if state.auth.limiter is not None:
        state.auth.limiter.forget(project)
    return json_response(_shown(request, project, overrides))


@router.delete(
    "/v2/quotas/{project}",
    status_code=204,
    summary="Remove a project's quotas: the defaults again (EXT; admin)",
)
async def delete_quotas(request: Request, project: Project) -> Response:
    project = _project(project)
    state = state_of(request)
    await state.store.delete_quota(project)
    await state.store.delete_quota(topics_of(project))
    if state.auth.limiter is not None:
        state.auth.limiter.forget(project)
    return Response(status_code=204)
