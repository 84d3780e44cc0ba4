"""The Spark Python data source `charon`: a store's dead-lettered messages as a DataFrame, read through the
store's dead-letter export (storage/export.py), so it knows no layout and reads Redis, MongoDB and pooled
deployments alike.

Name: `charon` (`spark.dataSource.register(CharonDataSource)`, done by spark.session()).
Schema: records.SCHEMA (records.DDL).
Options:
  uri             the storage URI, as CHARON_STORAGE_URI (redis://, rediss://, unix://, redis+cluster://,
                  mongodb://, mongodb+srv://); with pooled, the pool catalogue's (CHARON_MANAGEMENT_URI);
                  required
  pooled          "true": read every pool of the catalogue at uri (default "false")
  namespace       key / collection prefix, as CHARON_NAMESPACE (default "charon")
  project         read one project only (default: every project)
  queues          comma-separated DLQ names (default: every DLQ, as DeadLetterExport.extents says)
  numPartitions   about how many partitions to cut (default 8); each is one DLQ's marker range
  maxBodyBytes    a longer body is read as null, its length kept (default records.DEFAULT_MAX_BODY_BYTES)
  nowMs           skip messages expired at this time (default: when the read is planned)
  markers         JSON [[pool, project, queue, after, upto], ...]: read only these DLQs, and of each only the
                  messages with markers in (after, upto] (charon insights: a run reads up to the markers it
                  saw when it began, and --since-last from where the previous run stopped)
Partitioning: by queue (and pool), then by marker range within a queue (plan()), so the reads run in
parallel. Each partition opens its own export in the task and yields Arrow RecordBatches, one per page.

Example:
  spark.read.format("charon").option("uri", "redis://127.0.0.1:6379/0").option("queues", "orders.dlq").load()
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipeline.records import DDL, DEFAULT_MAX_BODY_BYTES, batch
from storage.export import Extent, Slice
from storage.registry import open_export

DEFAULT_PARTITIONS = 8


def plan(extents: Sequence[Extent], *, slices: int, now_ms: int | None = None) -> list[Slice]:
    """About `slices` slices over all the queues, each with a share of the messages: a queue gets slices in
    proportion to its count (at least one), cut into equal marker ranges."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    total = sum(e.count for e in extents)
    return [
        s
        for e in extents
        if e.count
        for s in e.cut(max(1, min(e.count, round(slices * e.count / total))), now_ms=now_ms)
    ]


class CharonDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "charon"

    def schema(self) -> str:
        return DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return CharonReader(self.options)  # case-insensitive: a plain dict of it has the keys lower-cased


class SlicePartition(InputPartition):
    def __init__(self, s: Slice):
        super().__init__(s)
        self.slice = s


class CharonReader(DataSourceReader):
    def __init__(self, options: Mapping[str, Any]):
        if not options.get("uri"):
            raise ValueError("The charon data source needs the option uri (a storage URI).")
        self.uri: str = options["uri"]
        self.pooled = str(options.get("pooled") or "false").lower() == "true"
        self.namespace: str = options.get("namespace") or "charon"
        self.project: str | None = options.get("project") or None
        queues = options.get("queues")
        self.queues: list[str] | None = [q for q in queues.split(",") if q] if queues else None
        self.partitions_wanted = int(options.get("numPartitions") or DEFAULT_PARTITIONS)
        self.max_body_bytes = int(options.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
        now = options.get("nowMs")
        self.now_ms = int(now) if now else None
        ranges = options.get("markers")
        self.ranges = (
            {
                (pool, project, queue): (after, upto)
                for pool, project, queue, after, upto in json.loads(ranges)
            }
            if ranges
            else None
        )

    def partitions(self) -> Sequence[InputPartition]:
        export = open_export(self.uri, namespace=self.namespace, pooled=self.pooled)
        extents = export.extents(self.project, self.queues)
        if self.ranges is not None:  # only these DLQs, in these marker ranges
            extents = [
                part
                for e in extents
                if e.key in self.ranges and (part := e.within(*self.ranges[e.key])) is not None
            ]
        return [SlicePartition(s) for s in plan(extents, slices=self.partitions_wanted, now_ms=self.now_ms)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        export = open_export(self.uri, namespace=self.namespace, pooled=self.pooled)
        for page in export.read(partition.slice):
            yield batch(page, max_body_bytes=self.max_body_bytes)
