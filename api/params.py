"""Query parameters: one small pydantic model per route (a `QueryModel`) is the parsing, the check that no
parameter is unknown or repeated, and the route's OpenAPI entries. The route parses it before its endpoint
runs (api/routing.py), FastAPI routes and plain Starlette routes alike; an endpoint takes the parsed model
as a parameter annotated with the model: `Annotated[Model, QUERY]` on a FastAPI route, whose parameters'
order is then the order of the checks (as FastAPI's own), and `Model` on a plain one (checked first).

No query parameter is silently ignored. A route takes its model's fields, each once unless the field is a
list (`ids=a&ids=b`); a parameter given twice answers 400. One the route does not take is ignored, as Zaqar
ignores it (its tests send `?Invalid=...` and expect the answer), and the answer names it in its
`Charon-Ignored-Parameters` header (api/access.py ignored_header); with CHARON_STRICT_PARAMETERS
it answers 400 naming it and what the route takes. The one open model is the queue listing's, whose other
parameters are metadata filters (`open_query = True`). A value the model refuses answers 400 naming the
field and the rule (api.errors.describe_errors).

A field's JSON schema is its OpenAPI entry; api/contract.py then gives the bounds that follow the settings.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Self, get_args, get_origin, get_type_hints
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from api.access import IGNORED_KEY
from api.errors import describe_errors
from api.state import state_of
from core.errors import InvalidInput

Entry = dict[str, Any]
QUERY_KEY = "charon.query"  # where the route leaves the parsed model in the request's scope
_PATH_PARAM = re.compile(r"{(\w+)}")


class QueryModel(BaseModel):
    """A route's query parameters. Fields have defaults unless the route cannot do without them."""

    model_config = ConfigDict(frozen=True)  # one parsed default is shared by every request without a query

    open_query: ClassVar[bool] = False
    _names: ClassVar[tuple[str, ...]] = ()
    _repeatable: ClassVar[frozenset[str]] = frozenset()
    _default: ClassVar[QueryModel | None] = None
    _entries: ClassVar[list[Entry]] = []

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        schema = cls.model_json_schema()
        assert "$defs" not in schema, f"{cls.__name__}: a query parameter is a scalar or a list of them"
        required = set(schema.get("required", ()))
        properties: dict[str, Entry] = schema.get("properties", {})
        own = vars(cls).get("__annotations__", {})  # a model's own parameters first, then its bases'
        names = sorted(properties, key=lambda name: name not in own)
        cls._names = tuple(names)
        cls._entries = [_entry(name, properties[name], name in required) for name in names]
        cls._repeatable = frozenset(name for name, prop in properties.items() if "array" in _kinds(prop))
        cls._default = None if required else cls()

    @classmethod
    def parse(cls, request: Request, template: str) -> Self:
        """The request's query as this model: `collect` then `validated`."""
        return cls.validated(cls.collect(request, template))

    @classmethod
    def collect(cls, request: Request, template: str) -> Any:
        """The request's query parameters by name (lists for list fields), or the parsed default when there
        are none; 400 for one given twice but for a list field. One the route does not take is left in the
        scope's IGNORED_KEY (a 400 with CHARON_STRICT_PARAMETERS). `template`: the route's path, for the
        error."""
        if not request.scope["query_string"] and cls._default is not None:
            return cls._default
        fields = cls._names
        values: dict[str, Any] = {}
        seen: set[str] = set()
        # what Starlette's request.query_params reads, without building its multidict (1.5 us a request)
        for name, value in parse_qsl(request.scope["query_string"].decode("latin-1"), keep_blank_values=True):
            if name in cls._repeatable:
                values.setdefault(name, []).append(value)
                continue
            if name not in fields and not cls.open_query:
                if state_of(request).strict_parameters:
                    takes = f"takes {', '.join(fields)}" if fields else "takes no query parameters"
                    raise InvalidInput(
                        f"Unknown query parameter {name[:40]!r}: {request.method} {template[:200]} {takes}."
                    )
                request.scope.setdefault(IGNORED_KEY, []).append(name)
                continue
            if name in seen:  # an open route's own metadata filters too (one value each)
                raise InvalidInput(f"Query parameter {name[:40]!r} is given more than once; give it once.")
            seen.add(name)
            if name in fields:
                values[name] = value
        return values

    @classmethod
    def validated(cls, collected: Any) -> Self:
        """What `collect` gave as this model; 400 naming each value the model refuses, and how."""
        if isinstance(collected, cls):
            return collected
        try:
            return cls.__pydantic_validator__.validate_python(collected)  # type: ignore[no-any-return]
        except ValidationError as exc:
            raise InvalidInput(describe_errors(exc.errors())) from None

    @classmethod
    def openapi_parameters(cls) -> list[Entry]:
        """The model's OpenAPI parameter entries, from its JSON schema (a fresh copy)."""
        return [{**e, "schema": dict(e["schema"])} for e in cls._entries]


class NoQuery(QueryModel):
    """The model of a route that takes no query parameters."""


def _kinds(prop: Entry) -> set[str]:
    return {prop.get("type", "")} | {branch.get("type", "") for branch in prop.get("anyOf", ())}


def _entry(name: str, prop: Entry, required: bool) -> Entry:
    """A field's JSON schema as an OpenAPI query parameter: what FastAPI writes for a declared `Query`."""
    entry: Entry = {"name": name, "in": "query", "required": required, "schema": prop}
    if "description" in prop:
        entry["description"] = prop["description"]
    return entry


async def parsed_query(request: Request) -> Any:
    """The route's query model (api/routing.py collected its parameters before FastAPI resolved anything),
    its values checked here: where the endpoint's parameters list it."""
    model, collected = request.scope[QUERY_KEY]
    return model.validated(collected)


QUERY = Depends(parsed_query)


def query_model_of(*calls: Callable[..., Any]) -> type[QueryModel]:
    """The query model `calls` (an endpoint and the dependencies it uses) are declared to take: the one
    model named by their parameters' annotations (`Annotated[Model, QUERY]`, or `Model` on a plain route),
    the most derived when a dependency names a base of the endpoint's; NoQuery when none does."""
    found: list[type[QueryModel]] = []
    for call in calls:
        function = call if inspect.isfunction(call) or inspect.ismethod(call) else None
        if function is None:
            continue
        for hint in get_type_hints(function, include_extras=True).values():
            base = get_args(hint)[0] if get_origin(hint) is Annotated else hint
            if isinstance(base, type) and issubclass(base, QueryModel):
                found.append(base)
    if not found:
        return NoQuery
    model = max(found, key=lambda m: len(m.__mro__))
    assert all(issubclass(model, m) for m in found), f"{calls[0]}: two query models {found}"
    return model


def path_value(name: str) -> Any:
    """A FastAPI dependency on the path parameter `name`, as sent (the route checks it): path parameters are
    documented from the path (`path_parameters`), not declared to FastAPI. Ids: api/ids.py."""

    async def value(request: Request) -> str:
        text: str = request.path_params[name]
        return text

    return Depends(value)


def path_parameters(template: str) -> list[Entry]:
    """The OpenAPI entries of the path parameters in `template`, but the queue name's (api/contract.py
    documents the queue identity, which api.deps reads by hand, on every queue route)."""
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(template)
        if name not in ("queue_name", "topic_name")
    ]


def operation_parameters(template: str, model: type[QueryModel], openapi_extra: Entry | None) -> Entry:
    """`openapi_extra` for a route: its path parameters, its query model's, then any it lists itself (a
    header read by hand)."""
    extra = dict(openapi_extra or {})
    own = extra.pop("parameters", [])
    extra["parameters"] = path_parameters(template) + model.openapi_parameters() + own
    return extra
