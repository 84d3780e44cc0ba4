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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute
from starlette.routing import Route as StarletteRoute
from starlette.types import Receive, Scope, Send

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

    It has no request wrapper of its own (Starlette's `request_response`): an error goes up to the app's
    ExceptionMiddleware, which answers it with the app's handlers, as the wrapper would have here."""

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
