"""Runs against each other: every run of `charon insights` keeps its tables under <out>/runs/<stamp>/ with a
run.json, and the next run in the same --out with the same scope (project and queues) compares its
signatures with them: new, growing, steady or quiet, and which one to fix first.

Pure Python over the small tables (no Spark): the driver reads the previous run's signatures table, and the
job counts each signature's `recent` messages (dead-lettered after the previous run's last death,
analysis.recent_from), so the comparison is exact however the queues were read.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GROWING = 1.5  # growing: dead-lettering since the previous run at this many times its rate in that run
MAX_RUNS = 1000  # --keep-runs' bound
KEEP_RUNS = 30  # runs kept in <out>/runs by default (the oldest are removed)
STATUSES = ("new", "growing", "steady", "quiet")


@dataclass(frozen=True)
class Run:
    """What a run leaves for the next: its span of deaths, its scope and its signatures' counts."""

    stamp: str
    first_ms: int
    last_ms: int
    scope: dict[str, Any]
    signatures: dict[tuple[str, str], int]


def scope(project: str | None, queues: Iterable[str] | None) -> dict[str, Any]:
    return {"project": project, "queues": sorted(queues) if queues else None}


def previous(out: Path, this_scope: Mapping[str, Any]) -> Run | None:
    """The newest kept run in `out` with this scope, else None."""
    import pyarrow.parquet as pq

    runs = out / "runs"
    if not runs.is_dir():
        return None
    for run in sorted(runs.iterdir(), reverse=True):
        try:
            meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
            if meta["scope"] != this_scope:
                continue
            table = pq.read_table(
                run / "tables" / "signatures.parquet", columns=["project", "signature", "messages"]
            )
        except (OSError, ValueError, KeyError):  # a run cut off before it finished, or not ours
            continue
        counts = {(r["project"], r["signature"]): r["messages"] for r in table.to_pylist()}
        return Run(run.name, meta["first_ms"], meta["last_ms"], meta["scope"], counts)
    return None


def status(row: Mapping[str, Any], before: Run | None, last_ms: int) -> str | None:
    """A signature row's status against the previous run (None when there is none): `new` (not in it),
    `quiet` (nothing dead-lettered since), `growing` (dead-lettering since at GROWING times or more its rate
    over that run's span), else `steady`."""
    if before is None:
        return None
    then = before.signatures.get((row["project"], row["signature"]))
    if then is None:
        return "new"
    if row["recent"] == 0:
        return "quiet"
    rate_then = then / max(before.last_ms - before.first_ms, 1)
    rate_now = row["recent"] / max(last_ms - before.last_ms, 1)
    return "growing" if rate_now >= GROWING * rate_then else "steady"


def fix_first(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The signature with the most recent messages (then the most messages); None when none is recent."""
    best = max(rows, key=lambda r: (r["recent"], r["messages"]), default=None)
    return best if best is not None and best["recent"] > 0 else None


def start(out: Path, stamp: str) -> Path:
    """<out>/runs/<stamp>/ with its tables/ directory made."""
    run = out / "runs" / stamp
    (run / "tables").mkdir(parents=True, exist_ok=True)
    return run


def finish(run: Path, meta: Mapping[str, Any], keep_runs: int) -> None:
    """run.json written last (a run without one is never compared with); runs beyond the newest `keep_runs`
    removed."""
    (run / "run.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    for old in sorted(p for p in run.parent.iterdir() if p.is_dir())[:-keep_runs]:
        shutil.rmtree(old, ignore_errors=True)
