"""The SparkSession the job runs on: Java checked first, the `charon` data source registered, and the code the
tasks import (pipeline, storage, core) shipped to the executors.

Nothing here assumes local mode: the master is the caller's, else spark-submit's, else local[*]; the code
goes to a cluster's executors with addPyFile.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import InsightsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pipeline", "storage", "core")  # the packages the executors import
MIN_JAVA = 17


def java_version(java: str) -> int | None:
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
    except OSError:
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    version = java_version(java) if java else None
    if version is None or version < MIN_JAVA:
        found = (
            f"found Java {version}"
            if version
            else "no java found" + (" in JAVA_HOME" if home else " on PATH")
        )
        raise InsightsError(
            f"Spark 4 needs Java {MIN_JAVA} or newer ({found}). On Debian/Ubuntu: "
            "sudo apt-get install openjdk-17-jre-headless (make install does it when run as root)."
        )


def session(master: str | None = None) -> SparkSession:
    """The SparkSession (an existing one is reused), with the `charon` data source registered and our code
    shipped to the executors. The master: `master`, else spark-submit's, else local[*]. In local mode the
    workers run this Python (pyarrow is in it; maybe not in `python3`) and Spark binds to loopback."""
    from pyspark.sql import SparkSession

    from pipeline.datasource import CharonDataSource

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM and chose the master
    fresh = SparkSession.getActiveSession() is None
    if fresh and not submitted:
        master = master or "local[*]"
        check_java()
    builder = SparkSession.builder.appName("charon-insights").config("spark.sql.session.timeZone", "UTC")
    if master:
        builder = builder.master(master)
    if fresh and master and master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.dataSource.register(CharonDataSource)
    context: Any = spark.sparkContext
    if not getattr(context, "_charon_shipped", False):
        context.addPyFile(_code_zip())
        context._charon_shipped = True
    return spark


def _code_zip() -> str:
    path = Path(tempfile.gettempdir()) / f"charon-pipeline-{os.getpid()}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for package in SHIPPED:
            for file in (ROOT / package).rglob("*"):
                if file.suffix in (".py", ".lua") and "__pycache__" not in file.parts:
                    z.write(file, file.relative_to(ROOT))
    return str(path)


@contextlib.contextmanager
def jvm_output(log: Path) -> Iterator[None]:
    """Send what the JVM (and the Python workers it starts) print to `log`: the JVM inherits file
    descriptors 1 and 2 when the session starts, so they point at the log then and are put back after."""
    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def failure(e: BaseException) -> str:
    """One line for a failed Spark job: a PythonException / Py4JJavaError carries the Python error raised in
    a task, if there is one, which says most."""
    text = str(e).strip()
    found = re.findall(r"^\w*(?:Error|Exception): .*$", text, re.MULTILINE)
    return (found[-1] if found else text.splitlines()[0] if text else type(e).__name__)[:300]
