"""app/http.py's HTTP/1.1 protocol as uvicorn runs it: uvicorn's own protocol and request cycles, fed the
bytes a client sends, answering through a transport that records each write (what a socket would get, one
send(2) each). A response goes out in one write, head and body together; a HEAD, a 100 Continue, a
streamed body and a keep-alive connection's next request are answered as before."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.server import ServerState

from app.http import BoundedHttp, CharonConfig, HttpSettings


class Recorded(asyncio.Transport):
    """What the protocol wrote, each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8888), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def _json(request: Request) -> Response:
    return JSONResponse({"body": (await request.body()).decode()}, status_code=201)


async def _empty(request: Request) -> Response:
    return Response(status_code=204)


async def _streamed(request: Request) -> Response:
    async def parts() -> Any:
        yield b"one,"
        await asyncio.sleep(0)
        yield b"two"

    return StreamingResponse(parts())


APP = Starlette(
    routes=[
        Route("/json", _json, methods=["GET", "POST"]),
        Route("/empty", _empty),
        Route("/streamed", _streamed),
    ]
)


def _connected() -> tuple[BoundedHttp, Recorded]:
    config = CharonConfig(APP, bounds=HttpSettings(), log_level="warning")
    config.load()
    protocol = BoundedHttp(config=config, server_state=ServerState(), app_state={})
    transport = Recorded()
    protocol.connection_made(transport)
    return protocol, transport


async def _answered(protocol: BoundedHttp, answers: int) -> None:
    for _ in range(200):
        await asyncio.sleep(0)
        if protocol.server_state.total_requests >= answers and not protocol.tasks:
            return


async def _exchange(raw: bytes, answers: int = 1) -> Recorded:
    protocol, transport = _connected()
    protocol.data_received(raw)
    await _answered(protocol, answers)
    protocol.connection_lost(None)
    return transport


async def test_a_response_goes_out_in_one_write() -> None:
    sent = await _exchange(b"GET /json HTTP/1.1\r\nhost: x\r\n\r\n")
    [write] = sent.writes
    assert write.startswith(b"HTTP/1.1 201 Created\r\n")
    assert write.endswith(b'\r\n\r\n{"body":""}')


async def test_a_response_without_a_body_goes_out_in_one_write() -> None:
    [write] = (await _exchange(b"GET /empty HTTP/1.1\r\nhost: x\r\n\r\n")).writes
    assert write.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert write.endswith(b"\r\n\r\n")


async def test_a_head_is_answered_with_its_head_alone() -> None:
    [write] = (await _exchange(b"HEAD /json HTTP/1.1\r\nhost: x\r\n\r\n")).writes
    assert write.startswith(b"HTTP/1.1 201 Created\r\n")
    assert write.endswith(b"\r\n\r\n")


async def test_a_100_continue_goes_before_the_body_is_read() -> None:
    head = b"POST /json HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    protocol, transport = _connected()
    protocol.data_received(head)
    for _ in range(50):
        await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # not held: the client waits for it
    protocol.data_received(b"hi")
    await _answered(protocol, 1)
    protocol.connection_lost(None)
    assert len(transport.writes) == 2
    assert transport.writes[1].endswith(b'{"body":"hi"}')


async def test_a_streamed_body_goes_out_as_it_comes_its_head_with_its_first_part() -> None:
    writes = (await _exchange(b"GET /streamed HTTP/1.1\r\nhost: x\r\n\r\n")).writes
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"\r\n\r\n4\r\none,\r\n")
    assert b"".join(writes[1:]) == b"3\r\ntwo\r\n0\r\n\r\n"


async def test_each_response_of_a_kept_alive_connection_goes_out_in_one_write() -> None:
    request = b"GET /json HTTP/1.1\r\nhost: x\r\n\r\n"
    writes = (await _exchange(request + request, answers=2)).writes
    assert len(writes) == 2
    assert all(w.startswith(b"HTTP/1.1 201") and w.endswith(b'{"body":""}') for w in writes)
