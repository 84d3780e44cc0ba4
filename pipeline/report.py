"""The HTML report: one self-contained page (inline CSS and SVG charts, no scripts, no network)."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any

from core.limits import is_name, is_valid_id
from core.signatures import DEFAULT_MAX_BODY_BYTES
from pipeline import trends
from pipeline.analysis import RECENT_S, REDRIVE_IDS, TTD_BUCKETS, TTD_LAST
from pipeline.insights import GROUP_CARDS, SERIES, Insights

# a colour per series of the rate chart and one for the rest, "other" (PALETTE[SERIES])
PALETTE = ("#3b6fb6", "#e0823d", "#4f9d69", "#c8534f", "#8a6bb8", "#9c7a4b", "#d17bb3", "#6f7f8f")
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1d2733;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde3ea;padding-bottom:4px}
.muted{color:#66727f}.kpis{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.kpi{background:#f3f6f9;border-radius:8px;padding:10px 14px;min-width:130px}.kpi b{display:block;font-size:20px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #edf0f3;vertical-align:top}
th{background:#f7f9fb;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,Menlo,Consolas,monospace;background:#f3f6f9;padding:1px 4px;border-radius:3px;word-break:break-all}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:12px}
.card{border:1px solid #e3e8ee;border-radius:8px;padding:10px}.card h3{font-size:13px;margin:0 0 6px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.sig{border:1px solid #e3e8ee;border-radius:8px;padding:10px;margin:0 0 10px}.sig h3{font-size:14px;margin:0 0 4px}
pre{font:12px ui-monospace,Menlo,Consolas,monospace;background:#f3f6f9;padding:6px;border-radius:4px;white-space:pre-wrap;word-break:break-all;margin:4px 0}
.bar{background:#3b6fb6;height:8px;border-radius:2px;display:inline-block}
.fix{border:2px solid #c8534f;border-radius:8px;padding:10px 14px;margin:14px 0}.fix h2{border:0;margin:0 0 6px;color:#c8534f}
.st{font-size:11px;font-weight:600;border-radius:9px;padding:1px 7px;margin-left:6px;vertical-align:middle;background:#edf0f3;color:#455261}
.st.new{background:#fbe3d4;color:#a1461a}.st.growing{background:#f7d7d6;color:#9c2f2b}.st.quiet{background:#e3f1e7;color:#2f6b41}
.spark{display:block;margin:4px 0}
"""


def ts(ms: int | None) -> str:
    return "" if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def html(
    insights: Insights,
    *,
    top: int,
    before: trends.Run | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> str:
    """The report. A redrive by signature is offered only for a run that read bodies as the server signs
    them (`max_body_bytes` the default): at another limit a body between the two is signed differently."""
    by_source = insights.shown("by_source")
    sigs = insights.shown("signatures")
    fields: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for f in insights.shown("signature_fields"):
        fields[(f["project"], f["signature"])].append(f)
    rates: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for r in insights.shown("signature_rate"):
        rates[(r["project"], r["signature"])][r["bucket_ms"]] = r["messages"]
    chart = Sparks(rates, insights.first_ms, insights.last_ms, insights.rate_width_s * 1000)
    signable = max_body_bytes == DEFAULT_MAX_BODY_BYTES
    redrives: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in insights.shown("signature_ids"):
        redrives[(r["project"], r["signature"])].append({**r, "by_signature": signable})
    window = (
        f"since the previous run (its last death {ts(before.last_ms)} UTC)"
        if before
        else f"in the last {duration(RECENT_S)} before the last death"
    )
    offenders = insights.shown("repeat_offenders")
    consumers = insights.shown("consumers")
    quality = insights.shown("quality")
    analysed, counts = insights.analysed, insights.counts
    first, last = insights.analysed_ms
    parts = [
        "<!doctype html><html lang=en><meta charset=utf-8><title>Charon DLQ insights</title>",
        f"<style>{CSS}</style><h1>Why messages died</h1>",
        f"<div class=muted>Charon DLQ insights, generated {ts(int(datetime.now(tz=UTC).timestamp() * 1000))} UTC"
        f" &middot; dead-lettered {ts(first)} to {ts(last)} UTC</div>",
        "<div class=kpis>",
        _kpi(f"{insights.total:,}", "messages read"),
        _kpi(f"{analysed:,}", "with provenance"),
        _kpi(f"{counts['by_source']:,}", "source queue / reason pairs"),
        _kpi(f"{counts['signatures']:,}", "failure signatures"),
        _kpi(f"{counts['repeat_offenders']:,}", "repeat offenders"),
        _kpi(f"{sum(insights.not_ok.values()):,}", "not analysed by body"),
        "</div>",
        _fix_first(trends.fix_first(sigs), fields, chart, window, redrives),
        "<h2>Per source queue and reason</h2>",
        _by_source_table(by_source, analysed),
        f"<h2>Dead-lettering rate</h2><div class=muted>messages per {duration(insights.rate_width_s)}</div>",
        _rate_chart(insights.shown("rate"), insights.rate_width_s),
        "<h2>Claim counts and time to death</h2>",
        _distribution_cards(by_source, insights.shown("claim_counts"), insights.shown("time_to_death")),
        "<h2>Failure signatures</h2><div class=muted>messages grouped by their error text with ids, values "
        "and times masked; under each, its body shapes and the fields that set its bodies apart; "
        + (
            f"new, growing, steady or quiet against the previous run ({escape(before.stamp)})"
            if before
            else "the first run in this output directory: nothing to compare with"
        )
        + f" (top {min(top, len(sigs))} of {counts['signatures']:,})</div>",
        _signature_cards(sigs[:top], fields, chart, window, redrives),
        "<h2>Rejections</h2><div class=muted>messages their consumer rejected, by the reason it gave</div>",
        _rejection_table(insights.shown("rejections")),
        "<h2>Failures per consumer</h2><div class=muted>by the Client-ID of the consumer whose claim used up "
        "the last delivery, or that rejected the message; its share of the source queue's dead letters, and "
        f"the signature of most of them (top {min(top, len(consumers))} of {counts['consumers']:,})</div>",
        _consumer_table(
            consumers[:top],
            {(s["project"], s["signature"]): s for s in sigs},
            {(s["project"], s["signature"]) for s in sigs[:top]},
        ),
        f"<h2>Repeat offenders</h2><div class=muted>identical bodies dead-lettered more than once "
        f"(top {min(top, len(offenders))} of {counts['repeat_offenders']:,})</div>",
        _offender_table(offenders[:top]),
        "<h2>Data quality</h2><div class=muted>messages whose body or provenance could not be analysed are "
        "counted here, not dropped</div>",
        _quality_table(quality),
        "</html>",
    ]
    return "\n".join(parts)


def _kpi(value: str, label: str) -> str:
    return f"<div class=kpi><b>{value}</b><span class=muted>{escape(label)}</span></div>"


def _table(head: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    th = "".join(f"<th{' class=n' if i in numeric else ''}>{h}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _name(r: dict[str, Any]) -> str:
    return f"{escape(r['project'])}/<b>{escape(r['source_queue'])}</b>"


def _by_source_table(rows: list[dict[str, Any]], analysed: int) -> str:
    widest = max((r["messages"] for r in rows), default=1)
    return _table(
        [
            "source queue",
            "DLQ",
            "reason",
            "messages",
            "",
            "first",
            "last",
            "claims p50 / max",
            "to death p50 / p90 / max",
            "redriven",
            "bad bodies",
        ],
        [
            [
                _name(r),
                escape(r["dlq"]),
                escape(r["reason"]),
                f"{r['messages']:,}",
                f"<span class=bar style='width:{max(1, 90 * r['messages'] // widest)}px'></span> "
                f"{100 * r['messages'] / max(analysed, 1):.0f}%",
                ts(r["first_ms"]),
                ts(r["last_ms"]),
                f"{r['claim_count_p50']:g} / {r['claim_count_max']}",
                f"{duration(r['ttd_p50_s'])} / {duration(r['ttd_p90_s'])} / {duration(r['ttd_max_s'])}",
                f"{r['redriven']:,}",
                f"{r['bad_bodies']:,}",
            ]
            for r in rows
        ],
        {3, 7, 8, 9, 10},
    )


def _rate_chart(rows: list[dict[str, Any]], width_s: int) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    totals: dict[tuple[str, str, str], int] = defaultdict(int)
    for r in rows:
        if r["project"] is not None:  # a null project: the rest of a partial view, summed (aggregate.view)
            totals[(r["project"], r["source_queue"], r["reason"])] += r["messages"]
    biggest = sorted(totals, key=lambda k: (-totals[k], k))
    series = {k: i for i, k in enumerate(biggest[:SERIES])}
    width_ms = width_s * 1000
    start = min(r["bucket_ms"] for r in rows)
    stacks = _stacks(rows, series, start, width_ms)
    other = len(biggest) > SERIES or any(r["project"] is None for r in rows)
    return _stacked_bars(stacks, start, width_ms) + _legend(series, other=other)


def _stacks(
    rows: list[dict[str, Any]], series: dict[tuple[str, str, str], int], start: int, width_ms: int
) -> list[list[int]]:
    """Per bucket from `start`, the messages of each series, and of the rest last."""
    n = (max(r["bucket_ms"] for r in rows) - start) // width_ms + 1
    stacks = [[0] * (SERIES + 1) for _ in range(n)]
    for r in rows:
        stacks[(r["bucket_ms"] - start) // width_ms][
            series.get((r["project"], r["source_queue"], r["reason"]), SERIES)
        ] += r["messages"]
    return stacks


def _stacked_bars(stacks: list[list[int]], start: int, width_ms: int) -> str:
    n = len(stacks)
    peak = max(sum(s) for s in stacks)
    w, h, left, bottom = 1100, 220, 48, 22
    bar = (w - left) / n
    out = [f"<svg viewBox='0 0 {w} {h + bottom}' width=100% role=img aria-label='dead letters over time'>"]
    for frac in (0.5, 1.0):
        y = h - frac * (h - 10)
        out.append(
            f"<line x1={left} x2={w} y1={y:.1f} y2={y:.1f} stroke='#e6eaee'/><text x={left - 6} y={y + 4:.1f} font-size=11 text-anchor=end fill='#66727f'>{round(frac * peak):,}</text>"
        )
    for i, stack in enumerate(stacks):
        y = float(h)
        for j, count in enumerate(stack):
            if count:
                height = count / peak * (h - 10)
                y -= height
                out.append(
                    f"<rect x={left + i * bar:.1f} y={y:.1f} width={max(bar - 1, 0.5):.1f} height={height:.1f} fill='{PALETTE[j]}'><title>{ts(start + i * width_ms)} {count:,}</title></rect>"
                )
    ticks = ((0, "start"), (n // 2, "middle"), (n - 1, "end")) if n > 2 else ((0, "start"),)
    for i, anchor in ticks:
        x = left + i * bar + {"start": 0, "middle": bar / 2, "end": bar}[anchor]
        out.append(
            f"<text x={x:.1f} y={h + 15} font-size=11 text-anchor={anchor} fill='#66727f'>{ts(start + i * width_ms)[5:16]}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _legend(series: dict[tuple[str, str, str], int], *, other: bool) -> str:
    out = ["<div class=legend>"]
    for k, j in series.items():
        out.append(
            f"<span><i style='background:{PALETTE[j]}'></i>{escape(k[0])}/{escape(k[1])} &middot; {escape(k[2])}</span>"
        )
    if other:
        out.append(f"<span><i style='background:{PALETTE[SERIES]}'></i>other</span>")
    out.append("</div>")
    return "".join(out)


def _bars(pairs: list[tuple[str, int]], color: str) -> str:
    """A small horizontal bar chart of (label, count)."""
    peak = max((c for _, c in pairs), default=1) or 1
    row, label_w, w = 16, 58, 250
    out = [f"<svg viewBox='0 0 {w} {row * len(pairs)}' width=100%>"]
    for i, (label, count) in enumerate(pairs):
        length = (w - label_w - 50) * count / peak
        out.append(
            f"<text x={label_w - 4} y={i * row + 12} font-size=11 text-anchor=end fill='#66727f'>{escape(label)}</text>"
            f"<rect x={label_w} y={i * row + 3} width={max(length, 0.5):.1f} height={row - 5} fill='{color}' rx='2'/>"
            f"<text x={label_w + length + 4:.1f} y={i * row + 12} font-size=11>{count:,}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _distribution_cards(
    by_source: list[dict[str, Any]], claims: list[dict[str, Any]], ttd: list[dict[str, Any]]
) -> str:
    claim_bars: dict[tuple[str, str, str], list[tuple[str, int]]] = defaultdict(list)
    for r in claims:
        claim_bars[(r["project"], r["source_queue"], r["reason"])].append(
            (str(r["claim_count"]), r["messages"])
        )
    ttd_counts: dict[tuple[str, str, str], dict[str, int]] = defaultdict(dict)
    for r in ttd:
        ttd_counts[(r["project"], r["source_queue"], r["reason"])][r["bucket"]] = r["messages"]
    labels = [label for _, label in TTD_BUCKETS] + [TTD_LAST]
    seen: set[tuple[str, str, str]] = set()
    cards = []
    for r in by_source:
        key = (r["project"], r["source_queue"], r["reason"])
        if key in seen:
            continue
        seen.add(key)
        cards.append(
            f"<div class=card><h3>{_name(r)} &middot; {escape(r['reason'])}</h3>"
            f"<div class=muted>claim count at death</div>{_bars(claim_bars[key], PALETTE[0])}"
            f"<div class=muted>time from first enqueue to death</div>"
            f"{_bars([(lb, ttd_counts[key].get(lb, 0)) for lb in labels], PALETTE[1])}</div>"
        )
        if len(cards) == GROUP_CARDS:
            break
    return f"<div class=cards>{''.join(cards)}</div>"


def _ids(ids: list[str]) -> str:
    return " ".join(f"<code>{escape(i)}</code>" for i in ids)


EXAMPLE_LINES = 14


def _pretty(example: str | None) -> str:
    """An example body, indented when it is whole JSON, cut to EXAMPLE_LINES lines."""
    if example is None:
        return "(not a JSON object)"
    try:
        text = json.dumps(json.loads(example), indent=2, ensure_ascii=False)
    except ValueError:
        text = example + " …"  # cut at analysis.EXAMPLE_CHARS
    lines = text.splitlines()
    return "\n".join(lines[:EXAMPLE_LINES] + (["…"] if len(lines) > EXAMPLE_LINES else []))


def untitled(row: Mapping[str, Any]) -> str:
    """A signature without error text is its messages' source queue and reason."""
    return f"no error text: died in {', '.join(row['source_queues'])} ({', '.join(row['reasons'])})"


def curl(project: str, dlq: str, message_id: str) -> str:
    """The command that fetches one dead letter with its provenance (every value quoted for the shell: read
    from a file, a project, queue or id can hold anything)."""
    return (
        f'curl -H "Client-ID: $CID" -H {shlex.quote("X-Project-ID: " + project)} '
        f'"$BASE"{shlex.quote(f"/v2/queues/{dlq}/messages/{message_id}?provenance=true")}'
    )


def redrive_request(row: Mapping[str, Any]) -> tuple[str, str, list[str]] | None:
    """For a signature_ids row: the dry run's and the redrive's request file, under the output directory
    (redrive/<project>/<signature>/<dlq>/dry-run.json and redrive.json; a project id that is not a plain
    name is written as ~ and the first 16 hex digits of its SHA-256), and the ids they list. None when the
    DLQ is not a queue name or none of the ids is a message id (dead letters read from a file can say
    anything), so no such path or request is ever written."""
    ids = [i for i in row["ids"] if is_valid_id(i)]
    if not ids or not is_name(row["dlq"]):
        return None
    project = row["project"]
    folder = project if is_name(project) else "~" + hashlib.sha256(project.encode()).hexdigest()[:16]
    base = f"redrive/{folder}/{row['signature']}/{row['dlq']}"
    return f"{base}/dry-run.json", f"{base}/redrive.json", ids


def _redrive_post(project: str, dlq: str, data: str) -> str:
    """curl's POST of a redrive, `data` its -d argument as the shell must read it."""
    return (
        f'curl -X POST -H "Client-ID: $CID" -H {shlex.quote("X-Project-ID: " + project)} '
        f'-H "Content-Type: application/json" "$BASE"{shlex.quote(f"/v2/queues/{dlq}/redrive")} '
        f"-d {data}"
    )


def redrive_curl(project: str, dlq: str, path: str) -> str:
    """The command that sends a redrive request file (run in the output directory)."""
    return _redrive_post(project, dlq, "@" + shlex.quote(path))


def signature_curl(project: str, dlq: str, signature: str, *, dry_run: bool) -> str:
    """The command that redrives every dead letter of a signature now in `dlq` (filter.signature: the server
    computes each one's signature as insights does at its default --max-body-bytes, so html() offers it only
    for a run at that default)."""
    body: dict[str, Any] = {"filter": {"signature": signature}}
    if dry_run:
        body["dry_run"] = True
    return _redrive_post(project, dlq, shlex.quote(json.dumps(body, separators=(",", ":"))))


def _redrive_notes(project: str, rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        request = redrive_request(r)
        if request is None:
            out.append(
                f"<div class=muted>{escape(r['dlq'])}: no redrive request (not a queue name, or no message "
                "ids)</div>"
            )
            continue
        dry, real, ids = request
        some = (
            f"all {r['messages']:,}"
            if r["messages"] == len(ids)
            else f"the newest {len(ids):,} of {r['messages']:,} (a request lists at most {REDRIVE_IDS:,})"
        )
        commands = f"{redrive_curl(project, r['dlq'], dry)}\n{redrive_curl(project, r['dlq'], real)}"
        out.append(
            f"<div class=muted>redrive {some} in {escape(r['dlq'])} (from the output directory): "
            f"the dry run, then the redrive</div><pre>{escape(commands)}</pre>"
        )
        if r.get("by_signature"):
            every = "\n".join(
                signature_curl(project, r["dlq"], r["signature"], dry_run=dry_run)
                for dry_run in (True, False)
            )
            out.append(
                "<div class=muted>or every dead letter of this signature in it now, however many, those "
                f"dead-lettered since this run too</div><pre>{escape(every)}</pre>"
            )
    return "".join(out)


def _field_notes(fields: list[dict[str, Any]]) -> str:
    notes = []
    for f in fields:
        where = "" if f["elsewhere"] is None else f" (in {f['elsewhere']:.0%} of the project's other bodies)"
        notes.append(f"<code>{escape(f['field'])}</code> in {f['share']:.0%}{where}")
    return "; ".join(notes) or "<span class=muted>none</span>"


class Sparks:
    """Each signature's dead letters per rate bucket over the run's whole span, as a small bar chart."""

    def __init__(
        self, rates: dict[tuple[str, str], dict[int, int]], first_ms: int, last_ms: int, width_ms: int
    ):
        self.rates, self.width_ms = rates, width_ms
        self.start = first_ms // width_ms * width_ms
        self.n = (last_ms - self.start) // width_ms + 1

    def __call__(self, project: str, signature: str) -> str:
        counts = self.rates.get((project, signature), {})
        peak = max(counts.values(), default=0) or 1
        w, h = 300, 34
        bar = w / self.n
        out = [f"<svg class=spark viewBox='0 0 {w} {h}' width={w} height={h} role=img aria-label='rate'>"]
        for bucket, count in sorted(counts.items()):
            i = (bucket - self.start) // self.width_ms
            height = max(count / peak * (h - 2), 1)
            out.append(
                f"<rect x={i * bar:.1f} y={h - height:.1f} width={max(bar - 0.5, 0.5):.1f} height={height:.1f} fill='{PALETTE[3]}'><title>{ts(bucket)} {count:,}</title></rect>"
            )
        out.append(f"<line x1=0 x2={w} y1={h - 0.5} y2={h - 0.5} stroke='#dde3ea'/></svg>")
        return "".join(out)


def _where(row: Mapping[str, Any]) -> str:
    """A signature's id, project, source queues, reasons and span, as a card's muted line."""
    return (
        f"<div class=muted>signature <code>{row['signature']}</code> &middot; {escape(row['project'])} &middot; "
        f"from {escape(', '.join(row['source_queues']))} &middot; {escape(', '.join(row['reasons']))}"
        f" &middot; {ts(row['first_ms'])} to {ts(row['last_ms'])}</div>"
    )


def _badge(status: str | None) -> str:
    return f"<span class='st {status}'>{status}</span>" if status else ""


def _fix_first(
    row: Mapping[str, Any] | None,
    fields: dict[tuple[str, str], list[dict[str, Any]]],
    chart: Sparks,
    window: str,
    redrives: dict[tuple[str, str], list[dict[str, Any]]],
) -> str:
    if row is None:
        return f"<div class=fix><h2>Fix first</h2><div class=muted>nothing was dead-lettered {window}</div></div>"
    first = row["examples"][0]
    key = (row["project"], row["signature"])
    return (
        f"<div class=fix><h2>Fix first{_badge(row.get('status'))}</h2>"
        f"<div><b>{row['recent']:,}</b> dead letters {window} ({row['messages']:,} in all) with "
        + (f"<code>{escape(row['error'])}</code>" if row["error"] else escape(untitled(row)))
        + f"</div>{chart(*key)}"
        f"{_where(row)}<div>fields: {_field_notes(fields[key])}</div>"
        f"<pre>{escape(curl(row['project'], first['dlq'], first['id']))}</pre>"
        f"{_redrive_notes(row['project'], redrives.get(key, []))}</div>"
    )


def _signature_cards(
    rows: list[dict[str, Any]],
    by_sig: dict[tuple[str, str], list[dict[str, Any]]],
    chart: Sparks,
    window: str,
    redrives: dict[tuple[str, str], list[dict[str, Any]]],
) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    cards = []
    for r in rows:
        error = (
            f"<code>{escape(r['error'])}</code>"
            if r["error"]
            else f"<span class=muted>{escape(untitled(r))}</span>"
        )
        first = r["examples"][0]
        shape = (
            f"{r['shapes']} body shape{'s' if r['shapes'] != 1 else ''}; the commonest "
            f"<code>{escape(r['shape'])}</code>"
            if r["shape"]
            else "no JSON object bodies"
        )
        examples = "".join(
            f"<div class=muted>{escape(e['dlq'])} <code>{escape(e['id'])}</code></div>"
            f"<pre>{escape(_pretty(e['example']))}</pre>"
            for e in r["examples"]
        )
        cards.append(
            f"<div class=sig id='{_anchor(r['project'], r['signature'])}'>"
            f"<h3>{r['messages']:,} &middot; {error}{_badge(r.get('status'))}</h3>"
            f"{chart(r['project'], r['signature'])}<div class=muted>{r['recent']:,} {window}</div>"
            f"{_where(r)}"
            + (
                f"<div>rejected as: {escape(', '.join(r['rejection_reasons']))}</div>"
                if r["rejection_reasons"]
                else ""
            )
            + f"<div>{shape}"
            + (f"; {r['bad_bodies']:,} not JSON objects" if r["bad_bodies"] else "")
            + f"</div><div>fields: {_field_notes(by_sig[(r['project'], r['signature'])])}</div>"
            f"<details><summary>examples</summary>{examples}"
            f"<pre>{escape(curl(r['project'], first['dlq'], first['id']))}</pre></details>"
            f"{_redrive_notes(r['project'], redrives.get((r['project'], r['signature']), []))}"
            "</div>"
        )
    return "".join(cards)


def _rejection_table(rows: list[dict[str, Any]]) -> str:
    return _table(
        ["source queue", "rejection reason", "messages", "first", "last", "examples"],
        [
            [
                _name(r),
                escape(r["rejection_reason"])
                if r["rejection_reason"] is not None
                else "<span class=muted>none given</span>",
                f"{r['messages']:,}",
                ts(r["first_ms"]),
                ts(r["last_ms"]),
                _ids(r["example_ids"]),
            ]
            for r in rows
        ],
        {2},
    )


def _anchor(project: str, signature: str) -> str:
    """A signature card's HTML id (a signature is per project)."""
    return f"sig-{hashlib.sha256(project.encode()).hexdigest()[:8]}-{signature}"


def _consumer_table(
    rows: list[dict[str, Any]],
    sigs: Mapping[tuple[str, str], Mapping[str, Any]],
    carded: set[tuple[str, str]],
) -> str:
    """`carded`: the signatures with a card in the report, which the table links to."""

    def top(r: Mapping[str, Any]) -> str:
        key = (r["project"], r["top_signature"])
        sig = sigs.get(key)
        text = "" if sig is None else (sig["error"] or untitled(sig))
        name = f"<code>{r['top_signature']}</code>"
        if key in carded:
            name = f"<a href='#{_anchor(*key)}'>{name}</a>"
        return f"{name} {r['top_signature_messages']:,} <span class=muted>{escape(text[:120])}</span>"

    head = (
        "source queue,consumer,messages,share,max claims,expired,rejected,signatures,the most with,first,last"
    )
    return _table(
        head.split(","),
        [
            [
                _name(r),
                f"<code>{escape(r['consumer'])}</code>"
                if r["consumer"] is not None
                else "<span class=muted>no claim held them</span>",
                f"{r['messages']:,}",
                f"{r['share']:.0%}",
                f"{r['max_claims']:,}",
                f"{r['expired']:,}",
                f"{r['rejected']:,}",
                f"{r['signatures']:,}",
                top(r),
                ts(r["first_ms"]),
                ts(r["last_ms"]),
            ]
            for r in rows
        ],
        {2, 3, 4, 5, 6, 7},
    )


def _offender_table(rows: list[dict[str, Any]]) -> str:
    return _table(
        ["times", "body", "hash", "source queues", "first", "last", "examples"],
        [
            [
                f"{r['messages']:,}",
                f"<code>{escape(r['preview'])}</code>",
                f"<code>{r['body_hash']}</code>",
                escape(", ".join(r["source_queues"])),
                ts(r["first_ms"]),
                ts(r["last_ms"]),
                _ids(r["example_ids"]),
            ]
            for r in rows
        ],
        {0},
    )


def _quality_table(rows: list[dict[str, Any]]) -> str:
    return _table(
        ["project / DLQ", "bucket", "messages", "examples"],
        [
            [
                f"{escape(r['project'])}/{escape(r['queue'])}",
                escape(r["bucket"]),
                f"{r['messages']:,}",
                _ids(r["example_ids"]),
            ]
            for r in rows
        ],
        {2},
    )
