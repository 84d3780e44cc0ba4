"""Every aggregate of analysis.py over a records DataFrame: each table a cached Spark DataFrame (written
whole by Spark, output.py), of which only a bounded view comes to the driver (the report's rows: the top
signatures, consumers and offenders, at most SHOWN rows of the others) with each table's row count."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
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
SIGNATURE = ("project", "signature")
GROUP = ("project", "source_queue", "reason")
# their view: the rows of given keys (the viewed signatures; the groups the report has a card for)
KEYED = {"signature_fields": SIGNATURE, "signature_rate": SIGNATURE, "claim_counts": GROUP,
         "time_to_death": GROUP}  # fmt: skip


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
    not_ok: dict[str, int] = field(default_factory=dict)  # per quality bucket other than ok, its messages
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


def _ordered(order: list[tuple[str, str]]) -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.col(c).asc_nulls_first() if how == "ascending" else F.col(c).desc_nulls_first() for c, how in order
    ]


def _joined(
    frame: DataFrame, columns: tuple[str, ...], keys: Iterable[tuple[Any, ...]], how: str
) -> DataFrame:
    """The frame joined (`how`: left_semi, left_anti) with `keys` of its `columns`, broadcast."""
    from pyspark.sql import functions as F

    asked = frame.sparkSession.createDataFrame(list(keys), ", ".join(f"{c} string" for c in columns))
    return frame.join(F.broadcast(asked), list(columns), how)


def of_keys(
    name: str, frame: DataFrame, columns: tuple[str, ...], keys: Iterable[tuple[Any, ...]]
) -> pa.Table:
    """The table's rows whose `columns` are one of `keys` (a broadcast semi-join), in its order."""
    return in_order(name, _joined(frame, columns, keys, "left_semi").toArrow())


def _filtered(table: pa.Table, columns: tuple[str, ...], keys: Iterable[tuple[Any, ...]]) -> pa.Table:
    import pyarrow as pa

    wanted = set(keys)
    rows = table.select(list(columns)).to_pylist()
    return table.filter(pa.array([tuple(r[c] for c in columns) in wanted for r in rows], pa.bool_()))


def view(
    name: str, frame: DataFrame, *, top: int, keys: Iterable[tuple[Any, ...]] = ()
) -> tuple[pa.Table, int]:
    """What of a table comes to the driver, and its row count: the signatures' `top` in their order with the
    fix-first one (trends.fix_first), the `top` consumers and offenders; of the KEYED tables the rows of
    `keys`; signature_ids whole (it holds only the signatures redrive requests are made for); of the rate,
    the report chart's series (the biggest groups) with the rest summed per bucket as one row with a null
    project; of the rest the first SHOWN rows; sorted as analysis.ORDER says. One job when the table has at
    most SHOWN rows (the first SHOWN + 1 are collected and the view cut from them), a few more when larger."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from pipeline import analysis, report

    def first(order: list[tuple[str, str]], n: int) -> pa.Table:
        return in_order(name, frame.orderBy(*_ordered(order)).limit(n).toArrow())

    head = first(analysis.ORDER[name], SHOWN + 1)
    whole = head.num_rows <= SHOWN
    count = head.num_rows if whole else frame.count()
    if whole and name not in TOP:
        return (_filtered(head, KEYED[name], keys) if name in KEYED else head), count
    if name in KEYED:
        return of_keys(name, frame, KEYED[name], keys), count
    if name == "signature_ids":
        return in_order(name, frame.toArrow()), count
    if name == "rate":
        biggest = frame.groupBy(*GROUP).agg(F.sum("messages").alias("total"))
        series = biggest.orderBy(F.desc("total"), *GROUP).limit(report.SERIES).collect()
        keys = [tuple(r[c] for c in GROUP) for r in series]
        rest = _joined(frame, GROUP, keys, "left_anti").groupBy("bucket_ms")
        other = rest.agg(F.sum("messages").cast("long").alias("messages"))
        other = other.select(
            *(F.lit(None).cast("string").alias(c) if c in GROUP else c for c in frame.columns)
        )
        mine = of_keys(name, frame, GROUP, keys)
        return in_order(name, pa.concat_tables([mine, other.toArrow().cast(mine.schema)])), count
    if name not in TOP:
        return head.slice(0, SHOWN), count
    table = head.slice(0, top)
    if name == "signatures":
        best = head.sort_by([(c, h, "at_start") for c, h in FIX_FIRST]).slice(0, 1)
        fix = best if whole else first(FIX_FIRST, 1)
        if fix.num_rows and not _filtered(table, SIGNATURE, _keys(fix, SIGNATURE)).num_rows:
            table = pa.concat_tables([table, fix.cast(table.schema)])
    return in_order(name, table), count


def carded(by_source: pa.Table) -> list[tuple[Any, ...]]:
    """The groups the report has a card for (report.GROUP_CARDS): the first in by_source's order."""
    from pipeline import report

    return list(dict.fromkeys(_keys(by_source, GROUP)))[: report.GROUP_CARDS]


def _keys(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in columns) for r in table.select(list(columns)).to_pylist()]


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
    import pyarrow as pa
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
    reread: list[DataFrame] = []  # what an aggregate reads more than once, until every table is cached

    def persisted(frame: DataFrame) -> DataFrame:
        reread.append(frame.persist(StorageLevel.DISK_ONLY))
        return reread[-1]

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
            "signature_fields": analysis.signature_fields(enriched, persisted),
            "signature_rate": analysis.signature_rate(enriched, width),
            "rejections": analysis.rejections(enriched),
            "consumers": analysis.consumers(enriched),
            "repeat_offenders": analysis.repeat_offenders(enriched),
            "quality": analysis.quality(enriched),
        }
        tables, counts = {}, {}

        def collect(name: str, frame: DataFrame, keys: Iterable[tuple[Any, ...]] = ()) -> None:
            step(name.replace("_", " "))
            t = time.monotonic()
            # on disk, off the heap: small, read back for the view and the writes only
            frames[name] = frame = frame.persist(StorageLevel.DISK_ONLY)
            tables[name], counts[name] = view(name, frame, top=top, keys=keys)  # computes and caches it
            timings[f"{name}_s"] = time.monotonic() - t  # each table's share of the aggregates

        for name in ("signatures", *(n for n in built if n != "signatures" and n not in KEYED)):
            collect(name, built[name])
        top_keys = trends.redrive_keys(tables["signatures"].to_pylist(), top)  # before the consumers' below
        # the signatures the consumers' view names as their commonest, for their text in the report
        named = {(r["project"], r["top_signature"]) for r in tables["consumers"].to_pylist()}
        named -= set(_keys(tables["signatures"], SIGNATURE))
        if named:
            more = of_keys("signatures", frames["signatures"], SIGNATURE, named)
            tables["signatures"] = in_order("signatures", pa.concat_tables([tables["signatures"], more]))
        for name, columns in KEYED.items():
            wanted = (
                _keys(tables["signatures"], SIGNATURE)
                if columns == SIGNATURE
                else carded(tables["by_source"])
            )
            collect(name, built[name], wanted)
        collect("signature_ids", analysis.signature_ids(enriched, top_keys))
        # from the views when they hold the whole tables (no job), else in Spark
        totals: Any
        if counts["by_source"] <= SHOWN:
            got = tables["by_source"]
            totals = (pc.sum(got["messages"]).as_py(), pc.min(got["first_ms"]).as_py(),
                      pc.max(got["last_ms"]).as_py())  # fmt: skip
        else:
            totals = frames["by_source"].agg(F.sum("messages"), F.min("first_ms"), F.max("last_ms")).first()
        not_ok: dict[str, int] = {}
        if counts["quality"] <= SHOWN:
            for q in tables["quality"].to_pylist():
                not_ok[q["bucket"]] = not_ok.get(q["bucket"], 0) + q["messages"]
        else:
            bad = frames["quality"].groupBy("bucket").agg(F.sum("messages").alias("messages")).collect()
            not_ok = {r["bucket"]: int(r["messages"]) for r in bad}
        not_ok.pop("ok", None)
        timings["aggregate_s"] = time.monotonic() - started - timings["read_s"]
        if keep:
            step("writing the messages")
            enriched.write.mode("overwrite").parquet(keep)
    except BaseException:
        for frame in frames.values():
            frame.unpersist()
        raise
    finally:
        for frame in (*reread, enriched):
            frame.unpersist()
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
        not_ok=dict(sorted(not_ok.items())),
        top=top,
        timings={k: round(v, 3) for k, v in timings.items()},
        shuffle_partitions=partitions,
    )
