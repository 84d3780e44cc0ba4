"""The aggregates of analysis.py, computed in one Python process without Spark.

Two uses: the benchmark's baseline (what a single-process script over the same records costs), and the
tests' oracle (every Spark aggregate is checked against these numbers). It is written independently of the
Spark code, from analysis.py's definitions: json instead of VARIANT, `re` instead of Java's regex; the
error text and signature are core/signatures.py's, which the service's redrive filter uses too.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from core import signatures
from core.signatures import canonical, normalise, signature
from pipeline import trends
from pipeline.analysis import (
    DISTINGUISHES,
    EXAMPLE_CHARS,
    EXAMPLES,
    MAX_FIELDS,
    OPTIONAL_BELOW,
    PERCENTILE_ACCURACY,
    PREVIEW_CHARS,
    REDRIVE_IDS,
    TTD_BUCKETS,
    TTD_LAST,
    rate_width_s,
    recent_from,
)

Row = dict[str, Any]


Type = str | tuple[str, Any]  # "STRING" ..., ("OBJECT", {key: Type}) or ("ARRAY", Type)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _type(value: Any) -> Type:
    if value is None:
        return "VOID"
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, int | float):
        return "NUMBER"
    if isinstance(value, str):
        return "STRING"
    if isinstance(value, dict):
        return ("OBJECT", {k: _type(v) for k, v in value.items()})
    element: Type = "VOID"
    for v in value:
        element = _merge(element, _type(v))
    return ("ARRAY", element)


def _merge(a: Type, b: Type) -> Type:
    """schema_of_variant's merge of an array's element types (numbers are all NUMBER here already)."""
    if a == b or b == "VOID":
        return a
    if a == "VOID":
        return b
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "OBJECT":
        fields = dict(a[1])
        for k, t in b[1].items():
            fields[k] = _merge(fields[k], t) if k in fields else t
        return ("OBJECT", fields)
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0] == "ARRAY":
        return ("ARRAY", _merge(a[1], b[1]))
    return "VARIANT"


def _show(t: Type) -> str:
    if isinstance(t, str):
        return t
    if t[0] == "ARRAY":
        return f"ARRAY<{_show(t[1])}>"
    fields = ", ".join(f"{_key(k)}: {_show(v)}" for k, v in sorted(t[1].items()))
    return f"OBJECT<{fields}>"


def _key(k: str) -> str:
    return k if _PLAIN_KEY.fullmatch(k) else "`" + k.replace("`", "``") + "`"


def shape(body: Any) -> str:
    """analysis.shape: the body's schema as schema_of_variant writes it, numbers as NUMBER."""
    return _show(_type(body))


def error_text(
    body: Mapping[str, Any] | None,
    record: Mapping[str, Any],
    clean: Callable[[str | None], str | None] = normalise,
) -> str | None:
    """signatures.error_text of a record: `body` parsed when it is a JSON object, else None."""
    description, reason = record.get("rejection_description"), record.get("rejection_reason")
    return signatures.error_text(body, description, reason, clean)


def bucket(record: Mapping[str, Any]) -> tuple[str, Any]:
    """The record's bucket and, for "ok", its parsed body."""
    if any(
        record.get(f) is None
        for f in ("source_queue", "reason", "dead_lettered_at_ms", "first_enqueued_at_ms")
    ):
        return "no_provenance", None
    if record["body"] is None:
        if record.get("sealed_key") is not None:
            return "encrypted", None
        return ("huge" if record.get("body_bytes") else "not_json"), None
    try:
        body = json.loads(record["body"])
    except ValueError:
        return "not_json", None
    if not isinstance(body, dict):
        return "not_object", None
    return "ok", body


def percentile_approx(values: Sequence[Any], p: float) -> Any:
    """Spark's `percentile_approx` where its sketch is exact (a group of up to 5,000 values at accuracy
    10,000): the value at rank ceil(p * n), the smallest below the accuracy's error, the largest above."""
    ordered = sorted(values)
    if p <= 1 / PERCENTILE_ACCURACY:
        return ordered[0]
    if p >= 1 - 1 / PERCENTILE_ACCURACY:
        return ordered[-1]
    return ordered[math.ceil(p * len(ordered)) - 1]


def ttd_bucket(ttd_s: float) -> tuple[int, str]:
    for i, (bound, label) in enumerate(TTD_BUCKETS):
        if ttd_s < bound:
            return i, label
    return len(TTD_BUCKETS), TTD_LAST


def _earliest(items: list[tuple[Any, str]]) -> list[str]:
    return [i for _, i in sorted(items)[:EXAMPLES]]


def analyse(
    records: Iterable[Mapping[str, Any]], since_ms: int | None = None, top: int = 15
) -> dict[str, list[Row]]:
    """Every table of analysis.py, as lists of dicts in the same order and with the same columns."""
    records = list(records)
    deaths = [r["dead_lettered_at_ms"] for r in records if r["dead_lettered_at_ms"] is not None]
    recent_ms = recent_from(max(deaths, default=0), since_ms)
    # the rate's bucket width from every death, with provenance or not, as the Spark job takes its span
    width_ms = rate_width_s(min(deaths, default=0), max(deaths, default=0)) * 1000
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    sigs: dict[tuple[str, str], list[Row]] = defaultdict(list)
    bodies: dict[tuple[str, str], list[tuple[Mapping[str, Any], str]]] = defaultdict(list)
    buckets: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r in records:
        name, body = bucket(r)
        buckets[(r["project"], r["queue"], name)].append(r["id"])
        if name == "no_provenance":
            continue
        row = {**r, "bucket": name, "ttd_s": (r["dead_lettered_at_ms"] - r["first_enqueued_at_ms"]) / 1000.0}
        groups[(r["project"], r["queue"], r["source_queue"], r["reason"])].append(row)
        error = error_text(body, r)
        text = canonical(body) if name == "ok" else None
        row |= {
            "error": error,
            "shape": shape(body) if name == "ok" else None,
            "fields": sorted(body)[:MAX_FIELDS] if name == "ok" else None,
            "example": None if text is None else text[:EXAMPLE_CHARS],
        }
        sigs[(r["project"], signature(error, r["source_queue"], r["reason"]))].append(row)
        if text is not None:
            bodies[(r["project"], text)].append((row, text))
    signatures = _signatures(sigs, recent_ms)
    return {
        "by_source": _by_source(groups),
        **_distributions(groups, width_ms),
        "signatures": signatures,
        "signature_ids": _signature_ids(sigs, trends.redrive_keys(signatures, top)),
        "signature_fields": _signature_fields(sigs),
        "signature_rate": _signature_rate(sigs, width_ms),
        "rejections": _rejections(groups),
        "consumers": _consumers(sigs),
        "repeat_offenders": _offenders(bodies),
        "quality": [
            {
                "project": p,
                "queue": q,
                "bucket": b,
                "messages": len(ids),
                "example_ids": sorted(ids)[:EXAMPLES],
            }
            for (p, q, b), ids in sorted(buckets.items())
        ],
    }


def _span(rows: Sequence[Mapping[str, Any]]) -> Row:
    """How many, and the first and last time one was dead-lettered."""
    times = [r["dead_lettered_at_ms"] for r in rows]
    return {"messages": len(rows), "first_ms": min(times), "last_ms": max(times)}


def _by_source(groups: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]) -> list[Row]:
    out = []
    for (project, dlq, source, reason), rows in groups.items():
        counts = [r["dl_claim_count"] for r in rows]
        ttd = [r["ttd_s"] for r in rows]
        out.append(
            {
                "project": project,
                "dlq": dlq,
                "source_queue": source,
                "reason": reason,
                **_span(rows),
                "claim_count_p50": percentile_approx(counts, 0.5),
                "claim_count_max": max(counts),
                "ttd_p50_s": percentile_approx(ttd, 0.5),
                "ttd_p90_s": percentile_approx(ttd, 0.9),
                "ttd_max_s": max(ttd),
                "redriven": sum(1 for r in rows if (r["redrive_count"] or 0) > 0),
                "bad_bodies": sum(1 for r in rows if r["bucket"] != "ok"),
            }
        )
    return sorted(out, key=lambda r: (-r["messages"], r["project"], r["dlq"], r["source_queue"], r["reason"]))


def _distributions(
    groups: Mapping[tuple[Any, ...], list[Mapping[str, Any]]], width_ms: int
) -> dict[str, list[Row]]:
    rows = [r for members in groups.values() for r in members]
    rate: dict[tuple[Any, ...], int] = defaultdict(int)
    claims: dict[tuple[Any, ...], int] = defaultdict(int)
    ttd: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in rows:
        key = (r["project"], r["source_queue"], r["reason"])
        rate[(*key, r["dead_lettered_at_ms"] // width_ms * width_ms)] += 1
        claims[(*key, r["dl_claim_count"])] += 1
        ttd[(*key, *ttd_bucket(r["ttd_s"]))] += 1
    names = ("project", "source_queue", "reason")
    return {
        "rate": [
            {**dict(zip(names, k[:3], strict=True)), "bucket_ms": k[3], "messages": n}
            for k, n in sorted(rate.items(), key=lambda kv: (kv[0][3], *kv[0][:3]))
        ],
        "claim_counts": [
            {**dict(zip(names, k[:3], strict=True)), "claim_count": k[3], "messages": n}
            for k, n in sorted(claims.items())
        ],
        "time_to_death": [
            {**dict(zip(names, k[:3], strict=True)), "bucket_order": k[3], "bucket": k[4], "messages": n}
            for k, n in sorted(ttd.items())
        ],
    }


def _signature_rate(sigs: Mapping[tuple[str, str], list[Row]], width_ms: int) -> list[Row]:
    counts = Counter(
        (project, sig, r["dead_lettered_at_ms"] // width_ms * width_ms)
        for (project, sig), rows in sigs.items()
        for r in rows
    )
    return [
        {"project": p, "signature": s, "bucket_ms": b, "messages": n}
        for (p, s, b), n in sorted(counts.items())
    ]


def _signature_ids(sigs: Mapping[tuple[str, str], list[Row]], keys: list[tuple[str, str]]) -> list[Row]:
    out = []
    for project, sig in sorted(keys):
        by_dlq: dict[str, list[Row]] = defaultdict(list)
        for r in sigs[(project, sig)]:
            by_dlq[r["queue"]].append(r)
        for dlq, rows in sorted(by_dlq.items()):
            newest = sorted(((r["dead_lettered_at_ms"], r["id"]) for r in rows), reverse=True)[:REDRIVE_IDS]
            out.append(
                {
                    "project": project,
                    "signature": sig,
                    "dlq": dlq,
                    "messages": len(rows),
                    "ids": [i for _, i in newest],
                }
            )
    return out


def _signatures(sigs: Mapping[tuple[str, str], list[Row]], recent_ms: int) -> list[Row]:
    out = []
    for (project, sig), rows in sigs.items():
        shapes = Counter(r["shape"] for r in rows if r["shape"] is not None)
        examples = sorted(rows, key=lambda r: (r["dead_lettered_at_ms"], r["id"]), reverse=True)[:EXAMPLES]
        out.append(
            {
                "project": project,
                "signature": sig,
                "error": rows[0]["error"],
                **_span(rows),
                "recent": sum(1 for r in rows if r["dead_lettered_at_ms"] > recent_ms),
                "source_queues": sorted({r["source_queue"] for r in rows}),
                "reasons": sorted({r["reason"] for r in rows}),
                "rejection_reasons": sorted(
                    {r["rejection_reason"] for r in rows if r["rejection_reason"] is not None}
                ),
                "bad_bodies": sum(1 for r in rows if r["bucket"] != "ok"),
                "shapes": len(shapes),
                "shape": max(shapes.items(), key=lambda kv: (kv[1], kv[0]))[0] if shapes else None,
                "examples": [{"dlq": r["queue"], "id": r["id"], "example": r["example"]} for r in examples],
            }
        )
    return sorted(out, key=lambda r: (-r["messages"], r["project"], r["signature"]))


def _signature_fields(sigs: Mapping[tuple[str, str], list[Row]]) -> list[Row]:
    present: dict[tuple[str, str], Counter[str]] = {}
    totals: dict[tuple[str, str], int] = {}
    in_project: dict[str, Counter[str]] = defaultdict(Counter)
    project_total: Counter[str] = Counter()
    for key, rows in sigs.items():
        ok = [r for r in rows if r["bucket"] == "ok"]
        if not ok:
            continue
        present[key] = Counter(f for r in ok for f in r["fields"])
        totals[key] = len(ok)
        in_project[key[0]].update(present[key])
        project_total[key[0]] += len(ok)
    out = []
    for (project, sig), counts in present.items():
        total, rest = totals[(project, sig)], project_total[project] - totals[(project, sig)]
        common = {f for f, n in in_project[project].items() if n >= project_total[project] * DISTINGUISHES}
        for field in sorted(set(counts) | common):
            n = counts.get(field, 0)
            share = n / total
            elsewhere = (in_project[project][field] - n) / rest if rest > 0 else None
            optional = 0 < share < OPTIONAL_BELOW
            if optional or (elsewhere is not None and abs(share - elsewhere) >= DISTINGUISHES):
                out.append(
                    {
                        "project": project,
                        "signature": sig,
                        "field": field,
                        "messages": n,
                        "share": share,
                        "elsewhere": elsewhere,
                    }
                )
    return sorted(out, key=lambda r: (r["project"], r["signature"], r["field"]))


def _rejections(groups: Mapping[tuple[Any, ...], list[Mapping[str, Any]]]) -> list[Row]:
    by: dict[tuple[str, str, str | None], list[Mapping[str, Any]]] = defaultdict(list)
    for rows in groups.values():
        for r in rows:
            if r["reason"] == "rejected":
                by[(r["project"], r["source_queue"], r["rejection_reason"])].append(r)
    out = [
        {
            "project": project,
            "source_queue": source,
            "rejection_reason": code,
            **_span(rows),
            "example_ids": _earliest([(r["dead_lettered_at_ms"], r["id"]) for r in rows]),
        }
        for (project, source, code), rows in by.items()
    ]
    return _most_first(out, "rejection_reason")


def _most_first(rows: list[Row], column: str) -> list[Row]:
    """Per source queue rows, the most messages first, then by project, source queue and `column` (null
    first), as analysis.ORDER sorts them."""

    def key(r: Row) -> tuple[Any, ...]:
        return (-r["messages"], r["project"], r["source_queue"], r[column] is not None, r[column] or "")

    return sorted(rows, key=key)


def _consumers(sigs: Mapping[tuple[str, str], list[Row]]) -> list[Row]:
    by: dict[tuple[str, str, str | None], dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for (_, sig), rows in sigs.items():
        for r in rows:
            by[(r["project"], r["source_queue"], r.get("consumer"))][sig].append(r)
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for (project, source, _), per in by.items():
        totals[(project, source)] += sum(len(rows) for rows in per.values())
    out = []
    for (project, source, consumer), per in by.items():
        rows = [r for group in per.values() for r in group]
        top = max(per, key=lambda s: (len(per[s]), s))
        out.append(
            {
                "project": project,
                "source_queue": source,
                "consumer": consumer,
                "messages": len(rows),
                "share": len(rows) / totals[(project, source)],
                "first_ms": min(r["dead_lettered_at_ms"] for r in rows),
                "last_ms": max(r["dead_lettered_at_ms"] for r in rows),
                **{k: sum(r["reason"] == k for r in rows) for k in ("max_claims", "expired", "rejected")},
                "signatures": len(per),
                "top_signature": top,
                "top_signature_messages": len(per[top]),
            }
        )
    return _most_first(out, "consumer")


def _offenders(bodies: Mapping[tuple[str, str], list[tuple[Mapping[str, Any], str]]]) -> list[Row]:
    out = []
    for (project, text), members in bodies.items():
        if len(members) < 2:
            continue
        rows = [r for r, _ in members]
        out.append(
            {
                "project": project,
                "body_hash": hashlib.sha256(text.encode()).hexdigest()[:16],
                **_span(rows),
                "source_queues": sorted({r["source_queue"] for r in rows}),
                "example_ids": _earliest([(r["dead_lettered_at_ms"], r["id"]) for r in rows]),
                "preview": text[:PREVIEW_CHARS],
            }
        )
    return sorted(out, key=lambda r: (-r["messages"], r["project"], r["first_ms"], r["body_hash"]))
