"""Claims: create (with ttl, grace, limit), get, renew (PATCH), release (DELETE)."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request, Response
from pydantic import Field

from api.deps import (
    CallDep,
    ClockDep,
    ProvenanceQuery,
    QueueDep,
    ShownDep,
    StoreDep,
    call_of,
    read_object,
    validate_body,
)
from api.ids import ClaimIdDep, claim_id, in_path_to_delete
from api.params import QueryModel
from api.render import json_response, messages
from api.routing import Router
from api.schemas import ClaimCreateIn, ClaimIn, ClaimOut, ErrorOut, MessagesOut, json_body
from api.state import state_of
from core.errors import InvalidInput, MessageUnreadable
from core.limits import (
    DELAY_DOC,
    Limits,
    check_claim_grace,
    check_claim_limit,
    check_claim_ttl,
    check_range,
    check_release_delay,
)
from core.models import ClaimId

router = Router(tags=["claims"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}})

C = TypeVar("C", bound=ClaimIn)
CLAIM_BODY = json_body(ClaimIn)
CREATE_CLAIM_BODY = json_body(ClaimCreateIn)


async def _claim_body(request: Request, limits: Limits, model: type[C]) -> C:
    raw = await read_object(request, max_size=limits.max_queue_metadata, what="A claim body")
    return validate_body(model, raw)


class ClaimQuery(ProvenanceQuery):
    limit: int | None = Field(None, description="Most messages to claim, 1 to 20 (max_messages_per_claim).")
    wait: int | None = Field(
        None,
        description="Long polling (EXT, SQS's WaitTimeSeconds): when nothing is claimable, wait up to this "
        "many seconds (0 to 20, max_claim_wait) until a message is (posted, released, its delay over, "
        "dead-lettered into or redriven to this queue), then claim it; 204 if none came. Default 0.",
    )


class ReleaseQuery(QueryModel):
    delay: int | None = Field(None, description=DELAY_DOC)
    acknowledge: bool = Field(
        False,
        description="EXT: true deletes the messages the claim still holds, with the claim, in one step "
        '("I processed everything I claimed"); 404 when the claim does not exist or has expired. Not with '
        "`delay` (400).",
    )


@router.plain(
    "POST",
    "/v2/queues/{queue_name}/claims",
    status_code=201,
    response_model=MessagesOut,
    summary="Claim up to `limit` messages (204 when none is claimable, after `wait` seconds if given)",
    description="With `wait` (long polling, EXT), a claim that finds nothing waits until a message becomes "
    "claimable or `wait` seconds pass: woken by the store (Redis pub/sub, a MongoDB change stream), one "
    "waiter a message. At most max_waiting_claims (1000) claims wait at once in one API process: beyond, "
    "503 (claim again in a moment). At shutdown, waiting claims answer at once (204).\n\n"
    '`curl -X POST -H "Client-ID: $CID" -H "X-Project-ID: $P" -H "Content-Type: application/json" '
    '-d \'{"ttl": 60}\' "$BASE/v2/queues/jobs/claims?limit=10&wait=20"`',
    responses={204: {"description": "Nothing to claim (within `wait`)."}},
    openapi_extra=CREATE_CLAIM_BODY,
)
async def create_claim(request: Request, params: ClaimQuery) -> Response:
    call = call_of(request)
    limits = call.limits
    shown = call.show(params.provenance)
    if params.limit is not None:
        check_claim_limit(params.limit, limits)
    wait = check_range(params.wait, 0, limits.max_claim_wait, "wait") if params.wait is not None else 0
    body = await _claim_body(request, limits, ClaimCreateIn)
    if body.limit is not None:  # bounded even where the query's wins
        check_claim_limit(body.limit, limits)
    limit = params.limit if params.limit is not None else body.limit  # the query's wins
    size = check_claim_limit(limit if limit is not None else limits.default_messages_per_claim, limits)
    ttl = check_claim_ttl(body.ttl if body.ttl is not None else limits.default_claim_ttl, limits)
    grace = check_claim_grace(body.grace if body.grace is not None else limits.default_claim_grace, limits)
    try:
        if wait:
            polls = state_of(request).long_polls
            result = await polls.claim(
                call.q, ttl=ttl, grace=grace, limit=size, wait=wait, client_id=call.client
            )
        else:
            result = await call.store.claim(call.q, ttl=ttl, grace=grace, limit=size, client_id=call.client)
    except MessageUnreadable as e:  # a 5xx never hides what was done
        raise e.after(
            "The claim was made all the same: its messages are claimable again when it expires (its ttl), "
            "and count that claim."
        ) from None
    if result.claim is None:
        return Response(status_code=204)
    now = call.clock.now_ms()
    return json_response(
        {"messages": messages(result.claim.messages, now, shown, claim=result.claim.id)},
        status_code=201,
        headers={"Location": f"/v2/queues/{call.q.name}/claims/{result.claim.id}"},
    )


@router.get(
    "/v2/queues/{queue_name}/claims/{claim_id}",
    response_model=ClaimOut,
    summary="A claim and the messages it holds",
    responses={404: {"model": ErrorOut}},
)
async def get_claim(
    q: QueueDep, cid: ClaimIdDep, store: StoreDep, clock: ClockDep, shown: ShownDep
) -> Response:
    claim = await store.get_claim(q, cid)
    now = clock.now_ms()
    return json_response(
        {
            "age": claim.age(now),
            "ttl": claim.ttl,
            "grace": claim.grace,
            "href": f"/v2/queues/{q.name}/claims/{claim.id}",
            "messages": messages(claim.messages, now, shown, claim=claim.id),
        }
    )


@router.patch(
    "/v2/queues/{queue_name}/claims/{claim_id}",
    status_code=204,
    summary="Renew a claim: new ttl and grace, age starts again",
    responses={404: {"model": ErrorOut}},
    openapi_extra=CLAIM_BODY,
)
async def renew_claim(call: CallDep, cid: ClaimIdDep, request: Request) -> Response:
    q, store, limits = call.q, call.store, call.limits
    body = await _claim_body(request, limits, ClaimIn)
    ttl, grace = body.ttl, body.grace
    if ttl is None or grace is None:  # keep what the claim has for a field not given
        current = await store.get_claim(q, cid)
        ttl = current.ttl if ttl is None else ttl
        grace = current.grace if grace is None else grace
    await store.renew_claim(q, cid, ttl=check_claim_ttl(ttl, limits), grace=check_claim_grace(grace, limits))
    return Response(status_code=204)


@router.plain(
    "DELETE",
    "/v2/queues/{queue_name}/claims/{claim_id}",
    status_code=204,
    summary="Release a claim: its messages can be claimed again (after `delay`, or the queue's backoff); "
    "or, with `acknowledge=true`, delete them with it",
    responses={404: {"model": ErrorOut, "description": "acknowledge=true: no such live claim."}},
    description="With `acknowledge=true` (EXT), the messages the claim still holds are deleted with the "
    "claim in one step (one script on Redis; on MongoDB the messages, then the claim), and an unknown or "
    "expired claim is 404: the messages may be delivered again.\n\n"
    "Without `delay`, each message waits the queue's redelivery backoff (`_redelivery_delay`, "
    "`_redelivery_delay_multiplier`, `_max_redelivery_delay`, `_redelivery_jitter`, "
    "`_redelivery_delay_levels`), counted by its claim count; without a backoff it is claimable at once.\n\n"
    '`curl -X DELETE -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/jobs/claims/$CLAIM?delay=30"`',
)
async def release_claim(request: Request, params: ReleaseQuery) -> Response:
    call = call_of(request)
    wait = check_release_delay(params.delay, call.limits)
    if params.acknowledge:
        if wait is not None:
            raise InvalidInput(
                "acknowledge=true deletes the claim's messages: a delay has no meaning with it."
            )
        await call.store.acknowledge_claim(call.q, claim_id(request))
        return Response(status_code=204)
    cid = in_path_to_delete(request, "claim_id")
    if cid is not None:  # else it names no claim: nothing to release
        await call.store.release_claim(call.q, ClaimId(cid), delay=wait)
    return Response(status_code=204)
