"""What the job reads, as a records DataFrame (records.SCHEMA): a store's DLQs through its dead-letter export
(storage/export.py, by the `charon` data source), or `charon export` files (jsonl.py).

DeadLetterStore names a store the way the service's settings do (a URI, a namespace, pooled or not);
dead_letter_queues() asks it, before Spark starts, what there is to read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import CharonError
from pipeline.errors import InsightsError, NothingToAnalyse
from storage.export import DeadLetterExport, Extent, shown
from storage.registry import open_export

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True, slots=True)
class DeadLetterStore:
    """A store to read: `uri` is the store's, or with `pooled` the pool catalogue's (every pool is read)."""

    uri: str
    namespace: str = "charon"
    pooled: bool = False

    def open(self) -> DeadLetterExport:
        return open_export(self.uri, namespace=self.namespace, pooled=self.pooled)


# A DLQ's marker range to read: (pool, project, queue, after, upto), markers in (after, upto].
Range = tuple[str | None, str, str, int, int]


def ranges_from(extents: Sequence[Extent], after: Mapping[tuple[str | None, str, str], int]) -> list[Range]:
    """Each DLQ from the marker `after` says it was read to (0: from its start) up to its highest now, and
    never below where it was read to: a DLQ whose newest messages were redriven, deleted or expired has
    nothing new (markers only grow; a DLQ deleted and made again starts them over, and is read again once
    they pass that marker, or by a run without --since-last)."""
    out = []
    for e in extents:
        start = after.get(e.key, 0)
        out.append((e.pool, e.project, e.queue, start, max(e.hi, start)))
    return out


def dead_letter_queues(
    store: DeadLetterStore, project: str | None, queues: Sequence[str] | None
) -> list[Extent]:
    """The DLQs to read and how many messages each holds; InsightsError when the store cannot be read,
    NothingToAnalyse when there is nothing in it to read."""
    try:
        extents = store.open().extents(project, queues)
    except CharonError as e:
        raise InsightsError(str(e)) from None
    if not extents:
        where = f"project {project!r}" if project else "any project"
        what = f"queue(s) {', '.join(queues)}" if queues else "any dead-letter queue"
        raise NothingToAnalyse(f"no messages in {what} of {where} at {shown(store.uri)}; nothing to analyse.")
    return extents


def from_store(
    spark: SparkSession,
    store: DeadLetterStore,
    *,
    project: str | None = None,
    queues: Sequence[str] | None = None,
    partitions: int | None = None,
    max_body_bytes: int,
    now_ms: int | None = None,
    ranges: Sequence[Range] | None = None,
) -> DataFrame:
    """The store's dead letters, read by the `charon` data source in `partitions` partitions (default: 4 per
    core Spark has), skipping messages expired at `now_ms` (default: now); with `ranges`, only those DLQs'
    messages with markers in (after, upto]."""
    reader = (
        spark.read.format("charon")
        .option("uri", store.uri)
        .option("pooled", str(store.pooled).lower())
        .option("namespace", store.namespace)
        .option("numPartitions", partitions or 4 * spark.sparkContext.defaultParallelism)
        .option("maxBodyBytes", max_body_bytes)
        .option("nowMs", int(time.time() * 1000) if now_ms is None else now_ms)
    )
    if project:
        reader = reader.option("project", project)
    if queues:
        reader = reader.option("queues", ",".join(queues))
    if ranges is not None:
        reader = reader.option("markers", json.dumps([list(r) for r in ranges]))
    return reader.load()


def from_files(spark: SparkSession, paths: Sequence[str], *, max_body_bytes: int) -> DataFrame:
    """The messages of `charon export` files (local paths, hdfs://, s3a://: whatever Spark reads)."""
    from pipeline import jsonl

    return jsonl.read(spark, list(paths), max_body_bytes=max_body_bytes)
