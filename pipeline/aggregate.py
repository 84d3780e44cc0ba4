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
from pipeline.insights import GROUP_CARDS, SERIES, Insights, in_order

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
    from pipeline import analysis

    head = _first(name, frame, analysis.ORDER[name], SHOWN + 1)
    whole = head.num_rows <= SHOWN
    count = head.num_rows if whole else frame.count()
    if whole and name not in TOP:
        return (_filtered(head, KEYED[name], keys) if name in KEYED else head), count
    if name in KEYED:
        return of_keys(name, frame, KEYED[name], keys), count
    if name == "signature_ids":
        return in_order(name, frame.toArrow()), count
    if name == "rate":
        return _rate_view(frame), count
    if name not in TOP:
        return head.slice(0, SHOWN), count
    return _top_view(name, frame, head, top=top, whole=whole), count


def _first(name: str, frame: DataFrame, order: list[tuple[str, str]], n: int) -> pa.Table:
    return in_order(name, frame.orderBy(*_ordered(order)).limit(n).toArrow())


def _rate_view(frame: DataFrame) -> pa.Table:
    """The rate of the chart's SERIES biggest groups, and the rest summed per bucket (a null project)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    biggest = frame.groupBy(*GROUP).agg(F.sum("messages").alias("total"))
    series = biggest.orderBy(F.desc("total"), *GROUP).limit(SERIES).collect()
    keys = [tuple(r[c] for c in GROUP) for r in series]
    rest = _joined(frame, GROUP, keys, "left_anti").groupBy("bucket_ms")
    other = rest.agg(F.sum("messages").cast("long").alias("messages"))
    other = other.select(*(F.lit(None).cast("string").alias(c) if c in GROUP else c for c in frame.columns))
    mine = of_keys("rate", frame, GROUP, keys)
    return in_order("rate", pa.concat_tables([mine, other.toArrow().cast(mine.schema)]))


def _top_view(name: str, frame: DataFrame, head: pa.Table, *, top: int, whole: bool) -> pa.Table:
    """The `top` first rows of `head` (the table's first, or all of it when `whole`); of the signatures,
    with the fix-first one when it is not among them."""
    import pyarrow as pa

    table = head.slice(0, top)
    if name == "signatures":
        best = head.sort_by([(c, h, "at_start") for c, h in FIX_FIRST]).slice(0, 1)
        fix = best if whole else _first(name, frame, FIX_FIRST, 1)
        if fix.num_rows and not _filtered(table, SIGNATURE, _keys(fix, SIGNATURE)).num_rows:
            table = pa.concat_tables([table, fix.cast(table.schema)])
    return in_order(name, table)


def carded(by_source: pa.Table) -> list[tuple[Any, ...]]:
    """The groups the report has a card for (GROUP_CARDS): the first in by_source's order."""
    return list(dict.fromkeys(_keys(by_source, GROUP)))[:GROUP_CARDS]


def _keys(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in columns) for r in table.select(list(columns)).to_pylist()]


@dataclass
class _Views:
    """The tables as they are collected: each cached whole, its view and row count, its time."""

    step: Callable[[str], None]
    top: int
    frames: dict[str, DataFrame] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def collect(self, name: str, frame: DataFrame, keys: Iterable[tuple[Any, ...]] = ()) -> None:
        from pyspark import StorageLevel

        self.step(name.replace("_", " "))
        t = time.monotonic()
        # on disk, off the heap: small, read back for the view and the writes only
        self.frames[name] = frame = frame.persist(StorageLevel.DISK_ONLY)
        self.tables[name], self.counts[name] = view(name, frame, top=self.top, keys=keys)  # computes, caches
        self.timings[f"{name}_s"] = time.monotonic() - t  # each table's share of the aggregates

    def release(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


class _Shuffle:
    """spark.sql.shuffle.partitions set from the data for the aggregates (shuffle_partitions), unless the
    operator chose it (--conf, spark-defaults.conf, or set in this session); put back by restore()."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.before = spark.conf.get(SHUFFLE_PARTITIONS) or SPARK_DEFAULT
        self.partitions: int | None = None  # what was set, None when nothing was

    def fit(self, rows: int) -> None:
        context = self.spark.sparkContext
        if not context.getConf().contains(SHUFFLE_PARTITIONS) and self.before == SPARK_DEFAULT:
            self.partitions = shuffle_partitions(rows, context.defaultParallelism)
            self.spark.conf.set(SHUFFLE_PARTITIONS, str(self.partitions))

    def restore(self) -> None:
        if self.partitions is not None:
            self.spark.conf.set(SHUFFLE_PARTITIONS, self.before)


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
    from pyspark import StorageLevel

    from pipeline import analysis

    started = time.monotonic()
    if save is not None:
        records = _kept(spark, records, save=save, history=history, step=step)
    step("reading and parsing")
    enriched = analysis.enrich(records).persist(StorageLevel.MEMORY_AND_DISK)
    views, shuffle = _Views(step=step, top=top), _Shuffle(spark)
    reread: list[DataFrame] = []  # what an aggregate reads more than once, until every table is cached

    def persisted(frame: DataFrame) -> DataFrame:
        reread.append(frame.persist(StorageLevel.DISK_ONLY))
        return reread[-1]

    try:
        insights = _aggregated(enriched, views, shuffle, persisted, since_ms=since_ms, started=started)
        if keep:
            step("writing the messages")
            enriched.write.mode("overwrite").parquet(keep)
    except BaseException:
        views.release()
        raise
    finally:
        for frame in (*reread, enriched):
            frame.unpersist()
        shuffle.restore()
    step("")
    return insights


def _kept(
    spark: SparkSession, records: DataFrame, *, save: str, history: str | None, step: Callable[[str], None]
) -> DataFrame:
    """The records written to `save` with those of `history` (--since-last), read back from there."""
    step("keeping the records")
    if history is not None:
        records = records.unionByName(spark.read.parquet(history), allowMissingColumns=True)
    records.write.mode("overwrite").parquet(save)
    return spark.read.parquet(save)


def _aggregated(
    enriched: DataFrame,
    views: _Views,
    shuffle: _Shuffle,
    persisted: Callable[[DataFrame], DataFrame],
    *,
    since_ms: int | None,
    started: float,
) -> Insights:
    """Every table of the enriched records collected into `views`, then the run's totals."""
    from pipeline import analysis

    total, first_ms, last_ms = _span(enriched)
    views.timings["read_s"] = time.monotonic() - started
    if total == 0:
        raise NothingToAnalyse("the input holds no messages; nothing to analyse.")
    shuffle.fit(total)
    width = analysis.rate_width_s(first_ms, last_ms)
    built = _built(enriched, width, analysis.recent_from(last_ms, since_ms), persisted)
    _collect(views, built, enriched)
    analysed, analysed_ms = _analysed(views)
    not_ok = _not_ok(views)
    views.timings["aggregate_s"] = time.monotonic() - started - views.timings["read_s"]
    return Insights(
        frames=views.frames,
        tables={name: views.tables[name] for name in TABLES},
        counts={name: views.counts[name] for name in TABLES},
        rate_width_s=width,
        total=total,
        first_ms=first_ms,
        last_ms=last_ms,
        analysed=analysed,
        analysed_ms=analysed_ms,
        not_ok=not_ok,
        top=views.top,
        timings={k: round(v, 3) for k, v in views.timings.items()},
        shuffle_partitions=shuffle.partitions,
    )


def _span(enriched: DataFrame) -> tuple[int, int, int]:
    """The messages read, and the first and last of their deaths (0 when none has one)."""
    from pyspark.sql import functions as F

    span = enriched.agg(F.count("*"), F.min("at_ms"), F.max("at_ms")).first()
    assert span is not None
    total, first_ms, last_ms = span
    return total, first_ms or 0, last_ms or 0


def _built(
    enriched: DataFrame, width: int, recent_ms: int, persisted: Callable[[DataFrame], DataFrame]
) -> dict[str, DataFrame]:
    """Every table but signature_ids, as a plan (nothing computed yet)."""
    from pipeline import analysis

    return {
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


def _collect(views: _Views, built: dict[str, DataFrame], enriched: DataFrame) -> None:
    """Every table into `views`, in an order that matters: signature_ids lists the signatures of the
    signatures' view as first collected (before the consumers' commonest are added to it); the keyed tables
    are viewed for the signatures and groups the others' views hold."""
    from pipeline import analysis

    for name in ("signatures", *(n for n in built if n != "signatures" and n not in KEYED)):
        views.collect(name, built[name])
    top_keys = trends.redrive_keys(views.tables["signatures"].to_pylist(), views.top)
    _add_named_signatures(views)
    _collect_keyed(views, built)
    views.collect("signature_ids", analysis.signature_ids(enriched, top_keys))


def _add_named_signatures(views: _Views) -> None:
    """The signatures the consumers' view names as their commonest, added to the signatures' view (for
    their text in the report)."""
    import pyarrow as pa

    named = {(r["project"], r["top_signature"]) for r in views.tables["consumers"].to_pylist()}
    named -= set(_keys(views.tables["signatures"], SIGNATURE))
    if named:
        more = of_keys("signatures", views.frames["signatures"], SIGNATURE, named)
        views.tables["signatures"] = in_order(
            "signatures", pa.concat_tables([views.tables["signatures"], more])
        )


def _collect_keyed(views: _Views, built: dict[str, DataFrame]) -> None:
    """The KEYED tables, each viewed for the signatures in the signatures' view or the carded groups."""
    for name, columns in KEYED.items():
        if columns == SIGNATURE:
            wanted = _keys(views.tables["signatures"], SIGNATURE)
        else:
            wanted = carded(views.tables["by_source"])
        views.collect(name, built[name], wanted)


def _analysed(views: _Views) -> tuple[int, tuple[int | None, int | None]]:
    """The messages with provenance and the first and last of their deaths: from by_source's view when it
    holds the whole table (no job), else in Spark."""
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    totals: Any
    if views.counts["by_source"] <= SHOWN:
        got = views.tables["by_source"]
        totals = (pc.sum(got["messages"]).as_py(), pc.min(got["first_ms"]).as_py(),
                  pc.max(got["last_ms"]).as_py())  # fmt: skip
    else:
        totals = views.frames["by_source"].agg(F.sum("messages"), F.min("first_ms"), F.max("last_ms")).first()
    if not totals:
        return 0, (None, None)
    return int(totals[0] or 0), (totals[1], totals[2])


def _not_ok(views: _Views) -> dict[str, int]:
    """The messages of each quality bucket other than ok: from the view when it holds the whole table."""
    from pyspark.sql import functions as F

    not_ok: dict[str, int] = {}
    if views.counts["quality"] <= SHOWN:
        for q in views.tables["quality"].to_pylist():
            not_ok[q["bucket"]] = not_ok.get(q["bucket"], 0) + q["messages"]
    else:
        bad = views.frames["quality"].groupBy("bucket").agg(F.sum("messages").alias("messages")).collect()
        not_ok = {r["bucket"]: int(r["messages"]) for r in bad}
    not_ok.pop("ok", None)
    return dict(sorted(not_ok.items()))
