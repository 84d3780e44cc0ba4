"""The aggregates of DLQ insights: DataFrame -> DataFrame functions, every one in Spark SQL functions.

enrich() parses each body once (try_parse_json, to a VARIANT) and adds what the aggregates group by:
  bucket      ok | no_provenance (no dead_letter record) | encrypted (sealed at rest, and this run has not
              the key: records.py) | huge (body over the reader's limit) | not_json
              (no body, or not JSON) | not_object (JSON, but not an object)
  ttd_s       time to death: dead-lettered at minus first enqueued at, in seconds
  shape       the body's shape: its schema as Spark's schema_of_variant writes it (keys sorted, nested
              objects and arrays' merged element types included), with every number type as NUMBER, e.g.
              OBJECT<error: STRING, items: ARRAY<OBJECT<qty: NUMBER, sku: STRING>>, order_id: NUMBER>
  error       the failure text: the first of ERROR_FIELDS a JSON object body has (an object there: its first
              MESSAGE_FIELDS, else its JSON), else the consumer's rejection description, else its rejection
              reason; normalised by MASKS so that it does not vary with ids, values and times
  signature   the first SIGNATURE_CHARS hex digits of the SHA-256 of `error`, or when there is none of
              "\n<source queue>\n<reason>" (no error text: what is known of the cause is where and how
              it died): a failure signature is a project's messages with one cause, whatever their bodies
  fields      the body's top-level field names (sorted, the first MAX_FIELDS), for the field detail
  body_hash   the first 16 hex digits of the SHA-256 of the body's canonical JSON (keys sorted)
The aggregates then group the enriched rows; purepython.py computes the same numbers the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from core.signatures import (
    ERROR_FIELDS,
    MASKS,
    MAX_ERROR_CHARS,
    MAX_RAW_ERROR_CHARS,
    MESSAGE_FIELDS,
    SIGNATURE_CHARS,
)

# A number type in schema_of_variant's output: after ": " (an object's field), "ARRAY<" or at the start.
# (A key is after "OBJECT<" or ", ", so a key named BIGINT stays; only a quoted key with ": BIGINT" in it
# would be changed.)
NUMBER_TYPES = r"(^|: |ARRAY<)(?:BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL\([0-9]+,[0-9]+\))(?=[,>]|$)"
PREVIEW_CHARS = 160
EXAMPLE_CHARS = 1000  # of an example body in the signatures table
EXAMPLES = 3  # example messages per group: the earliest dead-lettered ones (a signature's: the newest)
REDRIVE_IDS = 1000  # ids of one signature in one DLQ: one redrive request (the API's most message_ids)
MAX_FIELDS = 64  # a body's top-level fields looked at for a signature's field detail (sorted, the first)
OPTIONAL_BELOW = 1.0  # a field in fewer of a signature's bodies than this share is optional there
DISTINGUISHES = 0.5  # a field whose share in a signature differs by this much from the rest of its project
# percentile_approx's accuracy (Spark's default): a percentile is one of the group's values, at most
# count / PERCENTILE_ACCURACY ranks from the exact one and exactly it in a group of up to 5,000 values
# (purepython.percentile_approx); a bounded sketch per group, where `percentile` kept every value
PERCENTILE_ACCURACY = 10_000

# A signature's `recent` messages: dead-lettered after the previous run's last death, else in the RECENT_S
# before the last death of this run's messages.
RECENT_S = 3600

# Time to death, bucketed: (upper bound in seconds, exclusive; label); the last bucket has no bound.
TTD_BUCKETS = ((1, "<1s"), (10, "1-10s"), (60, "10s-1m"), (600, "1-10m"), (3600, "10m-1h"), (86400, "1h-1d"))
TTD_LAST = ">1d"
RATE_WIDTHS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_RATE_BUCKETS = 120

GROUP = ("project", "source_queue", "reason")
BY_SOURCE = (
    "project", "dlq", "source_queue", "reason", "messages", "first_ms", "last_ms", "claim_count_p50",
    "claim_count_max", "ttd_p50_s", "ttd_p90_s", "ttd_max_s", "redriven", "bad_bodies",
)  # fmt: skip

SIGNATURES = (
    "project", "signature", "error", "messages", "recent", "first_ms", "last_ms", "source_queues", "reasons",
    "rejection_reasons", "bad_bodies", "shapes", "shape", "examples",
)  # fmt: skip

# How each table is ordered, applied by the driver to the collected table (a Spark orderBy would cost a
# sampling job and a shuffle per table); nulls first.
ORDER: dict[str, list[tuple[str, str]]] = {
    "by_source": [
        ("messages", "descending"),
        *((c, "ascending") for c in ("project", "dlq", "source_queue", "reason")),
    ],
    "rate": [(c, "ascending") for c in ("bucket_ms", *GROUP)],
    "claim_counts": [(c, "ascending") for c in (*GROUP, "claim_count")],
    "time_to_death": [(c, "ascending") for c in (*GROUP, "bucket_order")],
    "signatures": [("messages", "descending"), *((c, "ascending") for c in ("project", "signature"))],
    "signature_fields": [(c, "ascending") for c in ("project", "signature", "field")],
    "signature_rate": [(c, "ascending") for c in ("project", "signature", "bucket_ms")],
    "signature_ids": [(c, "ascending") for c in ("project", "signature", "dlq")],
    "rejections": [
        ("messages", "descending"),
        *((c, "ascending") for c in ("project", "source_queue", "rejection_reason")),
    ],
    "consumers": [
        ("messages", "descending"),
        *((c, "ascending") for c in ("project", "source_queue", "consumer")),
    ],
    "repeat_offenders": [
        ("messages", "descending"),
        *((c, "ascending") for c in ("project", "first_ms", "body_hash")),
    ],
    "quality": [(c, "ascending") for c in ("project", "queue", "bucket")],
}


def recent_from(last_ms: int, since_ms: int | None) -> int:
    """The time after which a dead letter is recent: `since_ms` (the previous run's last death) when given."""
    return since_ms if since_ms is not None else last_ms - RECENT_S * 1000


def rate_width_s(first_ms: int, last_ms: int) -> int:
    """The narrowest bucket that shows the whole span in at most MAX_RATE_BUCKETS bars."""
    span_s = (last_ms - first_ms) / 1000
    return next((w for w in RATE_WIDTHS_S if span_s / w <= MAX_RATE_BUCKETS), RATE_WIDTHS_S[-1])


def enrich(records: DataFrame) -> DataFrame:
    # Each step is its own column, referenced by name: Spark keeps an expensive column that is used more
    # than once in its own projection instead of inlining (and so recomputing) it, so every body is parsed
    # once, its schema taken once and its canonical JSON written once.
    schema = F.col("schema")
    bucket = (
        F.when(
            F.col("source_queue").isNull()
            | F.col("reason").isNull()
            | F.col("dead_lettered_at_ms").isNull()
            | F.col("first_enqueued_at_ms").isNull(),
            "no_provenance",
        )
        .when(F.col("body").isNull() & F.col("sealed_key").isNotNull(), "encrypted")
        .when(F.col("body").isNull() & (F.col("body_bytes") > 0), "huge")
        .when(schema.isNull(), "not_json")
        .when(~schema.startswith("OBJECT<"), "not_object")
        .otherwise("ok")
    )
    ok = F.col("bucket") == "ok"
    return (
        records.withColumn("v", F.try_parse_json("body"))
        .withColumn("schema", F.schema_of_variant("v"))
        .withColumn("bucket", bucket)
        .withColumn("canonical", F.when(ok, F.to_json("v")))
        .transform(with_normalised, "error", error_text(F.when(ok, F.col("v"))))
        .select(
            "project",
            "queue",
            "id",
            "source_queue",
            "reason",
            "bucket",
            F.col("dl_claim_count").alias("claim_count"),
            F.col("dead_lettered_at_ms").alias("at_ms"),
            ((F.col("dead_lettered_at_ms") - F.col("first_enqueued_at_ms")) / 1000.0).alias("ttd_s"),
            F.coalesce("redrive_count", F.lit(0)).alias("redrive_count"),
            F.when(ok, numbers_as_number(schema)).alias("shape"),
            "error",
            signature_of(F.col("error"), F.col("source_queue"), F.col("reason")).alias("signature"),
            "rejection_reason",
            "consumer",
            F.when(
                ok, F.slice(F.array_sort(F.array_distinct(F.json_object_keys("body"))), 1, MAX_FIELDS)
            ).alias("fields"),
            F.substring(F.sha2("canonical", 256), 1, 16).alias("body_hash"),
            F.substring("canonical", 1, EXAMPLE_CHARS).alias("example"),
        )
    )


def numbers_as_number(schema: Column) -> Column:
    return F.regexp_replace(schema, NUMBER_TYPES, "$1NUMBER")


def shape(v: Column) -> Column:
    """The body's schema_of_variant with every number type written NUMBER: parse_json types a number by its
    digits (BIGINT, DECIMAL(p,s), DOUBLE), and a shape must not change with the values."""
    return numbers_as_number(F.schema_of_variant(v))


def with_normalised(frame: DataFrame, name: str, text: Column) -> DataFrame:
    """`frame` with a column `name`: `text` normalised as core.signatures.normalise does (MASKS), null when
    nothing is left. The masked text is a projection of its own: written in one expression with the check for
    an empty text, Spark ran the nine regular expressions twice a row (half of enrich's time)."""
    masked = F.substring(text, 1, MAX_RAW_ERROR_CHARS)
    for pattern, replacement in MASKS:
        masked = F.regexp_replace(masked, pattern, replacement)
    frame = frame.withColumn(name, F.substring(F.trim(masked), 1, MAX_ERROR_CHARS))
    return frame.withColumn(name, F.when(F.col(name) != "", F.col(name)))


def error_text(v: Column) -> Column:
    """`v`: the body (a VARIANT), null when it is not a JSON object. An error field holding a string is taken
    as it is; one holding an object, by its first MESSAGE_FIELDS (a path into a string is null); the text
    before normalising (with_normalised)."""
    found = [
        F.coalesce(
            *(F.try_variant_get(v, f"$.{name}.{inner}", "string") for inner in MESSAGE_FIELDS),
            F.try_variant_get(v, f"$.{name}", "string"),
        )
        for name in ERROR_FIELDS
    ]
    return F.coalesce(*found, F.col("rejection_description"), F.col("rejection_reason"))


def signature_of(error: Column, source_queue: Column, reason: Column) -> Column:
    # a normalised error text has no newline (MASKS collapse whitespace), so the two kinds never meet
    unknown = F.concat(F.lit("\n"), source_queue, F.lit("\n"), reason)
    return F.substring(F.sha2(F.coalesce(error, unknown, F.lit("")), 256), 1, SIGNATURE_CHARS)


def _ids(order: Column) -> Column:
    return F.min_by("id", F.struct(order, "id"), EXAMPLES)


def by_source(enriched: DataFrame) -> DataFrame:
    """Per DLQ, source queue and reason: counts, when, claim counts and time to death."""
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy("project", F.col("queue").alias("dlq"), "source_queue", "reason")
        .agg(
            F.count("*").alias("messages"),
            F.min("at_ms").alias("first_ms"),
            F.max("at_ms").alias("last_ms"),
            F.percentile_approx("claim_count", 0.5, PERCENTILE_ACCURACY).alias("claim_count_p50"),
            F.max("claim_count").alias("claim_count_max"),
            F.percentile_approx("ttd_s", [0.5, 0.9], PERCENTILE_ACCURACY).alias("ttd_p"),  # one sketch, both
            F.max("ttd_s").alias("ttd_max_s"),
            F.count_if(F.col("redrive_count") > 0).alias("redriven"),
            F.count_if(F.col("bucket") != "ok").alias("bad_bodies"),
        )
        .select(
            *(c for c in BY_SOURCE if not c.startswith("ttd_p")),
            F.col("ttd_p")[0].alias("ttd_p50_s"),
            F.col("ttd_p")[1].alias("ttd_p90_s"),
        )
        .select(*BY_SOURCE)
    )


def rate(enriched: DataFrame, width_s: int) -> DataFrame:
    """Dead letters per time bucket (`width_s` wide, aligned to the epoch) per source queue and reason."""
    width_ms = width_s * 1000
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy(*GROUP, (F.floor(F.col("at_ms") / width_ms) * width_ms).alias("bucket_ms"))
        .agg(F.count("*").alias("messages"))
    )


def signature_ids(enriched: DataFrame, keys: list[tuple[str, str]]) -> DataFrame:
    """For the (project, signature)s given (the report's top ones), per DLQ: how many messages and the ids of
    the newest REDRIVE_IDS (the likeliest to be in the DLQ still, when --since-last kept older records), for
    a redrive of exactly those."""
    wanted = enriched.sparkSession.createDataFrame(keys, "project string, signature string")
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .join(F.broadcast(wanted), ["project", "signature"])
        .groupBy("project", "signature", F.col("queue").alias("dlq"))
        .agg(
            F.count("*").alias("messages"),
            F.max_by("id", F.struct("at_ms", "id"), REDRIVE_IDS).alias("ids"),
        )
    )


def signature_rate(enriched: DataFrame, width_s: int) -> DataFrame:
    """Dead letters per time bucket (as in `rate`) per signature: its small chart."""
    width_ms = width_s * 1000
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy("project", "signature", (F.floor(F.col("at_ms") / width_ms) * width_ms).alias("bucket_ms"))
        .agg(F.count("*").alias("messages"))
    )


def claim_counts(enriched: DataFrame) -> DataFrame:
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy(*GROUP, "claim_count")
        .agg(F.count("*").alias("messages"))
    )


def ttd_bucket(ttd_s: Column) -> tuple[Column, Column]:
    """(order, label) of the time-to-death bucket."""
    order: Column = F.lit(len(TTD_BUCKETS))
    label: Column = F.lit(TTD_LAST)
    for i, (bound, name) in reversed(list(enumerate(TTD_BUCKETS))):
        order = F.when(ttd_s < bound, i).otherwise(order)
        label = F.when(ttd_s < bound, name).otherwise(label)
    return order, label


def time_to_death(enriched: DataFrame) -> DataFrame:
    order, label = ttd_bucket(F.col("ttd_s"))
    return (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy(*GROUP, order.alias("bucket_order"), label.alias("bucket"))
        .agg(F.count("*").alias("messages"))
    )


def signatures(enriched: DataFrame, recent_ms: int) -> DataFrame:
    """Failure signatures: a project's messages with one error text (its signature), whatever their body,
    with the body shapes under it (how many, and the commonest), the source queues, reasons and the
    consumers' rejection reasons, the newest dead-lettered examples (DLQ, id, body), and how many were
    dead-lettered after `recent_ms` (recent_from)."""
    scoped = enriched.where(F.col("bucket") != "no_provenance")
    shapes = (
        scoped.where(F.col("shape").isNotNull())
        .groupBy("project", "signature", "shape")
        .agg(F.count("*").alias("n"))
        .groupBy("project", "signature")
        .agg(
            F.count("*").alias("shapes"),
            F.max_by("shape", F.struct("n", F.col("shape"))).alias("shape"),
        )
    )
    return (
        scoped.groupBy("project", "signature")
        .agg(
            F.first("error").alias("error"),
            F.count("*").alias("messages"),
            F.count_if(F.col("at_ms") > recent_ms).alias("recent"),
            F.min("at_ms").alias("first_ms"),
            F.max("at_ms").alias("last_ms"),
            F.array_sort(F.collect_set("source_queue")).alias("source_queues"),
            F.array_sort(F.collect_set("reason")).alias("reasons"),
            F.array_sort(F.collect_set("rejection_reason")).alias("rejection_reasons"),
            F.count_if(F.col("bucket") != "ok").alias("bad_bodies"),
            F.max_by(
                F.struct(F.col("queue").alias("dlq"), "id", "example"), F.struct("at_ms", "id"), EXAMPLES
            ).alias("examples"),
        )
        .join(shapes, ["project", "signature"], "left")
        .withColumn("shapes", F.coalesce("shapes", F.lit(0)))
        .select(*SIGNATURES)
    )


def signature_fields(
    enriched: DataFrame, keep: Callable[[DataFrame], DataFrame] = lambda frame: frame
) -> DataFrame:
    """What the bodies of a signature have in common and what sets them apart (JSON object bodies, top-level
    fields): a row per field that is optional in the signature (in some of its bodies, not all) or whose
    share there differs by DISTINGUISHES or more from its share in the rest of the project's bodies (a
    field every failing body lacks shows with share 0). `elsewhere` is null when the project has no other
    bodies. `keep`: given the per-field counts (a few rows a signature), returns them kept (analyse
    persists them), because the plan reads them four times and would make them four times (2.3x this
    table's time on 300,000 dead letters) when not kept."""
    # One pass over the messages: per signature, a row per field with its count and one (field null) with
    # the signature's count; the project's counts are windows over those few rows, not more passes.
    every = F.concat(F.array(F.lit(None).cast("string")), F.col("fields"))
    counts = keep(
        enriched.where(F.col("bucket") == "ok")
        .select("project", "signature", F.explode(every).alias("field"))
        .groupBy("project", "signature", "field")
        .agg(F.count("*").alias("messages"))
    )
    total = F.when(F.col("field").isNull(), F.col("messages"))
    shares = (
        counts.withColumn("total", F.max(total).over(Window.partitionBy("project", "signature")))
        .withColumn("project_total", F.sum(total).over(Window.partitionBy("project")))
        .withColumn("project_messages", F.sum("messages").over(Window.partitionBy("project", "field")))
    )
    present = shares.where(F.col("field").isNotNull())
    # a field common in the project may be missing from every body of a signature: pair each signature
    # with the fields in at least DISTINGUISHES of its project's bodies that it lacks
    common = (
        present.where(F.col("project_messages") >= F.col("project_total") * DISTINGUISHES)
        .select("project", "field", "project_messages")
        .distinct()
    )
    absent = (
        shares.where(F.col("field").isNull())
        .select("project", "signature", "total", "project_total")
        .join(common, "project")
        .join(present.select("project", "signature", "field"), ["project", "signature", "field"], "left_anti")
        .withColumn("messages", F.lit(0).cast("long"))
    )
    rest = F.col("project_total") - F.col("total")
    share = F.col("messages") / F.col("total")
    elsewhere = F.when(rest > 0, (F.col("project_messages") - F.col("messages")) / rest)
    columns = ["project", "signature", "field", "messages", "total", "project_total", "project_messages"]
    return (
        present.select(*columns)
        .unionByName(absent.select(*columns))
        .select(
            "project", "signature", "field", "messages", share.alias("share"), elsewhere.alias("elsewhere")
        )
        .where(
            ((F.col("share") > 0) & (F.col("share") < OPTIONAL_BELOW))
            | (F.abs(F.col("share") - F.col("elsewhere")) >= DISTINGUISHES)
        )
    )


def rejections(enriched: DataFrame) -> DataFrame:
    """Messages their consumer rejected, per source queue and rejection reason (null: none given)."""
    return (
        enriched.where(F.col("reason") == "rejected")
        .groupBy("project", "source_queue", "rejection_reason")
        .agg(
            F.count("*").alias("messages"),
            F.min("at_ms").alias("first_ms"),
            F.max("at_ms").alias("last_ms"),
            _ids(F.col("at_ms")).alias("example_ids"),
        )
    )


CONSUMERS = (
    "project", "source_queue", "consumer", "messages", "share", "first_ms", "last_ms", "max_claims",
    "expired", "rejected", "signatures", "top_signature", "top_signature_messages",
)  # fmt: skip


def consumers(enriched: DataFrame) -> DataFrame:
    """Failures per consumer: per source queue and the Client-ID of the consumer that failed (null: no claim
    held the message), how many and when, by reason, their `share` of the source queue's dead letters, and
    how many signatures, with the one of most of them (ties: the greatest signature)."""
    per_signature = (
        enriched.where(F.col("bucket") != "no_provenance")
        .groupBy("project", "source_queue", "consumer", "signature")
        .agg(
            F.count("*").alias("n"),
            F.min("at_ms").alias("first_ms"),
            F.max("at_ms").alias("last_ms"),
            *(F.count_if(F.col("reason") == r).alias(r) for r in ("max_claims", "expired", "rejected")),
        )
    )
    source = Window.partitionBy("project", "source_queue")
    return (
        per_signature.groupBy("project", "source_queue", "consumer")
        .agg(
            F.sum("n").alias("messages"),
            F.min("first_ms").alias("first_ms"),
            F.max("last_ms").alias("last_ms"),
            *(F.sum(r).alias(r) for r in ("max_claims", "expired", "rejected")),
            F.count("*").alias("signatures"),
            F.max_by(F.struct("signature", "n"), F.struct("n", "signature")).alias("top"),
        )
        .withColumn("share", F.col("messages") / F.sum("messages").over(source))
        .withColumn("top_signature", F.col("top.signature"))
        .withColumn("top_signature_messages", F.col("top.n"))
        .select(*CONSUMERS)
    )


def repeat_offenders(enriched: DataFrame) -> DataFrame:
    """Identical bodies (same canonical JSON) dead-lettered more than once: the hashes seen twice or more are
    found first (a shuffle of hashes only: most bodies are unique), then only their messages are
    aggregated."""
    ok = enriched.where(F.col("bucket") == "ok")
    repeated = ok.groupBy("project", "body_hash").agg(F.count("*").alias("n")).where(F.col("n") > 1).drop("n")
    return (
        ok.join(F.broadcast(repeated), ["project", "body_hash"], "left_semi")
        .groupBy("project", "body_hash")
        .agg(
            F.count("*").alias("messages"),
            F.min("at_ms").alias("first_ms"),
            F.max("at_ms").alias("last_ms"),
            F.array_sort(F.collect_set("source_queue")).alias("source_queues"),
            _ids(F.col("at_ms")).alias("example_ids"),
            F.substring(F.min_by("example", F.struct("at_ms", "id")), 1, PREVIEW_CHARS).alias("preview"),
        )
    )


def quality(enriched: DataFrame) -> DataFrame:
    """Messages per DLQ and bucket, with example ids (by id) of each."""
    return enriched.groupBy("project", "queue", "bucket").agg(
        F.count("*").alias("messages"), F.min_by("id", "id", EXAMPLES).alias("example_ids")
    )
