"""Messages: post in batches, list with marker paging, get/delete by ids, pop, get/delete one."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated
from urllib.parse import urlencode

import orjson
from fastapi import Depends, Request, Response
from pydantic import Field

from api.auth import sent_twice
from api.deps import (
    CallDep,
    ClientIdDep,
    ClockDep,
    LimitsDep,
    ProvenanceQuery,
    QueueDep,
    ShownDep,
    StoreDep,
    call_of,
    header_parameter,
    read_json,
    read_object,
    validate_body,
)
from api.ids import ClaimIdParam, MessageIdDep, claim_ids, in_path_to_delete, message_ids
from api.params import QUERY, QueryModel
from api.render import json_response, message, messages
from api.routing import Router
from api.schemas import (
    ErrorOut,
    MessageOut,
    MessagesOut,
    MessagesPage,
    NotDeletedOut,
    PostedOut,
    PostMessagesIn,
    RejectIn,
    RejectOut,
    json_body,
)
from api.state import state_of
from core.errors import InvalidInput, MessageNotFound, MessageUnreadable, NotAllDeleted
from core.limits import (
    DELAY_DOC,
    check_claim_limit,
    check_json_depth,
    check_marker,
    check_message_delay,
    check_message_ttl,
    check_page_limit,
    check_release_delay,
    max_delete_ids,
)
from core.models import Idempotency, MessageId, NewMessage, Rejection

CLAIM_ID_DOC = "The claim that holds the message."

router = Router(
    tags=["messages"],
    responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}},
)


IDEMPOTENCY_DOC = (
    "A key of your choosing (1 to 255 printable ASCII characters, optionally in double quotes as the "
    "IETF httpapi draft's sf-string; no quote or backslash inside) that makes the post safe to repeat: a "
    "post with the same key on the same queue within CHARON_IDEMPOTENCY_WINDOW (300 s) stores nothing and "
    "answers the first post's resources; the same key with other messages answers 422. Use it to retry a "
    "post whose answer was lost or was a 503 saying the outcome is unknown."
)
# 1 to 255 printable ASCII characters but '"' and '\', bare (no space at either end: HTTP strips those) or in
# double quotes (the draft's sf-string). Checked with this very pattern, which openapi.yaml publishes.
IDEMPOTENCY_PATTERN = r'^(?:[!#-\[\]-~](?:[ !#-\[\]-~]{0,253}[!#-\[\]-~])?|"[ !#-\[\]-~]{1,255}")$'
_KEY_RE = re.compile(IDEMPOTENCY_PATTERN)


def idempotency_key(request: Request) -> str | None:
    sent = request.headers.getlist("idempotency-key")
    if not sent:
        return None
    if len(sent) > 1:
        raise sent_twice("Idempotency-Key")
    key = sent[0].strip()
    if _KEY_RE.fullmatch(key) is None:
        raise InvalidInput(
            "Idempotency-Key must be 1 to 255 printable ASCII characters (in double quotes or not), with no "
            f"quote or backslash inside; got {sent[0][:80]!r}."
        )
    return key[1:-1] if key.startswith('"') else key


def fingerprint(body: PostMessagesIn) -> str:
    """What makes two posts the same: their messages, in order (object keys in any order)."""
    given = [[m.body, m.ttl, m.delay, m.dead_letter_eligible] for m in body.messages]
    return hashlib.sha256(orjson.dumps(given, option=orjson.OPT_SORT_KEYS)).hexdigest()


IDS_DOC = "Message ids, comma-separated (at most 20; on a delete, at most max_messages_per_claim if larger)."
NOT_DELETED_REASONS = (
    "not_claimed: no live claim holds it; claimed_by_another: a claim not listed holds it; dead_lettered: "
    "its claim expired and it was moved to the DLQ, from which it will be delivered again"
)


class ListQuery(ProvenanceQuery):
    ids: list[str] | None = Field(None, description=IDS_DOC)
    marker: str | None = Field(None, description="Where the previous page ended.")
    limit: int | None = Field(None, description="Page size, 1 to 20.")
    echo: bool = Field(False, description="Include this client's own messages.")
    include_claimed: bool = False
    include_delayed: bool = False


class DeleteManyQuery(ProvenanceQuery):
    ids: list[str] | None = Field(None, description=IDS_DOC)
    claim_ids: list[str] | None = Field(
        None,
        description="Claim ids, comma-separated (Zaqar's `message_delete_with_claim_id`): each listed "
        "message is deleted only if one of these claims holds it now (claim-safe acknowledge); the others "
        "stay, answered 403 with `not_deleted`. Without it, `ids` are deleted whatever holds them (Zaqar). "
        "Only with `ids` (400).",
    )
    pop: int | None = Field(None, description="How many messages to take and delete, 1 to 20.")


class DeleteQuery(QueryModel):
    claim_id: ClaimIdParam | None = Field(None, description=CLAIM_ID_DOC)


class ReleaseQuery(QueryModel):
    claim_id: ClaimIdParam = Field(description=CLAIM_ID_DOC)
    delay: int | None = Field(None, description=DELAY_DOC)


class RejectQuery(QueryModel):
    claim_id: ClaimIdParam = Field(description=CLAIM_ID_DOC)


@router.plain(
    "POST",
    "/v2/queues/{queue_name}/messages",
    status_code=201,
    response_model=PostedOut,
    summary="Post messages (the queue is created if absent)",
    responses={413: {"model": ErrorOut}, 422: {"model": ErrorOut}},
    openapi_extra={
        "parameters": [header_parameter("Idempotency-Key", IDEMPOTENCY_DOC, pattern=IDEMPOTENCY_PATTERN)],
        **json_body(PostMessagesIn, required=True),
    },
)
async def post_messages(request: Request) -> Response:
    call = call_of(request)
    q, limits = call.q, call.limits
    posted = await read_json(request, max_size=limits.max_messages_post_size, what="A message post")
    body = validate_body(PostMessagesIn, posted.value)
    deep = posted.containers > limits.max_json_depth  # else no body can be too deep: skip the walk
    new = []
    for i, m in enumerate(body.messages):
        if deep:
            check_json_depth(m.body, limits, f"messages.{i}.body")
        if m.ttl is not None:
            check_message_ttl(m.ttl, limits, f"messages.{i}.ttl")
        if m.delay is not None:
            check_message_delay(m.delay, limits, f"messages.{i}.delay")
        new.append(
            NewMessage(body=m.body, ttl=m.ttl, delay=m.delay, dead_letter_eligible=m.dead_letter_eligible)
        )
    key = idempotency_key(request)
    once = None
    if key is not None:
        once = Idempotency(key, fingerprint(body), state_of(request).idempotency_window_ms)
    ids = await call.store.post_messages(
        q,
        new,
        client_id=call.client,
        default_ttl=limits.default_message_ttl,
        default_delay=0,
        body_size=posted.size,
        idempotency=once,
    )
    base = f"{q.href}/messages"
    return json_response(
        {"resources": [f"{base}/{i}" for i in ids]},
        status_code=201,
        headers={"Location": f"{base}?ids={','.join(ids)}"},
    )


@router.get(
    "/v2/queues/{queue_name}/messages",
    response_model=MessagesPage,
    summary="List messages (marker paging), or get messages by ids",
    responses={404: {"model": ErrorOut}},
)
async def list_messages(
    q: QueueDep,
    client: ClientIdDep,
    store: StoreDep,
    limits: LimitsDep,
    clock: ClockDep,
    shown: ShownDep,
    params: Annotated[ListQuery, QUERY],
) -> Response:
    ids, marker, limit, echo = params.ids, params.marker, params.limit, params.echo
    include_claimed, include_delayed = params.include_claimed, params.include_delayed
    if ids is not None:
        listed = message_ids(ids, limits.max_messages_per_page)
        found = await store.get_messages(q, listed) if listed else []
        if not found:
            raise MessageNotFound("None of the listed messages exists.")
        now = clock.now_ms()
        return json_response({"messages": messages(found, now, shown)})
    size = check_page_limit(limit if limit is not None else limits.default_messages_per_page, limits)
    page = await store.list_messages(
        q,
        marker=check_marker(marker) if marker is not None else None,
        limit=size,
        echo=echo,
        client_id=client,
        include_claimed=include_claimed,
        include_delayed=include_delayed,
    )
    now = clock.now_ms()
    links = []
    if page.next_marker is not None:
        query = urlencode(
            {
                "marker": page.next_marker,
                "limit": size,
                "echo": str(echo).lower(),
                "include_claimed": str(include_claimed).lower(),
                "include_delayed": str(include_delayed).lower(),
                "provenance": str(shown.provenance).lower(),
            }
        )
        links.append({"rel": "next", "href": f"{q.href}/messages?{query}"})
    return json_response({"messages": messages(page.items, now, shown), "links": links})


@router.plain(
    "DELETE",
    "/v2/queues/{queue_name}/messages",
    summary="Delete messages by ids (204), or pop up to N messages (200)",
    description="With `claim_ids`, a claim-safe bulk acknowledge: each message listed in `ids` is deleted "
    "only if one of the listed claims holds it now, in one atomic step on Redis (a guarded delete per "
    "message on MongoDB). 204 when every listed message was deleted (ids of messages that no longer exist "
    "are skipped); else 403 with `not_deleted`, each `{id, reason}`, reason `not_claimed` (no live claim "
    "holds it: the claim expired, or it was never claimed), `claimed_by_another`, or `dead_lettered` (the "
    "claim expired and the message was moved to the DLQ meanwhile: it will be delivered again from there); "
    "the others were deleted.\n\n"
    '`curl -X DELETE -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/jobs/messages?ids=$M1,$M2&claim_ids=$CLAIM"`',
    status_code=204,
    responses={
        200: {"model": MessagesOut, "description": "The popped messages."},
        403: {
            "model": NotDeletedOut,
            "description": "Some listed messages were not deleted (`not_deleted`).",
        },
    },
)
async def delete_messages(request: Request, params: DeleteManyQuery) -> Response:
    """A plain route: a consumer acknowledges a claim's messages here, one request a claim."""
    call = call_of(request)
    q, store, limits = call.q, call.store, call.limits
    ids, pop = params.ids, params.pop
    if params.claim_ids is not None and ids is None:
        raise InvalidInput("claim_ids goes with ids: the claims that hold the listed messages.")
    if (ids is None) == (pop is None):
        raise InvalidInput(
            "Give either ids (to delete those messages) or pop (to take N), not both or neither."
        )
    if pop is not None:
        check_claim_limit(pop, limits, "pop")
        try:
            popped = await store.pop_messages(q, limit=pop)
        except MessageUnreadable as e:  # a 5xx never hides what was done
            raise e.after(
                "The messages were taken off the queue all the same (a pop deletes what it takes): this "
                "answer could not show them."
            ) from None
        now = call.clock.now_ms()
        shown = call.show(params.provenance)
        return json_response({"messages": messages(popped, now, shown)})
    assert ids is not None
    listed = message_ids(ids, max_delete_ids(limits))
    if params.claim_ids is None:
        if listed:
            await store.delete_messages(q, listed)
        return Response(status_code=204)
    claims = claim_ids(params.claim_ids, max_delete_ids(limits))
    left = await store.delete_messages(q, listed, claim_ids=claims) if listed else []
    if left:
        one = len(left) == 1
        raise NotAllDeleted(
            f"{len(left)} of the listed messages {'was' if one else 'were'} not deleted, since none of the "
            f"given claims holds {'it' if one else 'them'} now (not_deleted says which and why: "
            f"{NOT_DELETED_REASONS}); the others were deleted.",
            [{"id": n.id, "reason": n.reason} for n in left],
        )
    return Response(status_code=204)


@router.get(
    "/v2/queues/{queue_name}/messages/{message_id}",
    response_model=MessageOut,
    summary="Get one message",
    responses={404: {"model": ErrorOut}},
)
async def get_message(
    q: QueueDep, mid: MessageIdDep, store: StoreDep, clock: ClockDep, shown: ShownDep
) -> Response:
    found = await store.get_messages(q, [mid])
    if not found:
        raise MessageNotFound(f"Message {mid} does not exist in queue {q.name}.")
    return json_response(message(found[0], clock.now_ms(), shown))


@router.plain(
    "DELETE",
    "/v2/queues/{queue_name}/messages/{message_id}",
    status_code=204,
    summary="Delete one message (a claimed one needs its claim_id)",
    responses={403: {"model": ErrorOut}},
)
async def delete_message(request: Request, params: DeleteQuery) -> Response:
    call = call_of(request)
    mid = in_path_to_delete(request, "message_id")
    if mid is not None:  # else it names no message: nothing to delete
        await call.store.delete_message(call.q, MessageId(mid), claim_id=params.claim_id)
    return Response(status_code=204)


@router.post(
    "/v2/queues/{queue_name}/messages/{message_id}/release",
    status_code=204,
    summary="Release one message of a claim (EXT): claimable again after `delay`, or the queue's backoff",
    description="The claim keeps its other messages. A message that used up `_max_claim_count` moves to the "
    "DLQ now, whatever the delay.\n\n"
    '`curl -X POST -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/jobs/messages/$MID/release?claim_id=$CLAIM&delay=10"`',
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}},
)
async def release_message(
    call: CallDep, params: Annotated[ReleaseQuery, QUERY], mid: MessageIdDep
) -> Response:
    wait = check_release_delay(params.delay, call.limits)
    await call.store.release_message(call.q, mid, claim_id=params.claim_id, delay=wait)
    return Response(status_code=204)


async def _rejection(call: CallDep, request: Request) -> RejectIn:
    raw = await read_object(request, max_size=call.limits.max_queue_metadata, what="A rejection")
    return validate_body(RejectIn, raw)


@router.post(
    "/v2/queues/{queue_name}/messages/{message_id}/dead_letter",
    response_model=RejectOut,
    summary="Dead-letter a claimed message now, with a reason (EXT: reject)",
    description="Moves the message to the queue's DLQ at once: provenance reason `rejected`, with the "
    "given text as `rejection`. 409 when the queue has no `_dead_letter_queue`.\n\n"
    '`curl -X POST -H "Client-ID: $CID" -H "X-Project-ID: $P" '
    '"$BASE/v2/queues/orders/messages/$MID/dead_letter?claim_id=$CLAIM" '
    """-d '{"reason": "bad schema", "description": "field sku is null"}'`""",
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}, 409: {"model": ErrorOut}},
    openapi_extra=json_body(RejectIn),
)
async def dead_letter_message(
    call: CallDep,
    body: Annotated[RejectIn, Depends(_rejection)],
    params: Annotated[RejectQuery, QUERY],
    mid: MessageIdDep,
) -> Response:
    moved = await call.store.dead_letter_message(
        call.q,
        mid,
        claim_id=params.claim_id,
        rejection=Rejection(reason=body.reason, description=body.description),
        client_id=call.client,
    )
    return json_response({"outcome": "moved" if moved else "discarded"})
