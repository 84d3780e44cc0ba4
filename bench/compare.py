"""Charon (Redis driver) side by side with OpenStack Zaqar 23.0.1 and RabbitMQ in one run, one machine.

Starts, each on free loopback ports:
  - a private redis-server for Charon and another for Zaqar (no persistence);
  - Charon: `charon serve --workers W` (default 2: one per core of this machine);
  - Zaqar 23.0.1 from PyPI in its own virtualenv (.bench/zaqar-venv, made on first use), Redis message and
    management stores, `auth_strategy` empty, served by gunicorn with 4 workers (bench/README.md shows the
    exact configuration);
  - RabbitMQ (Debian's rabbitmq-server), a private broker (bench/rabbitmq.py);
  - for ping only: bench/bare_app.py, a bare FastAPI app served the way Charon is;
  - Charon twice more, as its variants (VARIANTS; --variants none leaves them out): `charon quotas`, every
    counted quota and request rate set far above what the bench uses (so each request is counted and none
    refused), and `charon encrypted`, a key set and each queue made with `_enable_encrypt_messages`. They
    and plain Charon run produce and pipeline in turns, --variant-rounds rounds (5), and the report gives
    each one's server CPU a message against plain Charon's of the same round (the median over the rounds).
Then runs each workload of bench/loadgen.py (HTTP) against Charon and Zaqar and of bench/amqp.py (aio-pika)
against RabbitMQ, one after the other, each in a fresh process that reads the servers' CPU around its timed
phase, and prints the results and the targets of issues 8 and 20 as Markdown (bench/report.py). A run that
fails is reported and the bench goes on; the exit code is 0 only when every target is met and no run failed.

Run: make bench            (or: .venv/bin/python -m bench.compare [--quick] [--peers zaqar] [--json out.json])
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.rabbitmq import RabbitMQ, release
from bench.report import (
    BARE,
    CHARON,
    CHARON_ENCRYPTED,
    CHARON_QUOTAS,
    CHARON_WS,
    LONG,
    RABBITMQ,
    RABBITMQ_ONE,
    SHORT,
    VARIANT_ROUNDS,
    ZAQAR,
    ZAQAR_SHORT,
    Results,
    markdown,
    targets,
)
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[1]
ZAQAR_VERSION = "23.0.1"
ZAQAR_VENV = ROOT / ".bench" / "zaqar-venv"
ZAQAR_WORKERS = 4
WORKLOADS = ("produce", "pipeline", "pipeline-bulk", "dlq", "depth", "ping", "idle")
PEERS = (ZAQAR, RABBITMQ)
RUN_TIMEOUT = 1800  # seconds a load generator run may take before it counts as failed
PING_HEADERS = {
    "Client-ID": "3381af92-2b9e-11e3-b191-71861300734c",
    "X-Project-ID": "bench",
}  # Zaqar wants both
HIGH = {"QUEUES": 10**6, "MESSAGES_PER_QUEUE": 10**9, "MESSAGE_BYTES": 10**15, "SUBSCRIPTIONS": 10**6}
HIGH |= {"READS_PER_SECOND": 10**6, "WRITES_PER_SECOND": 10**6}
BENCH_KEY = "bench:" + base64.b64encode(bytes(range(32))).decode()  # a key for the bench's throwaway data


@dataclass(frozen=True)
class Variant:
    """Charon with settings of a feature that costs per request on: its environment, and the metadata its
    queues are made with."""

    env: dict[str, str]
    queue_metadata: dict[str, Any] | None = None


VARIANTS = {
    CHARON_QUOTAS: Variant({f"CHARON_QUOTAS__{name}": str(value) for name, value in HIGH.items()}),
    CHARON_ENCRYPTED: Variant({"CHARON_ENCRYPTION__KEYS": BENCH_KEY}, {"_enable_encrypt_messages": True}),
}
VARIANT_WORKLOADS = ("produce", "pipeline")
VARIANT_ROUND_COUNT = 5
DEFAULT_VARIANTS = ",".join(name.removeprefix("charon ") for name in VARIANTS)


def variants_of(text: str) -> list[str]:
    """--variants ("quotas,encrypted", or "none") as the variants' labels."""
    return [f"charon {w.strip()}" for w in text.split(",") if w.strip() not in ("", "none")]


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


@dataclass
class System:
    """What a load generator is pointed at: its URL, the pids of its server processes (each with its
    children) for CPU accounting, and the store's URL for counting its commands; or why it did not start."""

    url: str
    pids: list[int]
    redis_url: str | None = None
    failed: str | None = None


def start_zaqar(stack: contextlib.ExitStack, workdir: Path) -> System:
    redis = RedisServer().start()
    stack.callback(redis.stop)
    home = workdir / "zaqar-home"  # oslo.config finds ~/zaqar.conf; HOME points the workers here
    home.mkdir()
    (home / "zaqar.conf").write_text(ZAQAR_CONF.format(uri=redis.url))
    gunicorn = zaqar_venv()
    port = free_port()
    argv = [str(gunicorn), "-w", str(ZAQAR_WORKERS), "-b", f"127.0.0.1:{port}"]
    argv.append("zaqar.transport.wsgi.app:app")
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    zaqar = stack.enter_context(Service("zaqar", argv, env, port, workdir / "zaqar.log"))
    return System(zaqar.url, [_pid(zaqar.proc), _pid(redis.proc)], redis.url)


def start_charon(
    stack: contextlib.ExitStack,
    workdir: Path,
    workers: int,
    name: str = CHARON,
    extra: dict[str, str] | None = None,
) -> System:
    redis = RedisServer().start()
    stack.callback(redis.stop)
    port = free_port()
    env = dict(os.environ, CHARON_STORAGE_URI=redis.url, CHARON_PORT=str(port), **(extra or {}))
    argv = [sys.executable, "-m", "app.cli", "serve", "--workers", str(workers), "--log-level", "warning"]
    log = workdir / f"{name.replace(' ', '-')}.log"
    charon = stack.enter_context(Service(name, argv, env, port, log))
    return System(charon.url, [_pid(charon.proc), _pid(redis.proc)], redis.url)


def start_rabbitmq(stack: contextlib.ExitStack) -> System:
    broker = stack.enter_context(RabbitMQ())
    print(f"compare: RabbitMQ {broker.version} at {broker.url}", flush=True)
    return System(broker.url, [broker.pid])


@contextlib.contextmanager
def services(
    workdir: Path, charon_workers: int, peers: list[str], variants: Sequence[str] = ()
) -> Iterator[dict[str, System]]:
    """Charon, each of `variants` of it and each of `peers` (zaqar, rabbitmq), running, stopped after
    whatever happened. One that does not start is a System with `failed` set: its runs are reported failed
    and the others go on."""
    with contextlib.ExitStack() as stack:
        running = {CHARON: start_charon(stack, workdir, charon_workers)}
        starters: dict[str, Callable[[], System]] = {
            ZAQAR: lambda: start_zaqar(stack, workdir),
            RABBITMQ: lambda: start_rabbitmq(stack),
        }
        for name in variants:
            starters[name] = functools.partial(
                start_charon, stack, workdir, charon_workers, name, VARIANTS[name].env
            )
        for peer in [*variants, *peers]:
            try:
                running[peer] = starters[peer]()
            except Exception as e:  # the bench goes on without it
                print(f"compare: {peer} did not start: {e}", flush=True)
                running[peer] = System("", [], failed=f"{peer} did not start: {str(e)[:200]}")
        yield running


def _pid(proc: subprocess.Popen[bytes] | None) -> int:
    assert proc is not None
    return proc.pid


def generator(module: str, system: System, workload: str, *options: str) -> dict[str, Any]:
    """One run of bench.loadgen or bench.amqp in a process of its own: its JSON, or {"failed": why} when it
    did not finish (the bench goes on; a target that needs the run is not met)."""
    if system.failed:
        return {"failed": system.failed}
    argv = [sys.executable, "-m", module, "--url", system.url, "--workload", workload, "--json", *options]
    argv += ["--server-pids", ",".join(map(str, system.pids))]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        print(f"  {workload:<13} {system.url:<40} FAILED: no result in {RUN_TIMEOUT} s", flush=True)
        return {"failed": f"no result in {RUN_TIMEOUT} s"}
    if not done.stdout.strip().startswith("{"):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        print(f"  {workload:<13} {system.url:<40} FAILED:\n{done.stderr[-3000:]}", flush=True)
        return {"failed": last.replace("|", "/")}
    result: dict[str, Any] = json.loads(done.stdout)
    print(f"  {workload:<13} {system.url:<40} done in {result.get('seconds', 0):.1f} s", flush=True)
    return result


def loadgen(url: str, workload: str, *options: str) -> dict[str, Any]:
    """bench.loadgen against `url` (no CPU accounting); raises when the run fails (bench/revisions.py)."""
    result = generator("bench.loadgen", System(url, []), workload, *options)
    if "failed" in result:
        raise RuntimeError(f"loadgen {workload} against {url} failed: {result['failed']}")
    return result


def bare_ping(workers: int, duration: str, workdir: Path) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.bare_app", "--port", str(port), "--workers", str(workers)]
    with Service("bare fastapi", argv, dict(os.environ), port, workdir / "bare.log") as bare:
        return generator("bench.loadgen", System(bare.url, [_pid(bare.proc)]), "ping", "--duration", duration)


def plan(
    args: argparse.Namespace, running: dict[str, System]
) -> Iterator[tuple[str, str, str, System, list[str]]]:
    """(workload, label, generator module, system, options) of every run, in order."""
    n, big = ("5000", "100000") if args.quick else (str(args.messages), str(args.depth_big))
    produced = str(int(n) * 5)  # posting is fast: more messages, so that the run lasts seconds
    duration = "3" if args.quick else "10"
    idle = ["--idle-seconds", "5", "--idle-messages", "500", "--idle-spread", "5"] if args.quick else []
    http = [name for name in (CHARON, ZAQAR) if name in running]
    amqp = running.get(RABBITMQ)
    for workload in args.workloads:
        if workload == "idle":
            charon = running[CHARON]
            options = [*idle, "--redis-url", str(charon.redis_url)]
            yield workload, LONG, "bench.loadgen", charon, [*options, "--poll", "long"]
            yield workload, SHORT, "bench.loadgen", charon, [*options, "--poll", "short"]
            if ZAQAR in running:  # Zaqar has no long polling: its short polling, for scale
                zaqar = running[ZAQAR]
                options = [*idle, "--redis-url", str(zaqar.redis_url), "--poll", "short"]
                yield workload, ZAQAR_SHORT, "bench.loadgen", zaqar, options
            continue
        options = {
            "produce": ["--messages", produced],
            "pipeline": ["--messages", n],
            "pipeline-bulk": ["--messages", n],
            "dlq": ["--messages", n],
            "depth": ["--depth-big", big],
            "ping": ["--duration", duration],
        }[workload]
        for name in http:
            yield workload, name, "bench.loadgen", running[name], options
        if workload in ("produce", "pipeline") and CHARON in running:  # beside HTTP: Zaqar's websocket
            yield workload, CHARON_WS, "bench.loadgen", running[CHARON], [*options, "--transport", "ws"]
        if amqp is not None and workload in ("produce", "pipeline", "dlq"):
            yield workload, RABBITMQ, "bench.amqp", amqp, options
            if workload == "produce":
                yield workload, RABBITMQ_ONE, "bench.amqp", amqp, ["--messages", produced]


def variant_rounds(
    args: argparse.Namespace, running: dict[str, System]
) -> Iterator[tuple[str, str, System, list[str]]]:
    """(workload, label, system, options) of the variants' runs: --variant-rounds rounds, each running
    plain Charon and each variant once on every workload of VARIANT_WORKLOADS, in an order turned by one
    each round (so no system always runs first or last on a machine whose load changes)."""
    if not args.variants:
        return
    n = "5000" if args.quick else str(args.messages)
    counts = {"produce": str(int(n) * 5), "pipeline": n}  # as the main runs'
    systems = [CHARON, *args.variants]
    for r in range(args.variant_rounds):
        for workload in [w for w in VARIANT_WORKLOADS if w in args.workloads]:
            for label in systems[r % len(systems) :] + systems[: r % len(systems)]:
                metadata = VARIANTS[label].queue_metadata if label in VARIANTS else None
                extra = ["--queue-metadata", json.dumps(metadata)] if metadata else []
                yield workload, label, running[label], ["--messages", counts[workload], *extra]


def run_variant_rounds(args: argparse.Namespace, running: dict[str, System], results: Results) -> None:
    """Each run of variant_rounds, its server CPU a message into results[VARIANT_ROUNDS] (None: failed)."""
    for workload, label, system, options in variant_rounds(args, running):
        cpu = generator("bench.loadgen", system, workload, *options).get("server_cpu_us_per_msg")
        rounds = results.setdefault(VARIANT_ROUNDS, {}).setdefault(workload, {})
        rounds.setdefault(label, []).append(cpu)


def run(args: argparse.Namespace) -> Results:
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="charon-bench-") as tmp:
        workdir = Path(tmp)
        with services(workdir, args.workers, args.peers, args.variants) as running:
            run_variant_rounds(args, running, results)  # first: every Charon's store as empty as the others'
            for workload, label, module, system, options in plan(args, running):
                amqp_workload = "produce-one" if label == RABBITMQ_ONE else workload
                results.setdefault(workload, {})[label] = generator(module, system, amqp_workload, *options)
        if "ping" in args.workloads:
            results["ping"][BARE] = bare_ping(args.workers, "3" if args.quick else "10", workdir)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="bench.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--peers", default=",".join(PEERS), help="peers beside Charon (default: zaqar,rabbitmq)")
    p.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help="Charon's variants beside it, for produce and pipeline (default: quotas,encrypted; none: no "
        "variant)",
    )
    p.add_argument(
        "--variant-rounds", type=int, default=VARIANT_ROUND_COUNT, help="rounds of the variants' runs (5)"
    )
    p.add_argument("--messages", type=int, default=20_000, help="per run (5x that for produce)")
    p.add_argument("--depth-big", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2, help="Charon worker processes (default 2)")
    p.add_argument(
        "--quick", action="store_true", help="5,000 messages, depth 100,000, 3 s of ping, 5 s of idle"
    )
    p.add_argument("--json", type=Path, help="also write every result to this file")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.peers = [w.strip() for w in args.peers.split(",") if w.strip()]
    args.variants = variants = variants_of(args.variants)
    if (
        unknown := set(args.workloads) - set(WORKLOADS)
        or set(args.peers) - set(PEERS)
        or set(variants) - set(VARIANTS)
    ):
        p.error(f"unknown workloads or peers: {', '.join(sorted(unknown))}")
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    command = " ".join(["python", "-m", "bench.compare", *(sys.argv[1:] if argv is None else argv)])
    peers = [f"Zaqar {ZAQAR_VERSION} with gunicorn -w {ZAQAR_WORKERS}"] if ZAQAR in args.peers else []
    if RABBITMQ in args.peers:
        with contextlib.suppress(RuntimeError):  # not installed: its runs say so
            peers.append(f"RabbitMQ {release()[0]} (quorum queues)")
    heading = (
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: `{command}`, Charon with {args.workers} workers"
        + "".join(f", {peer}" for peer in peers)
        + "."
    )
    print(markdown(results, heading))
    variant_cpus = [
        cpus for by_system in results.get(VARIANT_ROUNDS, {}).values() for cpus in by_system.values()
    ]
    failed = any(
        "failed" in r for w, by_system in results.items() if w != VARIANT_ROUNDS for r in by_system.values()
    ) or any(None in cpus for cpus in variant_cpus)
    return 0 if all(ok for *_, ok in targets(results)) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
