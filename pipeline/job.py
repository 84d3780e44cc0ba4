"""The insights job (`charon insights`), from what to read to the tables and report written: the store
probed, Spark started with the JVM's output in a log, the previous runs consulted, the records read, every
aggregate collected (aggregate.py) and written (output.py). app/insights.py parses its options and prints.

Failures are InsightsError (the message says what to change); a Spark failure becomes JobFailed, one line
naming where the rest is. The records a --since-last run began to keep are removed if it does not finish.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import DEFAULT_MAX_BODY_BYTES, aggregate, hadoop, load, output, spark, trends
from pipeline.errors import InsightsError, JobFailed, NothingToAnalyse
from pipeline.insights import Insights
from pipeline.progress import Progress
from storage.export import Extent

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Say = Callable[[str], None]


@dataclass(frozen=True)
class Job:
    """What to analyse and how: `store`, else the `charon export` files `inputs`; into `out` (a local path
    or a Hadoop URI). The rest are `charon insights`' options of the same names."""

    out: str
    store: load.DeadLetterStore | None = None
    inputs: Sequence[str] = ()
    project: str | None = None
    queues: Sequence[str] | None = None
    master: str | None = None
    partitions: int | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    top: int = 15
    keep_messages: bool = False
    since_last: bool = False
    keep_runs: int = trends.KEEP_RUNS


@dataclass(frozen=True)
class Plan:
    """What a run reads and compares with, decided before it reads."""

    before: trends.Run | None  # the previous run, compared with
    since: trends.Run | None  # the run --since-last goes on from (the newest that kept its records)
    ranges: list[load.Range] | None  # the marker ranges read from a store; None for files


def run(job: Job, *, say: Say | None = None) -> Insights:
    """The job, its tables and report written into `job.out`; the Insights it collected (released). `say`
    is told what the job found and does, and its progress is drawn on stderr; None: nothing is said."""
    tell: Say = say or (lambda _: None)
    # Spark and Hadoop are given URIs, never a path the cluster's default filesystem would resolve
    out = hadoop.location(job.out)
    local_out = hadoop.local(out)
    log = local_out / "spark.log" if local_out else None  # else in this user's directory, made below
    save = _records_dir(out) if job.since_last else None
    files: hadoop.Files | None = None
    try:
        # the store is probed before Spark starts
        extents = load.dead_letter_queues(job.store, job.project, job.queues) if job.store is not None else []
        log = _log_file(out)
        session, session_s = _session(job.master, log, tell)
        files = hadoop.Files(session, out)
        files.mkdirs(out)
        plan = _plan(files, out, job, extents, tell)
        return _analysed(session, job, out, plan, save=save, session_s=session_s, quiet=say is None)
    except InsightsError:
        raise
    except Exception as e:  # a Spark failure: one line, the rest is in the log
        raise JobFailed(_failed(e, log)) from None
    finally:  # the records a run that did not finish began to keep (a finished one moved them into its run)
        if save is not None and files is not None:
            with contextlib.suppress(Exception):  # the JVM may be gone with what failed
                files.delete(save)


def _records_dir(out: str) -> str:
    """Where a --since-last run keeps its records until it finishes (then they move into its run)."""
    return hadoop.join(out, "runs", f".records-{uuid.uuid4().hex}")


def _log_file(out: str) -> Path:
    """Where the JVM's output goes: spark.log in `out` when it is a local directory (made here), else in this
    user's own directory."""
    local_out = hadoop.local(out)
    if local_out is None:
        return spark.own_directory() / "insights-spark.log"
    try:
        local_out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InsightsError(f"--out {out}: {e.strerror}") from None
    return local_out / "spark.log"


def _session(master: str | None, log: Path, say: Say) -> tuple[SparkSession, float]:
    """The SparkSession, the JVM's output in `log`, and how long it took to start."""
    started = time.monotonic()
    with spark.jvm_output(log):
        session = spark.session(master)
    session_s = time.monotonic() - started
    context = session.sparkContext
    say(f"Spark {session.version} on {context.master} ({context.defaultParallelism} cores); its log: {log}")
    return session, session_s


def _plan(files: hadoop.Files, out: str, job: Job, extents: list[Extent], say: Say) -> Plan:
    scope = trends.scope(job.project, job.queues)
    before = trends.previous(files, out, scope)
    # the run --since-last goes on from: the newest that kept its records (a --since-last run; one without
    # --since-last in between is compared with, but neither goes on from nor drops them)
    since = trends.previous(files, out, scope, with_records=True) if job.since_last else None
    ranges = None
    if job.store is not None:
        ranges = _ranges(extents, since, say)
        if job.since_last and since is None:
            say(
                "--since-last: "
                + ("no previous run kept its records" if before else "no previous run")
                + "; reading every DLQ whole this time, and keeping the records for the next"
            )
    if before:
        say(f"comparing with the previous run, {before.stamp} (its last death {before.last_ms} ms)")
    return Plan(before, since, ranges)


def _ranges(extents: list[Extent], since: trends.Run | None, say: Say) -> list[load.Range]:
    """Each DLQ up to the marker it has now; with `since`, from where that run stopped. NothingToAnalyse
    when nothing arrived since."""
    ranges = load.ranges_from(extents, since.markers if since else {})
    if since and all(after >= upto for *_, after, upto in ranges):
        raise NothingToAnalyse(f"nothing was dead-lettered since the previous run ({since.stamp}).")
    say(
        f"{sum(e.count for e in extents):,} messages in {len(extents)} DLQ(s): "
        + ", ".join(f"{e.project}/{e.queue}" for e in extents[:5])
        + (" ..." if len(extents) > 5 else "")
        + (f"; reading what arrived since the previous run, {since.stamp}" if since else "")
    )
    return ranges


def _failed(e: Exception, log: Path | None) -> str:
    where = "spark-submit's output" if spark.submitted() else log or "the JVM's output"
    return f"the Spark job failed: {spark.failure(e)} (details: {where})"


def _analysed(
    session: SparkSession, job: Job, out: str, plan: Plan, *, save: str | None, session_s: float, quiet: bool
) -> Insights:
    """The records read and analysed, the tables and report written; the Insights, released."""
    with Progress(session, label="charon insights", quiet=quiet) as progress:
        insights = aggregate.analyse(
            session,
            _records(session, job, plan.ranges),
            step=progress.step,
            keep=hadoop.join(out, "messages") if job.keep_messages else None,
            since_ms=plan.before.last_ms if plan.before else None,
            top=job.top,
            save=save,
            history=plan.since.records if plan.since else None,
        )
        insights.timings["session_s"] = round(session_s, 3)
        progress.step("writing the tables and the report")
        _write(insights, out, job, plan, save)
        progress.step("")
    return insights


def _records(session: SparkSession, job: Job, ranges: list[load.Range] | None) -> DataFrame:
    if job.store is None:
        return load.from_files(session, job.inputs, max_body_bytes=job.max_body_bytes)
    return load.from_store(
        session,
        job.store,
        project=job.project,
        queues=job.queues,
        partitions=job.partitions,
        max_body_bytes=job.max_body_bytes,
        ranges=ranges,
    )


def _write(insights: Insights, out: str, job: Job, plan: Plan, save: str | None) -> None:
    """The tables, report and run written (output.write), then the cached tables released."""
    try:
        output.write(
            insights,
            out,
            top=job.top,
            scope=trends.scope(job.project, job.queues),
            before=plan.before,
            keep_runs=job.keep_runs,
            markers=[(pool, project, queue, upto) for pool, project, queue, _, upto in plan.ranges or []],
            since_last=plan.since is not None,
            records=save,
            max_body_bytes=job.max_body_bytes,
        )
    finally:
        insights.release()
