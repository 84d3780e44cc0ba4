"""`charon serve` as a process tree that cleans up after itself (issue 18): `kill -9` of the parent of
`--workers N` leaves no worker behind holding the port (nor the embedded redis-server), an immediate restart
binds and finds every acknowledged message, and a second service on a data directory in use refuses to start,
naming the directory and the process that holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_workers import listeners, wait_for, workers_of
from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess, redis_servers_on

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "supervision"}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_kill_9_of_the_parent_leaves_nothing_running_and_a_restart_binds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = CharonProcess(None, data_dir=data, env={"CHARON_WORKERS": "2"}).start()
    assert service.proc is not None
    wait_for(lambda: len(workers_of(service.proc.pid)) == 2 and listeners(service.port) == 2, "workers")
    workers = workers_of(service.proc.pid)
    acknowledged: list[int] = []
    stop = threading.Event()

    def load() -> None:
        n = 0
        while not stop.is_set():
            try:
                with httpx.Client(base_url=service.url, headers=HEADERS, timeout=5) as c:
                    r = c.post("/v2/queues/kept/messages", json={"messages": [{"body": n}]})
                if r.status_code == 201:
                    acknowledged.append(n)
            except httpx.TransportError:
                pass
            n += 1

    producer = threading.Thread(target=load)
    producer.start()
    wait_for(lambda: len(acknowledged) >= 20, "the load did not start")
    service.proc.kill()
    service.proc.wait(10)
    killed_at = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in workers), "workers outlived their parent", seconds=10)
    gone_after = time.monotonic() - killed_at
    stop.set()
    producer.join(30)
    wait_for(
        lambda: redis_servers_on(data) == [], "the embedded redis-server outlived its parent", seconds=10
    )
    print(f"workers gone {gone_after:.2f} s after the parent was killed")
    # within a second on a quiet machine (0.2 s measured here); the bound leaves room for a loaded one
    assert gone_after < 3, f"the workers took {gone_after:.1f} s to exit"

    again = CharonProcess(None, data_dir=data, env={"CHARON_WORKERS": "2"})
    again.port = service.port  # the same port, at once
    again.start()
    try:
        with httpx.Client(base_url=again.url, headers=HEADERS) as c:
            stored, url = [], "/v2/queues/kept/messages?echo=true&limit=20"
            while url:
                page = c.get(url).json()
                stored += [m["body"] for m in page["messages"]]
                url = page["links"][0]["href"] if page["links"] else ""
        assert set(acknowledged) <= set(stored)
    finally:
        again.stop()


def test_a_data_directory_whose_service_is_alive_is_refused_at_once(tmp_path: Path) -> None:
    """Its lock's holder is a live service: no use waiting for it (a wait of an hour is not waited); a
    holder that just died is still waited for, while its redis-server finishes (the next test)."""
    data = tmp_path / "data"
    first = CharonProcess(None, data_dir=data).start()
    assert first.proc is not None
    try:
        code = (
            "from pathlib import Path; from app.embedded import lock_data_dir; "
            f"lock_data_dir(Path({str(data)!r}), 3600)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "DataDirInUse" in done.stderr
        assert f"PID {first.proc.pid}" in done.stderr
    finally:
        first.stop()


def test_a_second_service_on_a_data_directory_in_use_refuses_to_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = CharonProcess(None, data_dir=data).start()
    assert first.proc is not None
    try:
        second = CharonProcess(None, data_dir=data)
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            str(second.port),
            "--log-level",
            "warning",
        ]
        done = subprocess.run(argv, env=second.env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        said = done.stdout + done.stderr
        assert str(data.resolve()) in said
        assert f"PID {first.proc.pid}" in said
        assert len(redis_servers_on(data)) == 1  # no second redis-server on the same AOF
        r = httpx.get(f"{first.url}/v2/ping")
        assert r.status_code == 204
    finally:
        first.stop()
    assert not os.path.exists(data / "charon.lock") or redis_servers_on(data) == []
