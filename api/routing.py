"""The one dispatch path: every route sits on the app's own router, and every error, whatever the route, is
answered by the app's exception handlers (api/errors.py). A route is one of two kinds, declared alike:

- a FastAPI route (`Route`, from `router.get(...)` etc.): FastAPI resolves its dependencies;
- a plain Starlette route (`router.plain(...)`), for the hot routes: the endpoint takes the Request, and its
  query model when it has one, and nothing is resolved for it. FastAPI's request handling costs a route
  about twice what Starlette's does (bench/README.md, "One dispatch path").

Either kind first finds who is calling and checks the route's policy rule (api/auth.py; the rule is looked
up by method and path in api/policy.py, and a route without one is refused at import), then refuses a
query parameter it does not take before anything else runs, and reads the values with
its query model (api/params.py): a plain route before its endpoint runs, a FastAPI route where its endpoint's
parameters list the model. Its OpenAPI operation is FastAPI's, written from the same declaration: path
parameters from the path, query parameters from the model. A plain route is documented by an APIRoute that
serves nothing (`PlainRoute.doc`). Either kind's operation id is named after its policy rule (`operation_id`).

The app is an `App`: FastAPI's, with a leaner stack around the router (`App.build_middleware_stack`), in which
`Lanes` hands a request for a plain route straight to it, found by its method and path's segments, without
the router's scan of every route and FastAPI's per-request layers that serve no plain route: a ping cost
about a third less (bench/RESULTS.md, "Issue 42, second session").
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from operator import itemgetter
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from fastapi.routing import APIRoute
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.routing import Route as StarletteRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api.params import QUERY_KEY, operation_parameters, query_model_of
from api.policy import rule_for
from api.state import state_of

E = TypeVar("E", bound=Callable[..., Awaitable[Response]])
# How a route checks its rule, when not the app's Authenticator.authorize (GET /metrics: a scraper's token)
Guard = Callable[[Request, str], Awaitable[object]]


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    if dependant.call is not None:
        yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


RULE_KEY = "x-policy-rule"  # the operation's policy rule, in its OpenAPI entry
ANSWERING = "charon.answering"  # in a plain route's scope once its answer is being sent


def route_rule(method: str, path: str, openapi_extra: dict[str, Any] | None) -> str | None:
    """The policy rule a route names in its declaration (openapi_extra), else api/policy.py's for its method
    and path; None: a public route."""
    named = (openapi_extra or {}).get(RULE_KEY)
    return str(named) if named else rule_for(method, path)


def documents_rule(rule: str | None, openapi_extra: dict[str, Any] | None) -> dict[str, Any] | None:
    return {**(openapi_extra or {}), RULE_KEY: rule} if rule else openapi_extra


def operation_id(route: APIRoute) -> str:
    """A route's operationId, what a generated client names its function: the name of its policy rule, a
    name operators' policy files already use and so one that does not change (`queues:get_all` ->
    `queues_list`, `claims:create` -> `claims_create`); a public route's is its endpoint's (`ping`). Unique
    as long as no two documented routes share a rule (tests/api/test_openapi.py)."""
    assert route.methods, "an APIRoute has its methods"
    (method,) = route.methods
    rule = route_rule(method, route.path_format, route.openapi_extra)
    if rule is None:
        return route.name
    resource, _, action = rule.partition(":")
    if route.path_format.startswith("/v2/topics/") and resource != "topics":  # under a queue's rule
        resource = f"topic_{resource}"
    return f"{resource}_{'list' if action == 'get_all' else action}"


class Route(APIRoute):
    """A FastAPI route: checks its query parameters' names first (their values where the endpoint takes
    them, api.params.QUERY) and documents its path and query parameters."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        self.declared = kwargs  # as declared, for `served_at`
        (method,) = kwargs["methods"]
        self.rule = route_rule(
            method.upper(), path, kwargs.get("openapi_extra")
        )  # get_route_handler reads it
        super().__init__(path, endpoint, **kwargs)
        self.query_model = query_model_of(*_calls(self.dependant))
        self.openapi_extra = documents_rule(
            self.rule, operation_parameters(path, self.query_model, self.openapi_extra)
        )

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        rule = self.rule

        async def parsed(request: Request) -> Response:
            if rule is not None:
                await state_of(request).auth.authorize(request, rule)
            request.scope[QUERY_KEY] = (self.query_model, self.query_model.collect(request, self.path))
            return await handler(request)

        return parsed


class PlainRoute(StarletteRoute):
    """A Starlette route: `endpoint(request)`, or `endpoint(request, query)` when it takes a query model.

    It has no request wrapper of its own (Starlette's `request_response`): an error goes up to `Lanes` (or,
    for a request the router serves it, the app's ExceptionMiddleware), which answers it with the app's
    handlers, as the wrapper would have here. It marks the scope (ANSWERING) as its answer begins."""

    def __init__(
        self,
        path: str,
        endpoint: Callable[..., Awaitable[Response]],
        *,
        methods: list[str],
        doc: APIRoute,
        rule: str | None,
        guard: Guard | None = None,
    ):
        super().__init__(path, endpoint, methods=methods, include_in_schema=False)
        self.method = methods[0]
        self.declared: dict[str, Any] = {}  # how plain_route declared it, for `served_at`
        model = self.query_model = query_model_of(endpoint)
        self.doc = doc
        self.rule = rule
        route = self

        if model.model_fields:

            async def serve(scope: Scope, receive: Receive, send: Send) -> None:
                scope["route"] = route  # as FastAPI's routes do: the access log's template (api/access.py)
                request = Request(scope, receive, send)
                if rule is not None:
                    await (guard or state_of(request).auth.authorize)(request, rule)
                response = await endpoint(request, model.parse(request, path))
                scope[ANSWERING] = True
                await response(scope, receive, send)

        else:

            async def serve(scope: Scope, receive: Receive, send: Send) -> None:
                scope["route"] = route
                request = Request(scope, receive, send)
                if rule is not None:
                    await (guard or state_of(request).auth.authorize)(request, rule)
                if scope["query_string"]:
                    model.parse(request, path)  # refuses any parameter
                response = await endpoint(request)
                scope[ANSWERING] = True
                await response(scope, receive, send)

        self.app = serve

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self  # as FastAPI's routes leave it: the HTTP series read the route's template
        await super().handle(scope, receive, send)


class Router(APIRouter):
    """An APIRouter whose FastAPI routes are `Route`s, named by `operation_id`, and which declares plain
    routes too."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(route_class=Route, generate_unique_id_function=operation_id, **kwargs)

    def plain(
        self,
        method: str,
        path: str,
        *,
        responses: dict[int | str, dict[str, Any]] | None = None,
        openapi_extra: dict[str, Any] | None = None,
        guard: Guard | None = None,
        **operation: Any,
    ) -> Callable[[E], E]:
        """Declare a plain route; `operation`: what `router.post(...)` and the like take for the document
        (status_code, summary, description, response_model, response_class). `guard` checks its rule
        instead of the app's Authenticator (and must call it for whatever it does not let in itself)."""
        assert not self.dependencies, "a plain route resolves no dependency"

        def declare(endpoint: E) -> E:
            declared = {
                "tags": list(self.tags),
                "responses": {**self.responses, **(responses or {})},
                "openapi_extra": openapi_extra,
                "guard": guard,
                **operation,
            }
            self.routes.append(plain_route(method, path, endpoint, **declared))
            return endpoint

        return declare


def plain_route(
    method: str,
    path: str,
    endpoint: Callable[..., Awaitable[Response]],
    *,
    openapi_extra: dict[str, Any] | None,
    guard: Guard | None,
    **operation: Any,
) -> PlainRoute:
    model = query_model_of(endpoint)
    rule = route_rule(method, path, openapi_extra)
    doc = APIRoute(
        path,
        _documents_only,
        methods=[method],
        name=endpoint.__name__,
        openapi_extra=documents_rule(rule, operation_parameters(path, model, openapi_extra)),
        generate_unique_id_function=operation_id,
        **operation,
    )
    route = PlainRoute(path, endpoint, methods=[method], doc=doc, rule=rule, guard=guard)
    route.declared = {"openapi_extra": openapi_extra, "guard": guard, **operation}
    return route


def served_at(route: BaseRoute, path: str, **changes: Any) -> BaseRoute:
    """`route` declared again at `path`, as declared but for `changes` (its summary, tags, rule): the same
    endpoint, which tells the two apart by the request's path (Zaqar's topics: api/routes/topics.py)."""
    if isinstance(route, PlainRoute):
        return plain_route(route.method, path, route.endpoint, **{**route.declared, **changes})
    assert isinstance(route, Route), route
    return Route(path, route.endpoint, **{**route.declared, **changes})


async def _documents_only() -> Response:
    raise AssertionError("a plain route's APIRoute only documents it")


def documented(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """The routes FastAPI's OpenAPI generator is to see: each plain route as its documenting APIRoute."""
    return [route.doc if isinstance(route, PlainRoute) else route for route in routes]


# --- The app and its fast lane ------------------------------------------------------------------------------

Segments = tuple[str | None, ...]  # a path template's segments: a literal, or None for a {parameter}
# a plain route in a lane: the route, what picks a path's literal segments and what they must be, what picks
# its parameters' values, and their names
Lane = tuple[
    PlainRoute,
    Callable[[Sequence[Any]], tuple[Any, ...]],
    tuple[Any, ...],
    Callable[[Sequence[Any]], tuple[Any, ...]],
    tuple[str, ...],
]


def _segments(route: BaseRoute) -> Segments | None:
    """An HTTP route's path template as segments, when each is a literal or a plain `{name}` parameter (one
    or more characters, no '/', as Starlette matches it); None for any other."""
    if not isinstance(route, StarletteRoute) or not route.path.startswith("/"):
        return None
    out: list[str | None] = []
    for part in route.path.split("/"):
        if part.startswith("{") and part.endswith("}") and ":" not in part:
            out.append(None)
        elif "{" in part or "}" in part:
            return None
        else:
            out.append(part)
    return tuple(out)


def _overlap(a: Segments, b: Segments) -> bool:
    """Whether one request path could match both templates."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


class Lanes:
    """The router's last step for plain routes, taken first: a request whose method and path a plain route
    takes goes straight to its endpoint (with the scope the router would have given it: the endpoint, its
    path parameters, the router), found by method and number of segments among a few, and what it raises is
    answered by the app's exception `handlers` (its class's, by its MRO, as Starlette's ExceptionMiddleware
    finds it; one that has none goes up to RequestLog and ServerErrorMiddleware, the bug's 500). Any other
    request goes to `slow`: Starlette's ExceptionMiddleware, FastAPI's AsyncExitStackMiddleware (its routes
    need it) and the router, as before.

    A plain route is in a lane only when no route before it in the router could take the same request (a
    route the router would try first), so which route serves a request is what the router's scan decides.
    The lanes are made with the app's middleware stack (its first request, or the lifespan's start), from
    the routes it has then: `create_app` adds every route before."""

    def __init__(self, router: APIRouter, handlers: dict[Any, Any], slow: ASGIApp) -> None:
        self.router, self.handlers, self.slow = router, handlers, slow
        self.lanes: dict[tuple[str, int], list[Lane]] = {}  # by method and number of segments
        seen: list[tuple[set[str] | None, Segments | None]] = []  # the routes before, in the router's order
        for route in router.routes:
            methods = getattr(route, "methods", None) if isinstance(route, StarletteRoute) else None
            shape = _segments(route)
            if isinstance(route, PlainRoute) and shape is not None and methods:
                for method in sorted(methods):
                    if any(
                        other is None or ((ms is None or method in ms) and _overlap(other, shape))
                        for ms, other in seen
                    ):
                        continue  # an earlier route could take it: the router decides
                    self.lanes.setdefault((method, len(shape)), []).append(_lane(route, shape))
            if not isinstance(route, WebSocketRoute):  # any other could take an HTTP request
                seen.append((methods, shape))

    def find(self, scope: Scope) -> tuple[PlainRoute, dict[str, str]] | None:
        """The plain route whose lane takes this request, and its path parameters; None: the router's."""
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        parts = scope["path"].split("/")
        for route, literals, expected, params, names in self.lanes.get((scope["method"], len(parts)), ()):
            if literals(parts) == expected:
                values = params(parts)
                if "" not in values:
                    return route, dict(zip(names, values, strict=True))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.find(scope)
        if found is None:
            await self.slow(scope, receive, send)
            return
        route, scope["path_params"] = found
        scope["router"] = self.router
        scope["endpoint"] = route.endpoint
        try:
            await route.app(scope, receive, send)
        except Exception as exc:
            handler = next((self.handlers[c] for c in type(exc).__mro__ if c in self.handlers), None)
            if handler is None:
                raise
            if scope.get(ANSWERING):  # as Starlette's: no second answer
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
            exc.__traceback__ = None  # as Starlette's: a reused exception would gather tracebacks


def _lane(route: PlainRoute, shape: Segments) -> Lane:
    literal = [i for i, p in enumerate(shape) if p is not None]
    param = [i for i, p in enumerate(shape) if p is None]
    names = tuple(route.param_convertors)
    assert len(names) == len(param), route.path
    literals = _picker(literal)
    return route, literals, literals(shape), _picker(param), names


def _picker(indexes: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at `indexes` of a sequence, as a tuple (operator.itemgetter's speed; its one-index case and
    the empty one made tuples too)."""
    if not indexes:
        return lambda parts: ()
    if len(indexes) == 1:
        (i,) = indexes
        return lambda parts: (parts[i],)
    return itemgetter(*indexes)


class App(FastAPI):
    """FastAPI, with a leaner stack around its router: Starlette's ServerErrorMiddleware, the app's own
    middleware, then `Lanes`, which serves the plain routes itself and hands the rest to Starlette's
    ExceptionMiddleware (the app's handlers), FastAPI's AsyncExitStackMiddleware and the router. Left out
    are FastAPI's per-request layers that do nothing here: its native telemetry's (off: Charon traces
    through CHARON_TRACING, app/tracing.py, which still finds ServerErrorMiddleware outermost) and its
    app-wide body limit's (none is set: api/deps.py bounds each body as it is read)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan and websockets: FastAPI's own way
            await super().__call__(scope, receive, send)
            return
        if self.root_path:
            scope["root_path"] = self.root_path
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        if self.max_body_size is not None or self._native_telemetry.enabled():
            raise RuntimeError("App leaves out FastAPI's body limit and telemetry: both must be off")
        error_handler = None
        handlers: dict[Any, Any] = {}
        for key, value in self.exception_handlers.items():
            if key in (500, Exception):
                error_handler = value
            elif isinstance(key, int) or not inspect.iscoroutinefunction(value):
                raise RuntimeError(f"Lanes take handlers of exception classes, coroutines: not {key!r}")
            else:
                handlers[key] = value
        slow = ExceptionMiddleware(AsyncExitStackMiddleware(self.router), handlers=handlers, debug=self.debug)
        app: ASGIApp = Lanes(self.router, handlers, slow)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return ServerErrorMiddleware(app, handler=error_handler, debug=self.debug)
