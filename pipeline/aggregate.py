"""Every aggregate of analysis.py over a records DataFrame, collected (they are small) as Arrow tables."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline import trends
from pipeline.errors import NothingToAnalyse

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

TABLES = (
    "by_source", "rate", "claim_counts", "time_to_death", "signatures", "signature_fields",
    "signature_rate", "signature_ids", "rejections", "consumers",
    "repeat_offenders", "quality",
)  # fmt: skip


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
ROWS_PER_SHUFFLE_PARTITION = 250_000  # of the enriched rows an aggregate reads; its shuffle is far smaller
MAX_SHUFFLE_PARTITIONS = 2_000
SPARK_DEFAULT = "200"  # spark.sql.shuffle.partitions when nobody set it (or set it to 200)


def shuffle_partitions(rows: int, cores: int) -> int:
    """The aggregates' shuffle partitions, from the data: two per core (every core busy, with some to
    spare for skew), more when the rows are many, never more than MAX_SHUFFLE_PARTITIONS (Spark's fixed 200
    was 100 tiny tasks a core for each of the dozen aggregates of a laptop-sized run; adaptive execution
    coalesces what is still too small)."""
    return max(2 * max(cores, 1), min(MAX_SHUFFLE_PARTITIONS, -(-rows // ROWS_PER_SHUFFLE_PARTITION)))


@dataclass
class Insights:
    tables: dict[str, pa.Table]
    rate_width_s: int
    total: int
    first_ms: int  # the first and last death analysed
    last_ms: int
    timings: dict[str, float] = field(default_factory=dict)
    shuffle_partitions: int | None = None  # what the aggregates ran with, when set from the data

    def rows(self, name: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.tables[name].to_pylist()
        return rows


def analyse(
    spark: SparkSession,
    records: DataFrame,
    *,
    step: Callable[[str], None] = lambda _: None,
    keep: str | None = None,
    since_ms: int | None = None,
    top: int = 15,
    save: str | None = None,
    history: str | None = None,
) -> Insights:
    """The tables of TABLES, each sorted as analysis.ORDER says. `step` is told each step's name as it
    starts ("" at the end); `keep`: also write every enriched message there (Parquet, from the executors);
    `since_ms`: the previous run's last death, after which a signature's messages are `recent`; `top`: the
    signatures (the most messages first) whose ids signature_ids lists, with the fix-first one. `save`:
    first write the records there (Parquet, from the executors), with those kept in `history` (a previous
    run's `save`) when given, and analyse what was written: every dead letter of both (--since-last)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline import analysis

    timings: dict[str, float] = {}
    started = time.monotonic()
    if save is not None:
        step("keeping the records")
        if history is not None:
            records = records.unionByName(spark.read.parquet(history), allowMissingColumns=True)
        records.write.mode("overwrite").parquet(save)
        records = spark.read.parquet(save)
    step("reading and parsing")
    enriched = analysis.enrich(records).persist(StorageLevel.MEMORY_AND_DISK)
    before, partitions = spark.conf.get(SHUFFLE_PARTITIONS) or SPARK_DEFAULT, None
    try:
        span = enriched.agg(F.count("*"), F.min("at_ms"), F.max("at_ms")).first()
        assert span is not None
        total, first_ms, last_ms = span
        timings["read_s"] = time.monotonic() - started
        if total == 0:
            raise NothingToAnalyse("the input holds no messages; nothing to analyse.")
        # unless the operator chose (--conf, spark-defaults.conf, or set in this session): put back after
        if not spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS) and before == SPARK_DEFAULT:
            partitions = shuffle_partitions(total, spark.sparkContext.defaultParallelism)
            spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
        width = analysis.rate_width_s(first_ms or 0, last_ms or 0)
        recent_ms = analysis.recent_from(last_ms or 0, since_ms)
        frames = {
            "by_source": analysis.by_source(enriched),
            "rate": analysis.rate(enriched, width),
            "claim_counts": analysis.claim_counts(enriched),
            "time_to_death": analysis.time_to_death(enriched),
            "signatures": analysis.signatures(enriched, recent_ms),
            "signature_fields": analysis.signature_fields(enriched),
            "signature_rate": analysis.signature_rate(enriched, width),
            "rejections": analysis.rejections(enriched),
            "consumers": analysis.consumers(enriched),
            "repeat_offenders": analysis.repeat_offenders(enriched),
            "quality": analysis.quality(enriched),
        }
        tables = {}

        def collect(name: str, frame: DataFrame) -> None:
            step(name.replace("_", " "))
            t = time.monotonic()
            order = [(column, how, "at_start") for column, how in analysis.ORDER[name]]
            tables[name] = frame.toArrow().sort_by(order)
            timings[f"{name}_s"] = time.monotonic() - t  # each table's share of the aggregates

        for name, frame in frames.items():
            collect(name, frame)
        top_keys = trends.redrive_keys(tables["signatures"].to_pylist(), top)  # needs the signatures first
        collect("signature_ids", analysis.signature_ids(enriched, top_keys))
        timings["aggregate_s"] = time.monotonic() - started - timings["read_s"]
        if keep:
            step("writing the messages")
            enriched.write.mode("overwrite").parquet(keep)
    finally:
        enriched.unpersist()
        if partitions is not None:
            spark.conf.set(SHUFFLE_PARTITIONS, before)
    step("")
    return Insights(
        tables=tables,
        rate_width_s=width,
        total=total,
        first_ms=first_ms or 0,
        last_ms=last_ms or 0,
        timings={k: round(v, 3) for k, v in timings.items()},
        shuffle_partitions=partitions,
    )
