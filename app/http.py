"""The bounds a reverse proxy puts on its clients, on uvicorn itself, so that a service without one in front
is not held by slow clients: `CHARON_HTTP__*` (`HttpSettings`).

uvicorn bounds the idle time between two requests of a kept-alive connection (`timeout_keep_alive`), but not
how long a request's headers or body may take to arrive: a client that sends half its headers, or a body a
byte at a time, holds its connection (and a request, and its memory) for ever. `BoundedHttp` is uvicorn's
HTTP/1.1 protocol (httptools) with nginx's `client_header_timeout` (from the request's first byte, or the
connection's opening, to its last header) and `client_body_timeout` (here: from the last header to the body's
end, whole): past either, the connection is closed. And a connection beyond `max_connections` open in the
process is answered 503 in Zaqar's JSON and closed at once (uvicorn's `limit_concurrency` answers plain
text, and only once the request's headers have come). `CharonConfig` carries the bounds to every worker (a
worker gets its Config pickled, so the protocol is a class of this module, which reads them from it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from pydantic import BaseModel, Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HttpSettings(BaseModel):
    """CHARON_HTTP__*: what a client may take of the service (as nginx bounds its clients)."""

    header_timeout: float = Field(
        10,
        gt=0,
        le=300,
        description="Seconds a request's headers may take to arrive, from its first byte (or the "
        "connection's opening); then the connection is closed (nginx's client_header_timeout).",
    )
    body_timeout: float = Field(
        30,
        gt=0,
        le=3600,
        description="Seconds a request's body may take to arrive whole, from its last header; then the "
        "connection is closed (cf. nginx's client_body_timeout).",
    )
    keep_alive: float = Field(
        5,
        gt=0,
        le=300,
        description="Seconds a kept-alive connection may idle between requests (uvicorn's "
        "timeout_keep_alive; nginx's keepalive_timeout).",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="Connections (or requests in flight) a process serves at once; a request beyond is "
        "answered 503 (uvicorn's limit_concurrency; cf. nginx's worker_connections).",
    )


class CharonConfig(uvicorn.Config):
    """uvicorn's Config, serving HTTP/1.1 with `BoundedHttp` under `bounds`."""

    def __init__(self, app: Any, *, bounds: HttpSettings, **options: Any) -> None:
        super().__init__(
            app,
            http=BoundedHttp,
            timeout_keep_alive=bounds.keep_alive,  # type: ignore[arg-type]  # uvicorn reads it as a number
            **options,
        )
        self.bounds = bounds


SWEEP_S = 0.5  # how often a process looks for requests past their bounds


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol; a request whose headers or body come too slowly loses its connection.
    A request only notes when its current phase is due (a clock read); one sweep a process, every
    SWEEP_S, closes the connections past theirs, so a bound costs a request no timer of its own."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        bounds: HttpSettings = getattr(config, "bounds", None) or HttpSettings()
        self._header_s, self._body_s = bounds.header_timeout, bounds.body_timeout
        self._max = bounds.max_connections
        self._due: float | None = None  # when the phase the request is in must have ended (loop time)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._max:
            transport.write(_busy(self._max))
            transport.close()
            return
        self._due = self.loop.time() + self._header_s  # the first request's headers
        if not getattr(self.server_state, "charon_sweeping", False):
            self.server_state.charon_sweeping = True  # type: ignore[attr-defined]
            self.loop.call_later(SWEEP_S, _sweep, self.loop, self.connections)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._due = self.loop.time() + self._header_s  # a kept-alive connection's next request

    def on_headers_complete(self) -> None:
        self._due = self.loop.time() + self._body_s
        super().on_headers_complete()
        if self.parser.should_upgrade():  # a websocket: no body, and its own protocol from here
            self._due = None

    def on_message_complete(self) -> None:
        self._due = None
        super().on_message_complete()


def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    """Close every connection whose request is past its bound; again in SWEEP_S."""
    now = loop.time()
    for conn in list(connections):
        due = getattr(conn, "_due", None)
        if due is not None and due < now and not conn.transport.is_closing():
            conn._due = None
            conn.transport.close()
    loop.call_later(SWEEP_S, _sweep, loop, connections)


def _busy(most: int) -> bytes:
    """The answer to a connection beyond `most`: 503 in Zaqar's error shape, and closed."""
    body = json.dumps(
        {
            "title": "Service unavailable",
            "description": f"This process serves at most {most} connections at once "
            "(CHARON_HTTP__MAX_CONNECTIONS); try again shortly.",
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
