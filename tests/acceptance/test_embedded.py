"""`charon serve` with no storage URI runs on its own redis-server, and keeps messages across restarts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess, redis_servers_on

pytestmark = pytest.mark.slow
HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "embedded"}


def test_embedded_store_serves_and_persists(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = CharonProcess(None, data_dir=data).start()
    try:
        r = httpx.post(
            f"{first.url}/v2/queues/kept/messages", headers=HEADERS, json={"messages": [{"body": "survives"}]}
        )
        assert r.status_code == 201
        # as docs/storage.md asks of any Redis: AOF, and hz 100 (a grown keyspace rehashed in seconds)
        store = redis.Redis(unix_socket_path=str(data / "redis.sock"))
        assert store.config_get("appendonly") == {"appendonly": "yes"}
        assert store.config_get("hz") == {"hz": "100"}
        store.close()
    finally:
        first.stop()
    assert (data / "appendonlydir").is_dir() or (data / "appendonly.aof").exists()

    second = CharonProcess(None, data_dir=data).start()
    try:
        listing = httpx.get(f"{second.url}/v2/queues/kept/messages", headers=HEADERS, params={"echo": "true"})
        assert [m["body"] for m in listing.json()["messages"]] == ["survives"]
    finally:
        second.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_embedded_store_stops_with_the_service(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "data"
    proc = CharonProcess(None, data_dir=data).start()
    assert len(redis_servers_on(data)) == 1
    assert proc.proc is not None
    proc.proc.send_signal(sig)
    proc.proc.wait(15)
    deadline = time.monotonic() + 10
    while redis_servers_on(data) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert redis_servers_on(data) == []


def test_an_embedded_store_that_dies_is_started_again_with_what_it_had(tmp_path: Path) -> None:
    """Before, the service answered 503 for good once its redis-server died (an OOM kill, kill -9): it is
    started again on the same data directory, from its AOF, and the service serves on."""
    data = tmp_path / "data"
    service = CharonProcess(None, data_dir=data).start()
    try:
        posted = httpx.post(
            f"{service.url}/v2/queues/kept/messages", headers=HEADERS, json={"messages": [{"body": "kept"}]}
        )
        assert posted.status_code == 201
        time.sleep(1.5)  # appendfsync everysec: on disk within a second
        [line] = redis_servers_on(data)
        pid = int(line.split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            running = [int(x.split()[0]) for x in redis_servers_on(data)]
            if running and running != [pid]:
                try:
                    if httpx.get(f"{service.url}/v2/ping", timeout=2).status_code == 204:
                        break
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        else:
            raise AssertionError("the embedded store was not started again")
        listing = httpx.get(
            f"{service.url}/v2/queues/kept/messages", headers=HEADERS, params={"echo": "true"}
        )
        assert [m["body"] for m in listing.json()["messages"]] == ["kept"]
        assert (
            httpx.post(
                f"{service.url}/v2/queues/kept/messages",
                headers=HEADERS,
                json={"messages": [{"body": "more"}]},
            ).status_code
            == 201
        )
    finally:
        service.stop()
    deadline = time.monotonic() + 10
    while redis_servers_on(data) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert redis_servers_on(data) == []  # and the one started again stops with the service
