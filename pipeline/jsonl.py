"""Records (records.SCHEMA) as JSON Lines, both ways: `charon export` writes a store's DLQs as lines
(export()), and `charon insights --input` reads such files back in Spark SQL (read()).

A line is one message as the API shows it, with `project`, its `dead_letter` provenance and times in ISO 8601
to the millisecond (lines()); its body is copied as stored. Writing reads through the store's dead-letter
export (storage/export.py), each DLQ whole and in marker order, with pyarrow only: no Spark.

Spark reads the files itself (spark.read.text: local paths, HDFS, S3 ... whatever the cluster's Hadoop
reads), so a cluster can analyse an export kept on shared storage. A line that is not a JSON object with an
`id` gets its own first 80 characters as its id and no provenance: analysis counts it in the no_provenance
bucket.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import orjson

from core.errors import CharonError
from pipeline.errors import InsightsError
from pipeline.load import DeadLetterStore, dead_letter_queues
from pipeline.records import DEFAULT_MAX_BODY_BYTES, SCHEMA, batch
from storage.export import DeadLetterExport, Extent

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

ISO = "yyyy-MM-dd'T'HH:mm:ss[.SSS]X"  # Spark's pattern for what iso_ms() writes


class Exported(NamedTuple):
    """What export() wrote: how many messages, from how many DLQs."""

    messages: int
    queues: int


def export(
    store: DeadLetterStore, out: BinaryIO | Path, *, project: str | None, queues: Sequence[str]
) -> Exported:
    """`charon export`: the DLQs `queues` (of `project`, else of every project) as lines on `out`, a stream
    or a file made once the store has said what there is to read. InsightsError when the store cannot be
    read, NothingToAnalyse when the DLQs hold nothing."""
    extents = dead_letter_queues(store, project, queues)
    try:
        if isinstance(out, Path):
            with out.open("wb") as f:
                return Exported(write(store.open(), extents, f), len(extents))
        return Exported(write(store.open(), extents, out), len(extents))
    except CharonError as e:  # the store stopped answering during the read
        raise InsightsError(str(e)) from None


def write(export: DeadLetterExport, extents: Sequence[Extent], out: BinaryIO) -> int:
    """Every message of `extents` as a line on `out`; returns how many were written."""
    now_ms = int(time.time() * 1000)
    written = 0
    for extent in extents:
        for s in extent.cut(1, now_ms=now_ms):
            for page in export.read(s):
                rb = batch(page, max_body_bytes=None)
                out.writelines(lines(rb))
                written += rb.num_rows
    return written


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def lines(rb: pa.RecordBatch) -> Iterator[bytes]:
    """One message per line, as the API shows it (with `project`, and times to the millisecond), its body
    copied as stored."""
    for r in rb.to_pylist():
        head: dict[str, Any] = {
            "id": r["id"],
            "project": r["project"],
            "queue": r["queue"],
            "created": iso_ms(r["created_ms"]),
            "claim_count": r["claim_count"],
        }
        if r["source_queue"] is not None:
            dead_letter: dict[str, Any] = {
                "source_queue": r["source_queue"],
                "reason": r["reason"],
                "claim_count": r["dl_claim_count"],
                "dead_lettered_at": iso_ms(r["dead_lettered_at_ms"]),
                "first_enqueued_at": iso_ms(r["first_enqueued_at_ms"]),
                "redrive_count": r["redrive_count"] or 0,
            }
            rejection = {
                k: r[f"rejection_{k}"] for k in ("reason", "description") if r[f"rejection_{k}"] is not None
            }
            if rejection:
                dead_letter["rejection"] = rejection
            if r["consumer"] is not None:
                dead_letter["consumer"] = r["consumer"]
            head["dead_letter"] = dead_letter
        if (
            r["body"] is None and r["sealed_key"] is not None
        ):  # encrypted at rest, and this process has not its key (records.opened)
            head["encrypted_with"] = r["sealed_key"]
        yield orjson.dumps(head)[:-1] + b',"body":' + (r["body"] or "null").encode() + b"}\n"


def read(spark: SparkSession, paths: list[str], *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> DataFrame:
    from pyspark.sql import functions as F

    lines = spark.read.text(paths).where(F.trim("value") != "")
    v = F.try_parse_json("value")

    def text(path: str) -> Column:
        return F.try_variant_get(F.col("v"), path, "string")

    def integer(path: str) -> Column:
        return F.try_variant_get(F.col("v"), path, "bigint")

    def ms(path: str) -> Column:
        return F.unix_millis(F.try_to_timestamp(text(path), F.lit(ISO)))

    # an encrypted body this export could not open (`encrypted_with` its key's id) is null, as from a store
    body = F.when(
        text("$.encrypted_with").isNull(), F.to_json(F.try_variant_get(F.col("v"), "$.body", "variant"))
    )
    columns = {
        "project": F.coalesce(text("$.project"), F.lit("")),
        "queue": F.coalesce(text("$.queue"), F.lit("")),
        "id": F.coalesce(text("$.id"), F.concat(F.lit("line: "), F.substring("value", 1, 80))),
        "marker": F.lit(None).cast("bigint"),
        "body": F.when(F.octet_length(body) <= max_body_bytes, body),
        "body_bytes": F.octet_length(body).cast("bigint"),
        "created_ms": ms("$.created"),
        "claim_count": integer("$.claim_count"),
        "source_queue": text("$.dead_letter.source_queue"),
        "reason": text("$.dead_letter.reason"),
        "dl_claim_count": integer("$.dead_letter.claim_count"),
        "dead_lettered_at_ms": ms("$.dead_letter.dead_lettered_at"),
        "first_enqueued_at_ms": ms("$.dead_letter.first_enqueued_at"),
        "redrive_count": integer("$.dead_letter.redrive_count"),
        "rejection_reason": text("$.dead_letter.rejection.reason"),
        "rejection_description": text("$.dead_letter.rejection.description"),
        "sealed_key": text("$.encrypted_with"),
        "consumer": text("$.dead_letter.consumer"),
    }
    return lines.withColumn("v", v).select(*(columns[f.name].alias(f.name) for f in SCHEMA))
