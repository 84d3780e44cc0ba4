"""`charon insights` and `charon export` as a user runs them: clear errors and exit codes, bad input counted
in its own bucket, and the same job through spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.cli import main
from pipeline import analysis, purepython
from pipeline.errors import InsightsError
from pipeline.spark import LOG4J2, check_java
from tests.pipeline.conftest import DeadLetters
from tests.pipeline.test_insights import from_files, written
from tests.servers import CharonProcess

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


def run_charon(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("redis://127.0.0.1:1/0", "Cannot read Redis at redis://127.0.0.1:1/0"),
        (
            "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300",
            "Cannot read MongoDB at mongodb://127.0.0.1:1/",
        ),
        ("http://example.com/", "Unsupported storage URI scheme 'http'"),
    ],
)
def test_unreachable_or_unknown_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, uri: str, says: str
) -> None:
    for command in ("insights", "export"):
        extra = ["--out", str(tmp_path / "x")] + (["--queue", "q.dlq"] if command == "export" else [])
        code, err = run_charon(capsys, command, "--storage-uri", uri, *extra)
        assert code == 1
        assert says in err
        assert "Traceback" not in err
        assert "java." not in err


def test_empty_dead_letter_queues(capsys: pytest.CaptureFixture[str], redis_url: str, tmp_path: Path) -> None:
    fresh = f"t{uuid.uuid4().hex[:12]}"
    code, err = run_charon(
        capsys, "insights", "--storage-uri", redis_url, "--namespace", fresh, "--out", str(tmp_path)
    )
    assert code == 3
    assert "no messages in any dead-letter queue of any project" in err
    code, err = run_charon(
        capsys,
        "export",
        "--storage-uri",
        redis_url,
        "--namespace",
        fresh,
        "--queue",
        "orders.dlq",
        "--project",
        "p",
    )
    assert code == 3
    assert "no messages in queue(s) orders.dlq of project 'p'" in err


def test_no_store_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CHARON_STORAGE_URI", raising=False)
    monkeypatch.setenv("CHARON_DATA_DIR", str(tmp_path))  # where no `charon serve` runs
    code, err = run_charon(capsys, "insights")
    assert code == 1
    assert "--storage-uri" in err
    assert "CHARON_DATA_DIR" in err


def test_without_a_store_given_the_embedded_store_of_a_running_service_is_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make run` serves on an embedded redis-server behind a unix socket under ./data: export and insights
    find it there, as the service would, and say so (redis://127.0.0.1:6379 reaches nothing)."""
    monkeypatch.delenv("CHARON_STORAGE_URI", raising=False)
    monkeypatch.setenv("CHARON_DATA_DIR", str(tmp_path))
    service = CharonProcess(None, data_dir=tmp_path).start()
    try:
        code, err = run_charon(capsys, "export", "--queue", "orders.dlq", "--project", "p")
    finally:
        service.stop()
    assert f"reading the embedded store of `charon serve` at unix://{tmp_path / 'redis.sock'}" in err, err
    assert code == 3
    assert "no messages in queue(s) orders.dlq of project 'p'" in err


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(InsightsError, match=r"needs Java 17 or newer .*openjdk-17-jre-headless"):
        check_java()


def test_missing_input_file(spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = run_charon(
        capsys, "insights", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)
    )
    assert code == 1
    assert "the Spark job failed" in err
    assert "nope.jsonl" in err
    assert "\tat org.apache" not in err


def test_bad_lines_in_an_export_are_counted(spark: SparkSession, tmp_path: Path) -> None:
    good = {
        "id": "m1",
        "project": "p",
        "queue": "q.dlq",
        "created": "2026-11-23T10:00:00.000Z",
        "claim_count": 0,
        "dead_letter": {
            "source_queue": "q",
            "reason": "max_claims",
            "claim_count": 3,
            "dead_lettered_at": "2026-11-23T10:05:00.250Z",
            "first_enqueued_at": "2026-11-23T10:00:00.000Z",
            "redrive_count": 0,
        },
        "body": {"error": "boom 42"},
    }
    lines = [
        json.dumps(good),
        "this is not json",
        "[1, 2, 3]",
        json.dumps({**good, "id": "m2", "dead_letter": None}),
        json.dumps({**good, "id": "m3", "body": {"blob": "x" * 5000}}),
        json.dumps({**good, "id": "m4", "body": "a string"}),
        "",
    ]
    path = tmp_path / "dlq.jsonl"
    path.write_text("\n".join(lines) + "\n")
    insights = from_files(spark, path)
    buckets = {q["bucket"]: q["messages"] for q in insights.rows("quality") if q["queue"] == "q.dlq"}
    assert buckets == {"ok": 1, "no_provenance": 1, "huge": 1, "not_object": 1}
    junk = [q for q in insights.rows("quality") if q["queue"] == ""]
    assert [(q["bucket"], q["messages"]) for q in junk] == [("no_provenance", 2)]
    (row,) = insights.rows("by_source")
    assert (row["messages"], row["bad_bodies"], row["ttd_max_s"]) == (3, 2, 300.25)
    other, sig = insights.rows("signatures")  # the huge and the string body have no error text
    assert (sig["shape"], sig["error"], [e["id"] for e in sig["examples"]]) == (
        "OBJECT<error: STRING>",
        "boom <*>",
        ["m1"],
    )
    assert (other["error"], other["messages"], other["bad_bodies"], other["shape"]) == (None, 2, 2, None)


TRICKY = [
    "timeout after 30s on 10.0.0.12:5432",
    "id 550e8400-e29b-41d4-a716-446655440000 and 550E8400-E29B-41D4-A716-446655440000",
    "hash deadbeef12 vs deadbeef vs 12345678 vs cafe0x1F",
    "tabs\tand\nnewlines  and   spaces ",
    "ünïcödé ٣ digits ١٢٣ and 12",
    "$1 and \\1 are not group references",
    "",
    "   ",
    "x" * 300,
    "user \"Dana O'Neil\" can't log in; 'amount' and 'x y' and '' and \"order_id\" since 2026-11-24 10:00:00",
    "at 2026-11-24T10:00:00.123+05:30 to dana.smith+tag@mail.example.co.uk"
    " via cus_ABCDEFGHQ and cus_abcdefghij",
    "GET https://a.example/v1/users/a81fZ?page=10 -> 5.2.2 on 10:42:07 of 1,000 SKU-12-ab_c <*>",
    "'unclosed and \"unclosed",
]


def test_normalising_is_the_same_in_spark_and_python(spark: SparkSession) -> None:
    df = spark.createDataFrame([(t,) for t in TRICKY], "t string")
    got = [r[0] for r in analysis.with_normalised(df, "n", df.t).select("n").collect()]
    assert got == [purepython.normalise(t) for t in TRICKY]


def test_shapes_are_the_same_in_spark_and_python(spark: SparkSession) -> None:
    bodies = [
        {"b": 1, "a": {"y": [1, "x"], "x": {"deep": {"deeper": {"deepest": 1}}}}, "e": {}},
        {
            "l": [{"a": 1}, {"b": "x"}, {"a": 1.5}, None],
            "m": [[1], [2.5], []],
            "v": [True, 1],
            "w": [{"a": 1}, 2],
        },
        {"`q`": 1, "a:b": 1, "x y": {"with.dot": 1}, "_x1": 1, "1a": 1, "é": 1, "": 1, "BIGINT": 1},
        [1, "x"],
        {"n": None, "t": True, "f": 1.5, "big": 10**30, "s": "x", "l": [], "o": {"k": None}},
        {"weird key": {"with.dot": 1}, "ключ": "значение"},
        {},
    ]
    df = spark.createDataFrame([(json.dumps(b),) for b in bodies], "body string")
    got = [r[0] for r in df.select(analysis.shape(F.try_parse_json("body"))).collect()]
    assert got == [purepython.shape(b) for b in bodies]


@pytest.mark.slow
@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_charon_insights_command(dead_letters: DeadLetters, tmp_path: Path) -> None:
    """The command a user types, in its own process and JVM: summary on stdout, progress on stderr."""
    out = tmp_path / "insights"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "insights", "--storage-uri", dead_letters.store.uri,
         "--namespace", dead_letters.store.namespace, "--master", "local[2]", "--out", str(out),
         "--max-body-bytes", "4096"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{len(dead_letters.records):,} messages analysed" in done.stdout
    assert "top failure signatures" in done.stdout
    assert "reading and parsing" in done.stderr
    assert (out / "report.html").stat().st_size > 10_000
    by_source = written(out, "by_source")
    assert by_source == purepython.analyse(dead_letters.records)["by_source"]
    [run] = out.glob("runs/*/run.json")
    assert json.loads(run.read_text())["shuffle_partitions"] == 4  # from the data: two per core, few rows


@pytest.mark.slow
@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_spark_submit_runs_the_same_job(dead_letters: DeadLetters, tmp_path: Path) -> None:
    """`spark-submit app/submit.py`, the way a cluster runs it: the master comes from spark-submit."""
    out = tmp_path / "submitted"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         "--driver-java-options", f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=3",
         "app/submit.py", "--storage-uri", dead_letters.store.uri,
         "--namespace", dead_letters.store.namespace, "--out", str(out), "--max-body-bytes", "4096",
         "--quiet"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if " INFO " not in line)
    assert [line for line in done.stderr.splitlines() if " INFO " in line] == []  # pipeline/log4j2.properties
    assert written(out, "signatures") == purepython.analyse(dead_letters.records)["signatures"]
    [run] = out.glob("runs/*/run.json")
    assert json.loads(run.read_text())["shuffle_partitions"] is None  # the operator's --conf stands
