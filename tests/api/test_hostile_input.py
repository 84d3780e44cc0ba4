"""What an attacker or a careless producer sends: every finding of a hostile review.

Nothing a client stores may make a later read fail, no answer may be a 500 or a dropped connection, and no
parameter or body is silently ignored or misread. What is refused before any store is called runs on Redis;
what is stored and read back runs on every store (`every_store`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import yaml

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from tests.conftest import PROJECT, api_client

JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"
DEPTH = 64  # core.limits.Limits.max_json_depth's default


def nested(depth: int) -> Any:
    """A JSON value `depth` containers deep: {"k": [{"k": ...1...}]}."""
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def nested_raw(depth: int) -> bytes:
    """nested(depth) as JSON text, for depths JSON encoders refuse (orjson stops at 255, json at ~1000)."""
    opens = "".join('{"k": ' if i % 2 == 0 else "[" for i in reversed(range(depth)))
    closes = "".join("}" if i % 2 == 0 else "]" for i in range(depth))
    return f"{opens}1{closes}".encode()


def error(r: httpx.Response, status: int, *fragments: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.headers
    body = r.json()
    assert set(body) == {"title", "description"}, body
    for fragment in fragments:
        assert fragment in body["description"], body


async def post(client: httpx.AsyncClient, queue: str, *bodies: Any) -> list[str]:
    r = await client.post(f"/v2/queues/{queue}/messages", json={"messages": [{"body": b} for b in bodies]})
    assert r.status_code == 201, r.text
    return [href.rsplit("/", 1)[1] for href in r.json()["resources"]]


# -- poison: depth -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [DEPTH + 1, 254, 600, 1022])
async def test_a_body_nested_past_the_limit_is_refused_and_nothing_is_stored(
    client: httpx.AsyncClient, depth: int
) -> None:
    raw = b'{"messages": [{"body": 1}, {"body": ' + nested_raw(depth) + b"}]}"
    r = await client.post("/v2/queues/deep/messages", content=raw)
    named = ["messages.1.body"] if depth < 1000 else []  # past what JSON is read to: refused unparsed
    error(r, 400, *named, f"at most {DEPTH}")
    assert (await client.get("/v2/queues/deep/stats")).json()["messages"]["total"] == 0


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_a_body_at_the_depth_limit_reads_back_through_every_read(client: httpx.AsyncClient) -> None:
    body = nested(DEPTH)
    r = await client.put(
        "/v2/queues/at-limit", json={"_max_claim_count": 1, "_dead_letter_queue": "at-limit.dlq"}
    )
    assert r.status_code == 201
    (mid,) = await post(client, "at-limit", body)
    assert (await client.get(f"/v2/queues/at-limit/messages/{mid}")).json()["body"] == body
    listed = await client.get("/v2/queues/at-limit/messages?echo=true")
    assert [m["body"] for m in listed.json()["messages"]] == [body]
    claimed = await client.post("/v2/queues/at-limit/claims", json={"ttl": 60})
    assert claimed.status_code == 201, claimed.text
    assert claimed.json()["messages"][0]["body"] == body
    claim = claimed.headers["location"]
    assert (await client.get(claim)).json()["messages"][0]["body"] == body
    assert (await client.delete(claim)).status_code == 204  # its one claim used: moves to the DLQ
    dead = await client.get("/v2/queues/at-limit.dlq/messages?echo=true&provenance=true")
    assert [m["body"] for m in dead.json()["messages"]] == [body]
    preview = await client.post("/v2/queues/at-limit.dlq/redrive", json={"dry_run": True})
    assert preview.json()["sample"][0]["body"] == body
    popped = await client.delete("/v2/queues/at-limit.dlq/messages?pop=1")
    assert popped.json()["messages"][0]["body"] == body


@pytest.mark.parametrize("depth", [DEPTH + 1, 254, 1000])
async def test_metadata_nested_past_the_limit_is_refused(client: httpx.AsyncClient, depth: int) -> None:
    r = await client.put("/v2/queues/deep-meta", content=b'{"x": ' + nested_raw(depth - 1) + b"}")
    error(r, 400, "metadata", f"at most {DEPTH}")
    await client.put("/v2/queues/deep-meta", json={})
    patch = b'[{"op": "add", "path": "/metadata/x", "value": ' + nested_raw(depth - 1) + b"}]"
    r = await client.patch("/v2/queues/deep-meta", content=patch, headers={"Content-Type": JSON_PATCH})
    error(r, 400, f"at most {DEPTH}")
    listed = await client.get("/v2/queues?detailed=true")
    assert listed.status_code == 200, listed.text


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_metadata_at_the_depth_limit_lists_detailed(client: httpx.AsyncClient) -> None:
    meta = {"x": nested(DEPTH - 1)}
    assert (await client.put("/v2/queues/meta-at-limit", json=meta)).status_code == 201
    listed = await client.get("/v2/queues?detailed=true")
    assert listed.status_code == 200, listed.text
    assert [q["metadata"]["x"] for q in listed.json()["queues"] if q["name"] == "meta-at-limit"] == [
        meta["x"]
    ]


# -- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nl%0A", "nl%0D", "tab%09", "%2E%2E", "%2E", "sp%20ace", "%C3%A9"])
async def test_queue_names_are_fully_matched(client: httpx.AsyncClient, name: str) -> None:
    error(await client.put(f"/v2/queues/{name}"), 400, "Queue names")
    error(await client.post(f"/v2/queues/{name}/messages", json={"messages": [{"body": 1}]}), 400)
    listed = (await client.get("/v2/queues")).json()["queues"]
    assert listed == []


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_names_with_dots_other_than_dot_and_dot_dot_are_fine(client: httpx.AsyncClient) -> None:
    for name in ("...", ".a", "a..b", "orders.dlq"):
        assert (await client.put(f"/v2/queues/{name}")).status_code == 201, name


@pytest.mark.parametrize("dlq", ["ab\n", "..", "", "a" * 65, 7])
async def test_dead_letter_queue_names_are_fully_matched(client: httpx.AsyncClient, dlq: Any) -> None:
    error(await client.put("/v2/queues/src", json={"_dead_letter_queue": dlq}), 400, "_dead_letter_queue")


@pytest.mark.parametrize(
    ("field", "value"),
    [("destination", "ab\n"), ("destination", ".."), ("source_queue", "ab\n"), ("source_queue", "..")],
)
async def test_redrive_names_are_fully_matched(client: httpx.AsyncClient, field: str, value: str) -> None:
    body = {"destination": value} if field == "destination" else {"filter": {"source_queue": value}}
    error(await client.post("/v2/queues/dlq/redrive", json=body), 400, field)
    assert (await client.get("/v2/queues/dlq/redrive")).json()["tasks"] == []


# -- dates ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "when", ["9999-12-31T23:59:59-14:00", "10000-01-01T00:00:00Z", "0000-12-31T23:59:59Z"]
)
async def test_redrive_dates_out_of_range_are_refused_and_store_nothing(
    client: httpx.AsyncClient, when: str
) -> None:
    r = await client.post("/v2/queues/dlq/redrive", json={"filter": {"dead_lettered_before": when}})
    error(r, 400, "dead_lettered_before")
    listed = await client.get("/v2/queues/dlq/redrive")
    assert listed.status_code == 200, listed.text
    assert listed.json()["tasks"] == []


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_redrive_dates_at_the_ends_of_the_range_round_trip(client: httpx.AsyncClient) -> None:
    filters = {"dead_lettered_after": "0001-01-01T00:00:00Z", "dead_lettered_before": "9999-12-31T23:59:59Z"}
    assert (await client.put("/v2/queues/dlq")).status_code == 201
    r = await client.post("/v2/queues/dlq/redrive", json={"filter": filters, "max_per_second": 10})
    assert r.status_code == 202, r.text
    assert r.json()["request"]["filter"] == filters
    for _ in range(200):  # the DLQ is empty: the task ends at its first step
        if (await client.get(r.headers["location"])).json()["status"] != "running":
            break
        await asyncio.sleep(0.02)
    listed = await client.get("/v2/queues/dlq/redrive")
    assert [(t["status"], t["request"]["filter"]) for t in listed.json()["tasks"]] == [("succeeded", filters)]


# -- bodies that are not objects -----------------------------------------------------------------------------


FALSY = [b"null", b"[]", b"0", b"false", b'""', b"[1]", b"3.5", b'"x"']


@pytest.mark.parametrize("raw", FALSY)
async def test_purge_with_a_body_that_is_not_an_object_purges_nothing(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    await post(client, "keep", 1, 2)
    error(await client.post("/v2/queues/keep/purge", content=raw), 400, "JSON object")
    assert (await client.get("/v2/queues/keep/stats")).json()["messages"]["total"] == 2


@pytest.mark.parametrize("raw", FALSY)
async def test_claim_with_a_body_that_is_not_an_object_claims_nothing(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    await post(client, "keep", 1)
    error(await client.post("/v2/queues/keep/claims", content=raw), 400, "JSON object")
    assert (await client.get("/v2/queues/keep/stats")).json()["messages"]["claimed"] == 0


@pytest.mark.parametrize("raw", FALSY)
async def test_redrive_with_a_body_that_is_not_an_object_starts_nothing(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    error(await client.post("/v2/queues/dlq/redrive", content=raw), 400, "JSON object")
    assert (await client.get("/v2/queues/dlq/redrive")).json()["tasks"] == []


@pytest.mark.parametrize("raw", FALSY)
async def test_a_post_with_a_body_that_is_not_an_object_posts_nothing(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    error(await client.post("/v2/queues/keep/messages", content=raw), 400, "must be a JSON object")
    assert (await client.get("/v2/queues/keep/stats")).json()["messages"]["total"] == 0


@pytest.mark.parametrize("raw", FALSY)
async def test_queue_metadata_that_is_not_an_object_is_refused(client: httpx.AsyncClient, raw: bytes) -> None:
    error(await client.put("/v2/queues/meta", content=raw), 400, "JSON object")
    assert (await client.get("/v2/queues")).json()["queues"] == []


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_an_empty_body_still_means_the_defaults(client: httpx.AsyncClient) -> None:
    await post(client, "keep", 1)
    assert (await client.post("/v2/queues/keep/claims", content=b"")).status_code == 201
    assert (await client.post("/v2/queues/keep/purge", content=b" \n")).status_code == 204
    assert (await client.get("/v2/queues/keep/stats")).json()["messages"]["total"] == 0


@pytest.mark.parametrize(
    ("method", "url", "body", "fragments"),
    [
        (
            "POST",
            "/v2/queues/v/messages",
            {"messages": [{"body": 1, "ttl": 60.5}]},
            ["messages.0.ttl", "60.5"],
        ),
        (
            "POST",
            "/v2/queues/v/messages",
            {"messages": [{"body": 1, "delay": "5"}]},
            ["messages.0.delay", '"5"'],
        ),
        ("POST", "/v2/queues/v/claims", {"ttl": 60.5}, ["ttl", "whole number", "60.5"]),
        ("POST", "/v2/queues/v/claims", {"grace": "x"}, ["grace", "whole number", '"x"']),
        ("POST", "/v2/queues/v/claims", {"ttl": True}, ["ttl", "whole number", "true"]),
        ("POST", "/v2/queues/v/redrive", {"limit": 0}, ["limit", "between 1 and 1000000000", "got 0"]),
        ("POST", "/v2/queues/v/redrive", {"max_per_second": 1.5}, ["max_per_second", "whole number", "1.5"]),
        ("POST", "/v2/queues/v/redrive", {"destination": 5}, ["destination", "string", "got 5"]),
    ],
)
async def test_a_bad_field_is_named_with_the_rule_and_what_was_sent(
    client: httpx.AsyncClient, method: str, url: str, body: Any, fragments: list[str]
) -> None:
    r = await client.request(method, url, json=body)
    error(r, 400, *fragments)
    description = r.json()["description"]
    for internal in ("function-after", ".int:", "Value error"):  # pydantic's words, not the API's
        assert internal not in description, description


async def test_every_body_past_its_limit_or_not_utf8_is_refused_as_published(
    client: httpx.AsyncClient,
) -> None:
    """Each queue operation that takes a body, as openapi.yaml lists them: 2 MB (past every limit) answers
    413, a charset other than UTF-8 415, and openapi.yaml says they may."""
    from tests.api.test_openapi import SPEC

    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    big = b'{"x": "' + b"a" * 2_000_000 + b'"}'
    (message_id,) = await post(client, "big", 1)
    claim = await client.post("/v2/queues/big/claims", json={"ttl": 60})
    claim_id = claim.headers["location"].rsplit("/", 1)[1]
    hook = {"subscriber": "https://hooks.example.com/"}
    subscription_id = (await client.post("/v2/queues/big/subscriptions", json=hook)).json()["subscription_id"]
    checked = []
    for path, operations in spec["paths"].items():
        if not path.startswith("/v2/queues/"):
            continue
        for method, operation in operations.items():
            if "requestBody" not in operation:
                continue
            url = path.format(
                queue_name="big", message_id=message_id, claim_id=claim_id, subscription_id=subscription_id
            )
            content_type = next(iter(operation["requestBody"]["content"]))
            r = await client.request(method, url, content=big, headers={"Content-Type": content_type})
            error(r, 413)
            assert "413" in operation["responses"], (method, path)
            latin = {"Content-Type": f"{content_type}; charset=iso-8859-1"}
            error(await client.request(method, url, content=b"{}", headers=latin), 415, "iso-8859-1")
            assert "415" in operation["responses"], (method, path)
            checked.append((method, path))
    assert len(checked) >= 8, checked


# -- numbers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30])
async def test_integers_outside_64_bits_are_refused(client: httpx.AsyncClient, number: int) -> None:
    raw = b'{"messages": [{"body": {"n": ' + str(number).encode() + b"}}]}"
    error(await client.post("/v2/queues/num/messages", content=raw), 400, "64-bit", "string")
    raw = b'{"n": ' + str(number).encode() + b"}"
    error(await client.put("/v2/queues/num", content=raw), 400, "64-bit")
    assert (await client.get("/v2/queues/num/stats")).json()["messages"]["total"] == 0


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_numbers_round_trip_exactly(client: httpx.AsyncClient) -> None:
    bodies = [2**64 - 1, -(2**63), 0, -0.0, 1.5e300, {"id": "12345678901234567890123"}, 9007199254740993]
    ids = await post(client, "num", *bodies)
    got = (await client.get(f"/v2/queues/num/messages?ids={','.join(ids)}")).json()["messages"]
    by_id = {m["id"]: m["body"] for m in got}
    assert [by_id[i] for i in ids] == bodies
    assert [type(by_id[i]) for i in ids] == [type(b) for b in bodies]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"messages": [{"body": "\\ud800"}]}', "surrogate"),
        (b'{"messages": [{"body": 1e400}]}', "infinity"),
        (b'{"messages": [{"body": NaN}]}', "JSON"),
        (b'{"messages": [{"body": "\xff"}]}', "UTF-8"),
    ],
)
async def test_json_that_cannot_round_trip_is_refused(
    client: httpx.AsyncClient, raw: bytes, fragment: str
) -> None:
    error(await client.post("/v2/queues/num/messages", content=raw), 400, fragment)


# -- headers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("header", ["X-Project-ID", "Client-ID", "X-Roles"])
async def test_an_identity_header_given_twice_is_refused(client: httpx.AsyncClient, header: str) -> None:
    value = {"X-Project-ID": "other-project", "Client-ID": "6bd8f7d6-7a6e-11e3-b191-71861300734c"}.get(
        header, "admin"
    )
    for method, url in [("GET", "/v2/queues"), ("POST", "/v2/queues/q/claims"), ("GET", "/v2/queues/q")]:
        request = client.build_request(method, url)
        given = [(header, "reader")] if header == "X-Roles" else []
        request.headers = httpx.Headers([*request.headers.multi_items(), *given, (header, value)])
        error(await client.send(request), 400, header, "more than once")


async def test_a_project_with_a_comma_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.get("/v2/queues", headers={"X-Project-ID": f"{PROJECT}, evil"})
    error(r, 400, "X-Project-ID", "comma")


@pytest.mark.parametrize(
    ("method", "url", "allowed"),
    [
        ("POST", "/v2/queues/q", {"GET", "HEAD", "PUT", "PATCH", "DELETE"}),
        ("PUT", "/v2/queues/q/messages", {"GET", "HEAD", "POST", "DELETE"}),
        ("DELETE", "/v2/queues/q/stats", {"GET", "HEAD"}),
        ("GET", "/v2/queues/q/purge", {"POST"}),
        ("POST", "/v2/ping", {"GET", "HEAD"}),
    ],
)
async def test_405_says_which_methods_are_allowed(
    client: httpx.AsyncClient, method: str, url: str, allowed: set[str]
) -> None:
    r = await client.request(method, url)
    error(r, 405)
    assert {m.strip() for m in r.headers["allow"].split(",")} == allowed


@pytest.mark.parametrize(
    "path",
    [
        "/v2/queues/victim/messages/..%2f",
        "/v2/queues/victim/messages/..%2F",
        "/v2/queues/victim/",
        "/v2/queues/victim/messages/",
        "/v2/queues/victim/stats/",
        "/v2/queues/",
        "/v2/ping/",
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST", "PUT"])
async def test_a_trailing_or_encoded_slash_is_not_found_never_redirected(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    """A redirect keeps its method: DELETE .../messages/..%2f was sent on to DELETE /v2/queues/victim/ (a
    client that collapses `..`, as curl -L does) and then to DELETE /v2/queues/victim, the whole queue."""
    await post(client, "victim", 1)
    r = await client.request(method, path, content=b"{}" if method in ("POST", "PUT") else None)
    error(r, 404)
    assert (await client.get("/v2/queues/victim/stats")).json()["messages"]["total"] == 1


async def test_head_answers_like_get_without_a_body(client: httpx.AsyncClient) -> None:
    await post(client, "h", 1)
    for url in (
        "/v2/queues/h",
        "/v2/queues/h/stats",
        "/v2/queues",
        "/v2/ping",
        "/v2/queues/h/messages?echo=true",
    ):
        get, head = await client.get(url), await client.head(url)
        assert head.status_code == get.status_code, url
        assert head.content == b"", url
    refused = await client.head("/v2/queues/h/purge")
    assert (refused.status_code, refused.headers["allow"], refused.content) == (405, "POST", b"")


# -- parameters never silently ignored -----------------------------------------------------------------------

UNKNOWN_PARAMETERS = [
    ("GET", "/v2/queues/q/messages?limt=5", "limt"),
    ("POST", "/v2/queues/q/claims?limit=5&ttl=60", "ttl"),
    ("DELETE", "/v2/queues/q/messages?ids=" + "a" * 32 + "&claim_id=" + "b" * 32, "claim_id"),
    ("GET", "/v2/queues/q/stats?detailed=true", "detailed"),
    ("DELETE", "/v2/queues/q/claims/" + "a" * 32 + "?dealy=5", "dealy"),
    ("GET", "/v2/ping?x=1", "x"),
]


@pytest.mark.parametrize(("method", "url", "name"), UNKNOWN_PARAMETERS)
async def test_an_unknown_query_parameter_is_ignored_as_zaqar_does_and_named(
    client: httpx.AsyncClient, method: str, url: str, name: str
) -> None:
    r = await client.request(method, url, json={"ttl": 60} if method == "POST" else None)
    assert r.status_code < 400, r.text
    assert r.headers["charon-ignored-parameters"] == name


@pytest.mark.parametrize(("method", "url", "name"), UNKNOWN_PARAMETERS)
async def test_strict_parameters_refuse_an_unknown_query_parameter(
    store: Store, clock: ManualClock, method: str, url: str, name: str
) -> None:
    app = create_app(Settings(storage_uri="redis://unused", strict_parameters=True), store=store, clock=clock)
    async with api_client(app) as strict:
        r = await strict.request(method, url, json={"ttl": 60} if method == "POST" else None)
    error(r, 400, repr(name))
    assert "charon-ignored-parameters" not in r.headers


async def test_the_ignored_parameters_header_is_bounded_and_safe(client: httpx.AsyncClient) -> None:
    """Names come from the request: percent-encoded (no header injection), each cut to 40 characters, at
    most 10 shown."""
    many = "&".join(f"p{i}=1" for i in range(12))
    r = await client.get(f"/v2/ping?{'x' * 100}=1&a%0D%0AInjected:%20yes=1&%C3%A9=1&{many}")
    assert r.status_code == 204
    named = r.headers["charon-ignored-parameters"]
    assert named.startswith(f"{'x' * 40}, a%0D%0AInjected%3A%20yes, %C3%A9, p0, ")
    assert named.endswith("p6, and 5 more")
    assert "injected" not in r.headers


@pytest.mark.parametrize(
    "url", ["/v2/queues/q/messages?limit=1&limit=2", "/v2/queues/q/claims?limit=1&limit=2"]
)
async def test_a_single_valued_parameter_given_twice_is_refused(client: httpx.AsyncClient, url: str) -> None:
    method = "POST" if "claims" in url else "GET"
    error(await client.request(method, url), 400, "'limit'", "once")


async def test_a_metadata_filter_given_twice_is_refused(client: httpx.AsyncClient) -> None:
    assert (await client.put("/v2/queues/mf", json={"a": 1})).status_code == 201
    error(await client.get("/v2/queues?a=1&a=2"), 400, "'a'", "once")


@pytest.mark.parametrize("marker", ["\u00b2", "\uff11\uff12", "-1", "1" * 40, "1.5", " 1"])
async def test_message_markers_are_digits_in_range(client: httpx.AsyncClient, marker: str) -> None:
    error(await client.get("/v2/queues/q/messages", params={"marker": marker}), 400, "marker")


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
async def test_queue_list_filters_by_name_and_metadata_with_a_count(client: httpx.AsyncClient) -> None:
    queues = {
        "alpha": {"team": "red", "tier": 1},
        "alphabet": {"team": "blue", "tier": 1},
        "beta": {"team": "red", "tier": 2},
        "gamma-alpha": {"team": "red", "tier": "1"},
    }
    for name, meta in queues.items():
        assert (await client.put(f"/v2/queues/{name}", json=meta)).status_code == 201

    async def names(query: str) -> tuple[list[str], Any]:
        r = await client.get(f"/v2/queues?{query}")
        assert r.status_code == 200, r.text
        return [q["name"] for q in r.json()["queues"]], r.json().get("count")

    assert await names("name=alpha&with_count=true") == (["alpha", "alphabet", "gamma-alpha"], 3)
    assert await names("team=red&with_count=true") == (["alpha", "beta", "gamma-alpha"], 3)
    assert await names("team=red&tier=1") == (["alpha", "gamma-alpha"], None)
    assert await names("name=alpha&team=blue") == (["alphabet"], None)
    assert await names("with_count=true") == (sorted(queues), 4)
    assert await names("with_count=false") == (sorted(queues), None)
    page, _ = await names("team=red&limit=2")
    assert page == ["alpha", "beta"]
    r = await client.get("/v2/queues?team=red&limit=2")
    nxt = r.json()["links"][0]["href"]
    rest = await client.get(nxt)
    assert [q["name"] for q in rest.json()["queues"]] == ["gamma-alpha"]
    assert (await names("name=zzz&with_count=true")) == ([], 0)


@pytest.mark.every_store  # what it stores is read back: each store must keep it exactly
@pytest.mark.parametrize("path", ["/metadata/a/b", "/metadata/a~2", "/metadata/a~"])
async def test_a_patch_path_names_one_key_as_a_json_pointer(client: httpx.AsyncClient, path: str) -> None:
    """`/metadata/a/b` is the key b inside a (JSON Pointer, RFC 6901), which queue metadata patches do not
    reach: refused, not read as the key "a/b" (that is `/metadata/a~1b`)."""
    assert (await client.put("/v2/queues/pp", json={"a": {"b": 1}})).status_code == 201
    patch = [{"op": "add", "path": path, "value": 2}]
    r = await client.patch("/v2/queues/pp", json=patch, headers={"Content-Type": JSON_PATCH})
    error(r, 400, repr(path))

    async def metadata() -> dict[str, Any]:
        shown = (await client.get("/v2/queues/pp")).json()
        return {k: v for k, v in shown.items() if not k.startswith("_")}

    assert await metadata() == {"a": {"b": 1}}
    patch = [{"op": "add", "path": "/metadata/a~1b~0", "value": 2}]
    r = await client.patch("/v2/queues/pp", json=patch, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 200, r.text
    assert await metadata() == {"a": {"b": 1}, "a/b~": 2}


async def test_encryption_is_refused_without_a_key(client: httpx.AsyncClient) -> None:
    r = await client.put("/v2/queues/enc", json={"_enable_encrypt_messages": True})
    error(r, 400, "CHARON_ENCRYPTION__KEYS")
    assert (await client.put("/v2/queues/enc", json={})).status_code == 201
    patch = [{"op": "add", "path": "/metadata/_enable_encrypt_messages", "value": True}]
    r = await client.patch("/v2/queues/enc", json=patch, headers={"Content-Type": JSON_PATCH})
    error(r, 400, "_enable_encrypt_messages")
    shown = (await client.get("/v2/queues/enc")).json()
    assert shown.get("_enable_encrypt_messages", False) is False


async def test_an_unexpected_failure_answers_json(settings: Any, store: Any, clock: Any) -> None:
    from app.main import create_app
    from tests.conftest import api_client

    app = create_app(settings, store=store, clock=clock)

    @app.get("/v2/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    async with api_client(app) as c:
        transport = c._transport
        assert isinstance(transport, httpx.ASGITransport)
        transport.raise_app_exceptions = False
        r = await c.get("/v2/boom")
    error(r, 500, "not known")
    assert "a bug" not in r.text
