"""Clients that attack a live `charon serve` rather than use it: a body streamed past every limit. Each test
speaks raw HTTP/1.1 over a socket, as such a client would."""

from __future__ import annotations

import select
import socket
import uuid
from collections.abc import Iterator

import pytest

from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


@pytest.fixture
def service(redis_url: str) -> Iterator[CharonProcess]:
    proc = CharonProcess(redis_url, namespace=f"h{uuid.uuid4().hex[:10]}").start()
    try:
        yield proc
    finally:
        proc.stop()


def peak_memory(pid: int) -> int:
    """The process's peak resident memory so far, bytes (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer, head and body (by its Content-Length), then the socket closed."""
    sock.settimeout(30)
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536) or b"\r\n\r\n"
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            more = sock.recv(65536)
            if not more:
                break
            body += more
        return head + b"\r\n\r\n" + body
    finally:
        sock.close()


def test_a_chunked_body_past_the_limit_is_refused_before_it_is_read_whole(service: CharonProcess) -> None:
    """16 MiB sent chunked (no Content-Length to refuse it by) to a post whose limit is 256 KiB: the answer
    is 413 and the worker did not take the 16 MiB in (its peak memory grew by far less)."""
    assert service.proc is not None
    before = peak_memory(service.proc.pid)
    sock = socket.create_connection(("127.0.0.1", service.port))
    sock.sendall(
        b"POST /v2/queues/big/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Project-ID: hostile\r\n"
        b"Client-ID: " + str(uuid.uuid4()).encode() + b"\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    data = b" " * (64 * 1024)  # JSON's whitespace: no parser could refuse it early
    chunk = b"%x\r\n%s\r\n" % (len(data), data)
    sent = 0
    try:
        while sent < 16 * MiB and not select.select([sock], [], [], 0)[0]:  # until an answer is there
            sock.sendall(chunk)
            sent += len(data)
        if sent >= 16 * MiB:
            sock.sendall(b"0\r\n\r\n")
    except (
        BrokenPipeError,
        ConnectionResetError,
    ):  # the service answered and closed: the answer is read below
        pass
    answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"at most 262144 bytes" in answer
    assert peak_memory(service.proc.pid) - before < 8 * MiB
