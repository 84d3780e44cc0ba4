"""`charon serve` runs the service; `charon openapi` prints the published API as YAML; `charon insights`
analyses dead letters with PySpark and `charon export` writes a DLQ as JSON Lines (pipeline/)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

from app.settings import Settings
from core.errors import CharonError

APP = "app.main:create_app"
STARTUP_S = 10.0  # a worker that fails this soon after its start is not restarted (supervise)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.embedded import EmbeddedRedis

    settings = Settings()
    embedded = None
    if settings.store_uri() is None:
        # Started here, once, so that every worker process shares the one embedded store.
        embedded = EmbeddedRedis(settings.data_dir, settings.redis_server)
        try:
            os.environ["CHARON_STORAGE_URI"] = embedded.start()
        except CharonError as exc:
            print(f"charon: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"charon: embedded redis-server at {embedded.uri} (AOF in {embedded.data_dir})", flush=True)
    # uvicorn re-raises SIGTERM after its graceful shutdown; turning it into SystemExit lets `finally` stop
    # the embedded store.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host, port = args.host or settings.host, args.port or settings.port
    workers = args.workers or settings.workers
    try:
        if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
            return supervise(workers, host, port, args.log_level, APP)
        uvicorn.run(
            APP,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=args.log_level,
            access_log=False,
        )
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


def supervise(workers: int, host: str, port: int, log_level: str, app: str) -> int:
    """Run `workers` uvicorn processes, each with its own listening socket on host:port (SO_REUSEPORT), so
    that the kernel spreads connections evenly over them. With uvicorn's one shared socket, whichever worker
    was idle accepted the next connection, and a benchmark's kept-alive connections ended up 4:1 on one
    worker of two (bench/README.md). A worker that dies is started again, unless it exited with an error
    within STARTUP_S of its start (then all stop, exit code 1, as uvicorn does); SIGTERM/SIGINT stop all.
    `app` is "module:attribute", a factory when the attribute's name starts with "create_"."""
    probe = socket.create_server((host, port))  # without SO_REUSEPORT: fails if anything already listens
    probe.close()
    context = multiprocessing.get_context("spawn")

    started: dict[int | None, float] = {}
    parent = os.getpid()

    def start() -> multiprocessing.process.BaseProcess:
        process = context.Process(target=run_worker, args=(host, port, log_level, app, parent), daemon=False)
        process.start()
        started[process.pid] = time.monotonic()
        return process

    processes = [start() for _ in range(workers)]
    stopping, failed = False, False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        time.sleep(0.2)
        for i, process in enumerate(processes):
            if process.is_alive() or stopping:
                continue
            if (process.exitcode or 0) > 0 and time.monotonic() - started[process.pid] < STARTUP_S:
                # it gave up at start (bad settings, a store it cannot open): so would the next one; a worker
                # killed by a signal (exit code < 0) is restarted whenever it dies
                print(f"charon: worker {process.pid} failed at start ({process.exitcode})", flush=True)
                stopping = failed = True
                break
            print(f"charon: worker {process.pid} exited ({process.exitcode}); starting one", flush=True)
            processes[i] = start()
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: uvicorn finishes its requests and runs the lifespan shutdown
    for process in processes:
        process.join(30)
    return 1 if failed else 0


PARENT_GONE_GRACE_S = 0.8  # a worker whose parent died finishes its requests this long, then exits


def run_worker(host: str, port: int, log_level: str, app: str, parent: int) -> None:
    """One worker of `supervise`: its own SO_REUSEPORT socket, one uvicorn server. It never outlives the
    supervisor `parent`: the kernel sends it SIGTERM when the parent dies, even by kill -9 (uvicorn then
    finishes its requests), and a watchdog ends it PARENT_GONE_GRACE_S later whatever it is doing, so no
    orphan keeps the port answering 503 (its embedded store died with the parent)."""
    import uvicorn

    from app.embedded import die_with_parent

    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        sys.exit(1)
    threading.Thread(target=_exit_with, args=(parent,), name="charon-parent-watch", daemon=True).start()

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    factory = app.rpartition(":")[2].startswith("create_")
    config = uvicorn.Config(app, factory=factory, log_level=log_level, access_log=False, host=host, port=port)
    uvicorn.Server(config).run(sockets=[sock])


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.1)
    time.sleep(PARENT_GONE_GRACE_S)
    os._exit(1)


def openapi(_: argparse.Namespace) -> int:
    import yaml

    from app.main import create_app

    sys.stdout.write(yaml.safe_dump(create_app().openapi(), sort_keys=False, allow_unicode=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="charon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="run the HTTP API (uvicorn)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=serve)
    sub.add_parser("openapi", help="print the OpenAPI document as YAML").set_defaults(func=openapi)
    from app import insights

    p = sub.add_parser("insights", help="why messages died: a PySpark job over dead letters (pipeline/)")
    insights.add_insights_arguments(p)
    p.set_defaults(func=insights.run_insights)
    p = sub.add_parser("export", help="a DLQ's messages as JSON Lines, with their provenance")
    insights.add_export_arguments(p)
    p.set_defaults(func=insights.run_export)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
