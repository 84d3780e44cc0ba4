"""Really unchanged on a cluster: the job on a Spark standalone cluster started here (a master and a worker,
each its own JVM, from the installed PySpark) writes the same tables as the plain-Python oracle; an executor
Python that cannot run the job is named with its fix before the job; Spark Connect is refused clearly; the
code archive is one per version of the code, not one per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from pipeline import purepython, spark
from pipeline.aggregate import TABLES
from tests.pipeline.conftest import DeadLetters
from tests.pipeline.test_insights import written
from tests.servers import SparkStandalone

pytestmark = pytest.mark.timeout(400)
ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    standalone = SparkStandalone(tmp_path_factory.mktemp("spark-standalone")).start()
    yield standalone
    standalone.stop()


def insights(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "insights", *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **(env or {})),
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dead_letters", ["redis"], indirect=True)
def test_a_standalone_cluster_writes_the_same_tables(
    cluster: SparkStandalone, dead_letters: DeadLetters, tmp_path: Path
) -> None:
    out = tmp_path / "on-the-cluster"
    done = insights(
        "--storage-uri", dead_letters.store.uri, "--namespace", dead_letters.store.namespace,
        "--master", cluster.master, "--out", str(out), "--max-body-bytes", "4096",
        env={"PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on {cluster.master}" in done.stderr
    expected = purepython.analyse(dead_letters.records)
    for name in TABLES:
        assert written(out, name) == expected[name], name
    # the executors ran in the worker's JVM, not the driver's: the worker has the application's directory
    assert any((cluster.work_dir / "work").iterdir())


@pytest.mark.slow
def test_an_executor_python_without_the_packages_is_named_with_its_fix(tmp_path: Path) -> None:
    source = tmp_path / "dlq.jsonl"
    source.write_text(json.dumps({"id": "m1", "project": "p", "queue": "q.dlq", "body": {"a": 1}}) + "\n")
    bare = "/usr/bin/python3"  # Debian's: no pyarrow
    if not Path(bare).exists() or subprocess.run([bare, "-c", "import pyarrow"], check=False).returncode == 0:
        pytest.skip("needs a Python without pyarrow")
    done = insights(
        "--input", str(source), "--master", "local[1]", "--out", str(tmp_path / "out"),
        env={"PYSPARK_PYTHON": bare},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert "executors' Python" in done.stderr
    assert "PYSPARK_PYTHON" in done.stderr
    assert not (tmp_path / "out" / "tables").exists()  # stopped before the job


def test_spark_connect_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "dlq.jsonl"
    source.write_text("{}\n")
    code = main(
        ["insights", "--input", str(source), "--master", "sc://127.0.0.1:15002", "--out", str(tmp_path)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "Spark Connect (sc://127.0.0.1:15002) is not supported" in err
    assert "spark-submit" in err


def test_the_code_archive_is_one_per_version_of_the_code() -> None:
    first = spark.code_archive()
    assert spark.code_archive() == first  # a second run reuses it
    assert Path(first).name != f"charon-pipeline-{os.getpid()}.zip"
    import zipfile

    with zipfile.ZipFile(first) as z:
        names = set(z.namelist())
    assert {"pipeline/analysis.py", "storage/export.py", "core/models.py"} <= names
