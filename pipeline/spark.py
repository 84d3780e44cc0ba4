"""The SparkSession the job runs on: Java checked first, the `charon` data source registered, the code the
tasks import (pipeline, storage, core) shipped to the executors, and the executors' Python probed.

Nothing here assumes local mode: the master is the caller's, else spark-submit's, else local[*]; the code
goes to a cluster's executors with addPyFile, as one archive per version of the code (named by its hash, in
the user's own directory under the temporary one, so runs do not leave one each). Spark Connect (sc://) is
refused: the job needs a classic session (addPyFile, the SparkContext's jobs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
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
LOG4J2 = ROOT / "pipeline" / "log4j2.properties"  # WARN and up, Spark's INFO chatter off
EXECUTOR_NEEDS = ("pyarrow", "pandas", "orjson", "redis", "pymongo")  # what a task imports beyond pyspark


def refuse_connect(master: str | None) -> None:
    """Spark Connect has no SparkContext to ship code with or run the probe on: say so before anything."""
    remote = os.environ.get("SPARK_REMOTE") or os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    if (master and master.startswith("sc://")) or remote:
        raise InsightsError(
            f"Spark Connect ({master if master and master.startswith('sc://') else 'SPARK_REMOTE'}) is not "
            "supported: charon insights needs a classic Spark session (it ships its code to the executors "
            "and reads with a Python data source through the SparkContext). Give the cluster's master "
            "(--master spark://HOST:7077, yarn, k8s://...) or run it with spark-submit."
        )


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
            "sudo apt-get install openjdk-17-jre-headless (make insights does it when run as root)."
        )


def submitted() -> bool:
    """Whether spark-submit started the JVM (and chose the master): its output is then spark-submit's."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(master: str | None = None) -> SparkSession:
    """The SparkSession (an existing one is reused), with the `charon` data source registered and our code
    shipped to the executors. The master: `master`, else spark-submit's, else local[*]. In local mode the
    workers run this Python (pyarrow is in it; maybe not in `python3`) and Spark binds to loopback."""
    from pyspark.sql import SparkSession

    from pipeline.datasource import CharonDataSource

    refuse_connect(master)
    is_submitted = submitted()
    fresh = SparkSession.getActiveSession() is None
    if fresh and not is_submitted:
        master = master or "local[*]"
        check_java()
    builder = SparkSession.builder.appName("charon-insights").config("spark.sql.session.timeZone", "UTC")
    if fresh and not is_submitted:  # the driver JVM starts here: its log configuration with it
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"
        )
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
        context.setLogLevel("WARN")  # under spark-submit the JVM started with its own configuration
        context.addPyFile(code_archive())
        probe_executors(spark)
        context._charon_shipped = True
    return spark


def _shipped_files() -> list[Path]:
    return sorted(
        file
        for package in SHIPPED
        for file in (ROOT / package).rglob("*")
        if file.suffix in (".py", ".lua") and "__pycache__" not in file.parts
    )


def own_directory() -> Path:
    """<tmp>/charon-<uid>: this user's, 0700; another user's directory (or a symlink) there is refused."""
    folder = Path(tempfile.gettempdir()) / f"charon-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise InsightsError(
            f"{folder} is not a directory that only this user can write; remove it and retry."
        )
    return folder


def code_archive() -> str:
    """The --py-files archive of SHIPPED, in this user's own directory under the temporary one, named by its
    content's hash: made once per version of the code (atomically, so concurrent runs share it), reused by
    later runs."""
    files = _shipped_files()
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    path = own_directory() / f"charon-pipeline-{digest.hexdigest()[:16]}.zip"
    if not path.exists():
        fd, partial = tempfile.mkstemp(prefix=path.stem, suffix=".part", dir=path.parent)
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
            for file in files:
                z.write(file, file.relative_to(ROOT))
        os.replace(partial, path)
    return str(path)


def _probe(_: object) -> tuple[str, str, tuple[str, ...]]:
    """In an executor's Python: its executable, version and the EXECUTOR_NEEDS it cannot import."""
    import importlib

    missing = []
    for name in EXECUTOR_NEEDS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return sys.executable, f"{sys.version_info.major}.{sys.version_info.minor}", tuple(missing)


def probe_executors(spark: SparkSession) -> None:
    """One small task per default partition: every executor Python it reaches can import what the job
    needs, else InsightsError saying which Python lacks what and how to fix it (before the job, not 45 s
    into it)."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    context = spark.sparkContext
    n = max(context.defaultParallelism, 1)
    driver = f"{sys.version_info.major}.{sys.version_info.minor}"
    fix = (
        f"set PYSPARK_PYTHON to a Python {driver} with Charon's packages on every worker (e.g. the "
        "virtualenv's bin/python made by make insights)"
    )
    try:
        found = set(context.parallelize(range(n), n).map(_probe).collect())
    except (Py4JJavaError, PySparkException) as e:  # its worker did not start (another Python, no pyspark)
        raise InsightsError(f"the executors' Python cannot run the job: {failure(e)}; {fix}.") from None
    for executable, version, missing in sorted(found):
        if version != driver:
            raise InsightsError(
                f"the executors' Python ({executable}) is {version}, the driver's {driver}: {fix}."
            )
        if missing:
            raise InsightsError(
                f"the executors' Python ({executable}, {version}) lacks {', '.join(missing)}: {fix}, or "
                f"install them there: pip install {' '.join(missing)}."
            )


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
