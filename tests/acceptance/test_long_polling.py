"""Long polling against a live `charon serve` on each driver: a claim waiting in one worker process is woken
by a post that another worker served (through the store: Redis pub/sub, a MongoDB change stream), waiting
claims beyond the bound are refused with 503, and SIGTERM answers waiting claims at once."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid

import httpx
import pytest

from tests.servers import CharonProcess

pytestmark = pytest.mark.slow  # live server processes

HEADERS = {"Client-ID": "3381af92-2b9e-11e3-b191-71861300734c", "X-Project-ID": "long-poll"}
CLAIM = {"ttl": 60, "grace": 60}


def test_a_post_served_by_any_worker_wakes_claims_waiting_in_every_worker(storage_uri: str) -> None:
    namespace = f"lp{uuid.uuid4().hex[:8]}"
    service = CharonProcess(storage_uri, namespace=namespace, env={"CHARON_WORKERS": "2"}).start()
    waiters = 6
    try:
        with concurrent.futures.ThreadPoolExecutor(waiters) as pool:

            def long_poll(_: int) -> tuple[int, list[object]]:
                # a connection each: the kernel spreads them over both workers' sockets
                with httpx.Client(base_url=service.url, headers=HEADERS, timeout=40) as c:
                    r = c.post("/v2/queues/lp/claims?wait=20&limit=1", json=CLAIM)
                    return r.status_code, [m["body"] for m in r.json()["messages"]] if r.content else []

            answers = [pool.submit(long_poll, i) for i in range(waiters)]
            time.sleep(2)  # every claim has found nothing and waits
            assert not any(a.done() for a in answers)
            started = time.monotonic()
            with httpx.Client(base_url=service.url, headers=HEADERS) as c:
                for n in range(waiters):  # one post a message, each on a new connection: either worker
                    r = c.post(
                        "/v2/queues/lp/messages",
                        json={"messages": [{"body": n}]},
                        headers={"Connection": "close"},
                    )
                    assert r.status_code == 201
            got = [a.result(timeout=30) for a in answers]
            took = time.monotonic() - started
        assert sorted(body for status, bodies in got for body in bodies) == list(range(waiters))
        assert {status for status, _ in got} == {201}
        print(f"{waiters} waiting claims answered {took:.2f} s after the first post")
        assert took < 15  # woken, not timed out (the wait was 20 s)
    finally:
        service.stop()


def test_sigterm_answers_waiting_claims_at_once(storage_uri: str) -> None:
    service = CharonProcess(
        storage_uri, namespace=f"lp{uuid.uuid4().hex[:8]}", env={"CHARON_LIMITS__MAX_WAITING_CLAIMS": "2"}
    ).start()
    answers: list[httpx.Response] = []

    def long_poll() -> None:
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=40) as c:
            answers.append(c.post("/v2/queues/lp/claims?wait=20", json=CLAIM))

    threads = [threading.Thread(target=long_poll) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.5)
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=40) as c:
            busy = c.post("/v2/queues/lp/claims?wait=20", json=CLAIM)
        assert busy.status_code == 503
        assert "2 claims already wait in this process" in busy.json()["description"]
        assert not answers
        stopping = time.monotonic()
        assert service.proc is not None
        service.proc.terminate()
        for t in threads:
            t.join(30)
        service.proc.wait(30)
        stopped_after = time.monotonic() - stopping
    finally:
        service.stop()
    assert [a.status_code for a in answers] == [204, 204]
    print(f"stopped {stopped_after:.2f} s after SIGTERM with 2 claims waiting")
    assert stopped_after < 10  # not held until the 20 s wait ends
