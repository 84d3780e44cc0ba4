"""The bounds a reverse proxy puts on its clients, on uvicorn itself, so that a service without one in front
is not held by slow clients: `CHARON_HTTP__*` (`HttpSettings`).

uvicorn bounds the idle time between two requests of a kept-alive connection (`timeout_keep_alive`), but not
how long a request's headers or body may take to arrive: a client that sends half its headers, or a body a
byte at a time, holds its connection (and a request, and its memory) for ever. `BoundedHttp` is uvicorn's
HTTP/1.1 protocol (httptools) with nginx's `client_header_timeout` (from the request's first byte, or the
connection's opening, to its last header) and `client_body_timeout` (here: from the last header to the body's
end, whole), each read by a sweep of the process's connections every SWEEP_S (so to half a second), which
costs a request nothing: past either, the connection is closed. And a connection beyond `max_connections`
open in the process is answered 503 in Zaqar's JSON and closed at once (uvicorn's `limit_concurrency`
answers plain text, and only once the request's headers have come). `CharonConfig` carries the bounds to
every worker (a worker gets its Config pickled, so the protocol is a class of this module, which reads
them from it)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import uvicorn
from pydantic import BaseModel, Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("charon.http")


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
        description="Connections a process holds at once; the next is answered 503 (Zaqar's JSON, "
        "Retry-After: 1) and closed (cf. nginx's worker_connections).",
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
    """uvicorn's HTTP/1.1 protocol, with a process's connections bounded in number (`connection_made`) and
    in time (`Sweep`, which a request costs nothing: it reads uvicorn's own state of each connection)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.bounds: HttpSettings = getattr(config, "bounds", None) or HttpSettings()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.bounds.max_connections:
            transport.write(_busy(self.bounds.max_connections))
            transport.close()
            return
        if not getattr(self.server_state, "charon_sweep", None):
            sweep = Sweep(self.loop, self.connections, self.bounds)
            self.server_state.charon_sweep = sweep  # type: ignore[attr-defined]
            self.loop.call_later(SWEEP_S, sweep)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # the request's new cycle
            cycle.transport = OneSend(self.transport, cycle)  # type: ignore[assignment]  # what it uses of one


class OneSend:
    """A request cycle's transport: uvicorn's RequestResponseCycle writes a response's status line and
    headers, then its body, each with a write of its own, two send(2) calls where one does (a system call
    is several us on a shared machine). This holds the head until the body's first write and sends the two
    together. A HEAD's head, which no body follows, goes at once; a connection closed meanwhile (an app that
    failed after it began its answer) gets it first, as it did before. Anything else is the transport's."""

    __slots__ = ("_cycle", "_head", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport, self._cycle = transport, cycle
        self._head: bytes | None = None
        self._held = False  # this response's head was held

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif not self._held and self._cycle.response_started and self._cycle.scope["method"] != "HEAD":
            self._held = True  # the first write once the answer began: its head (a 100 Continue is before)
            self._head = data
            return
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Sweep:
    """Every SWEEP_S, each connection's phase, read from uvicorn's state of it: waiting for a request's
    headers (no request under way, and no keep-alive wait: bytes of the next one came, or none yet on a new
    connection), or for its body (a request whose body has not all come). A connection seen in the same
    phase of the same request for longer than its bound is closed; one idle between requests is uvicorn's
    (timeout_keep_alive), one whose request is being answered (a long poll too) is nobody's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], bounds: HttpSettings) -> None:
        self.loop, self.connections, self.bounds = loop, connections, bounds
        self.seen: dict[Any, tuple[tuple[str, int], float]] = {}  # connection -> (its phase, since when)

    def __call__(self) -> None:
        try:
            self._sweep()
        except Exception:  # a bug: logged, and the bounds go on being kept
            log.exception("the HTTP bounds' sweep failed")
        self.loop.call_later(SWEEP_S, self)

    def _sweep(self) -> None:
        now = self.loop.time()
        seen: dict[Any, tuple[tuple[str, int], float]] = {}
        for conn in list(self.connections):
            phase = _phase(conn)
            if phase is None or conn.transport.is_closing():
                continue
            earlier = self.seen.get(conn)
            since = earlier[1] if earlier is not None and earlier[0] == phase else now
            bound = self.bounds.header_timeout if phase[0] == "headers" else self.bounds.body_timeout
            if now - since >= bound:
                conn.transport.close()
            else:
                seen[conn] = (phase, since)
        self.seen = seen


def _phase(conn: Any) -> tuple[str, int] | None:
    """("headers" or "body", the request's cycle) while `conn` waits on its client for one; else None."""
    if not isinstance(conn, HttpToolsProtocol):  # a websocket's own protocol, after its upgrade
        return None
    cycle = conn.cycle
    if cycle is None or cycle.response_complete:
        return None if conn.timeout_keep_alive_task is not None else ("headers", id(cycle))
    return ("body", id(cycle)) if cycle.more_body and not cycle.disconnected else None


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
