"""Where the job's outputs go and what comes to the driver: every output through Hadoop (a path that only
Hadoop can reach takes them all: ViewFS over a local directory), every table written whole by Spark, and only
each table's view (the top rows) collected."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from app.cli import main
from pipeline import aggregate, hadoop, output, purepython, trends
from pipeline.aggregate import TABLES
from pipeline.insights import GROUP_CARDS, SERIES, in_order
from pipeline.records import DDL
from tests.pipeline import corpus
from tests.pipeline.conftest import DeadLetters, written

pytestmark = pytest.mark.timeout(300)


def mounted(spark: SparkSession, target: Path) -> str:
    """A ViewFS namespace whose /insights is `target`: a Hadoop URI (viewfs://NAME/insights) that Python's
    file calls cannot open, only Hadoop's FileSystem (a new name each time: Hadoop caches filesystems)."""
    name = f"charon{uuid.uuid4().hex[:8]}"
    target.mkdir(parents=True)
    conf: Any = spark._jsc.hadoopConfiguration()
    conf.set(f"fs.viewfs.mounttable.{name}.link./insights", target.as_uri())
    return f"viewfs://{name}/insights"


def job_tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    found = {name: written(out, name) for name in TABLES}
    for r in found["signatures"]:
        r.pop("status")
    return found


@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_a_hadoop_path_takes_every_output(
    spark: SparkSession, dead_letters: DeadLetters, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a path taken as local would land here
    target = tmp_path / "mounted"
    uri = mounted(spark, target)
    argv = ["insights", "--storage-uri", dead_letters.store.uri, "--namespace", dead_letters.store.namespace,
            "--out", uri, "--master", "local[2]", "--quiet", "--max-body-bytes", "4096"]  # fmt: skip
    assert main(argv) == 0
    assert main(argv) == 0  # the second compares with the first, found through Hadoop
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mounted"]
    runs = sorted((target / "runs").iterdir())
    metas = [json.loads((r / "run.json").read_text()) for r in runs]
    assert [m["compared_with"] for m in metas] == [None, runs[0].name]
    expected = purepython.analyse(dead_letters.records, since_ms=metas[0]["last_ms"])
    assert job_tables(target) == expected
    statuses = {s["status"] for s in written(target, "signatures")}
    assert statuses == {"quiet"}  # nothing died between the two runs
    assert metas[1]["rows"] == {name: len(expected[name]) for name in TABLES}
    for name in TABLES:  # each run keeps its own tables
        assert in_order(name, _read(runs[0], name)).num_rows == len(expected[name])
    report = (target / "report.html").read_text()
    assert "against the previous run" in report
    assert list((target / "redrive").rglob("dry-run.json"))


def _read(run: Path, name: str) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(run / "tables" / f"{name}.parquet")


def test_an_out_hadoop_cannot_open_is_named(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    jsonl = tmp_path / "dlq.jsonl"
    jsonl.write_text("{}\n")
    code = main(["insights", "--input", str(jsonl), "--out", "nosuch://bucket/x", "--master", "local[2]",
                 "--quiet"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "--out nosuch://bucket/x" in err
    assert "nosuch" in err.split("--out nosuch://bucket/x", 1)[1]


def rate_view(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rate's view of a partial table, from the whole: the chart's series, the rest summed per bucket."""
    totals: dict[tuple[str, str, str], int] = {}
    for r in rows:
        key = (r["project"], r["source_queue"], r["reason"])
        totals[key] = totals.get(key, 0) + r["messages"]
    series = set(sorted(totals, key=lambda k: (-totals[k], k))[:SERIES])
    other: dict[int, int] = {}
    for r in rows:
        if (r["project"], r["source_queue"], r["reason"]) not in series:
            other[r["bucket_ms"]] = other.get(r["bucket_ms"], 0) + r["messages"]
    mine = [r for r in rows if (r["project"], r["source_queue"], r["reason"]) in series]
    nulls = [{"bucket_ms": b, "project": None, "source_queue": None, "reason": None, "messages": n}
             for b, n in other.items()]  # fmt: skip
    return sorted(mine + nulls, key=lambda r: (r["bucket_ms"], r["project"] is not None, r["project"] or "",
                                             r["source_queue"] or "", r["reason"] or ""))  # fmt: skip


@pytest.mark.parametrize("shown", [2, 1_000])  # tables larger than the view, and tables it holds whole
def test_only_each_tables_view_comes_to_the_driver(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shown: int
) -> None:
    records, _ = corpus.generate(per_cause=4)
    monkeypatch.setattr(aggregate, "SHOWN", shown)
    collected: list[int] = []  # the rows of every table the driver collects
    classic = type(spark.range(1))  # the session's DataFrame class (a subclass of pyspark.sql's)
    to_arrow = classic.toArrow

    def spy(self: DataFrame) -> Any:
        table = to_arrow(self)
        collected.append(table.num_rows)
        return table

    monkeypatch.setattr(classic, "toArrow", spy)
    insights = aggregate.analyse(spark, spark.createDataFrame(records, DDL), top=3)
    monkeypatch.setattr(classic, "toArrow", to_arrow)
    assert collected
    expected = purepython.analyse(records, top=3)
    assert insights.counts == {name: len(expected[name]) for name in TABLES}
    if shown == 2:  # the largest table never came to the driver whole
        assert max(collected) < max(insights.counts.values())
    sigs = insights.shown("signatures")
    assert sigs[:3] == expected["signatures"][:3]
    assert trends.fix_first(sigs) == trends.fix_first(expected["signatures"])
    consumers = {(r["project"], r["top_signature"]) for r in insights.shown("consumers")}
    viewed = {(s["project"], s["signature"]) for s in sigs}
    assert consumers <= viewed  # the consumers' commonest signatures are there, with their text
    assert len(viewed) <= 3 + 1 + len(consumers)
    for name in ("signature_fields", "signature_rate"):
        assert insights.shown(name) == [r for r in expected[name] if (r["project"], r["signature"]) in viewed]
    for name in ("consumers", "repeat_offenders"):
        assert insights.shown(name) == expected[name][:3]
    for name in ("by_source", "rejections", "quality"):
        assert insights.shown(name) == expected[name][:shown], name
    assert insights.shown("signature_ids") == expected["signature_ids"]
    carded = list(
        dict.fromkeys((r["project"], r["source_queue"], r["reason"]) for r in expected["by_source"][:shown])
    )
    for name in ("claim_counts", "time_to_death"):
        of = set(carded[:GROUP_CARDS])
        assert insights.shown(name) == [
            r for r in expected[name] if (r["project"], r["source_queue"], r["reason"]) in of
        ]
    rate = expected["rate"] if len(expected["rate"]) <= shown else rate_view(expected["rate"])
    assert insights.shown("rate") == rate
    assert insights.analysed == sum(r["messages"] for r in expected["by_source"])
    bad: dict[str, int] = {}
    for q in expected["quality"]:
        if q["bucket"] != "ok":
            bad[q["bucket"]] = bad.get(q["bucket"], 0) + q["messages"]
    assert insights.not_ok == dict(sorted(bad.items()))
    out = tmp_path / "an out dir"  # a space in it: Hadoop takes the path as it is
    output.write(insights, out, top=3)
    assert job_tables(out) == expected  # written whole by Spark
    page = (out / "report.html").read_text()
    assert f"(top 3 of {len(expected['signatures'])})" in page
    assert hadoop.local(hadoop.location(out)) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["an out dir"]
    insights.release()  # every cache the job made is gone (its tables', and what an aggregate re-read)
    assert spark.sparkContext._jsc.getPersistentRDDs().isEmpty()


@pytest.mark.parametrize("where", ["local", "hadoop"])
def test_an_out_that_cannot_be_written_is_named(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    (tmp_path / "file").write_text("not a directory")
    jsonl = tmp_path / "dlq.jsonl"
    jsonl.write_text("{}\n")
    if where == "local":
        out = f"file://{tmp_path}/file/insights"
    else:  # a ViewFS path outside its mount table: Hadoop refuses it
        out = mounted(spark, tmp_path / "mounted").replace("/insights", "/elsewhere/insights")
    code = main(["insights", "--input", str(jsonl), "--out", out, "--master", "local[2]", "--quiet"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"--out {out}" in err
    assert "the Spark job failed" not in err
