"""What the job leaves: the tables (Parquet) and the report (HTML) in its output directory, and the summary
the command prints."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import DEFAULT_MAX_BODY_BYTES, hadoop, trends
from pipeline.insights import Insights
from pipeline.report import duration, untitled


def write(
    insights: Insights,
    out: str | Path,
    *,
    top: int,
    scope: Mapping[str, Any] | None = None,
    before: trends.Run | None = None,
    keep_runs: int = trends.KEEP_RUNS,
    markers: Sequence[tuple[str | None, str, str, int]] = (),
    since_last: bool = False,
    records: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Into `out` (a Hadoop URI or a local path, hadoop.location): every table written whole by Spark, as
    runs/<stamp>/tables/<name>.parquet and again as tables/<name>.parquet (the newest run's), with the run's
    run.json (the next run's comparison and, with `markers`, where `--since-last` goes on from); the redrive
    requests of the top signatures' messages (redrive/, as report.redrive_request names them) and
    report.html (`top` signatures and offenders), from the views. The signatures table gets each one's
    `status` against `before`, the previous run (trends.with_status, in Spark). `records`: the records a
    --since-last run kept (aggregate.analyse's `save`), moved into the run's directory for the next one to
    go on from; `max_body_bytes`: the run's --max-body-bytes (report.html offers a redrive by signature only
    at the default). Every file goes through Hadoop's FileSystem (hadoop.Files), none through Python's."""
    from pyspark import StorageLevel

    from pipeline import report
    from pipeline.aggregate import SIGNATURE, of_keys

    started = time.monotonic()
    uri = hadoop.location(out)
    files = hadoop.Files(insights.frames["signatures"].sparkSession, uri)
    computed = insights.frames["signatures"]
    # cached: written twice and viewed, and its join must not read a run that finish() may remove
    sigs = trends.with_status(computed.drop("status"), before, insights.last_ms)
    insights.frames["signatures"] = sigs = sigs.persist(StorageLevel.DISK_ONLY)
    viewed = [(r["project"], r["signature"]) for r in insights.shown("signatures")]
    insights.tables["signatures"] = of_keys("signatures", sigs, SIGNATURE, viewed)  # and caches it whole
    computed.unpersist()
    now = datetime.now(tz=UTC)
    run = trends.start(files, uri, now.strftime("%Y%m%dT%H%M%S.%fZ"))
    for name, frame in insights.frames.items():
        for where in (run, uri):
            frame.write.mode("overwrite").parquet(trends.table_of(where, name))
    files.delete(hadoop.join(uri, "redrive"))  # the previous run's requests
    for r in insights.shown("signature_ids"):
        request = report.redrive_request(r)
        if request is None:
            continue
        dry, real, ids = request
        body = {"filter": {"message_ids": ids}}
        files.write_text(hadoop.join(uri, dry), json.dumps({**body, "dry_run": True}))
        files.write_text(hadoop.join(uri, real), json.dumps(body))
    page = report.html(insights, top=top, before=before, max_body_bytes=max_body_bytes)
    files.write_text(hadoop.join(uri, "report.html"), page)
    meta = {
        "at": now.isoformat(),
        "scope": dict(scope or trends.scope(None, None)),
        "first_ms": insights.first_ms,
        "last_ms": insights.last_ms,
        "messages": insights.total,
        "rate_width_s": insights.rate_width_s,  # the width of the rate tables' buckets
        "shuffle_partitions": insights.shuffle_partitions,  # null: set by the operator (Spark's conf)
        "compared_with": before.stamp if before else None,
        # it read only what arrived after the newest run that kept records (not always the one compared
        # with: a run without --since-last may come between), and added it to that run's records
        "since_last": since_last,
        "markers": [list(m) for m in markers],  # per DLQ, the highest marker read
        "rows": insights.counts,  # each table's
    }
    if records is not None:
        files.rename(records, hadoop.join(run, trends.RECORDS))  # an InsightsError if it cannot
    trends.finish(files, run, meta, keep_runs)
    insights.timings["write_s"] = round(time.monotonic() - started, 3)  # the status join, writes, report


def summary(insights: Insights, out: str | Path, *, top: int) -> str:
    uri = hadoop.location(out)
    where = hadoop.local(uri) or uri
    lines = [
        f"{insights.total:,} messages analysed; report: {where}/report.html, tables: {where}/tables/",
        "",
    ]
    head = ("project/source queue", "reason", "messages", "claims p50", "to death p50")
    lines.append("  {:<36} {:<11} {:>9} {:>10} {:>12}".format(*head))
    for r in insights.shown("by_source")[:10]:
        lines.append(
            f"  {r['project'] + '/' + r['source_queue']:<36.36} {r['reason']:<11} {r['messages']:>9,} "
            f"{r['claim_count_p50']:>10g} {duration(r['ttd_p50_s']):>12}"
        )
    sigs = insights.shown("signatures")
    if sigs:
        lines += ["", f"  top failure signatures ({insights.counts['signatures']:,} in all):"]
        for s in sigs[: min(top, insights.top)]:  # the view's rows past --top are others' (fix-first, ...)
            lines.append(f"  {s['messages']:>9,}  {(s['error'] or untitled(s))[:80]:<80}  {s['signature']}")
    offenders = insights.shown("repeat_offenders")
    if offenders:
        worst = offenders[0]
        lines += [
            "",
            f"  repeat offenders: {insights.counts['repeat_offenders']:,} bodies dead-lettered more than "
            f"once (worst: {worst['messages']}x, {worst['preview'][:50]})",
        ]
    if insights.not_ok:
        bad = ", ".join(f"{k} {v:,}" for k, v in insights.not_ok.items())
        lines += ["", f"  not analysed by body: {bad}"]
    return "\n".join(lines)
