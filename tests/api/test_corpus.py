"""An adversarial corpus, on every store: every body the service accepts comes back exactly through every
read (list, get by ids, claim, a claim's messages, the dead-letter move and the DLQ's reads, redrive's
sample, pop, and `charon export`), and every body it cannot return exactly is refused with a 400 and stores
nothing. No read can fail because of what a producer stored."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app import insights
from app.main import create_app
from core.clock import ManualClock
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.redis.store import RedisStore
from tests.api.test_hostile_input import nested, nested_raw
from tests.conftest import SLOW_SERVER_TIMEOUT_S, api_client

DEPTH = 64
ACCEPTED: list[Any] = [
    nested(DEPTH),
    [nested(DEPTH - 1)],
    2**64 - 1,
    -(2**63),
    1.7976931348623157e308,
    5e-324,
    -0.0,
    "",
    {},
    [],
    None,
    False,
    '\u0000nul \u001f unit separator \u001e \\ " / \b\f\n\r\t',
    "\u2028\u2029 line separators, \ufeff BOM, \u202e RTL override, e\u0301 combining",
    "\U0001f600 \U0001d54f astral \U0010ffff",
    {"": {"": [""]}, "key with \u0000": 1, "\U0001f600": "k"},
    {"id": "12345678901234567890123456789", "n": "99999999999999999999"},  # big numbers as strings
    "x" * 100_000,  # one body of 100 kB (the post is under 256 KiB)
]
REFUSED: list[tuple[bytes, str]] = [
    (nested_raw(DEPTH + 1), f"at most {DEPTH}"),
    (b"[" + nested_raw(DEPTH) + b"]", f"at most {DEPTH}"),
    (b"18446744073709551616", "64-bit"),
    (b"-9223372036854775809", "64-bit"),
    (b'{"a": [123456789012345678901234567890]}', "64-bit"),
    (b'"\\ud800"', "surrogate"),
    (b'"\\udc00x"', "surrogate"),
    (b"NaN", "JSON"),
    (b"Infinity", "JSON"),
    (b"1e999", "infinity"),
    (b'"\xc3\x28"', "UTF-8"),
]


def post_raw(client: httpx.AsyncClient, queue: str, body: bytes) -> Any:
    return client.post(f"/v2/queues/{queue}/messages", content=b'{"messages": [{"body": ' + body + b"}]}")


@pytest.mark.parametrize(("raw", "fragment"), REFUSED)
async def test_what_cannot_come_back_exactly_is_refused(
    client: httpx.AsyncClient, raw: bytes, fragment: str
) -> None:
    r = await post_raw(client, "corpus", raw)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["description"]
    assert (await client.get("/v2/queues/corpus/stats")).json()["messages"]["total"] == 0


async def bodies(client: httpx.AsyncClient, url: str) -> list[Any]:
    """Every message's body a listing shows, page by page (next links)."""
    out: list[Any] = []
    while url:
        r = await client.get(url)
        assert r.status_code == 200, r.text
        out += [m["body"] for m in r.json()["messages"]]
        url = r.json()["links"][0]["href"] if r.json()["links"] else ""
    return out


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values, -0.0 and types included (Python's == takes 1 == 1.0 == True)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.every_store
async def test_every_accepted_body_comes_back_through_every_read(client: httpx.AsyncClient) -> None:
    r = await client.put(
        "/v2/queues/corpus", json={"_max_claim_count": 1, "_dead_letter_queue": "corpus.dlq"}
    )
    assert r.status_code == 201
    ids = []
    for body in ACCEPTED:  # one post each: the 100 kB one alone fits the post limit
        r = await client.post("/v2/queues/corpus/messages", json={"messages": [{"body": body}]})
        assert r.status_code == 201, r.text
        ids.append(r.json()["resources"][0].rsplit("/", 1)[1])
    by_id = dict(zip(ids, ACCEPTED, strict=True))

    listed = await bodies(client, "/v2/queues/corpus/messages?echo=true&limit=5")
    assert all(same(a, b) for a, b in zip(listed, ACCEPTED, strict=True))
    for i in range(0, len(ids), 20):
        got = (
            await client.get("/v2/queues/corpus/messages", params={"ids": ",".join(ids[i : i + 20])})
        ).json()
        assert all(same(m["body"], by_id[m["id"]]) for m in got["messages"])

    claimed: list[dict[str, Any]] = []
    while (r := await client.post("/v2/queues/corpus/claims?limit=20", json={"ttl": 60})).status_code == 201:
        claimed += r.json()["messages"]
        held = (await client.get(r.headers["location"])).json()["messages"]
        assert all(same(m["body"], by_id[m["id"]]) for m in held)
        await client.delete(r.headers["location"])  # each used its one claim: it moves to the DLQ
    assert sorted(m["id"] for m in claimed) == sorted(ids)
    assert all(same(m["body"], by_id[m["id"]]) for m in claimed)

    dead = await bodies(client, "/v2/queues/corpus.dlq/messages?echo=true&provenance=true&limit=20")
    assert len(dead) == len(ACCEPTED)
    preview = (await client.post("/v2/queues/corpus.dlq/redrive", json={"dry_run": True})).json()
    assert all(same(m["body"], by_id[m["id"]]) for m in preview["sample"])
    popped: list[dict[str, Any]] = []
    while (r := await client.delete("/v2/queues/corpus.dlq/messages?pop=20")).json()["messages"]:
        popped += r.json()["messages"]
    assert sorted(m["id"] for m in popped) == sorted(ids)
    assert all(same(m["body"], by_id[m["id"]]) for m in popped)


@pytest.mark.parametrize("driver", ["redis", "mongo"])
async def test_charon_export_writes_every_accepted_body_back(
    driver: str, redis_url: str, mongodb_uri: str, settings: Any, tmp_path: Path
) -> None:
    uri, namespace = (redis_url if driver == "redis" else mongodb_uri), f"t{uuid.uuid4().hex[:12]}"
    clock = ManualClock()
    store: Store
    if driver == "redis":
        store = RedisStore.from_url(uri, namespace=namespace, clock=clock)
    else:
        store = MongoStore.from_url(uri, namespace=namespace, clock=clock, timeout=SLOW_SERVER_TIMEOUT_S)
    try:
        async with api_client(create_app(settings, store=store, clock=clock)) as client:
            await client.put("/v2/queues/src", json={"_max_claim_count": 1, "_dead_letter_queue": "src.dlq"})
            ids = []
            for body in ACCEPTED:
                r = await client.post("/v2/queues/src/messages", json={"messages": [{"body": body}]})
                ids.append(r.json()["resources"][0].rsplit("/", 1)[1])
            while (
                r := await client.post("/v2/queues/src/claims?limit=20", json={"ttl": 60})
            ).status_code == 201:
                await client.delete(r.headers["location"])
        out = tmp_path / "dlq.jsonl"
        args = argparse.Namespace(
            storage_uri=uri, namespace=namespace, project="project-a", queues=["src.dlq"], out=str(out)
        )
        assert insights.run_export(args) == 0
        lines = [json.loads(line) for line in out.read_bytes().splitlines()]
        by_id = dict(zip(ids, ACCEPTED, strict=True))
        assert sorted(line["id"] for line in lines) == sorted(ids)
        assert all(same(line["body"], by_id[line["id"]]) for line in lines)
    finally:
        if isinstance(store, MongoStore):
            await store.drop_collections()
        await store.aclose()
