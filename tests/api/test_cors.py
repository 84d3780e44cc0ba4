"""CORS as Zaqar configures it (oslo.middleware's `[cors]`): off by default; with an allowed origin, a
browser's preflight is answered without credentials and the answers carry the CORS headers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from tests.conftest import api_client

HORIZON = "https://horizon.example.com"
PREFLIGHT = {
    "Origin": HORIZON,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "client-id, x-auth-token, content-type",
}


@pytest.fixture
async def browser(store: Store, clock: ManualClock) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a service that lets HORIZON's pages in (CHARON_CORS__ALLOWED_ORIGIN, as oslo writes it)."""
    settings = Settings(
        storage_uri="redis://unused", cors={"allowed_origin": f"{HORIZON}, http://other:8080"}
    )
    app = create_app(settings, store=store, clock=clock)
    async with api_client(app) as c:
        yield c
    await state_of(app).long_polls.aclose()


async def test_cors_is_off_by_default(client: httpx.AsyncClient) -> None:
    r = await client.options("/v2/queues/q/messages", headers=PREFLIGHT)
    assert r.status_code == 405
    r = await client.get("/v2/queues", headers={"Origin": HORIZON})
    assert r.status_code == 200
    assert not [h for h in r.headers if h.lower().startswith("access-control-")]


async def test_a_preflight_is_answered_without_credentials(browser: httpx.AsyncClient) -> None:
    r = await browser.options(
        "/v2/queues/q/messages",
        headers={**PREFLIGHT, "Client-ID": "", "X-Project-ID": ""},  # a browser's preflight carries none
    )
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == HORIZON
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-max-age"] == "3600"
    assert "PATCH" in r.headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"client-id", "x-auth-token", "x-project-id", "idempotency-key"} <= allowed
    assert r.headers["x-openstack-request-id"].startswith("req-")  # logged as every request is


async def test_the_answers_carry_cors_headers(browser: httpx.AsyncClient) -> None:
    r = await browser.post(
        "/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers={"Origin": "http://other:8080"}
    )
    assert r.status_code == 201
    assert r.headers["access-control-allow-origin"] == "http://other:8080"
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-openstack-request-id", "location", "charon-ignored-parameters"} <= exposed
    r = await browser.get("/v2/queues/q/nothing", headers={"Origin": HORIZON})  # errors too, for the page
    assert (r.status_code, r.headers["access-control-allow-origin"]) == (404, HORIZON)
    r = await browser.get("/v2/queues", headers={"Origin": "https://evil.example.com"})
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"Origin": "https://evil.example.com"}, "the origin 'https://evil.example.com'"),
        ({"Access-Control-Request-Method": "TRACE"}, "the method 'TRACE'"),
        ({"Access-Control-Request-Headers": "client-id, x-secret"}, "the header 'x-secret'"),
    ],
)
async def test_a_refused_preflight_says_what_was_refused(
    browser: httpx.AsyncClient, changed: dict[str, str], named: str
) -> None:
    r = await browser.options("/v2/queues/q/messages", headers={**PREFLIGHT, **changed})
    assert r.status_code == 400
    body = r.json()
    assert body["title"] == "Preflight refused"
    assert named in body["description"]
    assert HORIZON not in r.text  # what is allowed is not told to a page of any origin
    assert not [h for h in r.headers if h.lower().startswith("access-control-allow")]


@pytest.mark.parametrize(
    ("cors", "field"),
    [
        ({"allowed_origin": "https://a.example.com/"}, "allowed_origin"),
        ({"allowed_origin": "horizon"}, "allowed_origin"),
        ({"allowed_origin": "https://Horizon.example.com"}, "allowed_origin"),  # a browser sends lowercase
        ({"allowed_origin": "https://a.example.com:99999"}, "allowed_origin"),
        ({"allowed_origin": "https://a.example.com?x=1"}, "allowed_origin"),
        ({"max_age": -1}, "max_age"),
        ({"allow_methods": "GET,get it"}, "allow_methods"),
    ],
)
def test_cors_settings_are_checked(cors: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Settings(storage_uri="redis://unused", cors=cors)


async def test_any_origin_is_a_literal_star_without_credentials(store: Store, clock: ManualClock) -> None:
    """`*` as oslo.middleware answers it: browsers refuse a credentialed answer to `*`, so no page of any
    origin gets one (reflecting each origin with credentials would let every site in)."""
    app = create_app(
        Settings(storage_uri="redis://unused", cors={"allowed_origin": "*"}), store=store, clock=clock
    )
    async with api_client(app) as c:
        r = await c.options("/v2/queues", headers={**PREFLIGHT, "Origin": "https://evil.example.com"})
        assert (r.status_code, r.headers["access-control-allow-origin"]) == (200, "*")
        assert "access-control-allow-credentials" not in r.headers
        r = await c.get("/v2/queues", headers={"Origin": "https://evil.example.com"})
        assert (
            r.headers["access-control-allow-origin"],
            "access-control-allow-credentials" in r.headers,
        ) == ("*", False)
    await state_of(app).long_polls.aclose()
