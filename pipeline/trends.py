"""Runs against each other: every run of `charon insights` keeps its tables under <out>/runs/<stamp>/ with a
run.json, and the next run in the same --out with the same scope (project and queues) compares its
signatures with them: new, growing, steady or quiet, and which one to fix first.

The job counts each signature's `recent` messages (dead-lettered after the previous run's last death,
analysis.recent_from), so the comparison is exact however the queues were read; the status is a join with the
previous run's signatures table, in Spark (with_status). The runs are found, read and pruned through Hadoop's
FileSystem (hadoop.Files), so --out may be any Hadoop URI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline import hadoop

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

GROWING = 1.5  # growing: dead-lettering since the previous run at this many times its rate in that run
MAX_RUNS = 1000  # --keep-runs' bound
KEEP_RUNS = 30  # runs of one scope kept in <out>/runs by default (the oldest are removed)
STALE_S = 86_400  # a run directory without run.json this old was cut off: removed
RECORDS = "records"  # a --since-last run's records (Parquet), in its directory: the next one adds to them


@dataclass(frozen=True)
class Run:
    """What a run leaves for the next: its span of deaths, its scope and where its signatures table is."""

    stamp: str
    first_ms: int
    last_ms: int
    scope: dict[str, Any]
    # per DLQ (pool, project, queue): the highest marker it read, where `--since-last` goes on from
    markers: dict[tuple[str | None, str, str], int] = field(default_factory=dict)
    path: str = ""  # its directory (a URI)
    records: str | None = None  # the records a --since-last run kept (every dead letter its tables count)

    @property
    def signatures(self) -> str:
        return table_of(self.path, "signatures")


def table_of(where: str, name: str) -> str:
    """Where a table is in a run's directory, and in --out (its newest copy): tables/<name>.parquet."""
    return hadoop.join(where, "tables", f"{name}.parquet")


def scope(project: str | None, queues: Iterable[str] | None) -> dict[str, Any]:
    return {"project": project, "queues": sorted(queues) if queues else None}


def _meta(files: hadoop.Files, run: str) -> dict[str, Any] | None:
    """A finished run's run.json, or None (cut off before it wrote one, or not ours)."""
    try:
        meta = json.loads(files.read_text(hadoop.join(run, "run.json")) or "null")
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    ok = isinstance(meta.get("first_ms"), int) and isinstance(meta.get("last_ms"), int) and "scope" in meta
    return meta if ok else None


def previous(
    files: hadoop.Files, out: str, this_scope: Mapping[str, Any], *, with_records: bool = False
) -> Run | None:
    """The newest finished run in `out` (a URI) with this scope and its signatures table (`with_records`:
    of those that kept their records, the one --since-last goes on from), else None."""
    for entry in reversed(files.children(hadoop.join(out, "runs"))):
        if not entry.is_dir:
            continue
        meta = _meta(files, entry.uri)
        records = hadoop.join(entry.uri, RECORDS)
        kept = files.is_dir(records)
        if meta is None or meta["scope"] != this_scope or (with_records and not kept):
            continue
        if not _readable(files, table_of(entry.uri, "signatures")):  # gone, or not ours
            continue
        markers = {}
        for m in meta.get("markers") or []:
            if isinstance(m, list) and len(m) == 4 and isinstance(m[3], int):
                markers[(m[0], m[1], m[2])] = m[3]
        return Run(
            entry.name, meta["first_ms"], meta["last_ms"], meta["scope"], markers, entry.uri,
            records if kept else None,
        )  # fmt: skip
    return None


def _readable(files: hadoop.Files, table: str) -> bool:
    """Whether Spark reads the columns with_status needs from a run's signatures table."""
    try:
        files.spark.read.parquet(table).select("project", "signature", "messages").schema  # noqa: B018
    except Exception:  # missing, unreadable or another layout: a run this one does not compare with
        return False
    return True


def with_status(signatures: DataFrame, before: Run | None, last_ms: int) -> DataFrame:
    """The signatures table with each one's `status` against the previous run (null when there is none):
    `new` (not in it), `quiet` (nothing dead-lettered since), `growing` (dead-lettering since at GROWING
    times or more its rate over that run's span), else `steady`. A join with that run's table, in Spark."""
    from pyspark.sql import functions as F

    if before is None:
        return signatures.withColumn("status", F.lit(None).cast("string"))
    then = signatures.sparkSession.read.parquet(before.signatures).select(
        "project", "signature", F.col("messages").alias("_then")
    )
    rate_then = F.col("_then") / F.lit(max(before.last_ms - before.first_ms, 1))
    rate_now = F.col("recent") / F.lit(max(last_ms - before.last_ms, 1))
    status = (
        F.when(F.col("_then").isNull(), "new")
        .when(F.col("recent") == 0, "quiet")
        .when(rate_now >= F.lit(GROWING) * rate_then, "growing")
        .otherwise("steady")
    )
    joined = signatures.join(then, ["project", "signature"], "left")
    return joined.select(*signatures.columns, status.alias("status"))


def fix_first(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The signature with the most recent messages (then the most messages); None when none is recent."""
    best = max(rows, key=lambda r: (r["recent"], r["messages"]), default=None)
    return best if best is not None and best["recent"] > 0 else None


def redrive_keys(rows: Sequence[Mapping[str, Any]], top: int) -> list[tuple[str, str]]:
    """The (project, signature)s that get redrive requests: the report's `top` (rows in the signatures
    table's order) and the fix-first one."""
    keys = [(r["project"], r["signature"]) for r in rows[:top]]
    first = fix_first(rows)
    if first is not None and (first["project"], first["signature"]) not in keys:
        keys.append((first["project"], first["signature"]))
    return keys


def start(files: hadoop.Files, out: str, stamp: str) -> str:
    """<out>/runs/<stamp>/ made; its URI."""
    run = hadoop.join(out, "runs", stamp)
    files.mkdirs(run)
    return run


def finish(files: hadoop.Files, run: str, meta: Mapping[str, Any], keep_runs: int) -> None:
    """run.json written last (a run without one is never compared with); then, of the finished runs with this
    run's scope, all but the newest `keep_runs` removed (never the newest that kept records: --since-last
    goes on from it), and when this run kept records, those of the others; and runs that never finished once
    a day old (a run of another scope, or one still being written, is left alone)."""
    files.write_text(hadoop.join(run, "run.json"), json.dumps(meta, indent=2))
    mine, cut_off = [], []
    for other in files.children(run.rsplit("/", 1)[0]):
        if not other.is_dir:
            continue
        found = _meta(files, other.uri)
        if found is None:
            cut_off.append(other)
        elif found["scope"] == meta["scope"]:
            mine.append(other.uri)
    stale = (time.time() - STALE_S) * 1000
    kept = [p for p in mine if files.is_dir(hadoop.join(p, RECORDS))][-1:]
    old = [p for p in mine[:-keep_runs] if p not in kept]
    old += [e.uri for e in cut_off if files.newest_ms(e.uri) < stale]
    for path in old:
        files.delete(path)
    if kept == [run]:
        for other_run in mine:
            if other_run != run:
                files.delete(hadoop.join(other_run, RECORDS))
