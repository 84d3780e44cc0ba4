"""The dead-letter console (docs/console.md): a page at /console and its script and stylesheet, static files
of this package (api/console/), which the browser then uses to call the public API (/v2) with the
operator's own credentials. So the console holds no privilege of its own: what it shows and does, the API
and its policy allow or refuse, and a browser-side test of it is a test of the API.

Who may load the page: the policy rule `console:get`, anyone by default (a browser sends no X-Auth-Token for a
page); an operator who sets another rule has it asked as any route's. Not in the OpenAPI document: these are
pages for people, not operations for clients. The page calls nothing but this service (its
Content-Security-Policy says so to the browser).
"""

from __future__ import annotations

import hashlib
import html
import importlib.resources
from functools import cache

from fastapi import Request, Response
from fastapi.responses import RedirectResponse

from api.routes.docs import authorize_reader, service_root
from api.routing import RULE_KEY, Router
from api.state import state_of
from core.errors import NotFound

router = Router(tags=["console"])

CONSOLE = "console:get"  # api/policy.py
GUARDED = {RULE_KEY: CONSOLE}
# The files, by the content type each is served with (their total size is held to 300 KB by the tests)
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' "
    "data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


REPORT_META = b'<meta name="charon-insights-report" content="">'  # in index.html: filled from the setting


@cache
def _file(name: str, report: str | None = None) -> tuple[bytes, str]:
    """A file's bytes and their ETag, read once per process; the page with the insights report's link
    (CHARON_INSIGHTS_REPORT_URL, `report`) in its meta tag, escaped."""
    body = (importlib.resources.files("api") / "console" / name).read_bytes()
    if name == "index.html":
        assert REPORT_META in body
        filled = REPORT_META.replace(b'""', f'"{html.escape(report or "", quote=True)}"'.encode())
        body = body.replace(REPORT_META, filled)
    return body, f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def _answer(request: Request, name: str, media_type: str) -> Response:
    body, etag = _file(name, state_of(request).insights_report_url)
    headers = {**PAGE_HEADERS, "ETag": etag}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)


@router.plain("GET", "/console", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False)
async def console_page(request: Request) -> Response:
    return _answer(request, "index.html", "text/html; charset=utf-8")


@router.plain("GET", "/console/", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False)
async def console_slash(request: Request) -> Response:
    """/console/ (a browser's habit): the page is /console, whose files are relative to it."""
    return RedirectResponse(service_root(request) + "/console", status_code=308)


@router.plain(
    "GET", "/console/{asset}", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False
)
async def console_asset(request: Request) -> Response:
    """The page's script or stylesheet; a browser asks again with If-None-Match, answered 304 while
    unchanged."""
    name = request.path_params["asset"]
    if name not in ASSETS:
        raise NotFound(f"The console has no file {name[:100]!r}; it has {', '.join(ASSETS)}.")
    return _answer(request, name, ASSETS[name])
