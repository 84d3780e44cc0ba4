"""Notifications to websocket connections that subscribe themselves: Zaqar's `subscription_create` without a
subscriber, over its websocket (api/websocket.py). As in Zaqar, such a subscription is an ordinary one whose
subscriber is a listener of the API process holding the connection: its notifications go through the same
outbox, retries and notifier as every other, and the listener passes each one to its connection as a frame.

Each API process has one `Notices`: an HTTP/1.1 listener (h11) on loopback, on a port the system picks,
started when its first connection subscribes itself. A connection's subscriber is
`websocket://127.0.0.1:<port>/<key>?machine=<id>`, its key 128 random bits: only the service makes such
subscribers (the subscription route takes one only from the websocket call that made it, `SELF_SUBSCRIBER`),
and the deliverer sends them over loopback alone, from the machine named, with the notification alone
(service/delivery). A POST to a key with no live connection is a 404, which gives the delivery up; the
connection's subscriptions are deleted when it closes. So the notifier must run on the API's machine
(`charon serve` runs it there), and several machines on one store give up each other's connections'
notifications (whichever notifier leases a delivery sends it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import h11

from service.delivery.deliverer import MACHINE, NOTICE_SCHEME

log = logging.getLogger("charon.websocket")
SELF_SUBSCRIBER = "charon.websocket_subscriber"  # the scope key of the subscriber a websocket call may make
SELF_MADE = "charon.websocket_made"  # ... and of the list the route adds the subscription it made to
HOST = "127.0.0.1"
READ_CHUNK = 65536
IDLE_S = 60.0  # a notifier's kept-alive connection to the listener is closed after this long idle

Push = Callable[[bytes], Awaitable[bool]]  # a notification's body to a connection; False when it is gone


class Notices:
    """The process's listener, and the connections it passes notifications to, by key."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._targets: dict[str, Push] = {}
        self._server: asyncio.Server | None = None
        self._starting: asyncio.Lock | None = None

    async def subscriber(self, key: str, push: Push) -> str:
        """The subscriber of the connection of `key` (the listener started if it was not), whose
        notifications go to `push` until `forget(key)`."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._server is None:
                self._server = await asyncio.start_server(self._serve, HOST, 0)
        self._targets[key] = push
        port = self._server.sockets[0].getsockname()[1]
        return f"{NOTICE_SCHEME}://{HOST}:{port}/{key}?machine={MACHINE}"

    def forget(self, key: str) -> None:
        self._targets.pop(key, None)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16384)
        try:
            while True:
                status = await self._one(conn, reader)
                if status is None:  # the notifier hung up
                    return
                writer.write(conn.send(h11.Response(status_code=status, headers=[("content-length", "0")])))
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.ProtocolError, OSError, TimeoutError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, conn: h11.Connection, reader: asyncio.StreamReader) -> int | None:
        """One request read whole: the status its answer has (None: the connection ended first)."""
        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(READ_CHUNK), IDLE_S)
                conn.receive_data(data)  # b"": the end, which h11 reports as ConnectionClosed or an error
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body:
                    return 413  # not read further: the connection is closed after the answer
            elif isinstance(event, h11.EndOfMessage):
                break
        assert request is not None
        if request.method != b"POST":
            return 405
        push = self._targets.get(request.target.decode("latin-1").split("?", 1)[0].lstrip("/"))
        if push is None:
            return 404  # the connection is gone: the delivery is given up
        return 200 if await push(bytes(body)) else 404
