"""The one place that turns errors into Zaqar-style JSON: {"title": ..., "description": ...}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from core.errors import CharonError, UnsupportedMediaType

JSON_PATCH = "application/openstack-messaging-v2.0-json-patch"


def error_response(status: int, title: str, description: str) -> JSONResponse:
    headers = {"Accept-Patch": JSON_PATCH} if status == UnsupportedMediaType.status else None
    return JSONResponse({"title": title, "description": description}, status_code=status, headers=headers)


def describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "header", "path"))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "; ".join(parts) or "The request is not valid."


def charon_error_response(exc: CharonError) -> JSONResponse:
    """The answer to a domain error, wherever it is caught (this handler, api/direct.py)."""
    return error_response(exc.status, exc.title, exc.description)


async def _charon_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CharonError)
    return charon_error_response(exc)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, "Invalid API request", describe_validation(exc))


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    titles = {404: "Not found", 405: "Method not allowed"}
    description = "No such resource." if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, titles.get(exc.status_code, "Error"), description)


def register_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CharonError, _charon_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
