"""Pre-signed URLs (POST /v2/queues/{q}/share, Zaqar's): the signed request is allowed exactly its paths and
methods on its queue until it expires, without a token; anything else is 403 JSON. On Redis: a signature
is judged before any store is called."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from tests.conftest import CLIENT_ID, PROJECT, api_client

KEY = "a secret of the operator's"


@pytest.fixture
def settings() -> Settings:
    return Settings(storage_uri="redis://unused", signed_url_key=KEY)


@pytest.fixture
async def bare(store: Store, clock: ManualClock, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app that sends no identity of its own."""
    app = create_app(settings, store=store, clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://charon") as c:
        yield c
    await state_of(app).long_polls.aclose()


def signed(share: dict[str, Any], **change: str) -> dict[str, str]:
    headers = {
        "URL-Signature": share["signature"],
        "URL-Expires": share["expires"],
        "URL-Methods": ",".join(share["methods"]),
        "URL-Paths": ",".join(share["paths"]),
        "X-Project-ID": share["project"],
        "Client-ID": CLIENT_ID,
    }
    return {**headers, **change}


async def share(client: httpx.AsyncClient, queue: str = "jobs", **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v2/queues/{queue}/share", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def test_a_signed_url_reaches_its_queue_without_credentials(
    client: httpx.AsyncClient, bare: httpx.AsyncClient
) -> None:
    doc = await share(client, paths=["messages", "claims"], methods=["POST", "GET"])
    assert doc["paths"] == ["/v2/queues/jobs/claims", "/v2/queues/jobs/messages"]
    assert doc["methods"] == ["GET", "POST"]
    assert doc["project"] == PROJECT
    r = await bare.post(
        "/v2/queues/jobs/messages", json={"messages": [{"body": {"n": 1}}]}, headers=signed(doc)
    )
    assert r.status_code == 201, r.text
    message = r.json()["resources"][0]
    assert (await bare.get(message, headers=signed(doc))).json()["body"] == {"n": 1}  # a resource under it
    r = await bare.post("/v2/queues/jobs/claims", json={}, headers=signed(doc))
    assert r.status_code == 201
    # the message is the project's: the owner sees it claimed
    assert (await client.get("/v2/queues/jobs/stats")).json()["messages"]["claimed"] == 1


async def test_the_signature_is_zaqars(client: httpx.AsyncClient, clock: ManualClock) -> None:
    """The signed text is Zaqar's (zaqar/common/urls.py), quirk included: fields joined by backslash-n."""
    moment = datetime.fromtimestamp(clock.now_ms() / 1000 + 10 * 86_400, UTC)
    expires = moment.strftime("%Y-%m-%dT%H:%M:%S")
    doc = await share(client, methods=["GET"], expires=moment.isoformat())  # with its zone and fraction
    text = rf"/v2/queues/jobs/messages\nGET\n{PROJECT}\n{expires}"
    assert doc["signature"] == hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()
    assert doc["expires"] == expires


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"URL-Signature": "0" * 64}, "does not match"),
        ({"URL-Signature": "not hex"}, "does not match"),
        ({"URL-Methods": "GET,DELETE,POST"}, "does not match"),
        ({"URL-Paths": "/v2/queues/other/messages"}, "does not match"),
        ({"X-Project-ID": "another-project"}, "does not match"),
        ({"URL-Expires": "2099-01-01T00:00:00"}, "does not match"),
        ({"URL-Expires": ""}, "also sends URL-Expires"),
    ],
    ids=["signature", "not-hex", "methods", "paths", "project", "expires", "no-expires"],
)
async def test_a_tampered_signed_url_is_403(
    client: httpx.AsyncClient, bare: httpx.AsyncClient, change: dict[str, str], why: str
) -> None:
    doc = await share(client, methods=["GET", "POST"])
    r = await bare.get("/v2/queues/jobs/messages", headers=signed(doc, **change))
    assert r.status_code == 403
    assert why in r.json()["description"]


async def test_a_signed_url_allows_only_its_methods_and_paths(
    client: httpx.AsyncClient, bare: httpx.AsyncClient
) -> None:
    doc = await share(client, methods=["GET"])
    for method, path in [
        ("POST", "/v2/queues/jobs/messages"),  # a method not signed
        ("DELETE", "/v2/queues/jobs/messages?ids=" + "0" * 32),
        ("GET", "/v2/queues/other/messages"),  # another queue
        ("GET", "/v2/queues/jobs-2/messages"),  # a name that only starts like it
        ("GET", "/v2/queues/jobs"),  # the queue itself
        ("GET", "/v2/queues"),
        ("GET", "/v2/pools"),
    ]:
        r = await bare.request(method, path, headers=signed(doc), json={} if method == "POST" else None)
        assert r.status_code == 403, (method, path, r.text)
        assert "allows GET on /v2/queues/jobs/messages" in r.json()["description"]


async def test_a_signed_url_stops_working_when_it_expires(
    client: httpx.AsyncClient, bare: httpx.AsyncClient, clock: ManualClock
) -> None:
    doc = await share(client)  # a day, by default
    assert (await bare.get("/v2/queues/jobs/messages", headers=signed(doc))).status_code in (200, 204)
    clock.advance(86_400)
    r = await bare.get("/v2/queues/jobs/messages", headers=signed(doc))
    assert r.status_code == 403
    assert f"expired at {doc['expires']}" in r.json()["description"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"paths": ["queues"]}, "paths.0"),
        ({"paths": []}, "paths"),
        ({"methods": ["FETCH"]}, "methods.0"),
        ({"methods": ["OPTIONS"]}, "methods.0"),
        ({"methods": "GET"}, "methods"),
        ({"expires": 1893456000}, "expires"),
        ({"expires": "1893456000"}, "expires"),
        ({"expires": "tomorrow"}, "expires"),
        ({"expires": "2001-01-01T00:00:00"}, "in the future"),
        ({"expires": "2999-01-01T00:00:00"}, "CHARON_LIMITS__MAX_SHARE_SECONDS"),
        ({"expiry": "2099-01-01T00:00:00"}, "expiry"),
    ],
)
async def test_bad_share_bodies_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await client.post("/v2/queues/jobs/share", json=body)
    assert r.status_code == 400, r.text
    assert field in r.json()["description"]


async def test_without_a_key_there_are_no_signed_urls(store: Store, clock: ManualClock) -> None:
    app = create_app(Settings(storage_uri="redis://unused"), store=store, clock=clock)
    async with api_client(app) as client:
        r = await client.post("/v2/queues/jobs/share", json={})
        assert r.status_code == 403
        assert "CHARON_SIGNED_URL_KEY" in r.json()["description"]
        doc = {"signature": "0" * 64, "expires": "2099-01-01T00:00:00", "methods": ["GET"]}
        doc |= {"paths": ["/v2/queues/jobs/messages"], "project": PROJECT}
        r = await client.get("/v2/queues/jobs/messages", headers=signed(doc))
        assert r.status_code == 403
        assert "CHARON_SIGNED_URL_KEY" in r.json()["description"]
    await state_of(app).long_polls.aclose()


async def test_head_is_signed_as_head_or_by_get(client: httpx.AsyncClient, bare: httpx.AsyncClient) -> None:
    head_only = await share(client, methods=["HEAD"])
    assert (await bare.head("/v2/queues/jobs/messages", headers=signed(head_only))).status_code in (200, 204)
    assert (await bare.get("/v2/queues/jobs/messages", headers=signed(head_only))).status_code == 403
    get = await share(client, methods=["GET"])
    assert (await bare.head("/v2/queues/jobs/messages", headers=signed(get))).status_code in (200, 204)
