"""`charon serve` with no storage URI runs on its own redis-server, and keeps messages across restarts."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

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
