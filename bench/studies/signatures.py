"""Failure signatures against known causes: insights' masks (pipeline/analysis.py MASKS, through
purepython.py) against the masks and grouping it had before (the error text with UUIDs, hex runs and numbers
masked, and the body's shape, as one key) and against the Drain3 template miner (the log-pattern approach of
Datadog Log Patterns, Loki and others), on the raw error texts and on the masked ones.

The corpus is tests/pipeline/corpus.py: causes of known identity, ids in 8 spellings, times in 5 formats,
optional fields, nested errors, bodies that are not JSON objects, and two causes without any error text
(which insights tells apart by how they died; the others are given that as their text). For each approach:
the number of groups, the causes split over more than one group, the groups that mix causes, and error
texts grouped per second on one core (from the raw text: masking, hashing or mining; Drain3's through a
pipe, in batches). Drain3 pins cachetools 4, which Charon's own dependencies exclude, so it runs in its own
virtualenv (.bench/drain3-venv, made on first use from PyPI) reading the texts on stdin.

Run: .venv/bin/python -m bench.studies.signatures [--per-cause N]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline import purepython
from tests.pipeline import corpus

ROOT = Path(__file__).resolve().parents[2]
DRAIN3_VENV = ROOT / ".bench" / "drain3-venv"
DRAIN3 = "drain3==0.9.11"

# insights' masks until issue 23: UUIDs, hex runs with a letter and a digit, numbers
OLD_MASKS = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<id>"),
        (r"0[xX][0-9a-fA-F]+", "<hex>"),
        (
            r"(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}(?![0-9A-Za-z])",
            "<hex>",
        ),
        (r"[0-9]+(?:[.][0-9]+)?", "<n>"),
        (r"[ \t\r\n]+", " "),
    )
)

# Reads JSON lists of texts on stdin, one per line; writes each text's cluster id, one line per list.
DRAIN3_SCRIPT = """
import json, sys
from drain3 import TemplateMiner
from drain3.template_miner_config import TemplateMinerConfig
for line in sys.stdin:
    miner = TemplateMiner(config=TemplateMinerConfig())
    texts = json.loads(line)
    ids = [miner.add_log_message(t)["cluster_id"] for t in texts]
    # a cluster's template can change after a text joined it, never its id: the id is the group
    print(json.dumps(ids), flush=True)
"""


def drain3_python() -> Path:
    python = DRAIN3_VENV / "bin" / "python"
    if not python.exists():
        print(f"signatures: installing {DRAIN3} in {DRAIN3_VENV}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(DRAIN3_VENV)], check=True)
        subprocess.run([str(DRAIN3_VENV / "bin" / "pip"), "install", "-q", DRAIN3], check=True)
    return python


def texts(records: list[dict[str, Any]]) -> list[tuple[str, str, str | None, str]]:
    """Per message: id, raw error text (unmasked), masked error text, shape."""
    out = []
    for r in records:
        try:
            body = json.loads(r["body"])
        except ValueError:
            body = None
        obj = body if isinstance(body, dict) else None
        raw = _raw_error(obj, r)
        out.append((r["id"], raw, purepython.error_text(obj, r), purepython.shape(body)))
    return out


def _raw_error(body: Mapping[str, Any] | None, record: Mapping[str, Any]) -> str:
    """The text purepython.error_text masks, before its masks (whitespace collapsed)."""
    return (
        purepython.error_text(body, record, clean=lambda t: None if t is None else " ".join(t.split())) or ""
    )


def insights_signature(record: Mapping[str, Any]) -> str:
    """As insights computes it from a record: parse, error text, mask, hash."""
    try:
        body = json.loads(record["body"])
    except ValueError:
        body = None
    error = purepython.error_text(body if isinstance(body, dict) else None, record)
    return purepython.signature(error, record["source_queue"], record["reason"])


def fallback(raw: str, record: Mapping[str, Any]) -> str:
    """The text the other approaches group: the raw error text, else how the message died (what insights
    hashes when there is no error text), so that all compare on the same information."""
    return raw or f"died in {record['source_queue']} ({record['reason']})"


def _old(raw: str, shape: str) -> str:
    for pattern, replacement in OLD_MASKS:
        raw = pattern.sub(replacement, raw)
    return f"{shape}|{raw.strip()}"


def score(groups: list[Any], ids: list[str], cause_of: Mapping[str, str]) -> dict[str, int]:
    causes_of_group: dict[Any, set[str]] = defaultdict(set)
    groups_of_cause: dict[str, set[Any]] = defaultdict(set)
    for g, mid in zip(groups, ids, strict=True):
        causes_of_group[g].add(cause_of[mid])
        groups_of_cause[cause_of[mid]].add(g)
    return {
        "groups": len(causes_of_group),
        "split_causes": sum(len(gs) > 1 for gs in groups_of_cause.values()),
        "mixed_groups": sum(len(cs) > 1 for cs in causes_of_group.values()),
    }


def timed(fn: Callable[[], list[Any]], n: int) -> tuple[list[Any], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-cause", type=int, default=500, help="messages per cause (default 500)")
    p.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    args = p.parse_args()
    records, cause_of = corpus.generate(per_cause=args.per_cause)
    rows = texts(records)
    ids = [r[0] for r in rows]
    n = len(rows)
    results: dict[str, dict[str, Any]] = {}

    def run(name: str, fn: Callable[[], list[Any]]) -> None:
        groups, rate = timed(fn, n)
        results[name] = {**score(groups, ids, cause_of), "texts_per_s": round(rate)}

    def ours() -> list[str]:
        return [
            purepython.signature(purepython.normalise(raw), r["source_queue"], r["reason"])
            for (_, raw, _, _), r in zip(rows, records, strict=True)
        ]

    assert ours() == [insights_signature(r) for r in records]  # the bench's texts are insights' texts
    run("insights: masked error text", ours)
    texts_of = [fallback(raw, r) for (_, raw, _, _), r in zip(rows, records, strict=True)]
    run(
        "before issue 23: old masks, and the shape",
        lambda: [_old(text, shape) for text, (_, _, _, shape) in zip(texts_of, rows, strict=True)],
    )
    python = drain3_python()
    with subprocess.Popen(
        [str(python), "-c", DRAIN3_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as drain:
        assert drain.stdin is not None
        assert drain.stdout is not None

        def mine(batch: list[str]) -> list[Any]:
            drain.stdin.write(json.dumps(batch) + "\n")  # type: ignore[union-attr]
            drain.stdin.flush()  # type: ignore[union-attr]
            return list(json.loads(drain.stdout.readline()))  # type: ignore[union-attr]

        run("Drain3 on the raw error text", lambda: mine(texts_of))
        run(
            "Drain3 on insights' masked error text",
            lambda: mine([purepython.normalise(t) or "" for t in texts_of]),
        )
        drain.stdin.close()
    causes = len(set(cause_of.values()))
    if args.json:
        print(json.dumps({"messages": n, "causes": causes, "results": results}, indent=2))
        return
    print(f"{n:,} dead letters of {causes} causes (tests/pipeline/corpus.py, {args.per_cause} per cause)\n")
    print("| grouping | groups | causes split | groups mixing causes | texts/s |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['groups']} | {r['split_causes']} | {r['mixed_groups']} | {r['texts_per_s']:,} |"
        )


if __name__ == "__main__":
    main()
