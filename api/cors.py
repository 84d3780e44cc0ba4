"""CORS, as Zaqar configures it through oslo.middleware's `[cors]` section (allowed origins, methods,
headers, credentials, max age), on Starlette's CORSMiddleware: a browser's preflight (OPTIONS with `Origin`
and `Access-Control-Request-Method`) is answered here, before identity and policy, which a preflight never
carries; every other request gets the CORS headers on its answer. Off unless an origin is allowed
(app/settings.py `CorsSettings`). A refused preflight is Zaqar's error JSON, naming what was refused."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from api.errors import error_response

# What Zaqar's transport/middleware/cors.py gives oslo.middleware as defaults, and the headers Charon reads
# (X-Project-ID, Idempotency-Key, Content-Type for a JSON body) or answers with.
ALLOW_HEADERS = (
    "X-Auth-Token",
    "X-Identity-Status",
    "X-Roles",
    "X-Service-Catalog",
    "X-User-Id",
    "X-Tenant-Id",
    "X-OpenStack-Request-ID",
    "X-Trace-Info",
    "X-Trace-HMAC",
    "Client-ID",
    "X-Project-ID",
    "Idempotency-Key",
    "Content-Type",
    "URL-Signature",
    "URL-Expires",
    "URL-Methods",
    "URL-Paths",
)
EXPOSE_HEADERS = (
    "X-Auth-Token",
    "X-Subject-Token",
    "X-Service-Token",
    "X-OpenStack-Request-ID",
    "Location",
    "Charon-Ignored-Parameters",
)
ALLOW_METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD")


class Cors(CORSMiddleware):
    def __init__(
        self,
        app: ASGIApp,
        *,
        origins: Sequence[str],
        methods: Sequence[str],
        headers: Sequence[str],
        expose: Sequence[str],
        credentials: bool,
        max_age: int,
    ) -> None:
        super().__init__(
            app,
            allow_origins=origins,
            # any origin: a literal `*`, which browsers refuse with credentials (as oslo.middleware has it)
            allow_methods=methods,
            allow_headers=headers,
            expose_headers=expose,
            allow_credentials=credentials and "*" not in origins,
            max_age=max_age,
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        answer = super().preflight_response(request_headers)
        if answer.status_code == 200:
            return answer
        refused = bytes(answer.body).decode().removeprefix("Disallowed CORS ")
        asked = request_headers.get("access-control-request-headers", "")
        unknown = [h.strip() for h in asked.split(",") if h.strip().lower() not in self.allow_headers]
        said = {
            "origin": f"the origin {request_headers['origin'][:100]!r}",
            "method": f"the method {request_headers['access-control-request-method'][:20]!r}",
            "headers": f"the header {unknown[0][:64]!r}" if unknown else "a requested header",
            "private-network": "private network access",
        }
        what = ", ".join(said.get(r, r) for r in refused.split(", "))
        # nothing of what is allowed is told to a page of any origin: the browser needs only the refusal
        return error_response(
            400,
            "Preflight refused",
            f"This service does not allow {what} across origins (an operator allows them: CHARON_CORS__*).",
        )
