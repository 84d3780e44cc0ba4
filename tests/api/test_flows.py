"""The HTTP API end to end through the ASGI app, on every driver."""

from __future__ import annotations

import httpx
import pytest

from core.clock import ManualClock

pytestmark = pytest.mark.every_store

JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"


async def post_messages(client: httpx.AsyncClient, queue: str, *bodies: object) -> list[str]:
    r = await client.post(f"/v2/queues/{queue}/messages", json={"messages": [{"body": b} for b in bodies]})
    assert r.status_code == 201, r.text
    return [href.rsplit("/", 1)[1] for href in r.json()["resources"]]


async def test_versions_home_ping_health(client: httpx.AsyncClient) -> None:
    assert (await client.get("/")).status_code == 300
    home = await client.get("/v2")
    assert home.headers["content-type"].startswith("application/json-home")
    assert "rel/post_claim" in home.json()["resources"]
    assert (await client.get("/v2/ping")).status_code == 204
    assert (await client.head("/v2/ping")).status_code == 204
    assert (await client.get("/v2/health")).json() == {"storage_reachable": True, "storage_writable": True}


async def test_queue_lifecycle(client: httpx.AsyncClient) -> None:
    assert (await client.put("/v2/queues/q1", json={"color": "red"})).status_code == 201
    assert (await client.put("/v2/queues/q1", json={"color": "blue"})).status_code == 204
    meta = (await client.get("/v2/queues/q1")).json()
    assert meta["color"] == "red"
    assert meta["_default_message_ttl"] == 3600
    assert "_max_claim_count" not in meta
    listing = (await client.get("/v2/queues", params={"detailed": "true"})).json()
    assert listing["queues"] == [{"name": "q1", "href": "/v2/queues/q1", "metadata": {"color": "red"}}]
    assert (await client.delete("/v2/queues/q1")).status_code == 204
    assert (await client.get("/v2/queues")).json() == {"queues": [], "links": []}


async def test_lazy_queue_reads_as_empty(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/queues/never")).status_code == 200
    stats = (await client.get("/v2/queues/never/stats")).json()["messages"]
    assert (stats["free"], stats["claimed"], stats["total"]) == (0, 0, 0)
    assert (await client.get("/v2/queues/never/messages")).json() == {"messages": [], "links": []}
    assert (await client.post("/v2/queues/never/claims")).status_code == 204


async def test_queue_listing_pages_with_next_links(client: httpx.AsyncClient) -> None:
    for i in range(5):
        await client.put(f"/v2/queues/q{i}")
    names, url = [], "/v2/queues?limit=2"
    while url:
        body = (await client.get(url)).json()
        names += [q["name"] for q in body["queues"]]
        url = next((link["href"] for link in body["links"] if link["rel"] == "next"), "")
    assert names == [f"q{i}" for i in range(5)]


async def test_patch_metadata_add_replace_remove(client: httpx.AsyncClient) -> None:
    await client.put("/v2/queues/q", json={"a": 1, "b": 2})
    ops = [
        {"op": "replace", "path": "/metadata/a", "value": 10},
        {"op": "remove", "path": "/metadata/b"},
        {"op": "add", "path": "/metadata/c", "value": [1]},
        {"op": "remove", "path": "/metadata/_max_claim_count"},
    ]  # reserved: removing an unset one is fine
    r = await client.patch("/v2/queues/q", json=ops, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 200, r.text
    assert {k: v for k, v in r.json().items() if not k.startswith("_")} == {"a": 10, "c": [1]}
    meta = (await client.get("/v2/queues/q")).json()
    assert (meta["a"], meta["c"], "b" in meta) == (10, [1], False)


async def test_post_list_get_delete(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v2/queues/q/messages", json={"messages": [{"body": {"n": 1}, "ttl": 300}, {"body": "two"}]}
    )
    assert r.status_code == 201
    ids = [h.rsplit("/", 1)[1] for h in r.json()["resources"]]
    assert r.headers["location"] == f"/v2/queues/q/messages?ids={','.join(ids)}"
    listing = (await client.get("/v2/queues/q/messages", params={"echo": "true"})).json()
    assert [m["body"] for m in listing["messages"]] == [{"n": 1}, "two"]
    one = (await client.get(f"/v2/queues/q/messages/{ids[0]}")).json()
    assert (one["id"], one["ttl"], one["age"], one["href"]) == (
        ids[0],
        300,
        0,
        f"/v2/queues/q/messages/{ids[0]}",
    )
    many = (await client.get("/v2/queues/q/messages", params={"ids": ",".join(ids)})).json()
    assert len(many["messages"]) == 2
    assert (await client.delete(f"/v2/queues/q/messages/{ids[0]}")).status_code == 204
    assert (await client.get(f"/v2/queues/q/messages/{ids[0]}")).status_code == 404
    assert (await client.delete("/v2/queues/q/messages", params={"ids": ids[1]})).status_code == 204
    assert (await client.get("/v2/queues/q/messages", params={"ids": ",".join(ids)})).status_code == 404


async def test_message_paging_follows_next_links(client: httpx.AsyncClient) -> None:
    await post_messages(client, "q", *range(7))
    bodies, url = [], "/v2/queues/q/messages?limit=3&echo=true"
    while url:
        page = (await client.get(url)).json()
        bodies += [m["body"] for m in page["messages"]]
        url = next((link["href"] for link in page["links"] if link["rel"] == "next"), "")
    assert bodies == list(range(7))


async def test_claim_flow(client: httpx.AsyncClient, clock: ManualClock) -> None:
    ids = await post_messages(client, "q", "a", "b", "c")
    r = await client.post("/v2/queues/q/claims", params={"limit": 2}, json={"ttl": 120, "grace": 60})
    assert r.status_code == 201
    claim_href = r.headers["location"]
    claim_id = claim_href.rsplit("/", 1)[1]
    msgs = r.json()["messages"]
    assert [m["body"] for m in msgs] == ["a", "b"]
    assert all(m["href"].endswith(f"?claim_id={claim_id}") and m["claim_count"] == 1 for m in msgs)
    clock.advance(7)
    claim = (await client.get(claim_href)).json()
    assert (claim["ttl"], claim["age"], len(claim["messages"])) == (120, 7, 2)
    forbidden = await client.delete(f"/v2/queues/q/messages/{ids[0]}")
    assert forbidden.status_code == 403
    assert forbidden.json()["title"] == "Not authorized"
    wrong = await client.delete(f"/v2/queues/q/messages/{ids[0]}", params={"claim_id": "0" * 32})
    assert wrong.status_code == 403
    ok = await client.delete(f"/v2/queues/q/messages/{ids[0]}", params={"claim_id": claim_id})
    assert ok.status_code == 204
    assert (await client.patch(claim_href, json={"ttl": 300})).status_code == 204
    renewed = (await client.get(claim_href)).json()
    assert (renewed["ttl"], renewed["grace"], renewed["age"]) == (300, 60, 0)
    assert (await client.delete(claim_href)).status_code == 204
    assert (await client.get(claim_href)).status_code == 404
    again = await client.post("/v2/queues/q/claims", json={"ttl": None, "grace": None})
    assert [m["body"] for m in again.json()["messages"]] == ["b", "c"]


async def test_pop_and_purge(client: httpx.AsyncClient) -> None:
    await post_messages(client, "q", *range(5))
    popped = await client.delete("/v2/queues/q/messages", params={"pop": 2})
    assert popped.status_code == 200
    assert [m["body"] for m in popped.json()["messages"]] == [0, 1]
    assert (await client.post("/v2/queues/q/purge", json={"resource_types": ["messages"]})).status_code == 204
    assert (await client.get("/v2/queues/q/stats")).json()["messages"]["total"] == 0


async def test_stats_show_oldest_and_newest(client: httpx.AsyncClient, clock: ManualClock) -> None:
    ids = await post_messages(client, "q", "a")
    clock.advance(5)
    ids += await post_messages(client, "q", "b")
    stats = (await client.get("/v2/queues/q/stats")).json()["messages"]
    assert stats["oldest"]["href"] == f"/v2/queues/q/messages/{ids[0]}"
    assert stats["oldest"]["age"] == 5
    assert stats["newest"]["href"] == f"/v2/queues/q/messages/{ids[1]}"
    assert stats["newest"]["age"] == 0


async def test_ids_as_repeated_parameters(client: httpx.AsyncClient) -> None:
    ids = await post_messages(client, "q", "a", "b", "c")
    got = await client.get("/v2/queues/q/messages", params=[("ids", ids[0]), ("ids", f"{ids[1]},{ids[2]}")])
    assert [m["body"] for m in got.json()["messages"]] == ["a", "b", "c"]
    await client.delete("/v2/queues/q/messages", params=[("ids", ids[0]), ("ids", ids[1])])
    assert (await client.get("/v2/queues/q/stats")).json()["messages"]["total"] == 1
