"""What the job leaves: the tables (Parquet) and the report (HTML) in its output directory, and the summary
the command prints."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import DEFAULT_MAX_BODY_BYTES, trends
from pipeline.aggregate import Insights
from pipeline.report import duration, untitled


def write(
    insights: Insights,
    out: Path,
    *,
    top: int,
    scope: Mapping[str, Any] | None = None,
    before: trends.Run | None = None,
    keep_runs: int = trends.KEEP_RUNS,
    markers: Sequence[tuple[str | None, str, str, int]] = (),
    since_last: bool = False,
    records: Path | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """out/tables/<name>.parquet for every table, the same under out/runs/<stamp>/tables/ with run.json (the
    next run's comparison and, with `markers`, where `--since-last` goes on from), the redrive requests of
    the top signatures' messages (out/redrive/, as report.redrive_request names them), and out/report.html
    (`top` signatures and offenders). The signatures table gets each one's `status` against `before`, the
    previous run (trends.status). `records`: the records a --since-last run kept (aggregate.analyse's
    `save`), moved into the run's directory for the next one to go on from; `max_body_bytes`: the run's
    --max-body-bytes (report.html offers a redrive by signature only at the default)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import report

    sigs = insights.tables["signatures"]
    if "status" in sigs.column_names:  # written before
        sigs = sigs.drop_columns(["status"])
    status = [trends.status(r, before, insights.last_ms) for r in sigs.to_pylist()]
    insights.tables["signatures"] = sigs.append_column("status", pa.array(status, pa.string()))
    now = datetime.now(tz=UTC)
    run = trends.start(out, now.strftime("%Y%m%dT%H%M%S.%fZ"))
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name, table in insights.tables.items():
        kept = run / "tables" / f"{name}.parquet"
        pq.write_table(table, kept)
        shutil.copyfile(kept, tables / f"{name}.parquet")
    shutil.rmtree(out / "redrive", ignore_errors=True)  # the previous run's requests
    for r in insights.rows("signature_ids"):
        request = report.redrive_request(r)
        if request is None:
            continue
        dry, real, ids = request
        (out / dry).parent.mkdir(parents=True, exist_ok=True)
        body = {"filter": {"message_ids": ids}}
        (out / dry).write_text(json.dumps({**body, "dry_run": True}), encoding="utf-8")
        (out / real).write_text(json.dumps(body), encoding="utf-8")
    page = report.html(insights, top=top, before=before, max_body_bytes=max_body_bytes)
    (out / "report.html").write_text(page, encoding="utf-8")
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
    }
    if records is not None:
        records.replace(run / trends.RECORDS)
    trends.finish(run, meta, keep_runs)


def summary(insights: Insights, out: Path, *, top: int) -> str:
    lines = [
        f"{insights.total:,} messages analysed; report: {out / 'report.html'}, tables: {out / 'tables'}/",
        "",
    ]
    head = ("project/source queue", "reason", "messages", "claims p50", "to death p50")
    lines.append("  {:<36} {:<11} {:>9} {:>10} {:>12}".format(*head))
    for r in insights.rows("by_source")[:10]:
        lines.append(
            f"  {r['project'] + '/' + r['source_queue']:<36.36} {r['reason']:<11} {r['messages']:>9,} "
            f"{r['claim_count_p50']:>10g} {duration(r['ttd_p50_s']):>12}"
        )
    sigs = insights.rows("signatures")
    if sigs:
        lines += ["", f"  top failure signatures ({len(sigs):,} in all):"]
        for s in sigs[:top]:
            lines.append(f"  {s['messages']:>9,}  {(s['error'] or untitled(s))[:80]:<80}  {s['signature']}")
    offenders = insights.rows("repeat_offenders")
    if offenders:
        worst = offenders[0]
        lines += [
            "",
            f"  repeat offenders: {len(offenders):,} bodies dead-lettered more than once "
            f"(worst: {worst['messages']}x, {worst['preview'][:50]})",
        ]
    bad: dict[str, int] = {}
    for q in insights.rows("quality"):
        if q["bucket"] != "ok":
            bad[q["bucket"]] = bad.get(q["bucket"], 0) + q["messages"]
    if bad:
        lines += ["", "  not analysed by body: " + ", ".join(f"{k} {v:,}" for k, v in sorted(bad.items()))]
    return "\n".join(lines)
