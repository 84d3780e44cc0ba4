"""Real receivers of notifications for the tests, each on a free loopback port and in a thread of its own
(with its own event loop), so that an in-process async test and a live `charon serve` process reach them
alike: an HTTP server that records every request and answers as told (`HttpReceiver`), and an SMTP server
(aiosmtpd) that records every mail (`SmtpReceiver`).

A live server reaches them with `notification_env(smtp_receiver)` in its environment (loopback allowed to
webhooks, the SMTP server set): `CharonProcess(uri, env=notification_env(smtp_receiver))`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import json
import threading
import time
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, Generic, TypeVar

import h11
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.servers import free_port

LOOPBACK_NETWORKS = ["127.0.0.0/8", "::1/128"]
T = TypeVar("T")


class _Log(Generic[T]):
    """What a receiver got, appended from its thread, waited on from the tests'."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._changed = threading.Condition()

    def add(self, item: T) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    def items(self) -> list[T]:
        with self._changed:
            return list(self._items)

    def clear(self) -> None:
        with self._changed:
            self._items.clear()

    def wait_for(self, count: int, within: float) -> list[T]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._items) >= count, within):
                raise AssertionError(f"{len(self._items)} received in {within} s, expected {count}")
            return list(self._items)

    async def arrived(self, count: int, within: float) -> list[T]:
        deadline = time.monotonic() + within
        while len(items := self.items()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(items)} received in {within} s, expected {count}")
            await asyncio.sleep(0.01)
        return items


@dataclass(frozen=True)
class Request:
    method: str
    target: str  # path and query
    headers: dict[str, str]  # names lowercased
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    hang: bool = False


class HttpReceiver:
    """An HTTP/1.1 server (h11 over asyncio) on 127.0.0.1:<port>. Every request is recorded when its body
    has arrived, then answered the current way: `answer(status)` (200 to start with), the first `fail(n)`
    requests from now with a 503 (or `status`) before that, or not at all after `hang()` (the connection
    stays open until the client closes it or the receiver stops); `delay` seconds late (0 to start with).
    `in_flight` / `max_in_flight`: requests received and neither answered nor given up by their client."""

    def __init__(self) -> None:
        self.port = 0
        self.log: _Log[Request] = _Log()
        self._lock = threading.Lock()
        self._answer = _Answer()
        self._failures: list[_Answer] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.connections = 0  # accepted so far
        self.close_after_answer = False  # hang up after each answer (as a server whose keep-alive ended)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, path: str = "/hook") -> str:
        return f"{self.url}{path}"

    @property
    def requests(self) -> list[Request]:
        return self.log.items()

    def wait_for(self, count: int = 1, within: float = 10) -> list[Request]:
        """Block until `count` requests have arrived (from a sync test or a thread); AssertionError if not."""
        return self.log.wait_for(count, within)

    async def arrived(self, count: int = 1, within: float = 10) -> list[Request]:
        """The same from an async test, without blocking its loop."""
        return await self.log.arrived(count, within)

    def answer(self, status: int = 200, *, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        with self._lock:
            self._answer = _Answer(status, dict(headers or {}), body)

    def fail(self, times: int, status: int = 503) -> None:
        with self._lock:
            self._failures = [_Answer(status) for _ in range(times)]

    def hang(self) -> None:
        with self._lock:
            self._answer = _Answer(hang=True)

    def start(self) -> HttpReceiver:
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"the HTTP receiver did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        connections: set[asyncio.Task[None]] = set()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            connections.add(task)
            self.connections += 1
            try:
                await self._connection(reader, writer)
            except (ConnectionError, asyncio.CancelledError, h11.ProtocolError):
                pass
            finally:
                connections.discard(task)
                writer.close()

        try:
            server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            for task in list(connections):
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)

    def _next_answer(self) -> _Answer:
        with self._lock:
            return self._failures.pop(0) if self._failures else self._answer

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                request, body = event, bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                await self._respond(conn, reader, writer, request, bytes(body))
                if self.close_after_answer:
                    await writer.drain()
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
            else:  # ConnectionClosed, or PAUSED
                return

    async def _respond(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        body: bytes,
    ) -> None:
        headers = {name.decode().lower(): value.decode() for name, value in request.headers}
        self.in_flight += 1  # only the receiver's loop changes these
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.log.add(Request(request.method.decode(), request.target.decode(), headers, body))
            answer = self._next_answer()
            if self.delay:
                await asyncio.sleep(self.delay)
            if answer.hang:  # until the client gives up (closes) or the receiver stops
                assert self._stopping is not None
                waits = {asyncio.ensure_future(reader.read()), asyncio.ensure_future(self._stopping.wait())}
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for wait in waits:
                        wait.cancel()
                raise ConnectionError("hung up")
            out = [*answer.headers.items(), ("content-length", str(len(answer.body)))]
            writer.write(conn.send(h11.Response(status_code=answer.status, headers=out)) or b"")
            writer.write(conn.send(h11.Data(data=answer.body)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
        finally:
            self.in_flight -= 1


@dataclass(frozen=True)
class Mail:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    def body(self) -> str:
        part = self.message.get_body()
        assert part is not None
        return str(part.get_content())


class _Handler:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self.receiver = receiver

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        refusal = self.receiver._next_refusal()
        if refusal is not None:
            return refusal
        content = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        message = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.receiver.log.add(Mail(str(envelope.mail_from), list(envelope.rcpt_tos), message))
        return "250 OK"


class SmtpReceiver:
    """aiosmtpd's Controller on 127.0.0.1:<free port>, recording every mail it accepts; `fail(n)` makes it
    refuse the next n mails with a 451 (temporary) answer."""

    def __init__(self) -> None:
        self.port = free_port()
        self.log: _Log[Mail] = _Log()
        self._lock = threading.Lock()
        self._refusals: list[str] = []
        self._controller = Controller(_Handler(self), hostname="127.0.0.1", port=self.port)

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def mails(self) -> list[Mail]:
        return self.log.items()

    def wait_for(self, count: int = 1, within: float = 10) -> list[Mail]:
        return self.log.wait_for(count, within)

    async def arrived(self, count: int = 1, within: float = 10) -> list[Mail]:
        return await self.log.arrived(count, within)

    def fail(self, times: int, answer: str = "451 4.3.0 Try again later") -> None:
        with self._lock:
            self._refusals = [answer] * times

    def _next_refusal(self) -> str | None:
        with self._lock:
            return self._refusals.pop(0) if self._refusals else None

    def start(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(AssertionError):  # already stopped
            self._controller.stop()


def notification_env(smtp: SmtpReceiver | None = None, **more: str) -> dict[str, str]:
    """The environment of a live `charon serve` whose notifications reach these receivers: loopback allowed
    to webhooks and, given `smtp`, mail through it; `more`: other CHARON_NOTIFICATIONS__<NAME> values, by
    lowercase name (webhook_timeout="1")."""
    env = {"CHARON_NOTIFICATIONS__ALLOWED_NETWORKS": json.dumps(LOOPBACK_NETWORKS)}
    if smtp is not None:
        env["CHARON_NOTIFICATIONS__SMTP_HOST"] = smtp.host
        env["CHARON_NOTIFICATIONS__SMTP_PORT"] = str(smtp.port)
    env.update({f"CHARON_NOTIFICATIONS__{name.upper()}": value for name, value in more.items()})
    return env
