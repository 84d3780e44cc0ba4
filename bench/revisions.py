"""This checkout against an earlier revision of Charon, in one run on one machine: what a change costs on
the hot paths.

Starts both (the earlier one from a git worktree under .bench/, with its own code on PYTHONPATH and this
virtualenv), each as `charon serve --workers W` on a private redis-server, and runs bench/loadgen.py's
workloads against one then the other, alternating which goes first, for --rounds rounds. Besides msgs/s it
reads the CPU time each service's processes (workers and supervisor; not redis-server) used during the
workload, so it also reports server CPU per message, which a noisy machine disturbs less than rates.
`produce+key` is produce with an Idempotency-Key on every post (this checkout only, against its own
produce: the cost of the key).

Run: .venv/bin/python -m bench.revisions --base <commit> [--rounds 3] [--messages 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal, TypedDict

from bench.compare import ROOT, Service, loadgen
from bench.cpu import cpu_seconds
from tests.servers import RedisServer, free_port

WORKLOADS = ("produce", "pipeline", "dlq")


class Measured(TypedDict):
    """One workload run against one service."""

    msgs_per_s: float
    cpu_us_per_msg: float
    lost: int
    duplicated: int


Results = dict[str, dict[str, list[Measured]]]  # {workload: {"base" | "head": [a run each round]}}


def worktree(rev: str) -> Path:
    """A checkout of `rev` under .bench/ (made once per commit)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = ROOT / ".bench" / f"rev-{sha}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True)
    return path


def service(name: str, code: Path, redis_url: str, workers: int, log: Path) -> Service:
    port = free_port()
    env = dict(os.environ, CHARON_STORAGE_URI=redis_url, CHARON_PORT=str(port), PYTHONPATH=str(code))
    argv = [sys.executable, "-m", "app.cli", "serve", "--workers", str(workers), "--log-level", "warning"]
    return Service(name, argv, env, port, log, cwd=code)


def measure(svc: Service, workload: str, messages: int) -> Measured:
    assert svc.proc is not None
    keyed = workload == "produce+key"
    n = messages * 5 if workload.startswith("produce") else messages
    options = ["--messages", str(n), *(["--idempotency"] if keyed else [])]
    before = cpu_seconds(svc.proc.pid)
    result = loadgen(svc.url, "produce" if keyed else workload, *options)
    cpu = cpu_seconds(svc.proc.pid) - before
    rate = result["moves_per_s"] if workload == "dlq" else result["msgs_per_s"]
    done = result["dead_lettered"] if workload == "dlq" else n  # the dlq workload: messages moved
    return {
        "msgs_per_s": rate,
        "cpu_us_per_msg": cpu / max(done, 1) * 1e6,
        "lost": result.get("lost", 0),
        "duplicated": result.get("duplicated", 0),
    }


def run(args: argparse.Namespace) -> Results:
    base_code = worktree(args.base)
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="charon-revisions-") as tmp:
        base_redis, head_redis = RedisServer().start(), RedisServer().start()
        try:
            base = service("base", base_code, base_redis.url, args.workers, Path(tmp) / "base.log")
            head = service("head", ROOT, head_redis.url, args.workers, Path(tmp) / "head.log")
            with base, head:
                for r in range(args.rounds):
                    for workload in (*WORKLOADS, "produce+key"):
                        order = [head] if workload == "produce+key" else [base, head][:: 1 if r % 2 else -1]
                        for svc in order:
                            out = results.setdefault(workload, {}).setdefault(svc.name, [])
                            out.append(measure(svc, workload, args.messages))
        finally:
            base_redis.stop()
            head_redis.stop()
    return results


def median(runs: list[Measured], key: Literal["msgs_per_s", "cpu_us_per_msg"]) -> float:
    return statistics.median(r[key] for r in runs)


def _row(label: str, before: list[Measured], after: list[Measured]) -> str:
    rate_b, rate_a = median(before, "msgs_per_s"), median(after, "msgs_per_s")
    cpu_b, cpu_a = median(before, "cpu_us_per_msg"), median(after, "cpu_us_per_msg")
    bad = sum(r["lost"] + r["duplicated"] for r in before + after)
    return (
        f"| {label} | {rate_b:,.0f} | {rate_a:,.0f} | {rate_a / rate_b:.2f} | {cpu_b:.0f} | {cpu_a:.0f} | "
        f"{cpu_a / cpu_b:.2f} | {bad} |"
    )


def report(results: Results, base: str) -> str:
    lines = [
        f"| workload | base {base} msgs/s | this msgs/s | this / base | base CPU us/msg | this CPU us/msg | "
        "this / base | lost, dup |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_row(w, results[w]["base"], results[w]["head"]) for w in WORKLOADS]
    keyed = "produce with an Idempotency-Key (base: this produce without)"
    lines.append(_row(keyed, results["produce"]["head"], results["produce+key"]["head"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.revisions", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the earlier revision (a commit or ref)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=20_000, help="messages a run (produce: 5x)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the raw results to this file")
    args = p.parse_args(argv)
    results = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(report(results, args.base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
