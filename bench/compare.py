"""Charon (Redis driver) side by side with OpenStack Zaqar 23.0.1 in one run, one machine, one load generator.

Starts, each on a free loopback port:
  - a private redis-server for Charon and another for Zaqar (no persistence);
  - Charon: `charon serve --workers W` (default 2: one per core of this machine);
  - Zaqar 23.0.1 from PyPI in its own virtualenv (.bench/zaqar-venv, made on first use), Redis message and
    management stores, `auth_strategy` empty, served by gunicorn with 4 workers (bench/README.md shows the
    exact configuration);
  - for ping only: bench/bare_app.py, a bare FastAPI app served the way Charon is.
Then runs each workload of bench/loadgen.py (a fresh process per run) against Charon and against Zaqar, one
after the other, and prints the results and the ratios against the targets of issue 8 as Markdown.

Run: make bench            (or: .venv/bin/python -m bench.compare [--quick] [--json results.json])
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]
ZAQAR_VERSION = "23.0.1"
ZAQAR_VENV = ROOT / ".bench" / "zaqar-venv"
ZAQAR_WORKERS = 4
PING_HEADERS = {
    "Client-ID": "3381af92-2b9e-11e3-b191-71861300734c",
    "X-Project-ID": "bench",
}  # Zaqar wants both
ZAQAR_CONF = """\
[DEFAULT]
auth_strategy =
debug = False

[drivers]
transport = wsgi
message_store = redis
management_store = redis

[drivers:message_store:redis]
uri = {uri}

[drivers:management_store:redis]
uri = {uri}
"""


def zaqar_venv() -> Path:
    """The virtualenv with Zaqar and gunicorn, made on first use (about a minute, from PyPI)."""
    gunicorn = ZAQAR_VENV / "bin" / "gunicorn"
    if not gunicorn.exists():
        print(f"compare: installing zaqar=={ZAQAR_VERSION} and gunicorn in {ZAQAR_VENV}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(ZAQAR_VENV)], check=True)
        pip = [str(ZAQAR_VENV / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, f"zaqar=={ZAQAR_VERSION}", "gunicorn", "redis"], check=True)
    return gunicorn


class Service:
    """A server process on a free port, ready once GET /v2/ping answers 204."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], port: int, log: Path, cwd: Path = ROOT
    ) -> None:
        self.name, self.argv, self.env, self.port, self.log, self.cwd = name, argv, env, port, log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Service:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/v2/ping", headers=PING_HEADERS, timeout=2).status_code == 204:
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            time.sleep(0.2)
        self.__exit__()  # `with` does not call __exit__ when __enter__ raises
        raise RuntimeError(f"{self.name} did not start; see {self.log}")

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextlib.contextmanager
def services(workdir: Path, charon_workers: int) -> Iterator[dict[str, Service]]:
    charon_redis, zaqar_redis = RedisServer().start(), RedisServer().start()
    try:
        home = workdir / "zaqar-home"  # oslo.config finds ~/zaqar.conf; HOME points the workers here
        home.mkdir()
        (home / "zaqar.conf").write_text(ZAQAR_CONF.format(uri=zaqar_redis.url))
        gunicorn = zaqar_venv()
        port = free_port()
        zaqar = Service(
            "zaqar",
            [
                str(gunicorn),
                "-w",
                str(ZAQAR_WORKERS),
                "-b",
                f"127.0.0.1:{port}",
                "zaqar.transport.wsgi.app:app",
            ],
            {"PATH": os.environ["PATH"], "HOME": str(home)},
            port,
            workdir / "zaqar.log",
        )
        port = free_port()
        charon_env = dict(os.environ, CHARON_STORAGE_URI=charon_redis.url, CHARON_PORT=str(port))
        charon_argv = [sys.executable, "-m", "app.cli", "serve", "--workers", str(charon_workers)]
        charon = Service(
            "charon", [*charon_argv, "--log-level", "warning"], charon_env, port, workdir / "charon.log"
        )
        with zaqar, charon:
            yield {"charon": charon, "zaqar": zaqar}
    finally:
        charon_redis.stop()
        zaqar_redis.stop()


def loadgen(url: str, workload: str, *options: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.loadgen", "--url", url, "--workload", workload, "--json", *options]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if not done.stdout.strip().startswith("{"):
        raise RuntimeError(f"loadgen {workload} against {url} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    print(f"  {workload:<8} {url:<24} done in {result.get('seconds', 0):.1f} s", flush=True)
    return result


def bare_ping(workers: int, duration: str, workdir: Path) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.bare_app", "--port", str(port), "--workers", str(workers)]
    with Service("bare fastapi", argv, dict(os.environ), port, workdir / "bare.log") as bare:
        return loadgen(bare.url, "ping", "--duration", duration)


def run(args: argparse.Namespace) -> dict[str, Any]:
    n, big = ("5000", "100000") if args.quick else (str(args.messages), str(args.depth_big))
    produced = str(int(n) * 5)  # posting is fast: more messages, so that the run lasts seconds
    duration = "3" if args.quick else "10"
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="charon-bench-") as tmp:
        workdir = Path(tmp)
        with services(workdir, args.workers) as running:
            for workload in args.workloads:
                options = {
                    "produce": ["--messages", produced],
                    "pipeline": ["--messages", n],
                    "dlq": ["--messages", n],
                    "depth": ["--depth-big", big],
                    "ping": ["--duration", duration],
                }[workload]
                for name in ("charon", "zaqar"):
                    results.setdefault(workload, {})[name] = loadgen(running[name].url, workload, *options)
        if "ping" in args.workloads:
            results["ping"]["bare_fastapi"] = bare_ping(args.workers, duration, workdir)
    return results


def ratios(results: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """Each target of issue 8 that the results measure: (what, measured value, goal, whether met)."""
    rows: list[tuple[str, float, str, bool]] = []

    def get(workload: str, who: str, key: str) -> float | None:
        value = results.get(workload, {}).get(who, {}).get(key)
        return float(value) if value is not None else None

    for workload, key, label, target in (
        ("produce", "msgs_per_s", "produce msgs/s, Charon / Zaqar", 3.0),
        ("pipeline", "msgs_per_s", "pipeline consume msgs/s, Charon / Zaqar", 5.0),
        ("dlq", "moves_per_s", "dlq moves/s, Charon / Zaqar", 5.0),
    ):
        c, z = get(workload, "charon", key), get(workload, "zaqar", key)
        if c is not None and z:
            rows.append((label, c / z, f">= {target}", c / z >= target))
    if (t := get("dlq", "charon", "dlq_claimable_after_s")) is not None:
        rows.append(("dlq: seconds until dead-lettered messages are claimable (Charon)", t, "< 1", t < 1))
    if (r := get("depth", "charon", "p50_ratio")) is not None:
        rows.append(("depth: claim p50 at the big depth / at 1k (Charon)", r, "<= 1.5", r <= 1.5))
    c, b = get("ping", "charon", "requests_per_s"), get("ping", "bare_fastapi", "requests_per_s")
    if c is not None and b:
        rows.append(("GET /v2/ping req/s, Charon / bare FastAPI", c / b, ">= 0.8", c / b >= 0.8))
    return rows


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    command = " ".join(["python", "-m", "bench.compare", *sys.argv[1:]])
    out = [
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: `{command}`, "
        f"Charon with {args.workers} workers, Zaqar {ZAQAR_VERSION} with gunicorn -w {ZAQAR_WORKERS}.",
        "",
        "| target | measured | goal | met |",
        "| --- | --- | --- | --- |",
    ]
    out += [
        f"| {label} | {value:.2f} | {goal} | {'yes' if ok else '**no**'} |"
        for label, value, goal, ok in ratios(results)
    ]
    out += [
        "",
        "| workload | server | msgs/s | req/s | lost | dup | p50 ms by request | non-2xx | 503 retried |",
        "| --- " * 9 + "|",
    ]
    for workload, by_server in results.items():
        for server, r in by_server.items():
            rate = r.get("msgs_per_s") or r.get("moves_per_s")
            p50 = ", ".join(f"{k} {v['p50_ms']:.1f}" for k, v in r["requests"].items())
            bad = {k: v["non_2xx"] for k, v in r["requests"].items() if v["non_2xx"]}
            retried = r.get("retried_503") or "-"
            rate_text = f"{rate:,.0f}" if rate else "-"
            reqs_text = f"{r['requests_per_s']:,.0f}" if r.get("requests_per_s") else "-"
            dup = f"{r.get('duplicated', '-')}"
            if r.get("duplicated_by_post_retry"):
                dup += f" (+{r['duplicated_by_post_retry']} after a post retried on 503)"
            out.append(
                f"| {workload} | {server} | {rate_text} | {reqs_text} | "
                f"{r.get('lost', '-')} | {dup} | {p50} | {bad or '-'} | {retried} |"
            )
    if any(r.get("retried_503") for by_server in results.values() for r in by_server.values()):
        out += [
            "",
            "503 retried: requests answered 503 and tried again after a pause, by request type, set-up "
            "and read-back included (non-2xx counts the timed requests' answers, each 503 among them). "
            "A copy beyond the first of a message whose post was retried on a 503 is in brackets in dup, "
            "not in its count (see bench/README.md).",
        ]
    extra = results.get("dlq", {})
    if extra:
        out.append("")
        for server, r in extra.items():
            out.append(
                f"- dlq, {server}: dead-lettered messages claimable after {r.get('dlq_claimable_after_s')} s"
            )
    depth = results.get("depth", {})
    for server, r in depth.items():
        p50s = {k: round(v, 2) for k, v in r.items() if k.startswith("claim_p50_ms@")}
        out.append(f"- depth, {server}: claim p50 ms {p50s}, ratio {r.get('p50_ratio', 0):.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workloads", default="produce,pipeline,dlq,depth,ping")
    p.add_argument("--messages", type=int, default=20_000, help="per run (5x that for produce)")
    p.add_argument("--depth-big", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2, help="Charon worker processes (default 2)")
    p.add_argument("--quick", action="store_true", help="5,000 messages, depth 100,000, 3 s of ping")
    p.add_argument("--json", type=Path, help="also write every result to this file")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results, args))
    return 0 if all(ok for *_, ok in ratios(results)) else 1


if __name__ == "__main__":
    sys.exit(main())
