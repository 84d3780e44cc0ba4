"""`charon serve --workers 2`: uvicorn's supervisor with one SO_REUSEPORT socket per worker process
(app/workers.py); connections reach both workers, a worker that dies is replaced while the others keep
serving, SIGHUP replaces every worker, SIGTERM stops them all, and a worker that cannot start stops the
service."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess, spawn

pytestmark = pytest.mark.slow  # live server processes

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "workers"}
ONE = {"messages": [{"body": 1}]}


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


def connections(port: int, pids: list[int]) -> list[int]:
    """How many established connections to `port` each of `pids` has open (/proc/net/tcp, state 01, by
    socket inode)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    counts = []
    for pid in pids:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir() if fd.is_symlink()]
        counts.append(sum(link.startswith("socket:[") and link[8:-1] in inodes for link in links))
    return counts


def wait_for(check: object, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def post_through_every_worker(service: CharonProcess, workers: list[int]) -> int:
    """Posts a message on each of 16 kept-alive connections, which the kernel spreads over the workers'
    sockets, and checks that every worker holds some of them (all 16 on one of two: 1 in 32,768)."""
    clients = [httpx.Client(base_url=service.url, headers=HEADERS) for _ in range(16)]
    try:
        for n, c in enumerate(clients):
            r = c.post("/v2/queues/w/messages", json={"messages": [{"body": n}]})
            assert r.status_code == 201, r.text
        held = connections(service.port, workers)
        assert sum(held) == len(clients), f"connections held by workers {workers}: {held}"
        assert all(held), f"connections held by workers {workers}: {held}"
    finally:
        for c in clients:
            c.close()
    return len(clients)


def test_both_serve_a_killed_one_is_replaced_sighup_replaces_all_sigterm_stops_all(
    redis_url: str,
) -> None:
    service = CharonProcess(
        redis_url, namespace=f"k{os.urandom(4).hex()}", env={"CHARON_WORKERS": "2"}
    ).start()
    assert service.proc is not None
    try:
        wait_for(lambda: len(workers_of(service.proc.pid)) == 2, "two workers did not start")
        # ping answered once one worker listened: go on only when both do, each on its own socket
        wait_for(lambda: listeners(service.port) == 2, "two workers are not both listening")
        first = workers_of(service.proc.pid)
        posted = post_through_every_worker(service, first)
        os.kill(first[0], signal.SIGKILL)
        wait_for(
            lambda: len(workers_of(service.proc.pid)) == 2 and first[0] not in workers_of(service.proc.pid),
            "the killed worker was not replaced",
        )
        wait_for(lambda: listeners(service.port) == 2, "the replacement worker does not listen")
        replaced = workers_of(service.proc.pid)
        posted += post_through_every_worker(service, replaced)
        service.proc.send_signal(signal.SIGHUP)  # uvicorn replaces each worker, the new one ready first
        wait_for(
            lambda: not set(replaced) & set(workers_of(service.proc.pid)), "SIGHUP replaced no worker", 60
        )
        wait_for(lambda: listeners(service.port) == 2, "the workers started by SIGHUP do not listen")
        running = workers_of(service.proc.pid)
        posted += post_through_every_worker(service, running)
        with httpx.Client(base_url=service.url, headers=HEADERS) as c:
            assert c.get("/v2/queues/w/stats").json()["messages"]["total"] == posted
        service.proc.send_signal(signal.SIGTERM)
        assert service.proc.wait(30) == 0
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in running), "workers outlived SIGTERM")
    finally:
        service.stop()


@pytest.mark.parametrize(
    ("uri", "port_taken", "said"),
    [
        ("redis://127.0.0.1:1/0?wait_replicas=many", False, "wait_replicas must be a whole number"),
        ("redis://127.0.0.1:1/0", True, "Address already in use"),
    ],
    ids=["a storage URI its driver refuses", "port in use"],
)
def test_workers_that_cannot_start_stop_the_service_with_exit_code_1(
    uri: str, port_taken: bool, said: str
) -> None:
    """A service whose workers cannot start (a store its driver refuses, a port already in use) stops at once
    with exit code 1 and says why; it does not restart workers in a loop (uvicorn's supervisor stops when a
    worker exits with its STARTUP_FAILURE code)."""
    service = CharonProcess(uri, env={"CHARON_WORKERS": "2"})
    argv = [sys.executable, "-m", "app.cli", "serve", "--port", str(service.port), "--log-level", "warning"]
    with socket.socket() as taken:
        if port_taken:
            taken.bind(("127.0.0.1", service.port))
            taken.listen()
        done = subprocess.run(argv, env=service.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in done.stderr


SLOW_START = """\
import sys
import time

if "--multiprocessing-fork" in sys.argv:  # a worker (a spawned process), as on a starved CPU: 12 s to start
    time.sleep(12)
"""


def test_workers_slow_to_start_are_waited_for_not_killed(redis_url: str, tmp_path: Path) -> None:
    """On a CPU starved by other work a worker can take longer to import than uvicorn's 5 s health check,
    which then killed it and started another, for ever. Here each worker takes 12 s to start (a
    sitecustomize that sleeps in spawned processes): both start once, and serve."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    service = CharonProcess(
        redis_url, namespace=f"s{os.urandom(4).hex()}", env={"CHARON_WORKERS": "2", "PYTHONPATH": path}
    )
    argv = [service.python, "-m", "app.cli", "serve", "--port", str(service.port), "--log-level", "info"]
    proc = spawn(argv, env=service.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(workers_of(proc.pid)) == 2, "two workers did not start")
        first = workers_of(proc.pid)
        wait_for(lambda: listeners(service.port) == 2, "the slow workers never both listened", seconds=60)
        assert workers_of(proc.pid) == first  # neither was killed and replaced
        assert httpx.get(f"{service.url}/v2/ping", timeout=10).status_code == 204
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert b"died" not in err, err.decode(errors="replace")[-2000:]


def test_a_projects_request_rate_is_one_budget_over_every_worker(redis_url: str) -> None:
    """Two workers, a write rate of 10 requests in a burst and next to no refill: 32 posts spread over both
    workers' connections get exactly 10 201s between them (each worker counting its own would give 20)."""
    rate = {"CHARON_QUOTAS__WRITES_PER_SECOND": "0.01", "CHARON_QUOTAS__BURST_SECONDS": "1000"}
    service = CharonProcess(
        redis_url, namespace=f"r{os.urandom(4).hex()}", env={"CHARON_WORKERS": "2", **rate}
    ).start()
    assert service.proc is not None
    clients = [httpx.Client(base_url=service.url, headers=HEADERS) for _ in range(16)]
    try:
        wait_for(lambda: listeners(service.port) == 2, "two workers are not both listening")
        for c in clients:  # a read each (reads are not limited): 16 kept-alive connections
            assert c.get("/v2/queues/w/stats").status_code == 200
        held = connections(service.port, workers_of(service.proc.pid))
        assert all(held), held
        assert sum(held) == 16, held
        codes = [c.post("/v2/queues/w/messages", json={"messages": [{"body": 1}]}) for c in clients * 2]
        statuses = sorted(r.status_code for r in codes)
        assert statuses.count(201) in (10, 11), statuses  # 11: a refill of 0.01 a second, should it come
        assert set(statuses) == {201, 429}
        posted = clients[0].get("/v2/queues/w/stats").json()["messages"]["total"]
        assert posted == statuses.count(201)  # a refused post stored nothing
    finally:
        for c in clients:
            c.close()
        service.stop()


@pytest.mark.parametrize("uri", ["redis_url", "mongodb_uri"])
@pytest.mark.parametrize("quota", ["messages_per_queue", "message_bytes"])
def test_producers_racing_over_two_workers_never_pass_a_message_quota(
    request: pytest.FixtureRequest, uri: str, quota: str
) -> None:
    """Two workers, a quota of 10 messages a queue (or of 10 bytes, the bodies of 10 messages `1`): 32 posts
    at once over 16 connections spread over both workers get exactly 10 201s and 22 403s, and the queue
    holds 10 (each worker counting alone, or a count and a write that another writer can come between,
    would let more in)."""
    service = CharonProcess(
        request.getfixturevalue(uri),
        namespace=f"q{os.urandom(4).hex()}",
        env={"CHARON_WORKERS": "2", f"CHARON_QUOTAS__{quota.upper()}": "10"},
    ).start()
    assert service.proc is not None
    clients = [httpx.Client(base_url=service.url, headers=HEADERS, timeout=60) for _ in range(16)]
    try:
        wait_for(lambda: listeners(service.port) == 2, "two workers are not both listening")
        for c in clients:
            assert c.get("/v2/queues/w/stats").status_code == 200
        assert all(connections(service.port, workers_of(service.proc.pid)))
        with ThreadPoolExecutor(len(clients)) as pool:
            codes = list(
                pool.map(
                    lambda c: [c.post("/v2/queues/w/messages", json=ONE).status_code for _ in "ab"], clients
                )
            )
        statuses = sorted(s for pair in codes for s in pair)
        assert (statuses.count(201), statuses.count(403)) == (10, 22), statuses
        assert clients[0].get("/v2/queues/w/stats").json()["messages"]["total"] == 10
        refused = clients[0].post("/v2/queues/w/messages", json=ONE).json()
        assert refused["quota"] == quota
    finally:
        for c in clients:
            c.close()
        service.stop()
