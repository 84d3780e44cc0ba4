"""`charon serve --workers W` (one SO_REUSEPORT socket per worker) against uvicorn's own `--workers W` (one
listening socket shared by every worker), in one run on one machine.

Starts both on a private redis-server each, the second as `uvicorn app.main:create_app --factory --workers W`
(what `uvicorn.run(..., workers=W)` does), and runs bench/loadgen.py's workloads against one then the other,
alternating which goes first, for --rounds rounds. Besides the rate it reports how the load spread over the
workers: the share of the workers' CPU the busiest one used, and the share of the load generator's
connections the busiest one held (sampled during the run from /proc: established sockets on the port, by the
worker that has them open).

Run: .venv/bin/python -m bench.studies.worker_sockets [--rounds 3] [--messages 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.compare import Service, loadgen
from bench.cpu import TICKS
from tests.acceptance.test_workers import connections, workers_of
from tests.servers import RedisServer, free_port

WORKLOADS = ("produce", "pipeline", "ping")


def service(name: str, redis_url: str, workers: int, log: Path) -> Service:
    port = free_port()
    env = dict(os.environ, CHARON_STORAGE_URI=redis_url, CHARON_PORT=str(port))
    quiet = ["--log-level", "warning"]
    if name == "per-worker":
        argv = [sys.executable, "-m", "app.cli", "serve", "--workers", str(workers), *quiet]
    else:
        app = ["app.main:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)]
        argv = [sys.executable, "-m", "uvicorn", *app, "--workers", str(workers), "--no-access-log", *quiet]
    return Service(name, argv, env, port, log)


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(svc: Service, workload: str, messages: int) -> dict[str, Any]:
    assert svc.proc is not None
    pids = workers_of(svc.proc.pid)
    samples: list[list[int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            counts = connections(svc.port, pids)
            if sum(counts) >= 16:  # the load generator's 16 connections are all open
                samples.append(counts)

    sampler = threading.Thread(target=sample)
    before = [cpu(p) for p in pids]
    sampler.start()
    options = ["--duration", "10"] if workload == "ping" else ["--messages", str(messages)]
    if workload == "produce":
        options = ["--messages", str(messages * 5)]
    try:
        result = loadgen(svc.url, workload, *options)
    finally:
        done.set()
        sampler.join()
    used = [cpu(p) - b for p, b in zip(pids, before, strict=True)]
    return {
        "rate": result["requests_per_s"] if workload == "ping" else result["msgs_per_s"],
        "busiest_cpu_share": max(used) / max(sum(used), 1e-9),
        "busiest_connection_share": statistics.median(max(c) / sum(c) for c in samples) if samples else None,
        "lost": result.get("lost", 0),
        "duplicated": result.get("duplicated", 0),
    }


def run(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, Any]]]]:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="charon-sockets-") as tmp:
        redis_a, redis_b = RedisServer().start(), RedisServer().start()
        try:
            own = service("per-worker", redis_a.url, args.workers, Path(tmp) / "per-worker.log")
            shared = service("shared", redis_b.url, args.workers, Path(tmp) / "shared.log")
            with own, shared:
                for r in range(args.rounds):
                    for workload in WORKLOADS:
                        for svc in [shared, own][:: 1 if r % 2 else -1]:
                            out = results.setdefault(workload, {}).setdefault(svc.name, [])
                            out.append(measure(svc, workload, args.messages))
        finally:
            redis_a.stop()
            redis_b.stop()
    return results


def report(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    def med(runs: list[dict[str, Any]], key: str) -> float:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else float("nan")

    lines = [
        "| workload | shared socket /s | per-worker sockets /s | per-worker / shared | busiest worker's CPU "
        "share, shared / per-worker | busiest worker's connections, shared / per-worker | lost, dup |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, by in results.items():
        shared, own = by["shared"], by["per-worker"]
        rate_s, rate_o = med(shared, "rate"), med(own, "rate")
        bad = sum(r["lost"] + r["duplicated"] for r in shared + own)
        lines.append(
            f"| {workload} | {rate_s:,.0f} | {rate_o:,.0f} | {rate_o / rate_s:.2f} | "
            f"{med(shared, 'busiest_cpu_share'):.0%} / {med(own, 'busiest_cpu_share'):.0%} | "
            f"{med(shared, 'busiest_connection_share'):.0%} / {med(own, 'busiest_connection_share'):.0%} | "
            f"{bad} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.studies.worker_sockets", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=20_000, help="messages a run (produce: 5x)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args(argv)
    results = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
