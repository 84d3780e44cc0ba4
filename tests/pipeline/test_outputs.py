"""Where the job's outputs go and what comes to the driver: every output through Hadoop (a path that only
Hadoop can reach takes them all: ViewFS over a local directory), every table written whole by Spark, and only
each table's view (the top rows) collected."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.cli import main
from pipeline import aggregate, hadoop, output, purepython
from pipeline.aggregate import TABLES
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
        assert aggregate.in_order(name, _read(runs[0], name)).num_rows == len(expected[name])
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


@pytest.mark.parametrize("shown", [2, 1_000])  # tables larger than the view, and tables it holds whole
def test_only_each_tables_view_comes_to_the_driver(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shown: int
) -> None:
    records, _ = corpus.generate(per_cause=4)
    monkeypatch.setattr(aggregate, "SHOWN", shown)
    insights = aggregate.analyse(spark, spark.createDataFrame(records, DDL), top=3)
    expected = purepython.analyse(records, top=3)
    assert insights.counts == {name: len(expected[name]) for name in TABLES}
    sigs = insights.shown("signatures")
    assert sigs[:3] == expected["signatures"][:3]
    assert len(sigs) <= 4  # the top 3 and the fix-first one
    viewed = {(s["project"], s["signature"]) for s in sigs}
    for name in ("signature_fields", "signature_rate"):
        assert insights.shown(name) == [r for r in expected[name] if (r["project"], r["signature"]) in viewed]
    for name in ("consumers", "repeat_offenders"):
        assert insights.shown(name) == expected[name][:3]
    for name in ("by_source", "rate", "claim_counts", "time_to_death", "rejections", "quality"):
        assert insights.shown(name) == expected[name][:shown], name
    assert insights.analysed == sum(r["messages"] for r in expected["by_source"])
    output.write(insights, tmp_path, top=3)
    assert job_tables(tmp_path) == expected  # written whole by Spark
    report = (tmp_path / "report.html").read_text()
    assert f"(top 3 of {len(expected['signatures'])})" in report
    assert hadoop.local(hadoop.location(tmp_path)) == tmp_path
