"""Idempotency-Key on POST .../messages (the IETF httpapi draft's header), through the API on every store."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.every_store

URL = "/v2/queues/orders/messages"


async def post(client: httpx.AsyncClient, body: dict[str, object], key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return await client.post(URL, json=body, headers=headers)


async def total(client: httpx.AsyncClient) -> int:
    return int((await client.get("/v2/queues/orders/stats")).json()["messages"]["total"])


async def test_a_repeated_post_answers_the_first_resources_and_stores_nothing(
    client: httpx.AsyncClient,
) -> None:
    body = {"messages": [{"body": {"a": 1, "b": [2]}, "ttl": 600}, {"body": "x"}]}
    first = await post(client, body, "order-42")
    assert first.status_code == 201, first.text
    again = await post(client, body, '"order-42"')  # the draft's sf-string form is the same key
    assert again.status_code == 201, again.text
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    reordered = {"messages": [{"ttl": 600, "body": {"b": [2], "a": 1}}, {"body": "x"}]}
    assert (await post(client, reordered, "order-42")).json() == first.json()  # same messages
    assert await total(client) == 2
    assert (await post(client, body, None)).status_code == 201  # without a key: a new post
    assert await total(client) == 4


async def test_a_key_reused_with_other_messages_answers_422(client: httpx.AsyncClient) -> None:
    assert (await post(client, {"messages": [{"body": 1}]}, "k")).status_code == 201
    for other in ({"messages": [{"body": 2}]}, {"messages": [{"body": 1, "ttl": 600}]}):
        r = await post(client, other, "k")
        assert r.status_code == 422, r.text
        assert r.json()["title"] == "Idempotency key reused"
        assert "new key" in r.json()["description"]
    assert await total(client) == 1


@pytest.mark.parametrize("key", ["", '""', "x" * 256, 'a"b', "a\\b", "\u00e9t\u00e9", "tab\there"])
async def test_bad_keys_are_refused(client: httpx.AsyncClient, key: str) -> None:
    request = client.build_request("POST", URL, json={"messages": [{"body": 1}]})
    request.headers["Idempotency-Key"] = key.encode("utf-8").decode("latin-1")
    r = await client.send(request)
    assert r.status_code == 400, r.text
    assert "Idempotency-Key" in r.json()["description"]
    assert await total(client) == 0


async def test_a_key_sent_twice_is_refused(client: httpx.AsyncClient) -> None:
    request = client.build_request("POST", URL, json={"messages": [{"body": 1}]})
    request.headers = httpx.Headers(
        [*request.headers.multi_items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    )
    r = await client.send(request)
    assert r.status_code == 400, r.text
    assert "more than once" in r.json()["description"]
