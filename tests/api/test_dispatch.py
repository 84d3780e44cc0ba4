"""One dispatch path (api/routing.py): every route on the app's own router, each request served by the route
declared for it, every error answered by the app's exception handlers whichever kind of route raised it."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.routing import Match, WebSocketRoute
from starlette.routing import Route as StarletteRoute

from api.access import RequestLog
from api.errors import JSON_PATCH
from api.head import HeadAsGet
from api.metrics import HttpMetrics
from api.routing import App, Lanes, PlainRoute, Router
from app.main import create_app
from app.settings import Settings
from core import errors
from tests.conftest import api_client

HOT = {"post_messages", "delete_message", "delete_messages", "create_claim", "release_claim", "ping"}


def _domain_errors() -> list[type[errors.CharonError]]:
    def walk(cls: type[errors.CharonError]) -> list[type[errors.CharonError]]:
        return [cls] + [s for sub in cls.__subclasses__() for s in walk(sub)]

    return walk(errors.CharonError)[1:]


def test_the_hot_routes_are_plain_starlette_routes_on_the_apps_own_router() -> None:
    app = create_app(Settings(storage_uri="redis://unused"))
    plain = [r for r in app.router.routes if isinstance(r, PlainRoute)]
    # GET /metrics, the documentation pages and the console's: plain for their guards; the probes (/livez,
    # /readyz): plain, they resolve nothing; not hot
    pages = {"swagger_ui", "redoc", "docs_asset", "console_page", "console_slash", "console_asset"}
    assert {r.name for r in plain} == HOT | {"metrics", "livez", "readyz"} | pages
    assert not any(isinstance(r, APIRoute) for r in plain)
    hot = [r for r in plain if r.name in HOT and not r.path.startswith("/v2/topics")]
    assert app.router.routes[: len(hot)] == hot  # tried first: a regular expression per route tried
    topical = [r for r in app.router.routes if getattr(r, "path", "").startswith("/v2/topics")]
    last_queue = max(i for i, r in enumerate(app.router.routes) if getattr(r, "path", "").startswith("/v2/q"))
    assert app.router.routes.index(topical[0]) > last_queue  # a queue's request tries no topic route
    # no path around the router: HEAD as GET, then the request id, the access log and the HTTP series
    # (api/access.py, which counts with api/metrics.py's HttpMetrics what the router served)
    assert [m.cls for m in app.user_middleware] == [HeadAsGet, RequestLog]
    assert isinstance(app.user_middleware[1].kwargs["metrics"], HttpMetrics)


def test_each_request_is_served_by_the_route_declared_for_it() -> None:
    """No route shadows another: for every route, a request to its path with its method is matched first by
    that route (the router takes the first full match)."""
    app = create_app(Settings(storage_uri="redis://unused"))
    for route in app.router.routes:
        if isinstance(route, WebSocketRoute):  # websocket scopes only (api/websocket.py)
            assert route.path in ("/", "/v2/ws")
            continue
        assert isinstance(route, StarletteRoute)
        path = re.sub(r"{\w+}", "x", route.path)
        for method in route.methods or ():
            scope = {"type": "http", "path": path, "method": method, "root_path": "", "path_params": {}}
            first = next(r for r in app.router.routes if r.matches(scope)[0] == Match.FULL)
            assert first is route, (method, route.path)


def _lanes(app: FastAPI) -> Lanes:
    layer = app.build_middleware_stack()
    while not isinstance(layer, Lanes):
        layer = layer.app  # type: ignore[attr-defined]
    return layer


def test_a_plain_routes_lane_serves_what_the_router_would() -> None:
    """The lanes (api/routing.py) take a plain route's requests before the router: for every route and
    method, with each parameter a value or a literal of another route, the lane picks the route the router's
    scan picks, or leaves the request to it; the hot routes each have a lane."""
    app = create_app(Settings(storage_uri="redis://unused"))
    assert isinstance(app, App)
    lanes = _lanes(app)
    paths = [getattr(r, "path", "") for r in app.router.routes]
    literals = {"x", *(p for path in paths for p in path.split("/") if "{" not in p)}
    laned = set()
    for route in app.router.routes:
        if isinstance(route, WebSocketRoute):
            continue
        assert isinstance(route, StarletteRoute)
        for method in route.methods or ():
            for value in sorted(literals):
                path = re.sub(r"{\w+}", value, route.path)
                scope = {"type": "http", "path": path, "method": method, "root_path": "", "path_params": {}}
                first = next((r for r in app.router.routes if r.matches(scope)[0] == Match.FULL), None)
                found = lanes.find(scope)
                if found is not None:
                    assert found[0] is first, (method, path)
                    assert found[1] == first.matches(scope)[1]["path_params"], (method, path)
                    laned.add(found[0].name)
    assert laned >= HOT


def test_a_plain_route_behind_another_that_takes_its_requests_is_left_to_the_router() -> None:
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0))
    router = Router()
    anyone = {"x-policy-rule": "home:get"}

    @router.get("/v2/shadow/{name}", openapi_extra=anyone)
    async def first(request: Request) -> Response:
        return Response(b"first")

    @router.plain("GET", "/v2/shadow/x", openapi_extra=anyone)
    async def second(request: Request) -> Response:
        return Response(b"second")

    app.router.routes[:0] = router.routes
    lanes = _lanes(app)
    assert lanes.find({"type": "http", "path": "/v2/shadow/x", "method": "GET"}) is None


class _FailingMidway(Response):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise errors.NotFound("after the answer began")


async def test_an_error_after_a_plain_routes_answer_began_is_not_answered_twice() -> None:
    """As Starlette's ExceptionMiddleware: a handled error raised once the answer has begun is not answered
    a second time (the connection ends with what was sent); the lane raises it as a bug instead."""
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0))
    router = Router()

    @router.plain("GET", "/v2/test/midway", openapi_extra={"x-policy-rule": "home:get"})
    async def midway(request: Request) -> Response:
        return _FailingMidway()

    app.router.routes.extend(router.routes)
    async with api_client(app) as client:
        transport = client._transport
        assert isinstance(transport, httpx.ASGITransport)
        with pytest.raises(RuntimeError, match="response already started"):
            await client.get("/v2/test/midway")


def test_the_app_refuses_what_its_lanes_would_leave_out() -> None:
    """App leaves FastAPI's body limit and telemetry out, and answers a lane's errors with handlers of
    exception classes that are coroutines: a configuration that needs more is refused, not ignored."""
    with pytest.raises(RuntimeError, match="body limit and telemetry"):
        App(max_body_size=10).build_middleware_stack()
    app = App(telemetry={"tracing": False, "metrics": False, "logs": False})
    app.add_exception_handler(404, lambda request, exc: Response(b""))
    with pytest.raises(RuntimeError, match="handlers of exception classes"):
        app.build_middleware_stack()


async def test_requests_no_lane_takes_are_answered_as_the_router_answers_them() -> None:
    async with api_client(create_app(Settings(storage_uri="redis://unused", sweep_interval=0))) as client:
        empty = await client.post("/v2/queues//messages", json={"messages": [{"body": 1}]})
        trailing = await client.get("/v2/ping/")
        wrong_method = await client.post("/v2/ping")
    assert [empty.status_code, trailing.status_code, wrong_method.status_code] == [404, 404, 405]
    assert {empty.json()["title"], trailing.json()["title"]} == {"Not found"}
    assert wrong_method.json()["title"] == "Method not allowed"


def _app_raising(strict_parameters: bool = False) -> FastAPI:
    app = create_app(
        Settings(storage_uri="redis://unused", sweep_interval=0, strict_parameters=strict_parameters)
    )
    router = Router()
    raised = {e.__name__: e for e in _domain_errors()} | {"RuntimeError": RuntimeError}

    unguarded = {"x-policy-rule": "home:get"}  # any caller

    @router.get("/v2/test/fastapi/{error}", openapi_extra=unguarded)
    async def through_fastapi(request: Request) -> Response:
        raise raised[request.path_params["error"]]("what to change")

    @router.plain("GET", "/v2/test/plain/{error}", openapi_extra=unguarded)
    async def through_starlette(request: Request) -> Response:
        raise raised[request.path_params["error"]]("what to change")

    app.router.routes.extend(router.routes)
    return app


@pytest.mark.parametrize("kind", ["fastapi", "plain"])
@pytest.mark.parametrize("error", _domain_errors(), ids=lambda e: e.__name__)
async def test_every_domain_error_answers_its_status_through_both_kinds_of_route(
    kind: str, error: type[errors.CharonError]
) -> None:
    async with api_client(_app_raising()) as client:
        r = await client.get(f"/v2/test/{kind}/{error.__name__}")
    assert r.status_code == error.status
    raised = error("what to change")
    assert r.json() == {"title": raised.title, "description": raised.description, **(raised.details or {})}
    assert r.headers.get("accept-patch") == (JSON_PATCH if error.status == 415 else None)


@pytest.mark.parametrize("kind", ["fastapi", "plain"])
async def test_a_bug_answers_json_500_through_both_kinds_of_route(kind: str) -> None:
    async with api_client(_app_raising()) as client:
        transport = client._transport
        assert isinstance(transport, httpx.ASGITransport)
        transport.raise_app_exceptions = False
        r = await client.get(f"/v2/test/{kind}/RuntimeError")
    assert r.status_code == 500
    assert r.json()["title"] == "Internal server error"
    assert "what to change" not in r.text


@pytest.mark.parametrize("kind", ["fastapi", "plain"])
async def test_both_kinds_of_route_name_query_parameters_they_do_not_take(kind: str) -> None:
    async with api_client(_app_raising()) as client:
        r = await client.get(f"/v2/test/{kind}/NotFound?x=1")
    assert r.status_code == 404  # what the route answers: the parameter is ignored, and named
    assert r.headers["charon-ignored-parameters"] == "x"
    async with api_client(_app_raising(strict_parameters=True)) as client:
        r = await client.get(f"/v2/test/{kind}/NotFound?x=1")
    assert r.status_code == 400
    assert "Unknown query parameter 'x'" in r.json()["description"]
