"""Per-project request rates through the HTTP API (docs/quotas.md): past its rate a project's request answers
429 with Retry-After and does nothing; reads and writes have budgets of their own; an admin's override
takes effect at once; the quota routes are admin-only to change, a project reads its own, they are never
throttled themselves; and every bad input is a 400 naming the field and its bound."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import QuotaSettings, Settings
from core.clock import ManualClock
from core.quotas import QUOTAS, RATE_OF
from storage.base import Store
from tests.conftest import PROJECT, api_client

ADMIN = {"X-Roles": "admin"}
ONE = {"messages": [{"body": 1}]}


@pytest.fixture
def settings() -> Settings:
    return Settings(storage_uri="redis://unused", quotas={"writes_per_second": 1, "burst_seconds": 3})


async def statuses(
    client: httpx.AsyncClient, n: int, method: str = "POST", path: str = "/v2/queues/q/messages"
) -> list[int]:
    out = []
    for _ in range(n):
        r = await client.request(method, path, json=ONE if method == "POST" else None)
        out.append(r.status_code)
    return out


@pytest.mark.every_store
async def test_past_its_rate_a_project_gets_429_with_retry_after_and_nothing_is_done(
    client: httpx.AsyncClient,
) -> None:
    assert await statuses(client, 3) == [201, 201, 201]  # a burst of 3 s at 1 a second
    r = await client.post("/v2/queues/q/messages", json=ONE)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    problem = r.json()
    assert problem["title"] == "Too many requests"
    assert "writes_per_second 1" in problem["description"]
    assert "PUT /v2/quotas/" in problem["description"]
    assert (await client.get("/v2/queues/q/stats")).json()["messages"][
        "total"
    ] == 3  # reads: their own budget
    other = {"X-Project-ID": "someone-else"}
    assert (await client.post("/v2/queues/q/messages", json=ONE, headers=other)).status_code == 201


async def test_a_token_comes_back_at_the_rate(client: httpx.AsyncClient, clock: ManualClock) -> None:
    assert await statuses(client, 4) == [201, 201, 201, 429]
    clock.advance(1.0)  # one more token; the process's refusal ends with the wait it was told
    assert await statuses(client, 2) == [201, 429]


async def test_an_admins_override_takes_effect_at_once_and_delete_restores_the_default(
    client: httpx.AsyncClient,
) -> None:
    assert await statuses(client, 4) == [201, 201, 201, 429]
    r = await client.put(f"/v2/quotas/{PROJECT}", json={"writes_per_second": 1000}, headers=ADMIN)
    assert r.status_code == 200, r.text
    unset = {"queues": None, "messages_per_queue": None, "message_bytes": None, "subscriptions": None}
    assert r.json() == {
        "project": PROJECT,
        "quotas": {"reads_per_second": None, "writes_per_second": 1000.0, **unset},
        "overrides": {"writes_per_second": 1000.0},
        "defaults": {"reads_per_second": None, "writes_per_second": 1.0, **unset},
    }
    assert await statuses(client, 20) == [201] * 20
    r = await client.put(f"/v2/quotas/{PROJECT}", json={"reads_per_second": 0.5}, headers=ADMIN)
    assert r.json()["overrides"] == {"writes_per_second": 1000.0, "reads_per_second": 0.5}
    assert await statuses(client, 2, "GET", "/v2/queues/q/stats") == [200, 429]
    assert (await client.delete(f"/v2/quotas/{PROJECT}", headers=ADMIN)).status_code == 204
    shown = (await client.get(f"/v2/quotas/{PROJECT}")).json()
    assert (shown["overrides"], shown["quotas"]["writes_per_second"]) == ({}, 1.0)


async def test_the_quota_routes_are_admin_only_to_change_and_a_project_reads_its_own(
    client: httpx.AsyncClient,
) -> None:
    r = await client.put(f"/v2/quotas/{PROJECT}", json={"writes_per_second": 1000})
    assert r.status_code == 403
    assert r.json()["rule"] == "quotas:update"
    assert (await client.delete(f"/v2/quotas/{PROJECT}")).json()["rule"] == "quotas:delete"
    assert (await client.get(f"/v2/quotas/{PROJECT}")).status_code == 200
    r = await client.get("/v2/quotas/another-project")
    assert r.status_code == 403
    assert r.json()["rule"] == "quotas:get_any"
    assert (await client.get("/v2/quotas/another-project", headers=ADMIN)).status_code == 200


async def test_a_throttled_admin_can_still_change_quotas(client: httpx.AsyncClient) -> None:
    assert (await statuses(client, 4))[-1] == 429
    for _ in range(5):  # the quota routes are not counted
        r = await client.put(f"/v2/quotas/{PROJECT}", json={"writes_per_second": 5}, headers=ADMIN)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"writes_per_second": -1}, "greater than or equal to 0.01"),
        ({"writes_per_second": 0}, "greater than or equal to 0.01"),
        ({"writes_per_second": 2_000_000}, "less than or equal to 1000000"),
        ({"writes_per_second": "fast"}, "writes_per_second"),
        ({"writes_per_second": True}, "writes_per_second"),
        ({"max_everything": 1}, "max_everything"),
        ({}, "Name at least one quota"),
        ([1], "JSON object"),
    ],
)
async def test_bad_quotas_are_refused_by_name(client: httpx.AsyncClient, body: Any, fragment: str) -> None:
    r = await client.put(f"/v2/quotas/{PROJECT}", json=body, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"title", "description"}
    assert fragment in r.json()["description"]


async def test_a_bad_project_in_the_path_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/quotas/" + "p" * 300, headers=ADMIN)
    assert r.status_code == 400
    assert "at most 256" in r.json()["description"]
    r = await client.get("/v2/quotas/a,b", headers=ADMIN)
    assert r.status_code == 400
    assert "comma" in r.json()["description"]


async def test_without_a_default_only_a_project_with_an_override_is_limited(
    store: Store, clock: ManualClock
) -> None:
    app = create_app(Settings(storage_uri="redis://unused"), store=store, clock=clock)
    async with api_client(app) as c:
        assert await statuses(c, 30) == [201] * 30
        await store.set_quota("limited", {"writes_per_second": 0.01})  # a bucket of one write
        limited = {"X-Project-ID": "limited"}
        codes = [
            (await c.post("/v2/queues/q/messages", json=ONE, headers=limited)).status_code for _ in range(2)
        ]
        assert codes == [201, 429]


def test_every_rate_quota_has_its_setting() -> None:
    assert {q.name for q in QUOTAS} <= set(QuotaSettings.model_fields)
    assert set(RATE_OF.values()) == {q.name for q in QUOTAS if q.bucket}
