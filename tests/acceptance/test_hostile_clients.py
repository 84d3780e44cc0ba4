"""Clients that attack a live `charon serve` rather than use it: a body streamed past every limit, clients
that send their headers or body too slowly, more connections than a process takes. Each test speaks raw
HTTP/1.1 over a socket, as such a client would."""

from __future__ import annotations

import select
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

MiB = 1024 * 1024


@pytest.fixture
def service(redis_url: str) -> Iterator[CharonProcess]:
    bounds = {"CHARON_HTTP__HEADER_TIMEOUT": "1", "CHARON_HTTP__BODY_TIMEOUT": "1"}
    proc = CharonProcess(redis_url, namespace=f"h{uuid.uuid4().hex[:10]}", env=bounds).start()
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


HEAD = b"POST /v2/queues/slow/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Project-ID: hostile\r\n"


def closed_by_the_service(sock: socket.socket, deadline: float) -> bool:
    """Whether the service closes `sock` before `deadline` (the client sends nothing more)."""
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return True


def test_slow_clients_are_cut_and_others_served_meanwhile(service: CharonProcess) -> None:
    """50 clients hold their connections: 25 with half their headers sent, 25 with their headers and half a
    body. Meanwhile others are served; each slow one is closed once its headers (or body) took longer than
    CHARON_HTTP__HEADER_TIMEOUT (BODY_TIMEOUT), 1 s here."""
    slow = []
    for n in range(50):
        sock = socket.create_connection(("127.0.0.1", service.port))
        if n % 2:
            sock.sendall(
                HEAD + b"Client-ID: " + str(uuid.uuid4()).encode() + b"\r\nContent-Length: 1000\r\n\r\n{"
            )
        else:
            sock.sendall(HEAD + b"Client-I")
        slow.append(sock)
    headers = {"X-Project-ID": "hostile", "Client-ID": str(uuid.uuid4())}
    posted = httpx.post(
        f"{service.url}/v2/queues/fast/messages", json={"messages": [{"body": 1}]}, headers=headers
    )
    assert posted.status_code == 201, posted.text
    deadline = time.monotonic() + 30
    assert [closed_by_the_service(sock, deadline) for sock in slow] == [True] * 50
    assert httpx.get(f"{service.url}/v2/ping").status_code == 204


def test_connections_beyond_the_limit_are_refused_in_json(redis_url: str) -> None:
    """A process holds at most CHARON_HTTP__MAX_CONNECTIONS connections (10 here): the next is answered 503
    in Zaqar's shape and closed; once some close, others are served again."""
    bounds = {"CHARON_HTTP__MAX_CONNECTIONS": "10"}
    proc = CharonProcess(redis_url, namespace=f"h{uuid.uuid4().hex[:10]}", env=bounds).start()
    try:
        held = [socket.create_connection(("127.0.0.1", proc.port)) for _ in range(10)]
        time.sleep(0.5)  # accepted by the service, not only by the kernel
        extra = socket.create_connection(("127.0.0.1", proc.port))
        extra.sendall(b"GET /v2/ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = read_answer(extra)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b"CHARON_HTTP__MAX_CONNECTIONS" in answer
        for sock in held:
            sock.close()
        time.sleep(0.5)
        assert httpx.get(f"{proc.url}/v2/ping").status_code == 204
    finally:
        proc.stop()
