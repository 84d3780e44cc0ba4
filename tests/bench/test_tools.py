"""The maintained benchmark tools (bench/: compare, loadgen, amqp, rabbitmq, cpu, report, request_cost,
layers, revisions, bare_app) still run, each in its smallest form, against a live `charon serve` on a
redis-server of its own: the pipeline `make bench` runs, with a few messages. Speeds are not asserted
(bench/README.md); that each run finishes, loses and duplicates nothing, and is tabulated, is. bench/studies/
is not run, only imported: a study that no longer imports (one did, unnoticed) fails here."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from bench import amqp, compare, cpu, layers, loadgen, rabbitmq, report, request_cost, revisions
from tests.servers import CharonProcess, RedisServer

pytestmark = pytest.mark.slow

STUDIES = Path(__file__).resolve().parents[2] / "bench" / "studies"


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def charon(redis: RedisServer) -> Iterator[CharonProcess]:
    service = CharonProcess(redis.url, namespace="bench-smoke").start()
    yield service
    service.stop()


def test_loadgen_runs_tabulated_by_report(charon: CharonProcess, redis: RedisServer, tmp_path: Path) -> None:
    """bench.loadgen in processes of their own through compare.generator, as `make bench` runs them (the
    servers' CPU read through bench.cpu), the bare app's ping through compare.bare_ping, then
    report.markdown and report.targets over what they produced."""
    assert charon.proc is not None
    assert redis.proc is not None
    system = compare.System(charon.url, [charon.proc.pid, redis.proc.pid], redis.url)
    runs = {
        "pipeline": ["--messages", "100"],
        "pipeline-bulk": ["--messages", "100"],
        "ping": ["--duration", "1"],
        "depth": ["--depth-big", "3000", "--depth-claims", "20"],
    }
    results: report.Results = {
        workload: {report.CHARON: compare.generator("bench.loadgen", system, workload, *options)}
        for workload, options in runs.items()
    }
    results["ping"][report.BARE] = compare.bare_ping(1, "1", tmp_path)
    for by_system in results.values():
        for r in by_system.values():
            assert "failed" not in r, r
            assert (r["lost"], r["duplicated"]) == (0, 0), r
    assert results["pipeline"][report.CHARON]["msgs_per_s"] > 0
    assert results["pipeline"][report.CHARON]["server_cpu_us_per_msg"] >= 0  # read from /proc: bench.cpu
    depth = results["depth"][report.CHARON]
    assert (depth["queued@1000"], depth["queued@3000"]) == (1000, 3000)  # every claim was released
    assert depth["p50_ratio"] > 0, depth
    assert depth["store_ratio"] > 0, depth

    measured = {label: value for label, value, _, _ in report.targets(results)}
    assert measured.keys() == {
        "GET /v2/ping req/s, Charon / bare FastAPI",
        "pipeline-bulk msgs/s / pipeline msgs/s (Charon)",
        "depth: claim p50 at the big depth / at 1k, taking turns (Charon)",
    }
    assert all(value is not None and value > 0 for value in measured.values()), measured
    table = report.markdown(results, "smoke")
    for row in ("| pipeline | charon |", "| pipeline-bulk | charon |", "| ping | bare_fastapi |"):
        assert row in table
    assert "the 1k queue after the big post / alone" in table


async def test_a_queue_counted_through_the_listing_as_its_stats_count_it(charon: CharonProcess) -> None:
    """What the bench counts a queue with when a peer's stats answer 5xx after every retry (Zaqar's, in the
    dlq run): the listing from `marker=0`, claimed messages included, as many as the stats say; and the
    report says the run fell back on it."""
    client = loadgen.Client(charon.url, "bench-count")
    await loadgen.post_all(client, "counted", 45, "r", 2, timed=False)
    conn = client.untimed()
    status, claimed = await loadgen.claim(conn, "counted")
    assert status == 201
    assert len(claimed["messages"]) == loadgen.CLAIM_LIMIT
    assert await loadgen.listed_total(conn, "counted") == await loadgen.stats_total(conn, "counted") == 45
    assert client.counted_by_listing.total() == 0  # Charon's stats answered
    conn.close()

    run = {"dlq": {report.ZAQAR: {"stats_counted_by_listing": 3, "lost": 0, "duplicated": 0}}}
    table = report.markdown(run, "dlq")
    assert "Stats unanswered" in table
    assert "dlq zaqar (3)" in table


def test_revisions_measure_and_report(charon: CharonProcess) -> None:
    """revisions.measure (compare.loadgen, then the service's CPU) on every workload revisions runs, and its
    table; the live service stands in for both revisions. Enough messages that the service's CPU is some
    ticks of /proc's clock (the table divides by it)."""
    assert charon.proc is not None
    runs = {w: [revisions.measure(charon, w, 200)] for w in (*revisions.WORKLOADS, "produce+key")}
    for (run,) in runs.values():
        assert run["msgs_per_s"] > 0
        assert run["cpu_us_per_msg"] > 0
        assert (run["lost"], run["duplicated"]) == (0, 0)
    table = revisions.report({w: {"base": r, "head": r} for w, r in runs.items()}, "HEAD")
    rows = table.splitlines()[2:]
    assert len(rows) == len(runs)  # each workload against "base", then produce+key against produce
    for workload, row in zip(revisions.WORKLOADS, rows, strict=False):  # a run against itself: 1.00, twice
        assert row.startswith(f"| {workload} |"), row
        assert row.count("| 1.00 |") == 2, row


def test_request_cost_child(redis: RedisServer) -> None:
    """request_cost's measurement, in a process of its own run from this checkout as --against runs it."""
    result = request_cost.run_in(request_cost.ROOT, redis.url, 20)
    assert result.keys() == {"post of 10 messages", "claim of 10", "delete with claim_id"}
    assert all(us > 0 for us in result.values())


def test_layers_divide_a_request(tmp_path: Path) -> None:
    """bench.layers in a process of its own (it wraps functions process-wide): each op's CPU split into the
    layers, which a public route (ping) and a queue route go through differently."""
    out = tmp_path / "layers.json"
    argv = [sys.executable, "-m", "bench.layers", "--requests", "100", "--rounds", "1", "--json", str(out)]
    done = subprocess.run(
        argv, cwd=request_cost.ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    noauth = json.loads(out.read_text())["noauth"]
    assert set(noauth) >= {*layers.LAYERS, layers.FRAMEWORK, layers.REDIS, "total (this process)"}
    for op in ("post of 10", "claim of 10", "delete with claim_id", "bulk delete of 10"):
        assert noauth["identity and policy"][op] > 0, op
        assert noauth["store call (Python)"][op] > 0, op
        assert sum(noauth[layer][op] for layer in layers.LAYERS) < noauth["total (this process)"][op], op
    assert noauth["redis-server"]["post of 10"] > 0
    assert (
        noauth["identity and policy"]["ping"] == noauth["store call (Python)"]["ping"] == 0
    )  # public, no store
    assert "| framework |" in done.stdout


def test_the_variants_run_beside_charon_and_are_reported_against_it(tmp_path: Path) -> None:
    """compare.services starts Charon and its variants (each on a redis-server of its own), and
    compare.run_variant_rounds runs produce on each, in turns, the encrypted one's queues made encrypting;
    the report gives each variant's cost against plain Charon's. The encrypted variant's store holds no
    clear body."""
    args = argparse.Namespace(
        quick=False, workloads=["produce"], messages=60, variants=list(compare.VARIANTS), variant_rounds=3
    )
    results: report.Results = {}
    with compare.services(tmp_path, 1, [], args.variants) as running:
        compare.run_variant_rounds(args, running, results)
        store = redis_lib.Redis.from_url(str(running[report.CHARON_ENCRYPTED].redis_url))
        bodies = [store.hget(key, "b") for key in store.scan_iter(match="*:m:*", count=1000)]
        assert len(bodies) == 60 * 5 * 3  # produce posts 5 times --messages, as make bench's main runs
        assert all(isinstance(b, bytes) and b.startswith(b"\x01") for b in bodies), bodies[:3]  # sealed
    rounds = results[report.VARIANT_ROUNDS]["produce"]
    assert rounds.keys() == {report.CHARON, report.CHARON_QUOTAS, report.CHARON_ENCRYPTED}
    assert all(len(cpus) == 3 for cpus in rounds.values()), rounds
    assert all(c is not None and c >= 0 for cpus in rounds.values() for c in cpus), rounds  # /proc's ticks
    measured = {label: value for label, value, _, _ in report.targets(results)}
    assert measured.keys() == {
        "produce server CPU/msg, Charon with quotas / without (median of 3 rounds)",
        "produce server CPU/msg, queues encrypted / not (median of 3 rounds)",
    }
    assert "| produce | charon quotas |" in report.markdown(results, "variants")


def test_command_lines() -> None:
    """What needs RabbitMQ or Zaqar (neither runs here): compare's arguments and its plan of runs, the AMQP
    load generator's arguments."""
    with pytest.raises(SystemExit) as ended:
        compare.main(["--help"])
    assert ended.value.code == 0
    with pytest.raises(SystemExit) as ended:
        compare.main(["--workloads", "produce,nonsense"])
    assert ended.value.code == 2
    with pytest.raises(SystemExit) as ended:
        compare.main(["--variants", "quotas,nonsense"])
    assert ended.value.code == 2
    assert compare.variants_of(compare.DEFAULT_VARIANTS) == list(compare.VARIANTS)
    assert compare.variants_of("none") == []

    args = argparse.Namespace(
        quick=True, workloads=list(compare.WORKLOADS), messages=0, depth_big=0, variants=[]
    )
    systems = {name: compare.System(f"http://{name}", []) for name in (report.CHARON, report.ZAQAR)}
    systems[report.RABBITMQ] = compare.System("amqp://rabbitmq", [])
    runs = list(compare.plan(args, systems))
    assert {module for _, _, module, _, _ in runs} == {"bench.loadgen", "bench.amqp"}
    assert {label for _, label, _, _, _ in runs} >= {
        report.CHARON,
        report.ZAQAR,
        report.RABBITMQ,
        report.LONG,
    }

    parsed = amqp.parser().parse_args(["--workload", "dlq", "--messages", "10", "--server-pids", "1,2"])
    assert cpu.pid_list(parsed.server_pids) == [1, 2]
    assert callable(rabbitmq.RabbitMQ)
    assert callable(rabbitmq.release)


@pytest.mark.parametrize("study", sorted(p.stem for p in STUDIES.glob("*.py") if p.stem != "__init__"))
def test_every_study_still_imports(study: str) -> None:
    importlib.import_module(f"bench.studies.{study}")
