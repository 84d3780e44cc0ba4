"""DLQ insights on 1,000,000 dead letters: Spark local[1] and local[2], cold and warm, against one Python
process computing the same aggregates (pipeline/purepython.py), all reading the same redis-server.

The dead letters are made by the Redis driver itself (storage/redis/store.py), in its own layout, through
the calls the API makes, in batches far larger than the API allows: three DLQs of one project, fed by source
queues whose `_max_claim_count` is 1, so that a claim then a release moves a whole batch (max_claims), or
whose consumer rejects each claimed message (rejected); bodies of the scenario's kinds (tests/pipeline/
scenario.py) with ids and numbers varying, dead-lettered over 12 hours of a manual clock. Each Spark master
runs in its own process: "cold" is its first job (JVM start, then the first read, with Python workers and JIT
still starting), "warm" the same job again in the same session. The pure-Python pass reads with the same
export (storage/redis/export.py, pages to Arrow by pipeline/records.py) and aggregates in memory. Every run's
tables are checked equal to the pure-Python ones.

Run: .venv/bin/python -m bench.studies.insights [--messages N]   (prints Markdown; --json for the raw numbers)
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.clock import ManualClock
from core.limits import Limits
from core.metadata import parse_policy
from core.models import NewMessage, QueueRef, Rejection
from pipeline import DEFAULT_MAX_BODY_BYTES, purepython
from pipeline.datasource import plan
from pipeline.load import DeadLetterStore
from pipeline.records import batch
from storage.redis.store import RedisStore
from tests.servers import RedisServer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PROJECT = "bench"
DLQS = {"orders.dlq": ("orders",), "payments.dlq": ("payments",), "notify.dlq": ("emails", "sms")}
SPAN_MS = 12 * 3_600_000
BATCH = 5_000
TTL_S = 1_209_600


def body(rng: random.Random, source: str, n: int) -> tuple[Any, str]:
    """A body like the scenario's for `source`, and the reason it died."""
    hexid = f"{rng.getrandbits(48):012x}"
    roll = rng.random()
    if source == "orders":
        if roll < 0.05:
            return {"order_id": "n/a", "items": None}, "max_claims"  # a poison message, again and again
        if roll < 0.07:
            return rng.choice(["order please", [n, "rush"], n]), "max_claims"
        return {
            "order_id": n,
            "customer": {
                "id": str(uuid.UUID(int=rng.getrandbits(128))),
                "tier": rng.choice(["gold", "basic"]),
            },
            "items": [{"sku": f"SKU-{rng.randint(1, 40)}", "qty": rng.randint(1, 3)}],
            "error": f"inventory service timeout after {rng.choice([30, 60])}s (request {hexid})",
        }, "max_claims"
    if source == "payments":
        b: dict[str, Any] = {
            "payment_id": f"pay_{hexid}",
            "amount": rng.randint(5, 500) + 0.99,
            "currency": "EUR",
        }
        if roll < 0.5:
            b["error"] = f"card declined: code {rng.choice([5, 51, 54])} at 0x{hexid[:6]}"
            return b, "max_claims"
        b["exception"] = {
            "type": "KeyError",
            "message": f"'iban' missing for account {rng.randint(1, 99999)}",
        }
        return b, rng.choice(["max_claims", "rejected"])
    return {
        "to": f"user{n}@example.com",
        "template": "welcome",
        "reason": f"mailbox full (552 5.2.2) for user{n}",
    }, rng.choice(["max_claims", "expired"])


def fill(url: str, messages: int, namespace: str, seed: int = 1) -> None:
    asyncio.run(_fill(url, messages, namespace, seed))


async def _fill(url: str, messages: int, namespace: str, seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock(int(time.time() * 1000) - SPAN_MS)
    store = RedisStore.from_url(url, namespace=namespace, clock=clock)
    for dlq, sources in DLQS.items():
        for source in sources:
            meta = {"_max_claim_count": 1, "_dead_letter_queue": dlq}
            policy = parse_policy(meta, Limits(), queue=source)
            await store.create_queue(QueueRef(PROJECT, source), metadata=meta, policy=policy)
    dlqs = list(DLQS)
    step_s = SPAN_MS / 1000 * BATCH / messages
    try:
        for done in range(0, messages, BATCH):
            groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
            for n in range(done, min(done + BATCH, messages)):
                dlq = dlqs[n % len(dlqs)]
                source = DLQS[dlq][n % len(DLQS[dlq])]
                b, reason = body(rng, source, n)
                groups[(source, "rejected" if reason == "rejected" else "max_claims")].append(b)
            posted = clock.now_ms()
            for (source, _), bodies in groups.items():  # a source's groups die in this order too
                q = QueueRef(PROJECT, source)
                await store.post_messages(
                    q,
                    [NewMessage(b, ttl=TTL_S) for b in bodies],
                    client_id="bench",
                    default_ttl=TTL_S,
                    default_delay=0,
                    body_size=0,
                )
            # each group dies a while after the batch was posted (the time to death)
            for (source, reason), bodies in groups.items():
                clock.advance(rng.uniform(0, step_s / (2 * len(groups))))
                await _die(store, QueueRef(PROJECT, source), reason, len(bodies))
            clock.advance(max(0.0, step_s - (clock.now_ms() - posted) / 1000))
    finally:
        await store.aclose()


WORKERS = tuple(str(uuid.UUID(int=i)) for i in range(1, 4))  # the consumers' Client-IDs, one a batch


async def _die(store: RedisStore, q: QueueRef, reason: str, n: int) -> None:
    """Claim the queue's `n` messages (as one of WORKERS); release them (each used its one claim:
    max_claims) or reject each."""
    worker = WORKERS[n % len(WORKERS)]
    result = await store.claim(q, ttl=3600, grace=0, limit=n, client_id=worker)
    claim = result.claim
    assert claim is not None, q
    assert len(claim.messages) == n, (q, n)
    if reason == "max_claims":
        await store.release_claim(q, claim.id, delay=0)
        return
    rejection = Rejection(reason="invalid", description="'iban' missing")
    for i in range(0, n, 200):
        await asyncio.gather(
            *(
                store.dead_letter_message(q, m.id, claim_id=claim.id, rejection=rejection, client_id=worker)
                for m in claim.messages[i : i + 200]
            )
        )


def pure_python(
    url: str, namespace: str
) -> tuple[dict[str, float], dict[str, list[dict[str, Any]]], dict[tuple[str, ...], dict[str, list[float]]]]:
    """Timings, the tables, and each by_source group's values sorted (for the percentiles' ranks)."""
    started = time.perf_counter()
    export = DeadLetterStore(url, namespace).open()
    records = []
    for s in plan(export.extents(PROJECT, None), slices=1):
        for page in export.read(s):
            records += batch(page, max_body_bytes=DEFAULT_MAX_BODY_BYTES).to_pylist()
    read = time.perf_counter() - started
    tables = purepython.analyse(records)
    timings = {"read_s": read, "total_s": time.perf_counter() - started}
    values: dict[tuple[str, ...], dict[str, list[float]]] = defaultdict(lambda: {"claims": [], "ttd": []})
    for r in records:
        group = values[(r["project"], r["queue"], r["source_queue"], r["reason"])]
        group["claims"].append(r["dl_claim_count"])
        group["ttd"].append((r["dead_lettered_at_ms"] - r["first_enqueued_at_ms"]) / 1000.0)
    return timings, tables, {k: {c: sorted(v) for c, v in g.items()} for k, g in values.items()}


PERCENTILES = {"claim_count_p50": ("claims", 0.5), "ttd_p50_s": ("ttd", 0.5), "ttd_p90_s": ("ttd", 0.9)}


def compared(
    tables: dict[str, list[dict[str, Any]]],
    expected: dict[str, list[dict[str, Any]]],
    values: dict[tuple[str, ...], dict[str, list[float]]],
) -> tuple[bool, float]:
    """Whether Spark's tables equal the pure-Python ones, by_source's percentiles aside, and the largest
    distance, as a share of its group, of one of Spark's percentiles from the exact rank: percentile_approx
    is exact up to 5,000 values a group and within count / 10,000 ranks above (analysis.PERCENTILE_ACCURACY),
    the groups here are larger."""
    expected = json.loads(json.dumps(expected, default=str))
    worst = 0.0

    def aside(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in PERCENTILES} for r in rows]

    for row in tables["by_source"]:
        group = values[(row["project"], row["dlq"], row["source_queue"], row["reason"])]
        for column, (kind, p) in PERCENTILES.items():
            ordered, target = group[kind], math.ceil(p * len(group[kind]))
            # the ranks Spark's value holds (1-based; a value repeated holds several): how far the target
            # rank is from them
            value = row[column]
            first, last = bisect.bisect_left(ordered, value) + 1, bisect.bisect_right(ordered, value)
            worst = max(worst, max(0, first - target, target - last) / len(ordered))
    same = all(
        aside(tables[n]) == aside(expected[n]) if n == "by_source" else tables[n] == expected[n]
        for n in expected
    )
    return same, worst


def spark_run(url: str, namespace: str, master: str, alternate: int = 0) -> dict[str, Any]:
    """In this process: start a session on `master`, run the job twice (the analysis, then the outputs
    written as `charon insights` writes them, into a temporary directory); timings and the tables. Then
    `alternate` rounds of the pure-Python pass and the warm job, one after the other in this process, so
    that each ratio compares two runs a minute apart on a shared machine."""
    from pipeline import aggregate, load, output, spark

    started = time.perf_counter()
    session = spark.session(master)
    session.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {"session_s": time.perf_counter() - started}
    store = DeadLetterStore(url, namespace)

    def read() -> DataFrame:  # every dead letter of the project, as `charon insights` reads them
        return load.from_store(session, store, project=PROJECT, max_body_bytes=DEFAULT_MAX_BODY_BYTES)

    for run in ("cold", "warm"):
        t = time.perf_counter()
        insights = aggregate.analyse(session, read())
        analysed = time.perf_counter() - t
        if run == "warm":  # the whole tables, to compare (before the status column is added)
            out["tables"] = {name: insights.rows(name) for name in aggregate.TABLES}
        with tempfile.TemporaryDirectory() as folder:
            output.write(insights, Path(folder), top=15)
        insights.release()
        out[run] = {
            "total_s": analysed,
            **insights.timings,  # write_s among them
            "shuffle_partitions": insights.shuffle_partitions,
        }
    for run in ("read_cold", "read_warm"):  # the data source's read alone: every row to Spark, nothing done
        t = time.perf_counter()
        read().write.format("noop").mode("overwrite").save()
        out[run] = time.perf_counter() - t
    rounds = out["alternate"] = []
    for _ in range(alternate):
        python_s = pure_python(url, namespace)[0]["total_s"]
        t = time.perf_counter()
        aggregate.analyse(session, read()).release()
        spark_s = time.perf_counter() - t
        rounds.append({"python_s": python_s, "spark_s": spark_s, "ratio": python_s / spark_s})
    out["total_s"] = time.perf_counter() - started
    session.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--alternate", type=int, default=0, metavar="N",
        help="then N rounds of the pure-Python pass and the warm local[2] job, alternating",
    )  # fmt: skip
    parser.add_argument("--spark", nargs=3, metavar=("URL", "NAMESPACE", "MASTER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.spark:  # one Spark master, in a process of its own (see spark_run)
        sys.stdout.write(json.dumps(spark_run(*args.spark, alternate=args.alternate), default=str))
        return 0
    server = RedisServer().start()
    namespace = f"b{uuid.uuid4().hex[:8]}"
    try:
        t = time.perf_counter()
        fill(server.url, args.messages, namespace)
        results: dict[str, Any] = {"messages": args.messages, "fill_s": time.perf_counter() - t}
        results["python"], expected, values = pure_python(server.url, namespace)
        for master in ("local[1]", "local[2]"):
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "bench.studies.insights", "--spark", server.url, namespace, master,
                 "--alternate", str(args.alternate if master == "local[2]" else 0)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            run = json.loads(done.stdout)
            run["process_s"] = time.perf_counter() - t
            run["same_tables"], run["percentile_rank_error"] = compared(run.pop("tables"), expected, values)
            results[master] = run
    finally:
        server.stop()
    print(json.dumps(results, indent=2) if args.json else markdown(results))
    return 0


def markdown(r: dict[str, Any]) -> str:
    n = r["messages"]
    py = r["python"]["total_s"]
    one, two = r["local[1]"], r["local[2]"]
    lines = [
        f"{n:,} dead letters in Redis (filled in {r['fill_s']:.1f} s)",
        "",
        "| run | JVM + session s | job s | rows/s | read+parse s | aggregates s | tables = Python's * "
        "| writing s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| pure Python | | {py:.1f} | {n / py:,.0f} | {r['python']['read_s']:.1f} | "
        f"{py - r['python']['read_s']:.1f} | | |",
    ]
    for name, run in (("local[1]", one), ("local[2]", two)):
        for phase in ("cold", "warm"):
            p = run[phase]
            session = f"{run['session_s']:.1f}" if phase == "cold" else ""
            lines.append(
                f"| {name} {phase} | {session} | {p['total_s']:.1f} | {n / p['total_s']:,.0f} | "
                f"{p['read_s']:.1f} | {p['aggregate_s']:.1f} | {run['same_tables']} | {p['write_s']:.1f} |"
            )
    worst = max(one["percentile_rank_error"], two["percentile_rank_error"])
    lines += [
        "",
        "\\* by_source's percentiles aside: percentile_approx's farthest from the exact rank, as a share "
        f"of its group: {worst:.6f} (bound 1 / 10,000)",
        "",
        "The data source's read alone (every row into Spark, written to the `noop` sink), after the job:",
        "",
        "| run | first s | rows/s | again s | rows/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, run in (("local[1]", one), ("local[2]", two)):
        lines.append(
            f"| {name} | {run['read_cold']:.1f} | {n / run['read_cold']:,.0f} | {run['read_warm']:.1f} | "
            f"{n / run['read_warm']:,.0f} |"
        )
    cold_one, cold_two = (r["session_s"] + r["cold"]["total_s"] for r in (one, two))
    lines += [
        "",
        f"- warm local[2] / pure Python: **{py / two['warm']['total_s']:.2f}x** (target >= 1); with the "
        f"outputs written (tables whole, twice, and the report): "
        f"{py / (two['warm']['total_s'] + two['warm']['write_s']):.2f}x",
        "- shares of cold local[2] (JVM and session, read+parse, aggregates, writing): "
        + ", ".join(
            f"{100 * x / sum(parts):.0f}%"
            for parts in [
                [two["session_s"], two["cold"]["read_s"], two["cold"]["aggregate_s"], two["cold"]["write_s"]]
            ]
            for x in parts
        ),
        f"- local[2] / local[1], warm: **{one['warm']['total_s'] / two['warm']['total_s']:.2f}x** "
        f"(target >= 1.6); cold, JVM start included: {cold_one / cold_two:.2f}x",
        f"- the read alone on local[2]: **{n / two['read_warm']:,.0f} rows/s** (target >= 100,000)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
