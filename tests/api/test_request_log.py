"""X-OpenStack-Request-Id on every answer and the JSON access log (api/access.py), through HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api.access import StderrLines
from api.state import state_of
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from storage.registry import open_store
from tests.conftest import PROJECT, api_client
from tests.servers import free_port

HEADER = "X-OpenStack-Request-Id"
REQUEST_ID = re.compile(r"req-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
CLAIM = {"ttl": 60, "grace": 60}
FIELDS = ["time", "request_id", "project", "method", "route", "status", "duration_ms", "bytes", "client"]
TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(r.getMessage()) for r in self.records]


def captured(name: str) -> Iterator[Lines]:
    """Every line logger `name` logs meanwhile (its own handlers keep writing too)."""
    handler = Lines()
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture
def access() -> Iterator[Lines]:
    """Every access line logged during the test."""
    yield from captured("charon.access")


@pytest.fixture
def errors() -> Iterator[Lines]:
    yield from captured("charon.errors")


def fresh(r: httpx.Response) -> str:
    """The answer's request id, which must be one the service made."""
    rid = r.headers[HEADER]
    assert REQUEST_ID.fullmatch(rid), rid
    return rid


async def every_kind_of_answer(client: httpx.AsyncClient, clock: ManualClock, **kw: Any) -> dict[str, Any]:
    """A success, a 400, the router's 404 and 405, a domain 404, HEAD and a long poll's 204."""
    answers: dict[str, Any] = {
        "201": await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]}, **kw),
        "400": await client.post("/v2/queues/q/claims?limit=ten", json=CLAIM, **kw),
        "404 unknown route": await client.get("/v2/nowhere", **kw),
        "405": await client.put("/v2/ping", **kw),
        "404 message": await client.get(f"/v2/queues/q/messages/{'a' * 32}", **kw),
        "HEAD": await client.head("/v2/queues/q", **kw),
    }
    waiting = asyncio.create_task(client.post("/v2/queues/empty/claims?wait=3", json=CLAIM, **kw))
    await asyncio.wait_for(clock.sleepers(1), 10)
    clock.advance(3)
    answers["long poll 204"] = await asyncio.wait_for(waiting, 10)
    assert [r.status_code for r in answers.values()] == [201, 400, 404, 405, 404, 200, 204]
    return answers


async def test_every_answer_carries_a_fresh_request_id(client: httpx.AsyncClient, clock: ManualClock) -> None:
    answers = await every_kind_of_answer(client, clock)
    ids = [fresh(r) for r in answers.values()]
    assert len(set(ids)) == len(ids)


async def test_a_well_formed_request_id_is_kept(client: httpx.AsyncClient, clock: ManualClock) -> None:
    sent = f"req-{uuid.uuid4()}"
    answers = await every_kind_of_answer(client, clock, headers={HEADER: sent})
    assert {r.headers[HEADER] for r in answers.values()} == {sent}


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(str(uuid.uuid4()), id="no-prefix"),
        pytest.param(f"req-{uuid.uuid4()}".upper(), id="uppercase"),
        pytest.param(f"req-{uuid.uuid4().hex}", id="no-dashes"),
        pytest.param(f"req-{uuid.uuid4()}0", id="too-long"),
        pytest.param(f"req-{uuid.uuid4()}"[:-1] + "g", id="not-hex"),
        pytest.param("req-" + "x" * 5000, id="huge"),
        pytest.param('req-"}, {"injected": 1', id="json"),
        pytest.param("", id="empty"),
    ],
)
async def test_any_other_request_id_is_replaced_never_echoed(client: httpx.AsyncClient, sent: str) -> None:
    for r in [
        await client.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers={HEADER: sent}),
        await client.post("/v2/queues/q/claims?limit=ten", json=CLAIM, headers={HEADER: sent}),
        await client.get("/v2/nowhere", headers={HEADER: sent}),
    ]:
        assert fresh(r) != sent
        if sent:
            assert sent not in r.text


async def test_a_request_id_sent_twice_is_replaced(client: httpx.AsyncClient) -> None:
    one, two = f"req-{uuid.uuid4()}", f"req-{uuid.uuid4()}"
    r = await client.get("/v2/ping", headers=[(HEADER, one), (HEADER, two)])
    assert fresh(r) not in (one, two)


async def test_an_unreachable_store_answers_503_with_the_id_and_logs_it(errors: Lines) -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0")
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0), store=store)
    try:
        async with api_client(app) as c:
            r = await c.post("/v2/queues/q/claims", json=CLAIM)
    finally:
        await store.aclose()
    assert r.status_code == 503, r.text
    rid = fresh(r)
    [logged] = [m for m in (rec.getMessage() for rec in errors.records) if rid in m]
    assert logged.startswith(f"{rid} POST /v2/queues/{{queue_name}}/claims: 503 ")
    assert r.json()["description"] in logged
    gc.collect()  # the failed connection's socket, under this test's filters


def _app_with_a_bug(store: Store, clock: ManualClock, settings: Settings) -> FastAPI:
    app = create_app(settings, store=store, clock=clock)

    @app.get("/v2/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    return app


async def test_a_bug_answers_500_with_the_id_and_is_logged_once_with_it(
    store: Store, clock: ManualClock, settings: Settings, errors: Lines, access: Lines
) -> None:
    """The middleware answers with the app's handler and does not re-raise: the exception is logged once,
    with the request's id and its traceback (not again, without the id, by the server)."""
    async with api_client(_app_with_a_bug(store, clock, settings)) as c:
        r = await c.get("/v2/boom")  # ASGITransport raises what the app raises: nothing here
    assert r.status_code == 500
    assert r.json()["title"] == "Internal server error"
    rid = fresh(r)
    [record] = errors.records
    assert record.getMessage() == f"{rid} GET /v2/boom: 500 unexpected RuntimeError"
    assert record.exc_info is not None
    assert "a bug" in str(record.exc_info[1])
    [line] = access.json()
    assert (line["request_id"], line["status"], line["bytes"]) == (rid, 500, len(r.content))


async def test_the_access_log_has_one_line_a_request_with_every_field(
    client: httpx.AsyncClient, clock: ManualClock, access: Lines
) -> None:
    answers = await every_kind_of_answer(client, clock)
    lines = access.json()
    assert len(lines) == len(answers)
    for line, r in zip(lines, answers.values(), strict=True):
        assert list(line) == FIELDS
        assert TIME.fullmatch(line["time"]), line
        assert line["request_id"] == r.headers[HEADER]
        assert line["status"] == r.status_code
        assert line["bytes"] == len(r.content)
        assert line["client"] == "127.0.0.1"
        assert isinstance(line["duration_ms"], float)
        assert line["duration_ms"] >= 0
    shown = [(x["method"], x["route"], x["project"]) for x in lines]
    assert shown == [
        ("POST", "/v2/queues/{queue_name}/messages", PROJECT),
        ("POST", "/v2/queues/{queue_name}/claims", PROJECT),  # the query failed after authorization
        ("GET", None, None),  # no route: no template, and the raw path is never logged
        ("PUT", "/v2/ping", None),  # a public route
        ("GET", "/v2/queues/{queue_name}/messages/{message_id}", PROJECT),
        ("HEAD", "/v2/queues/{queue_name}", PROJECT),
        ("POST", "/v2/queues/{queue_name}/claims", PROJECT),
    ]
    assert "nowhere" not in json.dumps(lines)


async def test_a_refused_request_is_logged_without_a_project(
    store: Store, clock: ManualClock, access: Lines
) -> None:
    app = create_app(Settings(storage_uri="redis://unused", admin_mode=True), store=store, clock=clock)
    async with api_client(app) as c:
        r = await c.get("/v2/queues", headers={"X-Project-ID": "p", "Client-ID": "not-a-uuid"})
        refused = await c.put("/v2/pools/p", json={"uri": "redis://x", "weight": 1})
    assert (r.status_code, refused.status_code) == (400, 403)
    projects = [line["project"] for line in access.json()]
    assert projects == ["p", None]  # the 400 comes after authorization; the 403 is the policy's (admin)


@pytest.fixture
async def quiet_client(store: Store, clock: ManualClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(storage_uri="redis://unused", access_log=False), store=store, clock=clock)
    async with api_client(app) as c:
        yield c
    await state_of(app).long_polls.aclose()


async def test_turned_off_nothing_is_logged_and_the_id_stays(
    quiet_client: httpx.AsyncClient, clock: ManualClock, access: Lines
) -> None:
    answers = await every_kind_of_answer(quiet_client, clock)
    assert all(fresh(r) for r in answers.values())
    assert access.records == []


class Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write(self, text: str) -> int:
        self.calls += 1
        return super().write(text)


@contextlib.contextmanager
def logger_as_served() -> Iterator[logging.Logger]:
    """The `charon.access` logger as a service has it: no handler but the one AccessLog gives it (pytest
    gives every non-propagating logger its capture handlers at each phase of a test: taken off here)."""
    logger = logging.getLogger("charon.access")
    saved, propagate = logger.handlers[:], logger.propagate
    logger.handlers.clear()
    try:
        yield logger
    finally:
        logger.handlers[:] = saved
        logger.propagate = propagate


async def test_lines_to_stderr_wait_to_be_written_together(store: Store, clock: ManualClock) -> None:
    """With its own handler alone, the logger's lines are written together: after FLUSH_S, when
    MAX_PENDING wait, and at shutdown (`flush()`); each the line a record would have been."""
    with logger_as_served() as logger:
        app = create_app(Settings(storage_uri="redis://unused"), store=store, clock=clock)
        [handler] = logger.handlers
        assert isinstance(handler, StderrLines)
        stream = Writes()
        handler.setStream(stream)
        log = state_of(app).access_log
        assert log is not None
        log.FLUSH_S = 60
        async with api_client(app) as c:
            answers = [await c.get("/v2/ping") for _ in range(3)]
            assert stream.getvalue() == ""
            log.flush()
            assert stream.calls == 1
            log.MAX_PENDING = 2
            answers += [await c.get("/v2/ping") for _ in range(2)]
            assert stream.calls == 2
            log.FLUSH_S = 0.01
            answers.append(await c.get("/v2/nowhere"))
            await asyncio.sleep(0.5)
            assert stream.calls == 3
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == [r.headers[HEADER] for r in answers]
    assert all(list(line) == FIELDS for line in lines)
