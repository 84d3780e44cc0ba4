"""The API's documentation pages: Swagger UI at /docs and ReDoc at /redoc, both reading /openapi.json (what
`charon openapi` prints), their scripts and styles served from here (/docs/assets/...) out of the package
fastapi-offline installs, so that the pages load on a machine with no internet access.

Who may read them: the policy rule `docs:get`, anyone by default, credentials or not (a browser sends no
X-Auth-Token); an operator who sets another rule has them asked it as any route's. Not in the OpenAPI
document: they are pages for people, not operations for clients.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from functools import cache

from fastapi import Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

from api.routing import RULE_KEY, Router
from api.state import state_of
from core.errors import NotFound

router = Router(tags=["docs"])

DOCS = "docs:get"  # api/policy.py
GUARDED = {RULE_KEY: DOCS}
ASSETS_PATH = "/docs/assets"
# What fastapi-offline ships (its static/ folder), by the content type each is served with
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
# Swagger UI sends the document to validator.swagger.io unless told not to: a page of this service's calls
# nothing but this service.
SWAGGER_PARAMETERS = {"validatorUrl": None}
# ...and the browser is told so: ReDoc's bundle still draws its logo from cdn.redoc.ly, which this policy
# keeps it from fetching (the pages' own start-up scripts and styles are inline)
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' "
    "'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; frame-ancestors 'self'"
}


async def authorize_reader(request: Request, rule: str) -> None:
    """In without credentials while the rule lets anyone in; otherwise the rule decides, as for any route."""
    auth = state_of(request).auth
    if not auth.policy.lets_anyone_in(rule):
        await auth.authorize(request, rule)


def service_root(request: Request) -> str:
    """The service's root as the client sees it (behind a proxy serving it under a prefix: root_path)."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


@router.plain("GET", "/docs", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False)
async def swagger_ui(request: Request) -> Response:
    base, title = service_root(request), request.app.title
    page = get_swagger_ui_html(
        openapi_url=base + (request.app.openapi_url or ""),
        title=f"{title} - Swagger UI",
        swagger_js_url=f"{base}{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{base}{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{base}{ASSETS_PATH}/favicon.png",
        swagger_ui_parameters=SWAGGER_PARAMETERS,
    )
    page.headers.update(PAGE_HEADERS)
    return page


@router.plain("GET", "/redoc", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False)
async def redoc(request: Request) -> Response:
    base, title = service_root(request), request.app.title
    page = get_redoc_html(
        openapi_url=base + (request.app.openapi_url or ""),
        title=f"{title} - ReDoc",
        redoc_js_url=f"{base}{ASSETS_PATH}/redoc.standalone.js",
        redoc_favicon_url=f"{base}{ASSETS_PATH}/favicon.png",
        with_google_fonts=False,  # a stylesheet from fonts.googleapis.com otherwise
    )
    page.headers.update(PAGE_HEADERS)
    return page


@cache
def _asset(name: str) -> tuple[bytes, str]:
    """An asset's bytes and their ETag, read once per process (about 2.8 MB for all four)."""
    body = (importlib.resources.files("fastapi_offline") / "static" / name).read_bytes()
    return body, f'"{hashlib.sha256(body).hexdigest()[:32]}"'


@router.plain(
    "GET", f"{ASSETS_PATH}/{{asset}}", guard=authorize_reader, openapi_extra=GUARDED, include_in_schema=False
)
async def docs_asset(request: Request) -> Response:
    """An asset of the pages; a browser asks again with If-None-Match, answered 304 while unchanged."""
    name = request.path_params["asset"]
    if name not in ASSETS:
        raise NotFound(
            f"The documentation pages have no asset {name[:100]!r}; they have {', '.join(ASSETS)}."
        )
    body, etag = _asset(name)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=ASSETS[name], headers=headers)
