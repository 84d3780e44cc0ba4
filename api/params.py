"""No query parameter is silently ignored: a route takes exactly the query parameters its OpenAPI entry
lists (those FastAPI resolves and those a route reads by hand and documents with api.deps.parameters()), each
once unless it is a list; anything else answers 400 naming it and what the route takes. The one open route
is the queue listing, whose other parameters are metadata filters (`open_query`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi._compat.shared import field_annotation_is_sequence
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from core.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])
OPEN_QUERY = "__charon_open_query__"


def open_query(endpoint: F) -> F:
    """Mark a route that takes query parameters besides those it declares (and reads them itself)."""
    setattr(endpoint, OPEN_QUERY, True)
    return endpoint


@dataclass(frozen=True, slots=True)
class QuerySpec:
    names: tuple[str, ...]  # in the order the route declares them, for the error's list
    repeatable: frozenset[str]
    open: bool

    def check(self, request: Request) -> None:
        if not request.scope["query_string"]:
            return
        seen: set[str] = set()
        for name, _ in request.query_params.multi_items():
            if name not in self.names and not self.open:
                takes = f"takes {', '.join(self.names)}" if self.names else "takes no query parameters"
                raise InvalidInput(
                    f"Unknown query parameter {name[:40]!r}: {request.method} {_template(request)} {takes}."
                )
            if name in seen and name not in self.repeatable:  # an open route's own ones too (one value each)
                raise InvalidInput(f"Query parameter {name[:40]!r} is given more than once; give it once.")
            seen.add(name)


def _template(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", request.url.path))[:200]


def _query_fields(dependant: Dependant) -> list[tuple[str, bool]]:
    fields = [
        (f.alias, field_annotation_is_sequence(f.field_info.annotation)) for f in dependant.query_params
    ]
    for sub in dependant.dependencies:
        fields += _query_fields(sub)
    return fields


def query_spec(route: APIRoute) -> QuerySpec:
    """The query parameters `route` takes: FastAPI's and those documented in its openapi_extra."""
    fields = _query_fields(route.dependant)
    for p in (route.openapi_extra or {}).get("parameters", []):
        if p.get("in") == "query":
            schema = p.get("schema", {})
            kinds = [schema.get("type")] + [s.get("type") for s in schema.get("anyOf", [])]
            fields.append((p["name"], "array" in kinds))
    names = tuple(dict.fromkeys(name for name, _ in fields))
    repeatable = frozenset(name for name, many in fields if many)
    return QuerySpec(names, repeatable, bool(getattr(route.endpoint, OPEN_QUERY, False)))


class CheckedRoute(APIRoute):
    """An APIRoute that checks the request's query parameters (QuerySpec) before anything else runs."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        spec = self.query_spec = query_spec(self)

        async def checked(request: Request) -> Response:
            spec.check(request)
            return await handler(request)

        return checked
