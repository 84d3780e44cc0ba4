"""Every aggregate of analysis.py over a records DataFrame: each table a cached Spark DataFrame (written
whole by Spark, output.py), of which only a bounded view comes to the driver (the report's rows: the top
signatures, consumers and offenders, at most SHOWN rows of the others) with each table's row count."""

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
SHOWN = 1_000  # rows of a table (beyond the top signatures and offenders) that come to the driver
TOP = ("signatures", "consumers", "repeat_offenders")  # their view: the `top` first rows
OF_SIGNATURES = ("signature_fields", "signature_rate")  # their view: the rows of the viewed signatures


def shuffle_partitions(rows: int, cores: int) -> int:
    """The aggregates' shuffle partitions, from the data: two per core (every core busy, with some to
    spare for skew), more when the rows are many, never more than MAX_SHUFFLE_PARTITIONS (Spark's fixed 200
    was 100 tiny tasks a core for each of the dozen aggregates of a laptop-sized run; adaptive execution
    coalesces what is still too small)."""
    return max(2 * max(cores, 1), min(MAX_SHUFFLE_PARTITIONS, -(-rows // ROWS_PER_SHUFFLE_PARTITION)))


@dataclass
class Insights:
    frames: dict[str, DataFrame]  # every table whole, cached until release()
    tables: dict[str, pa.Table]  # what came to the driver: each table's view (view())
    counts: dict[str, int]  # each table's rows
    rate_width_s: int
    total: int
    first_ms: int  # the first and last death analysed
    last_ms: int
    analysed: int = 0  # the messages with provenance (by_source's sum), the first and last of their deaths
    analysed_ms: tuple[int | None, int | None] = (None, None)
    not_ok: int = 0  # the messages not analysed by body (quality's buckets other than ok)
    top: int = 15
    timings: dict[str, float] = field(default_factory=dict)
    shuffle_partitions: int | None = None  # what the aggregates ran with, when set from the data

    def shown(self, name: str) -> list[dict[str, Any]]:
        """The view's rows, in the table's order (analysis.ORDER)."""
        rows: list[dict[str, Any]] = self.tables[name].to_pylist()
        return rows

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The whole table, brought to the driver and sorted (for a caller that knows it is small: tests,
        notebooks); the command itself never does this."""
        rows: list[dict[str, Any]] = in_order(name, self.frames[name].toArrow()).to_pylist()
        return rows

    def release(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


def in_order(name: str, table: pa.Table) -> pa.Table:
    from pipeline import analysis

    return table.sort_by([(column, how, "at_start") for column, how in analysis.ORDER[name]])


# the fix-first signature (trends.fix_first) first: the most recent messages, then the most messages
FIX_FIRST = [("recent", "descending"), ("messages", "descending"), ("project", "ascending"),
             ("signature", "ascending")]  # fmt: skip


def view(
    name: str, frame: DataFrame, *, top: int, keys: list[tuple[str, str]] | None = None
) -> tuple[pa.Table, int]:
    """What of a table comes to the driver, and its row count: the signatures' `top` in their order with the
    fix-first one (trends.fix_first), the `top` consumers and offenders, of signature_fields and
    signature_rate the rows of `keys` (the viewed signatures), of the rest the first SHOWN rows; sorted as
    analysis.ORDER says. One job when the table has at most SHOWN rows (the first SHOWN + 1 are collected and
    the view cut from them), a few more for a larger one."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    from pipeline import analysis

    def ordered(order: list[tuple[str, str]]) -> list[Any]:
        return [
            F.col(c).asc_nulls_first() if how == "ascending" else F.col(c).desc_nulls_first()
            for c, how in order
        ]

    def first(order: list[tuple[str, str]], n: int) -> pa.Table:
        return in_order(name, frame.orderBy(*ordered(order)).limit(n).toArrow())

    head = first(analysis.ORDER[name], SHOWN + 1)
    whole = head.num_rows <= SHOWN
    count = head.num_rows if whole else frame.count()
    if name in OF_SIGNATURES:
        assert keys is not None
        if whole:
            wanted = pa.array([f"{p}\0{s}" for p, s in keys], pa.string())
            key = pc.binary_join_element_wise(head["project"], head["signature"], "\0")
            return head.filter(pc.is_in(key, value_set=wanted)), count
        asked = frame.sparkSession.createDataFrame(keys, "project string, signature string")
        of_keys = frame.join(F.broadcast(asked), ["project", "signature"], "left_semi")
        return in_order(name, of_keys.toArrow()), count
    if name not in TOP:
        return head.slice(0, SHOWN), count
    table = head.slice(0, top)
    if name == "signatures":
        best = in_order(name, head).sort_by([(c, h, "at_start") for c, h in FIX_FIRST]).slice(0, 1)
        fix = best if whole else first(FIX_FIRST, 1)
        shown = set(zip(table["project"].to_pylist(), table["signature"].to_pylist(), strict=True))
        if fix.num_rows and (fix["project"][0].as_py(), fix["signature"][0].as_py()) not in shown:
            table = pa.concat_tables([table, fix.cast(table.schema)])
    return in_order(name, table), count


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
    """The tables of TABLES, each a cached DataFrame with its view (view()) collected and its rows counted.
    `step` is told each step's name as it starts ("" at the end); `keep`: also write every enriched message
    there (Parquet, from the executors); `since_ms`: the previous run's last death, after which a
    signature's messages are `recent`; `top`: the signatures, consumers and offenders in the views, and
    the signatures (with the fix-first one) whose ids signature_ids lists. `save`: first write the records
    there (Parquet, from the executors), with those kept in `history` (a previous run's `save`) when given,
    and analyse what was written: every dead letter of both (--since-last)."""
    import pyarrow.compute as pc
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
    frames: dict[str, DataFrame] = {}
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
        built = {
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
        tables, counts = {}, {}

        def collect(name: str, frame: DataFrame, keys: list[tuple[str, str]] | None = None) -> None:
            step(name.replace("_", " "))
            t = time.monotonic()
            frames[name] = frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
            tables[name], counts[name] = view(name, frame, top=top, keys=keys)  # computes and caches it
            timings[f"{name}_s"] = time.monotonic() - t  # each table's share of the aggregates

        for name in ("signatures", *(n for n in built if n not in ("signatures", *OF_SIGNATURES))):
            collect(name, built[name])
        shown = [(r["project"], r["signature"]) for r in tables["signatures"].to_pylist()]
        for name in OF_SIGNATURES:
            collect(name, built[name], shown)
        top_keys = trends.redrive_keys(in_order("signatures", tables["signatures"]).to_pylist(), top)
        collect("signature_ids", analysis.signature_ids(enriched, top_keys))
        # from the views when they hold the whole tables (no job), else in Spark
        totals: Any
        not_ok: Any
        if counts["by_source"] <= SHOWN:
            got = tables["by_source"]
            totals = (pc.sum(got["messages"]).as_py(), pc.min(got["first_ms"]).as_py(),
                      pc.max(got["last_ms"]).as_py())  # fmt: skip
        else:
            totals = frames["by_source"].agg(F.sum("messages"), F.min("first_ms"), F.max("last_ms")).first()
        if counts["quality"] <= SHOWN:
            got = tables["quality"]
            not_ok = (pc.sum(pc.filter(got["messages"], pc.not_equal(got["bucket"], "ok"))).as_py(),)
        else:
            not_ok = frames["quality"].where(F.col("bucket") != "ok").agg(F.sum("messages")).first()
        timings["aggregate_s"] = time.monotonic() - started - timings["read_s"]
        if keep:
            step("writing the messages")
            enriched.write.mode("overwrite").parquet(keep)
    except BaseException:
        for frame in frames.values():
            frame.unpersist()
        raise
    finally:
        enriched.unpersist()
        if partitions is not None:
            spark.conf.set(SHUFFLE_PARTITIONS, before)
    step("")
    return Insights(
        frames=frames,
        tables={name: tables[name] for name in TABLES},
        counts={name: counts[name] for name in TABLES},
        rate_width_s=width,
        total=total,
        first_ms=first_ms or 0,
        last_ms=last_ms or 0,
        analysed=int((totals[0] if totals else None) or 0),
        analysed_ms=(totals[1], totals[2]) if totals else (None, None),
        not_ok=int((not_ok[0] if not_ok else None) or 0),
        top=top,
        timings={k: round(v, 3) for k, v in timings.items()},
        shuffle_partitions=partitions,
    )
