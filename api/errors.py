"""The one place that turns errors into Zaqar-style JSON: {"title": ..., "description": ...}. A 5xx is also
logged (`charon.errors`), with the request's id (api/access.py), which its answer carries too."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Route

from api.access import request_id_of, route_of
from core.errors import CharonError, UnsupportedMediaType

JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"
log = logging.getLogger("charon.errors")


def error_response(
    status: int,
    title: str,
    description: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """Zaqar's error body; `details`: fields beside title and description (e.g. a bulk delete's
    `not_deleted`); `headers`: the answer's own (e.g. a 401's WWW-Authenticate)."""
    if status == UnsupportedMediaType.status:
        headers = {**(headers or {}), "Accept-Patch": JSON_PATCH}
    body = {"title": title, "description": description, **(details or {})}
    return JSONResponse(body, status_code=status, headers=headers)


def describe_errors(errors: Sequence[Any], *, sourced: bool = False) -> str:
    """Validation errors as one sentence: each names the field, the rule, and the value sent when it is a
    scalar (as JSON): "messages.0.ttl: must be a whole number (got 60.5)". `sourced`: FastAPI's errors,
    whose locations start with where the value came from ("query", "body", ...)."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ())[1 if sourced else 0 :])
        rule = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        sent = err.get("input")
        if err.get("type") != "missing" and (sent is None or isinstance(sent, bool | int | float | str)):
            rule += f" (got {orjson.dumps(sent if not isinstance(sent, str) else sent[:60]).decode()})"
        parts.append(f"{where}: {rule}" if where else rule)
    return "; ".join(parts) or "The request is not valid."


def _where(request: Request) -> str:
    """The request, for a log line: its id, method and route template."""
    return f"{request_id_of(request.scope)} {request.scope['method']} {route_of(request.scope)}"


async def _charon_error(request: Request, exc: Exception) -> JSONResponse:
    """The answer to a domain error, from a FastAPI route or a plain one alike (api/routing.py)."""
    assert isinstance(exc, CharonError)
    if exc.status >= 500:
        log.warning("%s: %d %s", _where(request), exc.status, exc.description)
    return error_response(exc.status, exc.title, exc.description, exc.details, exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, "Invalid API request", describe_errors(exc.errors(), sourced=True))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        allowed = allowed_methods(request)
        response = error_response(
            405,
            "Method not allowed",
            f"{request.method} is not allowed on {request.url.path[:200]}; it takes {', '.join(allowed)}.",
        )
        response.headers["Allow"] = ", ".join(allowed)
        return response
    titles = {404: "Not found"}
    description = "No such resource." if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, titles.get(exc.status_code, "Error"), description)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on the request's path (HEAD wherever GET: api.head.HeadAsGet).
    Starlette's own 405 names only the methods of the first route that matched the path."""
    path = request.scope["path"]
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    if "GET" in methods:
        methods.add("HEAD")
    order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return sorted(methods, key=lambda m: order.index(m) if m in order else len(order))


UNEXPECTED = (
    "The service failed unexpectedly while answering this request, and has logged why. Whether a change the "
    "request asked for was made is not known: read the resource before repeating it (a message post can be "
    "repeated safely with the same Idempotency-Key)."
)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug's answer: JSON like every other error, never Starlette's text/plain; the traceback is logged here
    with the request's id (api.access.RequestLog answers with this handler and does not re-raise)."""
    log.error("%s: 500 unexpected %s", _where(request), type(exc).__name__, exc_info=exc)
    return error_response(500, "Internal server error", UNEXPECTED)


def register_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CharonError, _charon_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
