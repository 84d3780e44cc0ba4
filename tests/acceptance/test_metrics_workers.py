"""GET /metrics of `charon serve --workers 2`: whichever worker answers, its counters add up both workers'
(prometheus-client's multiprocess mode in a private directory `charon serve` makes), a worker killed with -9
still counts, its live gauges leave the directory, and the directory goes with the service (or with the
next service to start, after a kill -9)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_workers import HEADERS, connections, listeners, wait_for, workers_of
from tests.metrics_doc import samples
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

TOKEN = "scrape-token"
POSTS = ("charon_http_requests_total", "/v2/queues/{queue_name}/messages", "POST", "201")


def posts_counted(c: httpx.Client) -> float:
    r = c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return sum(
        s.value
        for s in samples(r.text)
        if (s.name, s.labels.get("route"), s.labels.get("method"), s.labels.get("status")) == POSTS
    )


def metrics_dir(worker: int) -> Path:
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    [value] = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")]
    return Path(value.decode())


def test_every_worker_answers_with_both_workers_counts(redis_url: str) -> None:
    # left by services killed with -9: the one whose PID is gone is removed at start, the other kept
    stale = Path(tempfile.mkdtemp(prefix="charon-metrics-999999999-"))
    alive = Path(tempfile.mkdtemp(prefix=f"charon-metrics-{os.getpid()}-"))
    service = CharonProcess(
        redis_url,
        namespace=f"m{os.urandom(4).hex()}",
        env={"CHARON_WORKERS": "2", "CHARON_METRICS__BEARER_TOKEN": TOKEN},
    ).start()
    assert service.proc is not None
    clients = [httpx.Client(base_url=service.url, headers=HEADERS) for _ in range(16)]
    try:
        wait_for(lambda: len(workers_of(service.proc.pid)) == 2, "two workers did not start")
        wait_for(lambda: listeners(service.port) == 2, "two workers are not both listening")
        workers = workers_of(service.proc.pid)
        assert (stale.exists(), alive.exists()) == (False, True)
        directory = metrics_dir(workers[0])
        assert metrics_dir(workers[1]) == directory
        assert directory.is_dir()
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
        for n, c in enumerate(clients):  # kept-alive connections, spread by the kernel over both workers
            assert c.post("/v2/queues/w/messages", json={"messages": [{"body": n}]}).status_code == 201
        held = connections(service.port, workers)
        assert all(held), f"connections held by workers {workers}: {held}"
        # each connection's scrape is answered by the worker that holds it: every one counts all 16
        assert [posts_counted(c) for c in clients] == [16] * 16

        os.kill(workers[0], signal.SIGKILL)
        wait_for(
            lambda: len(workers_of(service.proc.pid)) == 2 and workers[0] not in workers_of(service.proc.pid),
            "the killed worker was not replaced",
        )
        wait_for(
            lambda: not list(directory.glob(f"gauge_live*_{workers[0]}.db")),
            "the dead worker's live gauges were not marked dead",
        )
        assert list(directory.glob(f"counter_{workers[0]}.db"))  # its counts stay
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            assert posts_counted(c) == 16
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(30) == 0
        assert not directory.exists()
    finally:
        for c in clients:
            c.close()
        service.stop()
        shutil.rmtree(alive, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
