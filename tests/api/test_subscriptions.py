"""Subscriptions through HTTP (Zaqar v2's shapes), on Redis (the contract suite holds every store to them):
create, read, list, change, confirm, delete, purge; every bad input a 400 naming the field; and the
notifications they get."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from service.delivery import NotificationSettings
from storage.base import Store
from tests.conftest import api_client

Q = "/v2/queues/orders"
HOOK = "https://hooks.example.com/charon"


@pytest.fixture
def settings() -> Settings:
    """A service with an SMTP server configured (mailto: subscribers are refused without one; no test here
    delivers), which denies webhooks a private network (198.18.0.0/15)."""
    mail = NotificationSettings(smtp_host="mail.example", denied_networks=("198.18.0.0/15",))  # type: ignore[arg-type]
    return Settings(storage_uri="redis://unused", notifications=mail)


async def subscribe(client: httpx.AsyncClient, body: dict[str, Any], queue: str = Q) -> str:
    r = await client.post(f"{queue}/subscriptions", json=body)
    assert r.status_code == 201, r.text
    sid: str = r.json()["subscription_id"]
    return sid


async def test_a_subscription_is_created_read_listed_changed_and_deleted(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    sid = await subscribe(client, {"subscriber": HOOK, "ttl": 600, "options": {"post_headers": {"X-A": "1"}}})
    clock.advance(5)
    got = (await client.get(f"{Q}/subscriptions/{sid}")).json()
    assert got == {
        "id": sid,
        "source": "orders",
        "subscriber": HOOK,
        "ttl": 600,
        "age": 5,
        "options": {"post_headers": {"X-A": "1"}},
        "confirmed": True,
    }
    assert (await client.get(Q)).status_code == 200  # the queue was created with it
    listed = (await client.get(f"{Q}/subscriptions")).json()
    assert [s["id"] for s in listed["subscriptions"]] == [sid]

    r = await client.patch(f"{Q}/subscriptions/{sid}", json={"ttl": 3600, "subscriber": HOOK + "/v2"})
    assert r.status_code == 204, r.text
    got = (await client.get(f"{Q}/subscriptions/{sid}")).json()
    assert (got["ttl"], got["subscriber"]) == (3600, HOOK + "/v2")

    assert (await client.delete(f"{Q}/subscriptions/{sid}")).status_code == 204
    r = await client.get(f"{Q}/subscriptions/{sid}")
    assert r.status_code == 404
    assert "title" in r.json()
    assert (await client.delete(f"{Q}/subscriptions/{sid}")).status_code == 204  # again: no error


async def test_the_same_subscriber_twice_is_its_subscription_and_another_queue_is_not_the_same(
    client: httpx.AsyncClient,
) -> None:
    """Zaqar answers a repeated subscriber with 201 and the existing subscription's id (its tempest test
    test_create_subscriptions_with_duplicate_subscriber); nothing of the subscription changes."""
    sid = await subscribe(client, {"subscriber": HOOK, "ttl": 600})
    r = await client.post(f"{Q}/subscriptions", json={"subscriber": HOOK, "ttl": 7200})
    assert r.status_code == 201, r.text
    assert r.json() == {"subscription_id": sid}
    assert (await client.get(f"{Q}/subscriptions/{sid}")).json()["ttl"] == 600
    assert len((await client.get(f"{Q}/subscriptions")).json()["subscriptions"]) == 1
    assert await subscribe(client, {"subscriber": HOOK}, "/v2/queues/other") != sid


async def test_a_subscription_ends_with_its_ttl(client: httpx.AsyncClient, clock: ManualClock) -> None:
    sid = await subscribe(client, {"subscriber": HOOK, "ttl": 60})
    clock.advance(61)
    assert (await client.get(f"{Q}/subscriptions/{sid}")).status_code == 404
    assert (await client.get(f"{Q}/subscriptions")).json()["subscriptions"] == []
    await subscribe(client, {"subscriber": HOOK})  # the subscriber is free again


async def test_listing_pages_by_marker(client: httpx.AsyncClient) -> None:
    ids = sorted([await subscribe(client, {"subscriber": f"{HOOK}/{i}"}) for i in range(5)])
    page = (await client.get(f"{Q}/subscriptions?limit=2")).json()
    seen = [s["id"] for s in page["subscriptions"]]
    while page["links"]:
        page = (await client.get(page["links"][0]["href"])).json()
        seen += [s["id"] for s in page["subscriptions"]]
    assert seen == ids


async def test_purge_deletes_subscriptions_when_asked(client: httpx.AsyncClient) -> None:
    await subscribe(client, {"subscriber": HOOK})
    await client.post(f"{Q}/messages", json={"messages": [{"body": 1}]})
    r = await client.post(f"{Q}/purge", json={"resource_types": ["messages"]})
    assert r.status_code == 204
    assert len((await client.get(f"{Q}/subscriptions")).json()["subscriptions"]) == 1
    r = await client.post(f"{Q}/purge", json={"resource_types": ["subscriptions"]})
    assert r.status_code == 204
    assert (await client.get(f"{Q}/subscriptions")).json()["subscriptions"] == []


async def test_deleting_the_queue_deletes_its_subscriptions(client: httpx.AsyncClient) -> None:
    sid = await subscribe(client, {"subscriber": HOOK})
    assert (await client.delete(Q)).status_code == 204
    assert (await client.get(f"{Q}/subscriptions/{sid}")).status_code == 404


async def test_a_queue_has_at_most_its_limit_of_subscriptions(client: httpx.AsyncClient) -> None:
    limit = 100
    for i in range(limit):
        await subscribe(client, {"subscriber": f"{HOOK}/{i}"})
    r = await client.post(f"{Q}/subscriptions", json={"subscriber": f"{HOOK}/x"})
    assert r.status_code == 409
    assert "CHARON_LIMITS__MAX_SUBSCRIPTIONS_PER_QUEUE" in r.json()["description"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({}, "subscriber"),
        ({"subscriber": "ftp://files.example.com/x"}, "subscriber"),
        ({"subscriber": "trust+https://hooks.example.com/"}, "CHARON_AUTH=keystone"),  # noauth: no trusts
        ({"subscriber": "trust+http://169.254.169.254/latest/"}, "subscriber"),
        ({"subscriber": "trust+ftp://files.example.com/x"}, "subscriber"),
        ({"subscriber": "http://198.18.0.5:8080/"}, "CHARON_NOTIFICATIONS__DENIED_NETWORKS"),
        ({"subscriber": "https://"}, "subscriber"),
        ({"subscriber": "https://user:secret@hooks.example.com/"}, "subscriber"),
        ({"subscriber": "https://hooks.example.com:99999/"}, "subscriber"),
        ({"subscriber": "https://hooks.example.com/" + "a" * 2100}, "subscriber"),
        ({"subscriber": "http://127.0.0.1:8080/"}, "subscriber"),
        ({"subscriber": "http://169.254.169.254/latest/meta-data/"}, "subscriber"),
        ({"subscriber": "http://[::1]/"}, "subscriber"),
        ({"subscriber": "http://127.0.0.1./"}, "subscriber"),
        ({"subscriber": "http://localhost:8080/"}, "subscriber"),
        ({"subscriber": "http://100.100.100.200/latest/meta-data/"}, "subscriber"),
        ({"subscriber": "http://[fd00:ec2::254]/"}, "subscriber"),
        ({"subscriber": "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/"}, "subscriber"),
        ({"subscriber": "http://a_b.example.com/"}, "subscriber"),
        ({"subscriber": "mailto:"}, "subscriber"),
        ({"subscriber": 7}, "subscriber"),
        ({"subscriber": HOOK, "ttl": 59}, "ttl"),
        ({"subscriber": HOOK, "ttl": 250_000_000_001}, "ttl"),
        ({"subscriber": HOOK, "ttl": "60"}, "ttl"),
        ({"subscriber": HOOK, "options": []}, "options"),
        ({"subscriber": HOOK, "options": {"post_data": 3}}, "post_data"),
        ({"subscriber": HOOK, "options": {"post_headers": {"X-A": 1}}}, "post_headers"),
        (
            {"subscriber": HOOK, "options": {"post_headers": {"Transfer-Encoding": "chunked"}}},
            "Transfer-Encoding",
        ),
        ({"subscriber": HOOK, "options": {"post_headers": {"Content-Length": "4"}}}, "Content-Length"),
        ({"subscriber": HOOK, "options": {"post_headers": {"Host": "169.254.169.254"}}}, "Host"),
        ({"subscriber": HOOK, "options": {"post_headers": {"X-A": "\u00fc\u2603"}}}, "post_headers.X-A"),
        ({"subscriber": "mailto:a@example.com", "options": {"from": "a@b.example, c@d.example"}}, "from"),
        ({"subscriber": HOOK, "options": {"_retry_policy": {"minimum_delay": "5"}}}, "minimum_delay"),
        (
            {"subscriber": HOOK, "options": {"_retry_policy": {"retry_backoff_function": "cubic"}}},
            "retry_backoff",
        ),
        ({"subscriber": HOOK, "options": {"_retry_policy": {"maximum_delay": 6}}}, "maximum_delay"),
        ({"subscriber": HOOK, "options": {"_retry_policy": {"retries": 3}}}, "retries"),
        ({"subscriber": HOOK, "options": {"x": "y" * 70_000}}, "options"),
        ({"subscriber": HOOK, "color": "red"}, "color"),
    ],
)
async def test_bad_subscriptions_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], named: str
) -> None:
    r = await client.post(f"{Q}/subscriptions", json=body)
    assert r.status_code in (400, 413), r.text
    assert named in r.json()["description"], r.json()
    assert (await client.get(f"{Q}/subscriptions")).json()["subscriptions"] == []


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        ({"minimum_delay": 0}, "minimum_delay"),
        ({"retry_backoff_function": 1}, "retry_backoff_function"),
        ({"ignore_subscription_override": "yes"}, "ignore_subscription_override"),
        ("fast", "_retry_policy"),
    ],
)
async def test_a_bad_queue_retry_policy_is_400_naming_it(
    client: httpx.AsyncClient, policy: Any, named: str
) -> None:
    r = await client.put(Q, json={"_retry_policy": policy})
    assert r.status_code == 400, r.text
    assert named in r.json()["description"]


async def test_a_patch_needs_something_to_change_and_a_known_subscription(client: httpx.AsyncClient) -> None:
    sid = await subscribe(client, {"subscriber": HOOK})
    other = await subscribe(client, {"subscriber": HOOK + "/2"})
    r = await client.patch(f"{Q}/subscriptions/{sid}", json={})
    assert r.status_code == 400
    r = await client.patch(f"{Q}/subscriptions/{sid}", json={"subscriber": HOOK + "/2"})
    assert r.status_code == 409, r.text
    r = await client.patch(f"{Q}/subscriptions/{'0' * 32}", json={"ttl": 600})
    assert r.status_code == 404
    r = await client.get(f"{Q}/subscriptions/not-an-id")
    assert r.status_code == 404
    assert other


async def test_a_null_field_in_a_patch_keeps_it_as_the_openstack_cli_sends_it(
    client: httpx.AsyncClient,
) -> None:
    """`openstack messaging subscription update Q ID --ttl 7200` sends the fields it was not given as null;
    Zaqar keeps them."""
    sid = await subscribe(client, {"subscriber": HOOK, "ttl": 600, "options": {"k": "v"}})
    r = await client.patch(
        f"{Q}/subscriptions/{sid}", json={"subscriber": None, "ttl": 7200, "options": None}
    )
    assert r.status_code == 204, r.text
    shown = (await client.get(f"{Q}/subscriptions/{sid}")).json()
    assert (shown["subscriber"], shown["ttl"], shown["options"]) == (HOOK, 7200, {"k": "v"})


@pytest.mark.parametrize("field", ["subscriber", "ttl", "options"])
async def test_a_patch_of_nothing_but_null_is_400(client: httpx.AsyncClient, field: str) -> None:
    sid = await subscribe(client, {"subscriber": HOOK})
    r = await client.patch(f"{Q}/subscriptions/{sid}", json={field: None})
    assert r.status_code == 400, r.text
    assert "null keeps a field" in r.json()["description"]


async def test_with_confirmation_required_the_subscriber_cannot_change(
    store: Store, clock: ManualClock
) -> None:
    """Else a confirmation (for the subscription id) would carry over to an address that never agreed."""
    notifications = NotificationSettings(require_confirmation=True)
    settings = Settings(storage_uri="redis://unused", notifications=notifications, signed_url_key="k")
    app = create_app(settings, store=store, clock=clock)
    async with api_client(app) as client:
        sid = await subscribe(client, {"subscriber": HOOK})
        r = await client.patch(f"{Q}/subscriptions/{sid}", json={"subscriber": HOOK + "/victim"})
        assert r.status_code == 409, r.text
        assert "REQUIRE_CONFIRMATION" in r.json()["description"]
        assert (await client.get(f"{Q}/subscriptions/{sid}")).json()["subscriber"] == HOOK
        r = await client.patch(f"{Q}/subscriptions/{sid}", json={"subscriber": HOOK, "ttl": 600})
        assert r.status_code == 204  # the same subscriber is no change
    await state_of(app).deliverer.aclose()
    await state_of(app).long_polls.aclose()


async def test_a_mailto_subscriber_without_an_smtp_server_is_400_naming_the_setting(
    store: Store, clock: ManualClock
) -> None:
    """Accepted, every delivery to it would be given up: refused, on create and on change, naming what the
    operator sets; webhooks are still taken."""
    app = create_app(Settings(storage_uri="redis://unused"), store=store, clock=clock)
    async with api_client(app) as client:
        r = await client.post(f"{Q}/subscriptions", json={"subscriber": "mailto:ops@example.com"})
        assert r.status_code == 400, r.text
        assert "CHARON_NOTIFICATIONS__SMTP_HOST" in r.json()["description"]
        sid = await subscribe(client, {"subscriber": HOOK})
        r = await client.patch(f"{Q}/subscriptions/{sid}", json={"subscriber": "mailto:ops@example.com"})
        assert r.status_code == 400, r.text
        assert "CHARON_NOTIFICATIONS__SMTP_HOST" in r.json()["description"]
        listed = (await client.get(f"{Q}/subscriptions")).json()["subscriptions"]
        assert [x["subscriber"] for x in listed] == [HOOK]
    await state_of(app).deliverer.aclose()
    await state_of(app).long_polls.aclose()


async def test_confirm_takes_a_boolean(client: httpx.AsyncClient) -> None:
    sid = await subscribe(client, {"subscriber": HOOK})
    r = await client.put(f"{Q}/subscriptions/{sid}/confirm", json={"confirmed": "yes"})
    assert r.status_code == 400
    assert "confirmed" in r.json()["description"]
    r = await client.put(f"{Q}/subscriptions/{sid}/confirm", json={"confirmed": False})
    assert r.status_code == 204
    assert (await client.get(f"{Q}/subscriptions/{sid}")).json()["confirmed"] is False
    r = await client.put(f"{Q}/subscriptions/{'0' * 32}/confirm", json={"confirmed": True})
    assert r.status_code == 404


async def test_another_project_sees_none_of_them(client: httpx.AsyncClient) -> None:
    sid = await subscribe(client, {"subscriber": HOOK})
    other = {"X-Project-ID": "project-b"}
    assert (await client.get(f"{Q}/subscriptions/{sid}", headers=other)).status_code == 404
    assert (await client.get(f"{Q}/subscriptions", headers=other)).json()["subscriptions"] == []
    assert (await client.delete(f"{Q}/subscriptions/{sid}", headers=other)).status_code == 204
    assert (await client.get(f"{Q}/subscriptions/{sid}")).status_code == 200
