"""Subscriptions (Zaqar v2): who is told of every message posted to a queue, or dead-lettered into it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import Request, Response
from pydantic import Field

from api.auth import identity_of
from api.deps import ClockDep, LimitsDep, QueueDep, StoreDep, read_object, validate_body
from api.ids import SubscriptionIdDep, SubscriptionIdParam, in_path_to_delete
from api.params import QUERY, QueryModel
from api.render import json_response
from api.routing import Router
from api.schemas import (
    ConfirmIn,
    ErrorOut,
    SubscriptionCreated,
    SubscriptionIn,
    SubscriptionOut,
    SubscriptionPatch,
    SubscriptionsPage,
    json_body,
)
from api.state import state_of
from api.ws_notices import SELF_MADE, SELF_SUBSCRIBER
from core.errors import CharonError, Conflict, InvalidBody, InvalidInput, NotAuthorized, SubscriptionExists
from core.limits import Limits, check_json_depth, check_page_limit, check_range
from core.models import Subscription, SubscriptionId
from service.delivery import check_options
from service.ssrf import check_subscriber, is_trusted

router = Router(tags=["subscriptions"], responses={400: {"model": ErrorOut}, 503: {"model": ErrorOut}})

S = "/v2/queues/{queue_name}/subscriptions"


def _shown(s: Subscription, now_ms: int) -> dict[str, Any]:
    return {
        "id": s.id,
        "source": s.queue,
        "subscriber": s.subscriber,
        "ttl": s.ttl,
        "age": s.age(now_ms),
        "options": s.options,
        "confirmed": s.confirmed,
    }


def _options(options: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """`options` checked: its size, depth, and the fields the service reads (400 naming the field)."""
    size = len(orjson.dumps(options))
    if size > limits.max_subscription_options:
        raise InvalidBody(
            f"options may be at most {limits.max_subscription_options} bytes of JSON "
            f"(CHARON_LIMITS__MAX_SUBSCRIPTION_OPTIONS); got {size}."
        )
    check_json_depth(options, limits, "options")
    check_options(options)  # post_data, post_headers, subject, from, _retry_policy
    return options


def _subscriber(uri: str, limits: Limits, request: Request) -> str:
    if uri == request.scope.get(SELF_SUBSCRIBER):  # a websocket connection subscribing itself
        return uri
    notifications = state_of(request).notifications
    return check_subscriber(
        uri,
        limits,
        allowed_networks=notifications.allowed_networks,
        denied_networks=notifications.denied_networks,
        mail=bool(notifications.smtp_host),
    )


TRUST_ID = "trust_id"  # options' key of a trust+ subscriber's Keystone trust (Zaqar's), the service's own


async def _make_trust(request: Request, expires_ms: int) -> str:
    """A Keystone trust from the caller to the service, until `expires_ms`, for a trust+ subscriber (Zaqar's
    trust notifier: the webhook is sent a token of it, acting as the caller). 400 without Keystone, 403
    without the caller's own token (a pre-signed URL) or when Keystone refuses."""
    trustee = state_of(request).trustee
    if trustee is None:
        raise InvalidInput(
            "A trust+ subscriber is notified with a token of a Keystone trust from its creator, and this "
            "service does not use Keystone (CHARON_AUTH=keystone): subscribe an http, https or mailto URI."
        )
    identity = identity_of(request)
    token = (request.headers.get("x-auth-token") or "").strip(" \t")
    if identity.user is None or identity.project is None or not token:
        raise NotAuthorized("A trust+ subscriber needs its creator's own Keystone token to make a trust.")
    expires = datetime.fromtimestamp(expires_ms / 1000, UTC)
    return await trustee.make(token, identity.user, identity.project, identity.roles, expires)


def _own_trust(options: dict[str, Any], stored: object = None) -> None:
    """A trust+ subscriber's trust is the one the service made: options.trust_id may only repeat it."""
    given = options.get(TRUST_ID)
    if given is not None and given != stored:
        raise InvalidInput(
            f"options.{TRUST_ID} of a trust+ subscriber is the service's: it makes the Keystone trust from "
            "the caller's token. Leave it out."
        )


async def _forget(request: Request, trust: str | None) -> None:
    """Delete a trust that serves no subscription (best effort, with the caller's token)."""
    trustee = state_of(request).trustee
    if trust is not None and trustee is not None:
        await trustee.forget((request.headers.get("x-auth-token") or "").strip(" \t"), trust)


def _ttl(ttl: int, limits: Limits) -> int:
    return check_range(ttl, limits.min_subscription_ttl, limits.max_subscription_ttl, "ttl")


class ListQuery(QueryModel):
    marker: SubscriptionIdParam | None = Field(
        None, description="Id of the last subscription of the previous page."
    )
    limit: int | None = Field(None, description="Page size, 1 to 20.")


@router.post(
    S,
    status_code=201,
    response_model=SubscriptionCreated,
    summary="Subscribe to the queue (Zaqar's): 201 with its id, or the id this subscriber has already",
    description="Each message posted to the queue, and each dead letter moved into it (with its "
    "`dead_letter` provenance), is delivered to the subscriber at least once, from a durable outbox, "
    "retried by the queue's (or the subscription's) `_retry_policy`. Creates the queue when absent. When "
    "the operator requires confirmation (CHARON_NOTIFICATIONS__REQUIRE_CONFIRMATION), a new subscription "
    "is first sent a confirmation request with a pre-signed URL for `PUT .../confirm`, and told nothing "
    "else until confirmed; posting it again while unconfirmed sends the request again (201), and once "
    "confirmed is a 409. A subscriber the queue has already is answered with its subscription's id "
    "(201), which is left as it was: its ttl and options are not changed (PATCH does that).",
    openapi_extra=json_body(SubscriptionIn, required=True),
    responses={409: {"model": ErrorOut}, 413: {"model": ErrorOut}},
)
async def create_subscription(
    q: QueueDep, store: StoreDep, limits: LimitsDep, clock: ClockDep, request: Request
) -> Response:
    raw = await read_object(request, max_size=limits.max_subscription_options + 16_384, what="A subscription")
    body = validate_body(SubscriptionIn, raw)
    subscriber = _subscriber(body.subscriber, limits, request)
    ttl = _ttl(limits.default_subscription_ttl if body.ttl is None else body.ttl, limits)
    options = _options(body.options or {}, limits)
    trust = None
    if is_trusted(subscriber):
        _own_trust(options)
        trust = await _make_trust(request, clock.now_ms() + ttl * 1000)
        options = {**options, TRUST_ID: trust}
    confirmation = state_of(request).notifications.require_confirmation
    try:
        subscription, created = await store.create_subscription(
            q,
            SubscriptionId(uuid.uuid4().hex),
            subscriber=subscriber,
            ttl=ttl,
            options=options,
            confirmed=not confirmation,
            max_per_queue=limits.max_subscriptions_per_queue,
        )
    except CharonError:
        await _forget(request, trust)
        raise
    if not created:  # the subscription there already keeps its own trust
        await _forget(request, trust)
    if subscriber == request.scope.get(SELF_SUBSCRIBER):  # a websocket connection's: it deletes it at close
        request.scope[SELF_MADE].append((q, subscription.id))
    # The subscriber again: its subscription's id (Zaqar's 201), unless a confirmation was required and
    # given, which a repeated request must not undo or send again (Zaqar's 409). Nothing in it changes.
    if not created and confirmation and subscription.confirmed:
        raise SubscriptionExists(
            f"Queue {q.name} has a subscription for this subscriber already ({subscription.id}); "
            "subscriptions are unique by project, queue and subscriber."
        )
    return json_response({"subscription_id": subscription.id}, 201, {"Location": f"{request.url.path}"})


@router.get(S, response_model=SubscriptionsPage, summary="List the queue's subscriptions, in id order")
async def list_subscriptions(
    q: QueueDep,
    store: StoreDep,
    limits: LimitsDep,
    clock: ClockDep,
    params: Annotated[ListQuery, QUERY],
) -> Response:
    size = check_page_limit(
        params.limit if params.limit is not None else limits.default_messages_per_page, limits
    )
    page = await store.list_subscriptions(q, marker=params.marker, limit=size)
    now = clock.now_ms()
    links = []
    if page.next_marker is not None:
        query = urlencode({"marker": page.next_marker, "limit": size})
        links.append({"rel": "next", "href": f"{q.href}/subscriptions?{query}"})
    return json_response({"subscriptions": [_shown(s, now) for s in page.items], "links": links})


@router.get(f"{S}/{{subscription_id}}", response_model=SubscriptionOut, summary="A subscription")
async def get_subscription(
    q: QueueDep, subscription_id: SubscriptionIdDep, store: StoreDep, clock: ClockDep
) -> Response:
    return json_response(_shown(await store.get_subscription(q, subscription_id), clock.now_ms()))


@router.patch(
    f"{S}/{{subscription_id}}",
    status_code=204,
    summary="Change a subscription's subscriber, ttl (counted from now) or options",
    openapi_extra=json_body(SubscriptionPatch, required=True),
    responses={404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 413: {"model": ErrorOut}},
)
async def update_subscription(
    q: QueueDep,
    subscription_id: SubscriptionIdDep,
    store: StoreDep,
    limits: LimitsDep,
    clock: ClockDep,
    request: Request,
) -> Response:
    raw = await read_object(request, max_size=limits.max_subscription_options + 16_384, what="The change")
    body = validate_body(SubscriptionPatch, raw)
    if all(value is None for value in raw.values()):  # null keeps a field (Zaqar; the CLI sends them)
        raise InvalidBody("Give at least one of subscriber, ttl and options to change (null keeps a field).")
    subscriber = None if body.subscriber is None else _subscriber(body.subscriber, limits, request)
    ttl = None if body.ttl is None else _ttl(body.ttl, limits)
    options = None if body.options is None else _options(body.options, limits)
    current = await store.get_subscription(q, subscription_id)
    if subscriber not in (None, current.subscriber) and state_of(request).notifications.require_confirmation:
        # A confirmation (its pre-signed URL) is for the subscription id, not for a subscriber: one that
        # could change its subscriber would carry its confirmation over to an address that never agreed.
        raise Conflict(
            "This service requires confirmed subscriptions (CHARON_NOTIFICATIONS__REQUIRE_CONFIRMATION): "
            "a subscription's subscriber cannot change. Subscribe the new subscriber (it is asked to "
            "confirm) and delete this subscription."
        )
    # A trust+ subscriber is notified as whoever last changed it: every change makes a new trust from the
    # caller's token (another member of the project may not send the creator's identity to a URL or with
    # headers of its choosing), written with the subscriber it was made for, so that two changes at once
    # leave one caller's subscriber and trust, never one's trust with the other's URL. One that stops being
    # trust+ loses its trust.
    trust, stored = None, current.options.get(TRUST_ID) if is_trusted(current.subscriber) else None
    after = subscriber or current.subscriber
    if is_trusted(after):
        if options is not None:
            _own_trust(options, stored)
        expires_ms = current.expires_ms if ttl is None else clock.now_ms() + ttl * 1000
        trust = await _make_trust(request, expires_ms)
        options = {**(current.options if options is None else options), TRUST_ID: trust}
        subscriber = after
    elif stored is not None:
        options = {
            k: v for k, v in (current.options if options is None else options).items() if k != TRUST_ID
        }
    try:
        await store.update_subscription(q, subscription_id, subscriber=subscriber, ttl=ttl, options=options)
    except CharonError:
        await _forget(request, trust)
        raise
    if isinstance(stored, str):
        await _forget(request, stored)  # the trust it had (its creator's token may not delete it: it expires)
    return Response(status_code=204, headers={"Location": request.url.path})


@router.delete(
    f"{S}/{{subscription_id}}", status_code=204, summary="Unsubscribe (what it is owed is dropped)"
)
async def delete_subscription(q: QueueDep, store: StoreDep, request: Request) -> Response:
    sid = in_path_to_delete(request, "subscription_id")
    if sid is not None:  # else it names no subscription: nothing to delete
        await store.delete_subscription(q, SubscriptionId(sid))
    return Response(status_code=204)


@router.put(
    f"{S}/{{subscription_id}}/confirm",
    status_code=204,
    summary="Confirm a subscription, or unsubscribe it with confirmed false (Zaqar's)",
    description="`confirmed: false` stops its notifications and sends it an `UnsubscribeConfirmation` "
    "(with a pre-signed URL to confirm again). A subscriber usually calls this with the pre-signed URL "
    "headers of its confirmation request, without a token.",
    openapi_extra=json_body(ConfirmIn, required=True),
    responses={404: {"model": ErrorOut}, 413: {"model": ErrorOut}},
)
async def confirm_subscription(
    q: QueueDep, subscription_id: SubscriptionIdDep, store: StoreDep, limits: LimitsDep, request: Request
) -> Response:
    raw = await read_object(request, max_size=1024, what="The confirmation")
    body = validate_body(ConfirmIn, raw)
    await store.confirm_subscription(q, subscription_id, confirmed=body.confirmed)
    return Response(status_code=204, headers={"Location": request.url.path})
