"""The library under the commands, called directly: pipeline/job.py runs the insights job without the CLI,
pipeline/jsonl.py exports without it, and the view sizes the job and the report share agree."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline import jsonl, report
from pipeline.errors import JobFailed, NothingToAnalyse
from pipeline.insights import SERIES
from pipeline.job import Job, run
from pipeline.load import DeadLetterStore


def test_the_palette_has_a_colour_per_series_and_one_for_the_rest() -> None:
    assert len(report.PALETTE) == SERIES + 1


def test_a_spark_failure_is_one_line_naming_the_log(spark: SparkSession, tmp_path: Path) -> None:
    said: list[str] = []
    with pytest.raises(JobFailed) as failed:
        run(Job(out=str(tmp_path), inputs=[str(tmp_path / "nope.jsonl")]), say=said.append)
    assert str(failed.value).startswith("the Spark job failed: ")
    assert f"(details: {tmp_path / 'spark.log'})" in str(failed.value)
    assert "nope.jsonl" in str(failed.value)
    assert "\n" not in str(failed.value)
    assert any(line.startswith("Spark ") for line in said)  # it said where Spark runs before it failed


def test_an_export_makes_no_file_when_there_is_nothing_to_read(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "dlq.jsonl"
    store = DeadLetterStore(redis_url, f"t{uuid.uuid4().hex[:12]}")
    with pytest.raises(NothingToAnalyse, match=r"no messages in queue\(s\) orders.dlq"):
        jsonl.export(store, out, project=None, queues=["orders.dlq"])
    assert not out.exists()
