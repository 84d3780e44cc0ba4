"""`charon serve --workers 2`: one SO_REUSEPORT socket per worker process (app/cli.py supervise); a worker
that dies is replaced while the others keep serving, and SIGTERM stops every worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "workers"}


def workers_of(pid: int) -> list[int]:
    """The worker processes (multiprocessing spawn children, not its resource tracker) of `pid`."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "spawn_main"], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def listeners(port: int) -> int:
    """How many sockets listen on `port` (each worker has its own, SO_REUSEPORT): /proc/net/tcp, state 0A."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                count += state == "0A" and int(local.rsplit(":", 1)[1], 16) == port
    return count


def wait_for(check: object, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_killed_worker_is_replaced_and_sigterm_stops_all(redis_url: str) -> None:
    service = CharonProcess(
        redis_url, namespace=f"k{os.urandom(4).hex()}", env={"CHARON_WORKERS": "2"}
    ).start()
    assert service.proc is not None
    try:
        wait_for(lambda: len(workers_of(service.proc.pid)) == 2, "two workers did not start")
        # ping answered once one worker listened: kill one only when both do, or none may be left listening
        wait_for(lambda: listeners(service.port) == 2, "two workers are not both listening")
        first = workers_of(service.proc.pid)
        os.kill(first[0], signal.SIGKILL)
        wait_for(
            lambda: len(workers_of(service.proc.pid)) == 2 and first[0] not in workers_of(service.proc.pid),
            "the killed worker was not replaced",
        )
        wait_for(lambda: listeners(service.port) == 2, "the replacement worker does not listen")
        posted = 0
        for _ in range(20):  # a new connection each time: the kernel picks a worker for each
            with httpx.Client(base_url=service.url, headers=HEADERS) as c:
                r = c.post("/v2/queues/w/messages", json={"messages": [{"body": posted}]})
                assert r.status_code == 201, r.text
                posted += 1
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            wait_for(
                lambda: c.get("/v2/ping").status_code == 204, "the replacement worker does not answer", 10
            )
            assert c.get("/v2/queues/w/stats").json()["messages"]["total"] == posted
        running = workers_of(service.proc.pid)
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(30) == 0
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in running), "workers outlived SIGTERM")
    finally:
        service.stop()


def test_workers_that_cannot_start_stop_the_service_with_exit_code_1() -> None:
    """A worker failing at start (here: a storage URI no driver takes) is not restarted in a loop: the
    service stops, exit code 1, as uvicorn does with one worker."""
    service = CharonProcess("bogus://nowhere", env={"CHARON_WORKERS": "2"})
    argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(service.port), "--log-level", "warning"]
    done = subprocess.run(argv, env=service.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed at start" in done.stdout
