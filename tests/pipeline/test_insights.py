"""The Spark job over real dead letters (Redis and MongoDB): every aggregate equals the plain-Python one."""

from __future__ import annotations

import argparse
from collections import Counter
from html import escape
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from app import insights as cli
from pipeline import aggregate, load, output, purepython, report
from pipeline.aggregate import TABLES
from pipeline.insights import Insights
from tests.pipeline import scenario
from tests.pipeline.conftest import DeadLetters
from tests.pipeline.conftest import written as table_in
from tests.pipeline.scenario import TEST_MAX_BODY_BYTES

pytestmark = pytest.mark.timeout(300)


def records(spark: SparkSession, data: DeadLetters, **kw: Any) -> DataFrame:
    return load.from_store(spark, data.store, partitions=6, max_body_bytes=TEST_MAX_BODY_BYTES, **kw)


def from_store(spark: SparkSession, data: DeadLetters, **kw: Any) -> Insights:
    return aggregate.analyse(spark, records(spark, data, **kw))


def from_files(spark: SparkSession, *paths: Path) -> Insights:
    return aggregate.analyse(
        spark, load.from_files(spark, [str(p) for p in paths], max_body_bytes=TEST_MAX_BODY_BYTES)
    )


def tables(insights: Insights) -> dict[str, list[dict[str, Any]]]:
    return {name: insights.rows(name) for name in TABLES}


def written(out: Path, name: str) -> list[dict[str, Any]]:
    """A table a first run wrote to `out`, as the job computed it: a first run's signatures have no status
    (there is nothing to compare with), which is checked and dropped."""
    rows = table_in(out, name)
    if name == "signatures":
        assert {r.pop("status") for r in rows} <= {None}
    return rows


def test_every_aggregate_equals_plain_python(spark: SparkSession, dead_letters: DeadLetters) -> None:
    insights = from_store(spark, dead_letters)
    expected = purepython.analyse(dead_letters.records)
    got = tables(insights)
    for name in TABLES:
        assert got[name] == expected[name], name
    assert insights.total == len(dead_letters.records)
    # the scenario exercised what the report is for
    reasons = {r["reason"] for r in got["by_source"]}
    assert reasons == {"max_claims", "rejected", "expired"}
    buckets = Counter({(q["project"], q["bucket"]): q["messages"] for q in got["quality"]})
    assert buckets[("shop", "no_provenance")] == len(dead_letters.shops["shop"].direct) == 2
    assert buckets[("shop", "not_object")] > 0
    assert buckets[("shop", "huge")] > 0
    poison = [o for o in got["repeat_offenders"] if '"order_id":"n/a"' in o["preview"]]
    assert poison
    assert poison[0]["messages"] > 1
    errors = {s["error"] for s in got["signatures"]}
    assert "inventory service timeout after <*> (request <*>)" in errors
    assert "'iban' missing for account <*>" in errors  # the message of a nested error object
    assert "validation" in {r for s in got["signatures"] for r in s["rejection_reasons"]}
    assert {r["source_queue"] for r in got["claim_counts"]} >= {"orders", "payments", "emails", "sms"}
    # who failed: the worker whose claim used up the last delivery, or that rejected; none for an expiry
    consumers = {(r["source_queue"], r["consumer"]): r for r in got["consumers"]}
    for queue, workers in scenario.WORKERS.items():
        assert {c for q, c in consumers if q == queue} == set(workers), queue
    assert {c for q, c in consumers if q == "sessions"} == {None}
    [payments] = [r for (q, _), r in consumers.items() if q == "payments"]
    assert payments["rejected"] > 0
    assert payments["max_claims"] > 0
    assert payments["share"] == 1.0


def test_reads_each_message_once_in_parallel(spark: SparkSession, dead_letters: DeadLetters) -> None:
    df = records(spark, dead_letters)
    assert df.rdd.getNumPartitions() >= 4
    ids = [r.id for r in df.select("id").collect()]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(r["id"] for r in dead_letters.records)


def test_project_and_queue_filters(spark: SparkSession, dead_letters: DeadLetters) -> None:
    one = from_store(spark, dead_letters, project="tenant-b", queues=["payments.dlq", "notify.dlq"])
    expected = purepython.analyse(dead_letters.of("tenant-b", {"payments.dlq", "notify.dlq"}))
    assert tables(one) == expected
    assert {q["project"] for q in expected["quality"]} == {"tenant-b"}
    assert {q["queue"] for q in expected["quality"]} == {"payments.dlq", "notify.dlq"}


def test_export_then_insights_from_the_file(
    spark: SparkSession, dead_letters: DeadLetters, tmp_path: Path
) -> None:
    exported = tmp_path / "shop.jsonl"
    parser = argparse.ArgumentParser()
    cli.add_export_arguments(parser)
    dlqs = dead_letters.shops["shop"].dlqs
    ns = parser.parse_args(
        [
            "--storage-uri",
            dead_letters.store.uri,
            "--namespace",
            dead_letters.store.namespace,
            "--project",
            "shop",
            "--out",
            str(exported),
        ]
        + [a for q in dlqs for a in ("--queue", q)]
    )
    assert cli.run_export(ns) == 0
    lines = exported.read_text().splitlines()
    assert len(lines) == len(dead_letters.of("shop"))
    assert tables(from_files(spark, exported)) == purepython.analyse(dead_letters.of("shop"))


# Writing the outputs is the same whichever store the dead letters came from.
@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_outputs_parquet_and_report(spark: SparkSession, dead_letters: DeadLetters, tmp_path: Path) -> None:
    insights = from_store(spark, dead_letters, project="shop")
    output.write(insights, tmp_path, top=10)
    for name in TABLES:
        assert table_in(tmp_path, name) == insights.rows(name)
    html = (tmp_path / "report.html").read_text()
    top = insights.rows("signatures")[0]
    assert escape(top["error"] or report.untitled(top)) in html
    assert top["signature"] in html
    assert escape(report.curl("shop", top["examples"][0]["dlq"], top["examples"][0]["id"])) in html
    assert "<svg" in html
    assert "Repeat offenders" in html
    # the consumer with the most failures, linked to its top cause
    worst = next(r for r in insights.rows("consumers") if r["consumer"] is not None)
    assert f"<code>{worst['consumer']}</code>" in html
    assert f"href='#{report._anchor('shop', worst['top_signature'])}'" in html
    assert f"id='{report._anchor('shop', worst['top_signature'])}'" in html


@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_shuffle_partitions_come_from_the_data_unless_chosen(
    spark: SparkSession, dead_letters: DeadLetters
) -> None:
    """Spark's default of 200 shuffle partitions is replaced for the job by what the data needs (two per
    core here) and put back after; a number the session chose stands."""
    key = "spark.sql.shuffle.partitions"
    assert spark.conf.get(key) == "4"  # the fixture's choice
    assert from_store(spark, dead_letters).shuffle_partitions is None
    assert spark.conf.get(key) == "4"
    spark.conf.unset(key)
    try:
        assert from_store(spark, dead_letters).shuffle_partitions == 2 * spark.sparkContext.defaultParallelism
        assert spark.conf.get(key) == "200"  # the session as the job found it
    finally:
        spark.conf.set(key, "4")
