"""Every request's id and its access log line, in one pure ASGI middleware (a BaseHTTPMiddleware would cost a
request far more: bench/README.md, "Logs and request ids").

The request id is the client's `X-OpenStack-Request-Id` when it has oslo.middleware's form, `req-` and a
UUID in lowercase hex (40 characters; oslo's `global_request_id` check); anything else sent (another form,
another length, the header twice) is replaced by a fresh `req-<uuid4>` and never echoed. It is in the scope
(`REQUEST_ID`) for whatever logs while answering (api/errors.py), and in the header of every answer: errors
(the app's handlers), the router's own 404 and 405, HEAD, a long poll's 204, and a bug's 500, which is
answered here with the app's handler for `Exception` (then logged once, with the id, by that handler).

The access log (CHARON_ACCESS_LOG, on by default) is one JSON line a request (or with CHARON_LOG_FORMAT=text,
a text line: `AccessLog(text=True)`) on the `charon.access` logger:
when it came (UTC, ms), its id, the identity's project (None for public routes and refused requests), the
method, the route template (never the raw path; None when no route matches), the status, the time taken, the
body bytes sent and the client's address (`AccessLog`, which says how the lines are written).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from random import getrandbits
from typing import Any
from urllib.parse import quote

import orjson
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import IDENTITY
from api.head import HEAD_KEY
from api.metrics import HttpMetrics

REQUEST_ID = "charon.request_id"  # the scope key of the request's id
CLIENT_GONE = (
    499  # nginx's "client closed request": the HTTP series' status of one cancelled before an answer
)
HEADER = b"x-openstack-request-id"
WELL_FORMED = re.compile(rb"req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ACCESS_LOGGER = "charon.access"
_UUID4_BITS = (0x4 << 76) | (0x2 << 62)  # the version (4) and variant (RFC 9562) fields
_UUID4_MASK = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)


def new_request_id() -> str:
    """`req-` and a version-4 UUID. Its 122 random bits come from `random` (seeded from os.urandom, and again
    in a forked child): unique is all an id needs, and os.urandom is a system call a request."""
    h = f"{getrandbits(128) & _UUID4_MASK | _UUID4_BITS:032x}"
    return f"req-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def sent_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's X-OpenStack-Request-Id if it was sent once and is well-formed; else None."""
    found = None
    for name, value in headers:  # ASGI: lowercase names
        if name == HEADER:
            if found is not None:
                return None
            found = value
    if found is None or len(found) != 40 or WELL_FORMED.fullmatch(found) is None:
        return None
    return found.decode("ascii")


def utc_millis(when: float) -> str:
    """`when` (a time.time()) in UTC to the millisecond, as every log line has it: 2026-11-28T02:36:37.363Z"""
    second = int(when)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(second))}.{int((when - second) * 1000):03d}Z"


def request_id_of(scope: Scope) -> str | None:
    rid: str | None = scope.get(REQUEST_ID)
    return rid


def route_of(scope: Scope) -> str | None:
    """The template of the route that answered (`scope["route"]`: the router's, or a plain route's own);
    for a 405 whose route left none, the template its path matched; None when no route matches."""
    route = scope.get("route")
    if route is not None:
        path: str = route.path
        return path
    path_of = scope["path"]
    for candidate in scope["app"].router.routes:
        if isinstance(candidate, Route) and candidate.path_regex.match(path_of):
            return candidate.path
    return None


IGNORED_KEY = "charon.ignored"  # the query parameters a request gave that its route ignored (api/params.py)
IGNORED_HEADER = b"charon-ignored-parameters"
MOST_IGNORED_SHOWN = 10  # names in the header, each at most 40 characters, percent-encoded


def ignored_header(scope: Any) -> tuple[bytes, bytes]:
    """The `Charon-Ignored-Parameters` header naming the query parameters the request's route ignored (each
    percent-encoded and cut to 40 characters, at most MOST_IGNORED_SHOWN, then how many more)."""
    names: list[str] = scope[IGNORED_KEY]
    shown = [quote(name[:40], safe="") or '""' for name in names[:MOST_IGNORED_SHOWN]]
    if len(names) > MOST_IGNORED_SHOWN:
        shown.append(f"and {len(names) - MOST_IGNORED_SHOWN} more")
    return IGNORED_HEADER, ", ".join(shown).encode("ascii")


class RequestLog:
    """The request id in, on the scope and out; `log`: where each request's access line goes (None: off);
    `metrics`: what counts each request for GET /metrics (None: not counted)."""

    def __init__(self, app: ASGIApp, log: AccessLog | None, metrics: HttpMetrics | None = None) -> None:
        self.app = app
        self.log = log
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = sent_request_id(scope["headers"]) or new_request_id()
        scope[REQUEST_ID] = rid
        pair = (HEADER, rid.encode("ascii"))
        status = 0
        size = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
                # the message is the sender's own, made for this send; its list may be a Response's
                message["headers"] = [*message.get("headers", ()), pair]
                if IGNORED_KEY in scope:  # the query parameters the route ignored, named
                    message["headers"].append(ignored_header(scope))
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        began = time.time()
        start = time.perf_counter_ns()
        counted = 0  # the status the HTTP series count when no answer began (see HttpMetrics.count)
        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            counted = CLIENT_GONE
            raise
        except Exception as exc:
            counted = 500
            handler = scope["app"].exception_handlers.get(Exception)
            if status or handler is None:  # an answer has begun: the server ends the connection
                raise
            # what Starlette's ServerErrorMiddleware would answer, but with the id and through the log
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send_with_id)
        finally:
            took = time.perf_counter_ns() - start
            if self.log is not None:
                self.log.add(scope, rid, status, size, began, took)
            if self.metrics is not None:
                self.metrics.count(scope, status or counted, took / 1e9)


# what a line says, in its order: time (s), request_id, project, method, route, status, duration (ns), bytes,
# client
Entry = tuple[float, str, str | None, str, str | None, int | None, int, int, str | None]


class StderrLines(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler AccessLog gives the `charon.access` logger: each line bare, to stderr."""

    def __init__(self) -> None:
        super().__init__()  # sys.stderr
        self.setFormatter(logging.Formatter("%(message)s"))


class AccessLog:
    """The access lines, on the `charon.access` logger, which writes them bare to stderr (StderrLines) unless
    something configured it already.

    Making a line and a LogRecord for it in the request cost a one-message DELETE (about 150 us) 15 to 25 us:
    code run once between two awaits finds the CPU's caches cold (bench/README.md, "Logs and request ids").
    So while the logger has only its StderrLines and takes INFO, a request leaves a tuple, and the lines
    are made and written together, in one write(2), at most FLUSH_S later (or when MAX_PENDING wait, and at
    shutdown: `flush()`, from the app's lifespan): a process killed with SIGKILL loses the lines of its last
    FLUSH_S. A logger configured otherwise (other handlers, a level above INFO) gets each line as a record,
    when the request ends."""

    FLUSH_S = 0.1
    MAX_PENDING = 512

    def __init__(self, *, text: bool = False) -> None:
        self.text = text  # `time INFO charon.access: request_id project method route status ms bytes client`
        self.logger = logger = logging.getLogger(ACCESS_LOGGER)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        if not logger.handlers:
            logger.addHandler(StderrLines())
            logger.propagate = False  # the line is the whole record: no root handler's format around it
        self._pending: list[Entry] = []
        self._timer: asyncio.TimerHandle | None = None
        self._second = -1
        self._stamp = ""

    def _stderr(self) -> StderrLines | None:
        """The logger's own handler while it is the only one and the logger takes INFO."""
        handlers = self.logger.handlers
        if len(handlers) == 1 and type(handlers[0]) is StderrLines and self.logger.isEnabledFor(logging.INFO):
            return handlers[0]
        return None

    def add(self, scope: Scope, rid: str, status: int, size: int, began: float, took_ns: int) -> None:
        """The line of a request that ended."""
        identity = scope.get(IDENTITY)
        head = scope.get(HEAD_KEY, False)
        client = scope.get("client")
        entry = (
            began,
            rid,
            identity.project if identity is not None else None,
            "HEAD" if head else scope["method"],
            route_of(scope),
            status or None,  # None: the connection ended before an answer began
            took_ns,
            0 if head else size,  # a HEAD's body is not sent (api.head.HeadAsGet)
            client[0] if client else None,
        )
        if self._stderr() is None:
            self.flush()  # what waits first, in order
            self.logger.info(self.line(entry))
            return
        self._pending.append(entry)
        if len(self._pending) >= self.MAX_PENDING:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.FLUSH_S, self.flush)

    def flush(self) -> None:
        """Write the lines that wait."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        if not pending:
            return
        lines = [self.line(entry) for entry in pending]
        stderr = self._stderr()
        if stderr is None:  # configured otherwise meanwhile
            for line in lines:
                self.logger.info(line)
            return
        stderr.stream.write("\n".join(lines) + "\n")
        stderr.stream.flush()

    def line(self, entry: Entry) -> str:
        began, rid, project, method, route, status, took_ns, size, client = entry
        second = int(began)
        if second != self._second:  # the date and time to the second, formatted once a second
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        if self.text:
            millis = int((began - second) * 1000)
            return (
                f"{self._stamp}.{millis:03d}Z INFO {ACCESS_LOGGER}: {rid} {project or '-'} {method} "
                f"{route or '-'} {status or '-'} {took_ns // 1000 / 1000}ms {size}B {client or '-'}"
            )
        fields: dict[str, Any] = {
            "time": f"{self._stamp}.{int((began - second) * 1000):03d}Z",
            "request_id": rid,
            "project": project,
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": took_ns // 1000 / 1000,  # to the microsecond
            "bytes": size,
            "client": client,
        }
        return orjson.dumps(fields).decode()
