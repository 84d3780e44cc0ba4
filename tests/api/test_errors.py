"""Bad input gets a clear Zaqar-style error with the right 4xx, never a 500."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from core import errors
from storage.registry import open_store
from tests.conftest import CLIENT_ID, api_client
from tests.servers import RedisServer, free_port

JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"
NO_CLIENT: dict[str, Any] = {"Client-ID": None}
CLAIMED = "CLAIMED"  # placeholder replaced by the id of a claimed message

CASES = [
    # (id, method, url, kwargs, status, fragment of the description)
    (
        "no-client-id",
        "GET",
        "/v2/queues/q/messages",
        {"headers": NO_CLIENT},
        400,
        "Client-ID header is missing",
    ),
    ("bad-client-id", "GET", "/v2/queues", {"headers": {"Client-ID": "not-a-uuid"}}, 400, "must be a UUID"),
    ("no-project", "GET", "/v2/queues", {"headers": {"X-Project-ID": None}}, 400, "X-Project-ID"),
    ("empty-project", "GET", "/v2/queues", {"headers": {"X-Project-ID": " "}}, 400, "must not be empty"),
    ("long-project", "GET", "/v2/queues", {"headers": {"X-Project-ID": "p" * 257}}, 400, "at most 256"),
    ("long-queue-name", "PUT", "/v2/queues/" + "q" * 65, {}, 400, "1 to 64 characters"),
    ("bad-queue-name", "PUT", "/v2/queues/bad$name", {}, 400, "ASCII letters"),
    ("body-not-json", "POST", "/v2/queues/q/messages", {"content": b"{nope"}, 400, "not valid JSON"),
    # query parameters of the hot (plain) routes, parsed by their query models (api/params.py)
    ("claim-limit-not-int", "POST", "/v2/queues/q/claims?limit=ten", {}, 400, "limit: Input should be"),
    ("claim-provenance-not-bool", "POST", "/v2/queues/q/claims?provenance=maybe", {}, 400, "provenance:"),
    ("release-delay-not-int", "DELETE", "/v2/queues/q/claims/" + "a" * 32 + "?delay=1.5", {}, 400, "delay:"),
    (
        "no-messages-key",
        "POST",
        "/v2/queues/q/messages",
        {"json": [{"body": 1}]},
        400,
        "must be a JSON object; got an array",
    ),
    ("empty-messages", "POST", "/v2/queues/q/messages", {"json": {"messages": []}}, 400, "at least 1"),
    (
        "message-without-body",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"ttl": 60}]}},
        400,
        "messages.0.body",
    ),
    (
        "unknown-message-field",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": 1, "tll": 60}]}},
        400,
        "messages.0.tll",
    ),
    (
        "ttl-not-int",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": 1, "ttl": "60"}]}},
        400,
        "messages.0.ttl",
    ),
    (
        "ttl-too-small",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": 1, "ttl": 59}]}},
        400,
        "messages.0.ttl must be between 60 and 1209600; got 59",
    ),
    (
        "ttl-too-large",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": 1}, {"body": 2, "ttl": 1209601}]}},
        400,
        "messages.1.ttl must be between",
    ),
    (
        "delay-too-large",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": 1, "delay": 901}]}},
        400,
        "delay must be between 0 and 900",
    ),
    (
        "post-too-large",
        "POST",
        "/v2/queues/q/messages",
        {"json": {"messages": [{"body": "x" * 262_144}]}},
        413,
        "at most 262144 bytes",
    ),
    (
        "claim-ttl-too-small",
        "POST",
        "/v2/queues/q/claims",
        {"json": {"ttl": 10}},
        400,
        "Claim ttl must be between 60 and 43200; got 10",
    ),
    (
        "claim-grace-too-large",
        "POST",
        "/v2/queues/q/claims",
        {"json": {"grace": 50000}},
        400,
        "Claim grace must be between 0 and 43200",
    ),
    ("claim-limit-zero", "POST", "/v2/queues/q/claims?limit=0", {}, 400, "limit must be between 1 and 20"),
    (
        "claim-limit-too-large",
        "POST",
        "/v2/queues/q/claims?limit=21",
        {},
        400,
        "limit must be between 1 and 20",
    ),
    ("claim-limit-not-int", "POST", "/v2/queues/q/claims?limit=ten", {}, 400, "limit"),
    ("claim-body-a-list", "POST", "/v2/queues/q/claims", {"json": [1]}, 400, "must be a JSON object"),
    (
        "list-limit-too-large",
        "GET",
        "/v2/queues/q/messages?limit=50",
        {},
        400,
        "limit must be between 1 and 20",
    ),
    ("list-bad-marker", "GET", "/v2/queues/q/messages?marker=abc", {}, 400, "marker"),
    ("list-bad-bool", "GET", "/v2/queues/q/messages?echo=maybe", {}, 400, "echo"),
    ("queue-list-limit", "GET", "/v2/queues?limit=0", {}, 400, "limit must be between 1 and 20"),
    ("too-many-ids", "GET", "/v2/queues/q/messages?ids=" + ",".join(["a" * 32] * 21), {}, 400, "at most 20"),
    ("ids-and-pop", "DELETE", "/v2/queues/q/messages?ids=" + "a" * 32 + "&pop=1", {}, 400, "either ids"),
    ("ids-not-ids", "GET", "/v2/queues/q/messages?ids=" + "a" * 32 + ",nope", {}, 404, "None of the listed"),
    ("neither-ids-nor-pop", "DELETE", "/v2/queues/q/messages", {}, 400, "either ids"),
    ("pop-too-large", "DELETE", "/v2/queues/q/messages?pop=21", {}, 400, "pop must be between 1 and 20"),
    ("malformed-message-id", "GET", "/v2/queues/q/messages/not-an-id", {}, 404, "does not exist"),
    ("missing-message", "GET", "/v2/queues/q/messages/" + "b" * 32, {}, 404, "does not exist"),
    ("malformed-claim-id", "GET", "/v2/queues/q/claims/xyz", {}, 404, "does not exist"),
    ("missing-claim", "GET", "/v2/queues/q/claims/" + "c" * 32, {}, 404, "does not exist"),
    (
        "renew-missing-claim",
        "PATCH",
        "/v2/queues/q/claims/" + "c" * 32,
        {"json": {"ttl": 60, "grace": 60}},
        404,
        "does not exist",
    ),
    ("delete-claimed-no-claim-id", "DELETE", f"/v2/queues/q/messages/{CLAIMED}", {}, 403, "claim_id"),
    (
        "delete-claimed-wrong-claim",
        "DELETE",
        f"/v2/queues/q/messages/{CLAIMED}?claim_id=" + "d" * 32,
        {},
        403,
        "does not hold",
    ),
    ("patch-wrong-content-type", "PATCH", "/v2/queues/q", {"json": []}, 415, JSON_PATCH),
    (
        "patch-bad-op",
        "PATCH",
        "/v2/queues/q",
        {"content": b'[{"op": "move", "path": "/metadata/a"}]', "headers": {"Content-Type": JSON_PATCH}},
        400,
        "op",
    ),
    (
        "patch-bad-path",
        "PATCH",
        "/v2/queues/q",
        {"content": b'[{"op": "add", "path": "/a", "value": 1}]', "headers": {"Content-Type": JSON_PATCH}},
        400,
        "/metadata/<key>",
    ),
    (
        "patch-not-a-list",
        "PATCH",
        "/v2/queues/q",
        {"content": b'{"op": "add"}', "headers": {"Content-Type": JSON_PATCH}},
        400,
        "JSON array",
    ),
    (
        "patch-replace-missing",
        "PATCH",
        "/v2/queues/q",
        {
            "content": b'[{"op": "replace", "path": "/metadata/nope", "value": 1}]',
            "headers": {"Content-Type": JSON_PATCH},
        },
        409,
        "no such key",
    ),
    ("metadata-not-object", "PUT", "/v2/queues/q", {"json": [1, 2]}, 400, "JSON object"),
    ("metadata-too-large", "PUT", "/v2/queues/q", {"json": {"k": "x" * 70000}}, 413, "at most 65536"),
    (
        "max-claim-count-zero",
        "PUT",
        "/v2/queues/q",
        {"json": {"_max_claim_count": 0}},
        400,
        "_max_claim_count must be between 1",
    ),
    (
        "max-claim-count-string",
        "PUT",
        "/v2/queues/q",
        {"json": {"_max_claim_count": "3"}},
        400,
        "_max_claim_count must be an integer",
    ),
    ("dlq-is-itself", "PUT", "/v2/queues/q", {"json": {"_dead_letter_queue": "q"}}, 400, "not 'q' itself"),
    ("dlq-bad-name", "PUT", "/v2/queues/q", {"json": {"_dead_letter_queue": "a b"}}, 400, "must be 1 to 64"),
    (
        "dlq-ttl-too-small",
        "PUT",
        "/v2/queues/q",
        {"json": {"_dead_letter_queue_messages_ttl": 5}},
        400,
        "_dead_letter_queue_messages_ttl must be between 60",
    ),
    (
        "default-ttl-bad",
        "PUT",
        "/v2/queues/q",
        {"json": {"_default_message_ttl": 10**9}},
        400,
        "_default_message_ttl",
    ),
    ("unknown-route", "GET", "/v2/nothing-here", {}, 404, "No such resource"),
]


@pytest.mark.parametrize(
    ("method", "url", "kwargs", "status", "fragment"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
async def test_bad_input_gets_clear_error(
    client: httpx.AsyncClient, method: str, url: str, kwargs: dict[str, Any], status: int, fragment: str
) -> None:
    kwargs = dict(kwargs)  # the case is shared by every run: take the headers from a copy
    if CLAIMED in url:
        r = await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]})
        mid = r.json()["resources"][0].rsplit("/", 1)[1]
        assert (await client.post("/v2/queues/q/claims")).status_code == 201
        url = url.replace(CLAIMED, mid)
    headers = {"Client-ID": CLIENT_ID, "X-Project-ID": "project-a", **kwargs.pop("headers", {})}
    request = client.build_request(
        method, url, headers={k: v for k, v in headers.items() if v is not None}, **kwargs
    )
    for name in [k for k, v in headers.items() if v is None]:
        del request.headers[name]
    r = await client.send(request)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"title", "description"}
    assert fragment in body["description"], body
    if status == 415:
        assert r.headers["accept-patch"] == JSON_PATCH


async def test_no_state_changed_by_rejected_posts(client: httpx.AsyncClient) -> None:
    await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}, {"body": 2, "ttl": 5}]})
    assert (await client.get("/v2/queues/q/stats")).json()["messages"]["total"] == 0


def test_every_error_class_has_a_client_status_and_title() -> None:
    def walk(cls: type[errors.CharonError]) -> list[type[errors.CharonError]]:
        return [cls] + [s for sub in cls.__subclasses__() for s in walk(sub)]

    classes = walk(errors.CharonError)[1:]
    assert len(classes) >= 12
    for cls in classes:
        assert cls.status in {400, 401, 403, 404, 408, 409, 413, 415, 422, 429, 503, 507}, cls
        assert cls.title, cls
        assert cls.title != errors.CharonError.title, cls


async def check_requests_answer_503(uri: str) -> None:
    # A 1 s storage timeout: the MongoDB driver retries server selection until it is spent (5 s by default).
    store = open_store(uri.format(port=free_port()), timeout=1.0)
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0), store=store)
    try:
        async with api_client(app) as c:
            assert (await c.get("/v2/health")).status_code == 503
            assert (await c.get("/livez")).status_code == 204  # alive: the store's outage heals by itself
            for method, url in [
                ("POST", "/v2/queues/q/claims"),
                ("GET", "/v2/queues/q/stats"),
                ("GET", "/readyz"),
            ]:
                r = await c.request(method, url)
                assert r.status_code == 503, r.text
                assert r.json()["title"] == "Service temporarily unavailable"
                assert "not reachable" in r.json()["description"]
    finally:
        await store.aclose()


# PyMongo keeps its failed connection attempts (with their sockets) in the error it records, until the client
# is garbage; collect it here, under this test's filter, rather than at the end of the session.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning")
@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("redis://127.0.0.1:{port}/0", id="redis"),
        pytest.param("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300", id="mongo"),
    ],
)
async def test_a_store_that_cannot_be_reached_answers_503(uri: str) -> None:
    await check_requests_answer_503(uri)
    gc.collect()


async def test_ping_follows_the_storage_within_a_second_and_a_burst_costs_one_round_trip() -> None:
    """Ping reuses a storage check for up to 1 s (api.routes.health.StorageCheck): 100 concurrent pings and
    20 more one after the other are answered by one PING to redis-server, and once the server is gone ping
    answers 503 within about 1 s."""
    server = RedisServer().start()
    store = open_store(server.url)
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0), store=store)
    try:
        async with api_client(app) as c:
            before = await _pings_served(server.url)
            answers = await asyncio.gather(*(c.get("/v2/ping") for _ in range(100)))
            assert {r.status_code for r in answers} == {204}
            for _ in range(20):  # one after the other, within the second
                assert (await c.get("/v2/ping")).status_code == 204
            # one storage check; redis-py may precede a new connection's first command with a PING of its own
            assert await _pings_served(server.url) - before <= 2
            server.stop()
            start = time.monotonic()
            while (r := await c.get("/v2/ping")).status_code == 204:
                assert time.monotonic() - start < 1.5, "ping still says 204 1.5 s after the storage stopped"
                await asyncio.sleep(0.05)
            assert r.status_code == 503
            assert r.json()["title"] == "Service temporarily unavailable"
    finally:
        await store.aclose()
        server.stop()


async def _pings_served(url: str) -> int:
    """How many PING commands redis-server has run (INFO commandstats), through a client of its own."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        stats = await client.info("commandstats")
        return int(stats.get("cmdstat_ping", {}).get("calls", 0))
    finally:
        await client.aclose()
