"""Runs compared: the second run of insights into the same output directory says which signatures are new,
growing, steady or quiet against the first, and which to fix first; runs keep their tables."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from app.cli import main
from core.clock import ManualClock
from core.models import QueueRef
from pipeline import aggregate, load, output, purepython, trends
from pipeline.aggregate import TABLES
from pipeline.records import DDL
from storage.export import Extent
from storage.registry import open_store
from tests.contract.helpers import claim_ids, post, set_meta
from tests.pipeline import corpus
from tests.pipeline.conftest import listed, previous, record, written

pytestmark = pytest.mark.timeout(300)


def later(records: list[dict[str, Any]], cause_of: dict[str, str], mid: int) -> list[dict[str, Any]]:
    """The second run's dead letters: the same until `mid`; after it, `customer` stops, `timeout` dies at
    three times its rate, and a cause never seen before appears."""
    out = [r for r in records if r["dead_lettered_at_ms"] <= mid or cause_of[r["id"]] != "customer"]
    for r in records:
        if r["dead_lettered_at_ms"] > mid and cause_of[r["id"]] == "timeout":
            out += [{**r, "id": f"{r['id']}-copy{k}", "dead_lettered_at_ms": r["dead_lettered_at_ms"] + k}
                    for k in (1, 2)]  # fmt: skip
    last = max(r["dead_lettered_at_ms"] for r in records)
    for k in range(3):
        body = json.dumps({"error": f"schema registry unreachable (attempt {k})"})
        out.append({**records[0], "id": f"new{k}", "body": body, "body_bytes": len(body),
                    "dead_lettered_at_ms": last - k})  # fmt: skip
    return out


def test_a_second_run_says_what_is_new_growing_steady_or_quiet(spark: SparkSession, tmp_path: Path) -> None:
    records, cause_of = corpus.generate(per_cause=20)
    times = sorted(r["dead_lettered_at_ms"] for r in records)
    mid = times[len(times) // 2]
    scope = trends.scope("corpus", None)
    first = [r for r in records if r["dead_lettered_at_ms"] <= mid]
    assert previous(spark, tmp_path, scope) is None
    output.write(aggregate.analyse(spark, spark.createDataFrame(first, DDL)), tmp_path, top=20, scope=scope)
    assert "nothing to compare with" in (tmp_path / "report.html").read_text()

    before = previous(spark, tmp_path, scope)
    assert before is not None
    assert before.last_ms == mid
    assert previous(spark, tmp_path, trends.scope("corpus", ["orders.dlq"])) is None  # another scope
    second = later(records, cause_of, mid)
    insights = aggregate.analyse(spark, spark.createDataFrame(second, DDL), since_ms=before.last_ms)
    expected = purepython.analyse(second, since_ms=before.last_ms)
    for name in TABLES:
        assert insights.rows(name) == expected[name], name
    output.write(insights, tmp_path, top=20, scope=scope, before=before)

    sigs = written(tmp_path, "signatures")
    status = {s["error"]: s["status"] for s in sigs}
    assert status.pop("customer <*> not found") == "quiet"
    assert status.pop("schema registry unreachable (attempt <*>)") == "new"
    timeout = next(e for e in status if e.startswith("timeout after"))
    assert status.pop(timeout) == "growing"
    assert set(status.values()) == {"steady"}
    recent = {s["error"]: s["recent"] for s in sigs}
    assert recent[timeout] == 3 * 10  # its 10 after the first run's last death, and two copies of each
    assert recent["customer <*> not found"] == 0
    report = (tmp_path / "report.html").read_text()
    fix = report[report.index("<div class=fix>") : report.index("<h2>Per source queue")]
    assert "30</b> dead letters since the previous run" in fix
    assert "timeout after" in fix
    assert "curl " in fix
    assert "class='st growing'" in fix
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    assert json.loads((runs[1] / "run.json").read_text())["compared_with"] == runs[0].name
    assert pq.read_table(runs[0] / "tables" / "signatures.parquet").num_rows == 15  # the first run's, kept


def test_runs_beyond_keep_runs_are_removed_and_cut_off_runs_ignored(
    spark: SparkSession, tmp_path: Path
) -> None:
    records, _ = corpus.generate(per_cause=2)
    insights = aggregate.analyse(spark, spark.createDataFrame(records, DDL))
    scope = trends.scope(None, None)
    for _ in range(3):
        output.write(insights, tmp_path, top=5, scope=scope, keep_runs=2)
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    other = trends.scope("corpus", ["orders.dlq"])
    output.write(insights, tmp_path, top=5, scope=other, keep_runs=1)  # another scope's runs stay
    assert len(list((tmp_path / "runs").iterdir())) == 3
    (runs[1] / "run.json").unlink()  # as if that run had been killed before it finished
    before = previous(spark, tmp_path, scope)
    assert before is not None
    assert before.stamp == runs[0].name
    (runs[0] / "run.json").write_text("[]")  # not ours: ignored, not fatal
    assert previous(spark, tmp_path, scope) is None


def test_a_death_without_provenance_widens_the_rate_buckets_in_both(spark: SparkSession) -> None:
    """The rate's bucket width comes from the span of every death, as the Spark job takes it; the oracle
    once took it from the messages with provenance only, and the two disagreed."""
    records, _ = corpus.generate(per_cause=2)
    stray = {
        **records[0],
        "id": "stray",
        "source_queue": None,
        "dead_lettered_at_ms": corpus.START_MS + 30 * 86_400_000,
    }
    records.append(stray)
    insights = aggregate.analyse(spark, spark.createDataFrame(records, DDL))
    expected = purepython.analyse(records)
    assert insights.rate_width_s == 6 * 3600  # 30 days in at most 120 buckets
    for name in TABLES:
        assert insights.rows(name) == expected[name], name


async def test_since_last_reads_only_what_arrived_and_updates_the_tables(
    spark: SparkSession, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"t{uuid.uuid4().hex[:12]}"
    clock = ManualClock()
    store = open_store(redis_url, namespace=namespace, clock=clock)
    orders = QueueRef("shop", "orders")
    await set_meta(store, orders, _max_claim_count=1, _dead_letter_queue="orders.dlq")

    async def die(*bodies: object) -> None:  # one claim each, then released: dead-lettered (max_claims)
        await post(store, orders, *bodies)
        claim, _ = await claim_ids(store, orders)
        await store.release_claim(orders, claim)

    def table(name: str) -> list[dict[str, Any]]:  # as the job computed it (a status is the driver's)
        rows = written(tmp_path, name)
        for r in rows:
            r.pop("status", None)
        return rows

    try:
        await die(*({"error": f"boom in step {i}"} for i in range(5)))
        argv = ["insights", "--storage-uri", redis_url, "--namespace", namespace, "--out", str(tmp_path),
                "--master", "local[2]", "--quiet", "--since-last"]  # fmt: skip
        assert main(argv) == 0  # the first: everything, and it keeps the records it read
        assert main(argv) == 3  # nothing new: nothing to analyse
        assert "nothing was dead-lettered since the previous run" in capsys.readouterr().err
        first = previous(spark, tmp_path, trends.scope(None, None))
        assert first is not None
        clock.advance(60)
        await die(*({"error": f"crash {i}"} for i in range(3)))
        assert main(argv) == 0
        sigs = table("signatures")
        assert [(s["error"], s["messages"], s["recent"]) for s in sigs] == [
            ("boom in step <*>", 5, 0),
            ("crash <*>", 3, 3),
        ]
        shown = written(tmp_path, "signatures")
        assert [s["status"] for s in shown] == ["quiet", "new"]
        # the updated tables are those of one run over every dead letter, compared with the first run
        everything = [record("shop", m) for m in await listed(store, QueueRef("shop", "orders.dlq"))]
        expected = purepython.analyse(everything, since_ms=first.last_ms)
        for name in TABLES:
            assert table(name) == expected[name], name
        runs = sorted((tmp_path / "runs").iterdir())
        metas = [json.loads((r / "run.json").read_text()) for r in runs]
        assert [m["markers"] for m in metas] == [[[None, "shop", "orders.dlq", n]] for n in (5, 8)]
        assert [m["messages"] for m in metas] == [5, 8]
        # only the newest run keeps the records the next one goes on from
        assert [(r / "records").is_dir() for r in runs] == [False, True]
        # a run without --since-last in between (keeping one run) is compared with, but neither goes on from
        # the records nor drops them
        plain = [a for a in argv if a != "--since-last"]
        assert main([*plain, "--keep-runs", "1"]) == 0
        middle = previous(spark, tmp_path, trends.scope(None, None))
        assert middle is not None
        assert middle.records is None
        clock.advance(60)
        await die({"error": "late 1"})
        assert main(argv) == 0
        everything = [record("shop", m) for m in await listed(store, QueueRef("shop", "orders.dlq"))]
        assert len(everything) == 9
        expected = purepython.analyse(everything, since_ms=middle.last_ms)
        for name in TABLES:
            assert table(name) == expected[name], name
        files = ["insights", "--input", str(tmp_path / "x.jsonl"), "--out", str(tmp_path), "--since-last"]
        assert main(files) == 2  # a usage error: it reads a store
    finally:
        await store.aclose()


def test_since_last_never_reads_below_where_the_previous_run_stopped() -> None:
    dlq = Extent("shop", "orders.dlq", 10, 1, 10)
    key = dlq.key
    assert load.ranges_from([dlq], {}) == [(None, "shop", "orders.dlq", 0, 10)]  # a first run: all
    assert load.ranges_from([dlq], {key: 4}) == [(None, "shop", "orders.dlq", 4, 10)]
    # its newest were redriven or deleted since: nothing new, not the whole DLQ again
    assert load.ranges_from([dlq], {key: 12}) == [(None, "shop", "orders.dlq", 12, 12)]
    assert dlq.within(12, 12) is None
    assert dlq.within(4, 10) == Extent("shop", "orders.dlq", 6, 5, 10)
