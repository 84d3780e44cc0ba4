"""`charon serve --workers N`: uvicorn's own supervisor (`uvicorn.supervisors.Multiprocess`: it starts the
workers, replaces one that dies, stops them all when one fails at start or on SIGTERM/SIGINT, restarts them
on SIGHUP), with one change. Uvicorn binds one socket and every worker accepts from it, so whichever worker
is idle takes the next connection and kept-alive connections pile up on one of them; here each worker binds
its own socket on the same port with SO_REUSEPORT, and the kernel spreads connections evenly over them
(bench/README.md, "One socket per worker"). Also, a worker never outlives the supervisor, and every worker's
Prometheus values meet in one private directory (`share_metrics`), from which a scrape of any worker adds
them up (service/metrics.py)."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import cast

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from app.embedded import die_with_parent

PARENT_GONE_GRACE_S = 0.8  # a worker whose supervisor died finishes its requests this long, then exits
START_GRACE_S = 120.0  # a starting worker may take this long to answer its first health check
logger = logging.getLogger("uvicorn.error")


def run_workers(config: uvicorn.Config) -> int:
    """Serve `config.app` with `config.workers` processes until SIGTERM/SIGINT (then 0), or until a worker
    fails at start (then 1: the next one would fail the same way)."""
    try:  # bound without SO_REUSEPORT, this fails if anything already listens on the port
        socket.create_server((config.host, config.port)).close()
    except OSError as exc:
        logger.error("Cannot listen on %s:%d: %s", config.host, config.port, exc)
        return 1
    logger.info("Charon running on http://%s:%d, one socket per worker", config.host, config.port)
    own = cast(socket.socket, OwnSocket(config.host, config.port))  # uvicorn needs a socket only in workers
    supervisor = Supervisor(config, sockets=[own])
    supervisor.run()
    return 1 if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0


class OwnSocket:
    """Stands in for the socket uvicorn's supervisor hands every worker. A worker is a spawned process that
    receives it pickled, and unpickling it calls `worker_socket` there: each worker (a replacement too) binds
    its own socket as it starts."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def __reduce__(self) -> tuple[object, tuple[str, int, int]]:
        return worker_socket, (self.host, self.port, os.getpid())


def worker_socket(host: str, port: int, supervisor: int) -> socket.socket:
    """In a starting worker: its listening socket on host:port (SO_REUSEPORT). The worker never outlives
    `supervisor`: the kernel sends it SIGTERM when the supervisor dies, even by kill -9 (uvicorn then finishes
    its requests), and a watchdog ends it PARENT_GONE_GRACE_S later whatever it is doing, so no orphan keeps
    the port answering 503 (an embedded store dies with the supervisor)."""
    die_with_parent(signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the line above
        os._exit(1)
    threading.Thread(target=_exit_with, args=(supervisor,), name="charon-parent-watch", daemon=True).start()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # uvicorn's supervisor stops, as for any worker that cannot start
        logger.error("Cannot listen on %s:%d: %s", host, port, exc)
        sys.exit(STARTUP_FAILURE)
    return sock


def _exit_with(supervisor: int) -> None:
    while os.getppid() == supervisor:
        time.sleep(0.1)
    time.sleep(PARENT_GONE_GRACE_S)
    os._exit(1)


METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"
METRICS_PREFIX = "charon-metrics-"  # then the supervisor's PID


def share_metrics(workers: int | None) -> str | None:
    """With several processes (`workers`, else CHARON_WORKERS, above one; or a notifier process of its own,
    CHARON_NOTIFICATIONS__PROCESS without __EXTERNAL), point prometheus-client at a new private directory
    (mode 0700, empty) for every process of this `charon serve`, removed when it exits; before anything
    imports prometheus-client, which decides then where values live. A PROMETHEUS_MULTIPROC_DIR already set is
    not used: another service's files there would be added to ours. A service killed with -9 cannot remove its
    directory: the next one to start removes those whose service is gone (the directory's name holds its PID).
    With one process, values stay in memory: counting a request costs a third as much (bench/README.md, "What
    GET /metrics costs")."""
    os.environ.pop(METRICS_DIR, None)
    from app.settings import Settings

    try:
        settings = Settings()
    except ValueError:  # the configuration's errors are told when `charon serve` reads it next
        return None
    if workers is None:
        workers = settings.workers
    if workers <= 1 and not settings.notifications.own_process:
        return None
    _remove_stale(Path(tempfile.gettempdir()))
    path = tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-")
    os.environ[METRICS_DIR] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _remove_stale(parent: Path) -> None:
    for stale in parent.glob(f"{METRICS_PREFIX}*-*"):
        pid = stale.name.removeprefix(METRICS_PREFIX).split("-", 1)[0]
        try:
            owner = stale.stat().st_uid
        except OSError:  # removed meanwhile (another service starting at once), or not a directory to read
            continue
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and owner == os.getuid():
            shutil.rmtree(stale, ignore_errors=True)


class Supervisor(Multiprocess):
    """uvicorn's supervisor, which also tells prometheus-client of every worker that is gone (died, or
    replaced on SIGHUP), so that the gauges counted over live workers leave it out; and which gives a
    starting worker time to start.

    A worker answers uvicorn's health check (a ping on a pipe, every half second, answered within
    `timeout_worker_healthcheck`, 5 s) only once it has imported the app. On a CPU starved by other work that
    took longer, and uvicorn killed the worker as hung and started another, which fared no better: the
    service never came up. Here a worker is health-checked only once it has answered one ping (sent once,
    and its answer looked for without waiting); until then it is left to start while its process runs, for
    up to START_GRACE_S."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        self._pinged: dict[int, float] = {}  # starting workers (by PID): when their first ping was sent
        self._answered: set[int] = set()

    def keep_subprocess_alive(self) -> None:
        before = self._pids()
        starting = [p for p in self.processes if self._starting(p)]
        if starting:  # uvicorn's check, over the started ones alone (it replaces a worker by its index)
            everyone = self.processes
            self.processes = [p for p in everyone if p not in starting]
            try:
                super().keep_subprocess_alive()
            finally:
                self.processes = [p if p in starting else self.processes.pop(0) for p in everyone]
        else:
            super().keep_subprocess_alive()
        self._gone(before)
        alive = self._pids()
        self._answered &= alive
        self._pinged = {pid: at for pid, at in self._pinged.items() if pid in alive}

    def _starting(self, process: Process) -> bool:
        """Whether `process` is a worker still starting: running, not yet answered, within its grace."""
        pid = process.pid
        if pid is None or pid in self._answered or not process.process.is_alive():
            return False
        if pid not in self._pinged:
            self._pinged[pid] = time.monotonic()
            process.parent_conn.send(b"ping")
        if process.parent_conn.poll(0):
            process.parent_conn.recv()  # its answer: started
            self._answered.add(pid)
            return False
        return time.monotonic() - self._pinged[pid] < START_GRACE_S

    def restart_all(self) -> None:
        before = self._pids()
        super().restart_all()
        self._gone(before)

    def _pids(self) -> set[int]:
        return {p.pid for p in self.processes if p.pid is not None}

    def _gone(self, before: set[int]) -> None:
        if METRICS_DIR not in os.environ:
            return
        from prometheus_client import multiprocess

        for pid in before - self._pids():
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
