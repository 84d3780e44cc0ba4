"""The webhook client: HTTP/1.1 POSTs over kept-alive connections, h11 (the protocol library httpcore itself
uses) over asyncio streams, with the SSRF guard at every connect. A general client (httpx) spent about 0.9 ms
of CPU a POST here, more than everything else a notification costs together (bench/README.md, "What
subscriptions and GET /metrics cost"); a webhook needs one method, no redirects, no proxies, no cookies.

Every connection is made to an address the guard checked (`service.ssrf.resolve_checked`: the host resolved,
refused when any of its addresses is refused), never by name again; the Host header, TLS SNI and the
certificate check are the name's. Idle connections are kept per origin (scheme, host, port), at most
`max_idle` in all, each at most IDLE_S; a POST on a kept connection that the receiver closed meanwhile
(nothing of an answer read) is sent once more on a new one, as HTTP clients do. The caller bounds the time."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import Mapping, Sequence
from urllib.parse import quote, urlsplit

import certifi
import h11

from service.ssrf import Network, Refused, resolve_checked

IDLE_S = 5.0  # a kept connection unused this long is closed (httpx's keepalive_expiry)
READ_CHUNK = 65_536
DEFAULT_PORTS = {"http": 80, "https": 443}
_TARGET_SAFE = "/?&=%:@!$'()*+,;~[]"  # RFC 3986's delimiters and "%": only what is not ASCII is encoded


class Answer:
    __slots__ = ("location", "status")

    def __init__(self, status: int, location: str | None) -> None:
        self.status, self.location = status, location


class ProtocolFailure(Exception):
    """The receiver's answer broke HTTP/1.1, or the connection ended before a whole answer arrived."""


class _Connection:
    __slots__ = ("h11", "idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return now - self.idle_since < IDLE_S and not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class WebhookClient:
    def __init__(
        self,
        allowed: Sequence[Network] = (),
        *,
        denied: Sequence[Network] = (),
        max_idle: int,
        max_answer_bytes: int,
    ) -> None:
        self.allowed, self.denied = tuple(allowed), tuple(denied)
        self.max_idle = max_idle
        self.max_answer_bytes = max_answer_bytes
        self._idle: dict[tuple[str, str, int], deque[_Connection]] = {}
        self._idle_count = 0
        self._tls: ssl.SSLContext | None = None

    async def aclose(self) -> None:
        for kept in self._idle.values():
            for conn in kept:
                conn.close()
        self._idle.clear()
        self._idle_count = 0

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `body` to `url`: its answer's status and Location. ValueError for a URL that is not http(s)
        with a host; service.ssrf.Refused; OSError (and asyncio.IncompleteReadError) when the connection
        fails; ProtocolFailure when the answer is not HTTP."""
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        if scheme not in DEFAULT_PORTS or not host:
            raise ValueError(f"not an http(s) URL with a host: {url[:200]!r}")
        port = parts.port or DEFAULT_PORTS[scheme]
        origin = (scheme, host, port)
        # as browsers and httpx send it: characters beyond ASCII percent-encoded as UTF-8, escapes kept
        target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_TARGET_SAFE)
        shown = f"[{host}]" if ":" in host else host
        authority = shown if port == DEFAULT_PORTS[scheme] else f"{shown}:{port}"
        request = h11.Request(
            method="POST",
            target=target,
            headers=[("Host", authority), ("Content-Length", str(len(body))), *headers.items()],
        )
        conn = self._kept(origin)
        if conn is not None:
            try:
                return await self._exchange(origin, conn, request, body)
            except _Stale:
                pass  # the receiver closed the kept connection: once more, on a new one
        conn = await self._connect(scheme, host, port)
        return await self._exchange(origin, conn, request, body)  # a new one is never stale: no _Stale

    def _kept(self, origin: tuple[str, str, int]) -> _Connection | None:
        kept = self._idle.get(origin)
        now = time.monotonic()
        found = None
        while kept and found is None:
            conn = kept.pop()
            self._idle_count -= 1
            if conn.usable(now):
                found = conn
            else:
                conn.close()
        if kept is not None and not kept:
            del self._idle[origin]
        return found

    def _evict(self) -> None:
        """Close the kept connections no longer usable (expired, or closed by their receiver)."""
        now = time.monotonic()
        for origin, kept in list(self._idle.items()):
            for conn in [c for c in kept if not c.usable(now)]:
                kept.remove(conn)
                self._idle_count -= 1
                conn.close()
            if not kept:
                del self._idle[origin]

    async def _connect(self, scheme: str, host: str, port: int) -> _Connection:
        try:
            addresses = await resolve_checked(host, port, self.allowed, self.denied)
        except OSError as exc:
            raise OSError(f"cannot resolve {host}: {exc}") from exc
        tls = self._tls_context() if scheme == "https" else None
        failure: OSError | None = None
        for address in addresses:  # the next checked address when one does not answer
            try:
                reader, writer = await asyncio.open_connection(
                    address, port, ssl=tls, server_hostname=host if tls else None, limit=READ_CHUNK
                )
            except OSError as exc:
                failure = exc
                continue
            return _Connection(reader, writer)
        assert failure is not None
        raise failure

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=certifi.where())  # httpx's trust store
        return self._tls

    async def _exchange(
        self, origin: tuple[str, str, int], conn: _Connection, request: h11.Request, body: bytes
    ) -> Answer:
        c = conn.h11
        answered = False  # any byte of an answer read
        try:
            conn.writer.write(c.send(request) + c.send(h11.Data(data=body)) + c.send(h11.EndOfMessage()))
            await conn.writer.drain()
            status, location, read = 0, None, 0
            while True:
                event = c.next_event()
                if event is h11.NEED_DATA:
                    data = await conn.reader.read(READ_CHUNK)
                    if not data and not answered:
                        raise _Stale()
                    answered = True
                    c.receive_data(data)
                elif isinstance(event, h11.InformationalResponse):
                    continue  # 100 Continue and the like: the answer follows
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    for name, value in event.headers:
                        if name == b"location":
                            location = value.decode("latin-1")
                elif isinstance(event, h11.Data):
                    read += len(event.data)
                    if read > self.max_answer_bytes:  # the rest is not read: the connection is not kept
                        conn.close()
                        return Answer(status, location)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:  # ConnectionClosed, or PAUSED
                    raise ProtocolFailure(f"unexpected {type(event).__name__} in the answer")
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            conn.close()
            if not answered and conn.idle_since:
                raise _Stale() from exc
            raise
        except _Stale:
            conn.close()
            if conn.idle_since:
                raise
            raise ProtocolFailure("the connection closed before an answer") from None
        except h11.ProtocolError as exc:
            conn.close()
            raise ProtocolFailure(f"not HTTP/1.1: {exc}") from exc
        except BaseException:  # cancelled or timed out mid-exchange: the connection's state is unknown
            conn.close()
            raise
        self._keep(origin, conn)
        return Answer(status, location)

    def _keep(self, origin: tuple[str, str, int], conn: _Connection) -> None:
        c = conn.h11
        if self._idle_count >= self.max_idle:
            self._evict()
        if c.our_state is h11.DONE and c.their_state is h11.DONE and self._idle_count < self.max_idle:
            c.start_next_cycle()
            conn.idle_since = time.monotonic()
            self._idle.setdefault(origin, deque()).append(conn)
            self._idle_count += 1
        else:
            conn.close()


class _Stale(Exception):
    """A kept connection was closed by the receiver before any of the answer arrived."""


__all__ = ["Answer", "ProtocolFailure", "Refused", "WebhookClient"]
