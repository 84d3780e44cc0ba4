"""Notifications end to end, on every store: messages posted over HTTP and dead letters moved into a DLQ reach
real subscribers (an HTTP receiver, an SMTP server) through the outbox and the app's notifier; a subscriber
that fails is retried by the retry policy, one that hangs holds up nobody else, and a confirmation is a
pre-signed URL that confirms."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from service.delivery import NotificationSettings
from storage.base import Store
from tests.conftest import api_client
from tests.receivers import LOOPBACK_NETWORKS, HttpReceiver, SmtpReceiver

pytestmark = pytest.mark.every_store

Q = "/v2/queues/orders"
KEY = "the operator's signing key"


@pytest.fixture
def settings(smtp_receiver: SmtpReceiver) -> Settings:
    notifications = NotificationSettings(
        allowed_networks=tuple(LOOPBACK_NETWORKS),  # type: ignore[arg-type]  # pydantic parses them
        webhook_timeout=1,
        smtp_host=smtp_receiver.host,
        smtp_port=smtp_receiver.port,
    )
    return Settings(storage_uri="redis://unused", notifications=notifications, signed_url_key=KEY)


@pytest.fixture
async def app(store: Store, clock: ManualClock, settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(settings, store=store, clock=clock)
    yield app
    await state_of(app).notifier.aclose()
    await state_of(app).deliverer.aclose()
    await state_of(app).long_polls.aclose()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(app) as c:
        yield c


def confirming() -> Settings:
    """A service whose subscribers must confirm (Zaqar's require_confirmation), signing with KEY."""
    notifications = NotificationSettings(
        allowed_networks=tuple(LOOPBACK_NETWORKS),  # type: ignore[arg-type]
        require_confirmation=True,
    )
    return Settings(storage_uri="redis://unused", notifications=notifications, signed_url_key=KEY)


async def notify(app: FastAPI) -> int:
    """One round of the app's notifier, waited to its end: how many deliveries it leased."""
    notifier = state_of(app).notifier
    leased = await notifier.step()
    await notifier.drain()
    return leased


async def subscribe(client: httpx.AsyncClient, subscriber: str, queue: str = Q, **more: Any) -> str:
    r = await client.post(f"{queue}/subscriptions", json={"subscriber": subscriber, **more})
    assert r.status_code == 201, r.text
    sid: str = r.json()["subscription_id"]
    return sid


async def test_every_posted_message_reaches_the_webhook_and_the_mailbox(
    app: FastAPI, client: httpx.AsyncClient, webhook_receiver: HttpReceiver, smtp_receiver: SmtpReceiver
) -> None:
    await subscribe(client, webhook_receiver.url_for("/orders"), options={"post_headers": {"X-Team": "red"}})
    await subscribe(client, "mailto:oncall@example.com?subject=Orders")
    r = await client.post(f"{Q}/messages", json={"messages": [{"body": {"n": 1}}, {"body": {"n": 2}}]})
    ids = [href.rsplit("/", 1)[1] for href in r.json()["resources"]]
    assert await notify(app) == 4
    hooks = await webhook_receiver.arrived(2)
    assert {h.json()["id"] for h in hooks} == set(ids)
    for h in hooks:
        doc = h.json()
        assert (doc["queue_name"], doc["Message_Type"], doc["ttl"]) == ("orders", "Notification", 3600)
        assert doc["body"] == {"n": ids.index(doc["id"]) + 1}
        assert (h.path, h.headers["x-team"], h.headers["content-type"]) == (
            "/orders",
            "red",
            "application/json",
        )
    mails = await smtp_receiver.arrived(2)
    assert {m.subject for m in mails} == {"Orders"}
    assert await notify(app) == 0  # each was delivered once, and is gone


async def test_a_dead_letter_reaches_the_dlq_subscriber_with_its_provenance(
    app: FastAPI, client: httpx.AsyncClient, webhook_receiver: HttpReceiver, clock: ManualClock
) -> None:
    await client.put(Q, json={"_max_claim_count": 1, "_dead_letter_queue": "orders.dlq"})
    await subscribe(client, webhook_receiver.url_for("/dlq"), "/v2/queues/orders.dlq")
    await client.post(f"{Q}/messages", json={"messages": [{"body": "poison"}]})
    claimed = await client.post(f"{Q}/claims", json={"ttl": 60})
    claim_id = claimed.headers["location"].rsplit("/", 1)[1]
    mid = claimed.json()["messages"][0]["id"]
    r = await client.post(
        f"{Q}/messages/{mid}/dead_letter?claim_id={claim_id}",
        json={"reason": "bad_sku", "description": "no such SKU"},
    )
    assert r.status_code in (200, 204), r.text
    assert await notify(app) == 1
    [hook] = await webhook_receiver.arrived(1)
    doc = hook.json()
    assert (doc["id"], doc["queue_name"], doc["body"]) == (mid, "orders.dlq", "poison")
    assert doc["dead_letter"]["source_queue"] == "orders"
    assert doc["dead_letter"]["reason"] == "rejected"
    assert doc["dead_letter"]["rejection"] == {"reason": "bad_sku", "description": "no such SKU"}


async def test_a_failing_subscriber_is_retried_by_the_policy_and_nobody_waits_for_it(
    app: FastAPI,
    client: httpx.AsyncClient,
    failing_receiver: HttpReceiver,
    webhook_receiver: HttpReceiver,
    clock: ManualClock,
) -> None:
    policy = {"retries_with_no_delay": 0, "minimum_delay_retries": 1, "minimum_delay": 7, "maximum_delay": 30}
    await subscribe(client, failing_receiver.url_for("/flaky"), options={"_retry_policy": policy})
    await subscribe(client, webhook_receiver.url_for("/fine"))
    await client.post(f"{Q}/messages", json={"messages": [{"body": "x"}]})
    assert await notify(app) == 2
    assert len(await webhook_receiver.arrived(1)) == 1  # the other subscriber got it at once
    assert len(failing_receiver.requests) == 1  # 503
    assert await notify(app) == 0  # not due again before the policy's delay
    clock.advance(7)
    assert await notify(app) == 1  # 503 again
    clock.advance(7)  # the backoff's first step: linear, from minimum_delay
    assert await notify(app) == 1
    assert len(await failing_receiver.arrived(3)) == 3  # the third try is answered 200
    clock.advance(3600)
    assert await notify(app) == 0
    assert len(webhook_receiver.requests) == 1


async def test_a_subscriber_whose_try_failed_rests_and_its_other_deliveries_wait_uncounted(
    app: FastAPI, client: httpx.AsyncClient, webhook_receiver: HttpReceiver, clock: ManualClock
) -> None:
    """Zaqar's default policy retries 3 times "with no delay": a subscriber that fails is still tried at
    most once a second, and its other deliveries are put off without using up their tries."""
    webhook_receiver.answer(503)
    await subscribe(
        client, webhook_receiver.url_for("/down"), options={"_retry_policy": {"maximum_delay_retries": 0}}
    )
    await client.post(f"{Q}/messages", json={"messages": [{"body": 1}]})
    assert await notify(app) == 1
    await client.post(f"{Q}/messages", json={"messages": [{"body": n} for n in range(5)]})
    assert await notify(app) == 6  # the first one's retry and the new five: put off, none sent
    assert len(webhook_receiver.requests) == 1
    webhook_receiver.answer(200)
    clock.advance(1)
    assert await notify(app) == 6
    assert len(await webhook_receiver.arrived(7)) == 7


async def test_a_subscriber_refusing_for_good_is_given_up_at_once(
    app: FastAPI, client: httpx.AsyncClient, webhook_receiver: HttpReceiver, clock: ManualClock
) -> None:
    webhook_receiver.answer(404)
    await subscribe(client, webhook_receiver.url_for("/gone"))
    await client.post(f"{Q}/messages", json={"messages": [{"body": "x"}]})
    assert await notify(app) == 1
    clock.advance(3600)
    assert await notify(app) == 0
    assert len(webhook_receiver.requests) == 1


async def test_a_hanging_subscriber_times_out_and_the_others_are_served(
    app: FastAPI, client: httpx.AsyncClient, hanging_receiver: HttpReceiver, webhook_receiver: HttpReceiver
) -> None:
    await subscribe(client, hanging_receiver.url_for("/slow"))
    await subscribe(client, webhook_receiver.url_for("/fine"))
    await client.post(f"{Q}/messages", json={"messages": [{"body": n} for n in range(3)]})
    assert await notify(app) == 6  # the hanging one's tries end with webhook_timeout (1 s), as retries
    assert len(await webhook_receiver.arrived(3)) == 3
    assert len(hanging_receiver.requests) <= 4  # CHARON_NOTIFICATIONS__MAX_PER_SUBSCRIBER


async def test_with_confirmation_required_only_the_signed_confirm_turns_notifications_on(
    store: Store, clock: ManualClock, smtp_receiver: SmtpReceiver, webhook_receiver: HttpReceiver
) -> None:
    app = create_app(confirming(), store=store, clock=clock)
    try:
        async with api_client(app) as client:
            hook = webhook_receiver.url_for("/confirm-me")
            sid = await subscribe(client, hook)
            assert (await client.get(f"{Q}/subscriptions/{sid}")).json()["confirmed"] is False
            again = await client.post(
                f"{Q}/subscriptions", json={"subscriber": hook}
            )  # Zaqar: 201, asked again
            assert (again.status_code, again.json()) == (201, {"subscription_id": sid})
            await client.post(f"{Q}/messages", json={"messages": [{"body": "before"}]})
            assert await notify(app) == 2  # only the confirmation request, twice
            [_, request] = await webhook_receiver.arrived(2)
            doc = request.json()
            assert doc["Message_Type"] == "SubscriptionConfirmation"
            signed = {k: doc[k] for k in ("URL-Signature", "URL-Methods", "URL-Paths", "URL-Expires")}
            headers = {**signed, "X-Project-ID": doc["X-Project-ID"], "Client-ID": str(uuid.uuid4())}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://charon"
            ) as anonymous:
                r = await anonymous.put(doc["URL-Paths"], json=doc["SubscribeBody"], headers=headers)
                assert r.status_code == 204, r.text
                r = await anonymous.get(f"{Q}/subscriptions/{sid}", headers=headers)
                assert r.status_code == 403  # the URL allows the confirm, nothing else
            await client.post(f"{Q}/messages", json={"messages": [{"body": "after"}]})
            assert await notify(app) == 1
            [_, _, note] = await webhook_receiver.arrived(3)
            assert note.json()["body"] == "after"
            confirmed_again = await client.post(f"{Q}/subscriptions", json={"subscriber": hook})
            assert confirmed_again.status_code == 409, confirmed_again.text  # Zaqar: confirmed, so a conflict
    finally:
        await state_of(app).deliverer.aclose()
        await state_of(app).long_polls.aclose()
