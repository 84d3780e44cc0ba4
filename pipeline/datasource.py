"""The Spark Python data source `charon`: a store's dead-lettered messages as a DataFrame.

Name: `charon` (`spark.dataSource.register(CharonDataSource)`, done by job.session()).
Schema: records.SCHEMA (records.DDL).
Options:
  uri             the storage URI, as CHARON_STORAGE_URI (redis://, rediss://, unix://, redis+cluster://,
                  mongodb://, mongodb+srv://); required
  namespace       key / collection prefix, as CHARON_NAMESPACE (default "charon")
  project         read one project only (default: every project)
  queues          comma-separated DLQ names (default: every DLQ, sources.py says which queues those are)
  numPartitions   about how many partitions to cut (default 8); each is one DLQ's marker range
  maxBodyBytes    a longer body is read as null, its length kept (default records.DEFAULT_MAX_BODY_BYTES)
  nowMs           skip messages expired at this time (default: when the read is planned)
Partitioning: by queue, then by marker range within a queue (sources.plan), so the reads run in parallel.
Each partition opens its own client in the task and yields Arrow RecordBatches.

Example:
  spark.read.format("charon").option("uri", "redis://127.0.0.1:6379/0").option("queues", "orders.dlq").load()
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipeline.records import DDL, DEFAULT_MAX_BODY_BYTES
from pipeline.sources import Slice, open_source, plan

DEFAULT_PARTITIONS = 8


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
        self.namespace: str = options.get("namespace") or "charon"
        self.project: str | None = options.get("project") or None
        queues = options.get("queues")
        self.queues: list[str] | None = [q for q in queues.split(",") if q] if queues else None
        self.partitions_wanted = int(options.get("numPartitions") or DEFAULT_PARTITIONS)
        self.max_body_bytes = int(options.get("maxBodyBytes") or DEFAULT_MAX_BODY_BYTES)
        now = options.get("nowMs")
        self.now_ms = int(now) if now else None

    def partitions(self) -> Sequence[InputPartition]:
        source = open_source(self.uri, namespace=self.namespace)
        slices = plan(
            source.queues(self.project, self.queues), slices=self.partitions_wanted, now_ms=self.now_ms
        )
        return [SlicePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SlicePartition)
        source = open_source(self.uri, namespace=self.namespace)
        yield from source.read(partition.slice, max_body_bytes=self.max_body_bytes)
