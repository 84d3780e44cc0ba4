"""The direct path: a request for a route whose endpoint takes nothing but the Request (the hot routes: post
messages, claim, delete a message, release a claim, ping) goes from the outermost middleware straight to
that endpoint, skipping FastAPI's inner middleware, its route table and its request wrapper; on this
machine those were a third of a one-message DELETE (bench/README.md). Everything else, and the OpenAPI
document, stays FastAPI's: the routes are still declared with FastAPI, and this table is built from them.
Errors answer exactly as through FastAPI (api.errors); anything unexpected goes on to Starlette's
ServerErrorMiddleware (a 500), which sits outside this one.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import charon_error_response
from api.params import QuerySpec, query_spec
from core.errors import CharonError

Endpoint = Callable[[Request], Awaitable[Response]]
DirectRoute = tuple[re.Pattern[str], frozenset[str], Endpoint, QuerySpec]


def direct_routes(app: FastAPI) -> list[DirectRoute]:
    """Every route of `app` whose endpoint's one parameter is the Request, in the app's route order."""
    out: list[DirectRoute] = []
    for route in app.router.routes:
        if not isinstance(route, APIRoute) or route.dependencies:
            continue
        parameters = list(inspect.signature(route.endpoint, eval_str=True).parameters.values())
        if len(parameters) == 1 and parameters[0].annotation is Request:
            spec = getattr(route, "query_spec", None) or query_spec(route)
            out.append((route.path_regex, frozenset(route.methods or ()), route.endpoint, spec))
    return out


class DirectRoutes:
    """ASGI middleware: serves the direct routes itself, hands every other request to the app."""

    def __init__(self, app: ASGIApp, routes: list[DirectRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            for regex, methods, endpoint, spec in self.routes:
                if method in methods and (match := regex.match(path)) is not None:
                    scope["path_params"] = match.groupdict()
                    try:
                        request = Request(scope, receive)
                        spec.check(request)
                        response = await endpoint(request)
                    except CharonError as exc:
                        response = charon_error_response(exc)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
