"""Records (records.SCHEMA) from JSON Lines written by `charon export`, parsed in Spark SQL.

Spark reads the files itself (spark.read.text: local paths, HDFS, S3 ... whatever the cluster's Hadoop
reads), so a cluster can analyse an export kept on shared storage. A line that is not a JSON object with an
`id` gets its own first 80 characters as its id and no provenance: analysis counts it in the no_provenance
bucket. Times are ISO 8601 with milliseconds, as the export writes them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.records import DEFAULT_MAX_BODY_BYTES, SCHEMA

ISO = "yyyy-MM-dd'T'HH:mm:ss[.SSS]X"


def read(spark: SparkSession, paths: list[str], *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> DataFrame:
    lines = spark.read.text(paths).where(F.trim("value") != "")
    v = F.try_parse_json("value")

    def text(path: str) -> Column:
        return F.try_variant_get(F.col("v"), path, "string")

    def integer(path: str) -> Column:
        return F.try_variant_get(F.col("v"), path, "bigint")

    def ms(path: str) -> Column:
        return F.unix_millis(F.try_to_timestamp(text(path), F.lit(ISO)))

    body = F.to_json(F.try_variant_get(F.col("v"), "$.body", "variant"))
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
        "consumer": text("$.dead_letter.consumer"),
    }
    return lines.withColumn("v", v).select(*(columns[f.name].alias(f.name) for f in SCHEMA))
