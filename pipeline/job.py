"""Run DLQ insights: read dead letters, aggregate them in Spark, write Parquet tables and an HTML report.

  charon insights --storage-uri redis://127.0.0.1:6379/0 --out ./insights          (local[*])
  spark-submit --master spark://host:7077 pipeline/job.py --storage-uri ... --out /shared/insights

Both run main(). Nothing here assumes local mode: the master comes from --master or spark-submit, the code
the tasks import (pipeline, storage, core) is shipped to the executors with addPyFile, and the tables and
report are written by the driver from collected (small) aggregates. Only --keep-messages writes from the
executors, so its --out must be a path every node sees (or hdfs://, s3a://...).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if not __package__:  # run as a file by spark-submit: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import DEFAULT_MAX_BODY_BYTES

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.sources import QueueExtent

EXIT_FAILED, EXIT_EMPTY = 1, 3
ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pipeline", "storage", "core")  # the packages the executors import
TABLES = ("by_source", "rate", "claim_counts", "time_to_death", "signatures", "repeat_offenders", "quality")
MIN_JAVA = 17


class InsightsError(Exception):
    """Why the job could not run, for the user: printed as is, no stack trace."""

    exit_code = EXIT_FAILED


class NothingToAnalyse(InsightsError):
    exit_code = EXIT_EMPTY


@dataclass
class Insights:
    tables: dict[str, pa.Table]
    rate_width_s: int
    total: int
    timings: dict[str, float] = field(default_factory=dict)
    inputs: str = ""

    def rows(self, name: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.tables[name].to_pylist()
        return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--storage-uri", help="read the store (default: CHARON_STORAGE_URI)")
    src.add_argument("--input", nargs="+", metavar="JSONL", help="read `charon export` files instead")
    p.add_argument(
        "--namespace", default=None, help="key/collection prefix (default: CHARON_NAMESPACE or charon)"
    )
    p.add_argument("--project", help="one project only (default: all)")
    p.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="DLQ",
        help="a DLQ to read (repeatable; default: every DLQ)",
    )
    p.add_argument("--out", default="insights", help="output directory (default: ./insights)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--partitions", type=int, help="read partitions (default: 4 per core Spark has)")
    p.add_argument(
        "--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="longer bodies are counted as huge"
    )
    p.add_argument("--top", type=int, default=15, help="signatures and repeat offenders in the report")
    p.add_argument("--keep-messages", action="store_true", help="also write every analysed message (Parquet)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="charon insights", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


def run_cli(args: argparse.Namespace) -> int:
    """The command: checks that fail fast (store, Java) before Spark starts, then the job, then a summary."""
    out = Path(args.out)
    say = _Say(quiet=args.quiet)
    try:
        uri, namespace = _store(args)
        if uri is not None:
            extents = probe(uri, namespace, args.project, args.queues)
            say(
                f"{sum(e.count for e in extents):,} messages in {len(extents)} DLQ(s): "
                + ", ".join(f"{e.project}/{e.queue}" for e in extents[:5])
                + (" ..." if len(extents) > 5 else "")
            )
        out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with _jvm_output(out / "spark.log"):
            spark = session(args.master)
        session_s = time.monotonic() - started
        context = spark.sparkContext
        cores = context.defaultParallelism
        say(f"Spark {spark.version} on {context.master} ({cores} cores); its log: {out}/spark.log")
        with Progress(spark, say) as progress:
            insights = analyse(
                spark,
                load(spark, uri=uri, namespace=namespace, args=args),
                progress=progress,
                keep=str(out / "messages") if args.keep_messages else None,
            )
        insights.timings["session_s"] = round(session_s, 3)
        write(insights, out, top=args.top)
    except InsightsError as e:
        print(f"charon insights: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a Spark failure: one line, the rest is in spark.log
        print(
            f"charon insights: the Spark job failed: {_first_line(e)} (details: {out / 'spark.log'})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(summary(insights, out, top=5))
    return 0


def store_of(args: argparse.Namespace) -> tuple[str | None, str]:
    """The store's URI (None if not given) and namespace: the options, else CHARON_STORAGE_URI and
    CHARON_NAMESPACE, as the service reads them."""
    uri = args.storage_uri or os.environ.get("CHARON_STORAGE_URI")
    return uri, args.namespace or os.environ.get("CHARON_NAMESPACE") or "charon"


def _store(args: argparse.Namespace) -> tuple[str | None, str]:
    uri, namespace = store_of(args)
    if args.input:
        return None, namespace
    if not uri:
        raise InsightsError(
            "say where the dead letters are: --storage-uri URI (or CHARON_STORAGE_URI), or --input FILE.jsonl"
        )
    return uri, namespace


def probe(uri: str, namespace: str, project: str | None, queues: list[str] | None) -> list[QueueExtent]:
    """The DLQs to read and how many messages each holds; a clear error when there is nothing to read."""
    from pipeline.sources import SourceError, open_source

    try:
        extents = open_source(uri, namespace=namespace).queues(project, queues)
    except SourceError as e:
        raise InsightsError(str(e)) from None
    if not extents:
        where = f"project {project!r}" if project else "any project"
        what = f"queue(s) {', '.join(queues)}" if queues else "any dead-letter queue"
        raise NothingToAnalyse(f"no messages in {what} of {where} at {_redact(uri)}; nothing to analyse.")
    return extents


def _redact(uri: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", uri)


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


def load(spark: SparkSession, *, uri: str | None, namespace: str, args: argparse.Namespace) -> DataFrame:
    if uri is None:
        from pipeline import jsonl

        return jsonl.read(spark, list(args.input), max_body_bytes=args.max_body_bytes)
    reader = (
        spark.read.format("charon")
        .option("uri", uri)
        .option("namespace", namespace)
        .option("numPartitions", args.partitions or 4 * spark.sparkContext.defaultParallelism)
        .option("maxBodyBytes", args.max_body_bytes)
        .option("nowMs", int(time.time() * 1000))
    )
    if args.project:
        reader = reader.option("project", args.project)
    if args.queues:
        reader = reader.option("queues", ",".join(args.queues))
    return reader.load()


def analyse(
    spark: SparkSession, records: DataFrame, *, progress: Progress | None = None, keep: str | None = None
) -> Insights:
    """Every aggregate of analysis.py over `records`, collected (they are small) as Arrow tables."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline import analysis

    step = progress.step if progress else (lambda _: None)
    timings: dict[str, float] = {}
    started = time.monotonic()
    step("reading and parsing")
    enriched = analysis.enrich(records).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        span = enriched.agg(F.count("*"), F.min("at_ms"), F.max("at_ms")).first()
        assert span is not None
        total, first_ms, last_ms = span
        timings["read_s"] = time.monotonic() - started
        if total == 0:
            raise NothingToAnalyse("the input holds no messages; nothing to analyse.")
        width = analysis.rate_width_s(first_ms or 0, last_ms or 0)
        frames = {
            "by_source": analysis.by_source(enriched),
            "rate": analysis.rate(enriched, width),
            "claim_counts": analysis.claim_counts(enriched),
            "time_to_death": analysis.time_to_death(enriched),
            "signatures": analysis.signatures(enriched),
            "repeat_offenders": analysis.repeat_offenders(enriched),
            "quality": analysis.quality(enriched),
        }
        tables = {}
        for name, frame in frames.items():
            step(name.replace("_", " "))
            order = [(column, how, "at_start") for column, how in analysis.ORDER[name]]
            tables[name] = frame.toArrow().sort_by(order)
        timings["aggregate_s"] = time.monotonic() - started - timings["read_s"]
        if keep:
            step("writing the messages")
            enriched.write.mode("overwrite").parquet(keep)
    finally:
        enriched.unpersist()
    step("")
    return Insights(
        tables=tables, rate_width_s=width, total=total, timings={k: round(v, 3) for k, v in timings.items()}
    )


def write(insights: Insights, out: Path, *, top: int) -> None:
    import pyarrow.parquet as pq

    from pipeline import report

    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name, table in insights.tables.items():
        pq.write_table(table, tables / f"{name}.parquet")
    (out / "report.html").write_text(report.html(insights, top=top), encoding="utf-8")


def summary(insights: Insights, out: Path, *, top: int) -> str:
    from pipeline.report import duration

    lines = [
        f"{insights.total:,} messages analysed; report: {out / 'report.html'}, tables: {out / 'tables'}/",
        "",
    ]
    head = ("project/source queue", "reason", "messages", "claims p50", "to death p50")
    lines.append("  {:<36} {:<11} {:>9} {:>10} {:>12}".format(*head))
    for r in insights.rows("by_source")[:10]:
        lines.append(
            f"  {r['project'] + '/' + r['source_queue']:<36.36} {r['reason']:<11} {r['messages']:>9,} "
            f"{r['claim_count_p50']:>10g} {duration(r['ttd_p50_s']):>12}"
        )
    sigs = insights.rows("signatures")
    if sigs:
        lines += ["", f"  top failure signatures ({len(sigs):,} in all):"]
        for s in sigs[:top]:
            lines.append(
                f"  {s['messages']:>9,}  {(s['error'] or '(no error text)')[:60]:<60}  {s['shape'][:50]}"
            )
    offenders = insights.rows("repeat_offenders")
    if offenders:
        worst = offenders[0]
        lines += [
            "",
            f"  repeat offenders: {len(offenders):,} bodies dead-lettered more than once "
            f"(worst: {worst['messages']}x, {worst['preview'][:50]})",
        ]
    bad: dict[str, int] = {}
    for q in insights.rows("quality"):
        if q["bucket"] != "ok":
            bad[q["bucket"]] = bad.get(q["bucket"], 0) + q["messages"]
    if bad:
        lines += ["", "  not analysed by body: " + ", ".join(f"{k} {v:,}" for k, v in sorted(bad.items()))]
    return "\n".join(lines)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    # PythonException / Py4JJavaError: the Python error raised in a task, if there is one, says most
    found = re.findall(r"^\w*(?:Error|Exception): .*$", text, re.MULTILINE)
    return (found[-1] if found else text.splitlines()[0] if text else type(e).__name__)[:300]


class _Say:
    def __init__(self, *, quiet: bool):
        self.quiet = quiet

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(f"charon insights: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _jvm_output(log: Path) -> Iterator[None]:
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


class Progress:
    """Prints the step and its Spark stage's progress (tasks done / all) on stderr, twice a second."""

    def __init__(self, spark: SparkSession, say: _Say, stream: TextIO | None = None):
        self.spark, self.say, self.stream = spark, say, stream or sys.stderr
        self.current = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._tty = self.stream.isatty()

    def __enter__(self) -> Progress:
        if self._tty and not self.say.quiet:  # elsewhere step() says each step on its own line
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def step(self, name: str) -> None:
        self.current = name
        if name and not self._tty:
            self.say(f"{name} ...")

    def _run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            if not self.current:
                continue
            done = total = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info:
                    done, total = done + info.numCompletedTasks, total + info.numTasks
            bar = f" [{'#' * (20 * done // total):<20}] {done}/{total} tasks" if total else ""
            self.stream.write(f"\r\033[Kcharon insights: {self.current}{bar}")
            self.stream.flush()
        self.stream.write("\r\033[K")
        self.stream.flush()


if __name__ == "__main__":
    sys.exit(main())
