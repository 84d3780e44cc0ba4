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
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROWING = 1.5  # growing: dead-lettering since the previous run at this many times its rate in that run
MAX_RUNS = 1000  # --keep-runs' bound
KEEP_RUNS = 30  # runs of one scope kept in <out>/runs by default (the oldest are removed)
STALE_S = 86_400  # a run directory without run.json this old was cut off: removed
RECORDS = "records"  # a --since-last run's records (Parquet), in its directory: the next one adds to them


@dataclass(frozen=True)
class Run:
    """What a run leaves for the next: its span of deaths, its scope and its signatures' counts."""

    stamp: str
    first_ms: int
    last_ms: int
    scope: dict[str, Any]
    signatures: dict[tuple[str, str], int]
    # per DLQ (pool, project, queue): the highest marker it read, where `--since-last` goes on from
    markers: dict[tuple[str | None, str, str], int] = field(default_factory=dict)
    path: Path | None = None  # its directory

    @property
    def records(self) -> Path | None:
        """The records a --since-last run kept (every dead letter its tables count), None if it kept none."""
        if self.path is None or not (self.path / RECORDS).is_dir():
            return None
        return self.path / RECORDS


def scope(project: str | None, queues: Iterable[str] | None) -> dict[str, Any]:
    return {"project": project, "queues": sorted(queues) if queues else None}


def _meta(run: Path) -> dict[str, Any] | None:
    """A finished run's run.json, or None (cut off before it wrote one, or not ours)."""
    try:
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    ok = isinstance(meta.get("first_ms"), int) and isinstance(meta.get("last_ms"), int) and "scope" in meta
    return meta if ok else None


def previous(out: Path, this_scope: Mapping[str, Any], *, with_records: bool = False) -> Run | None:
    """The newest finished run in `out` with this scope (`with_records`: of those that kept their records,
    the one --since-last goes on from), else None."""
    import pyarrow.parquet as pq

    runs = out / "runs"
    if not runs.is_dir():
        return None
    for run in sorted(runs.iterdir(), reverse=True):
        meta = _meta(run)
        if meta is None or meta["scope"] != this_scope or (with_records and not (run / RECORDS).is_dir()):
            continue
        try:
            table = pq.read_table(
                run / "tables" / "signatures.parquet", columns=["project", "signature", "messages"]
            )
        except (OSError, ValueError, KeyError):  # its tables are gone or not ours
            continue
        counts = {(r["project"], r["signature"]): r["messages"] for r in table.to_pylist()}
        markers = {}
        for entry in meta.get("markers") or []:
            if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[3], int):
                markers[(entry[0], entry[1], entry[2])] = entry[3]
        return Run(run.name, meta["first_ms"], meta["last_ms"], meta["scope"], counts, markers, run)
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


def redrive_keys(rows: Sequence[Mapping[str, Any]], top: int) -> list[tuple[str, str]]:
    """The (project, signature)s that get redrive requests: the report's `top` (rows in the signatures
    table's order) and the fix-first one."""
    keys = [(r["project"], r["signature"]) for r in rows[:top]]
    first = fix_first(rows)
    if first is not None and (first["project"], first["signature"]) not in keys:
        keys.append((first["project"], first["signature"]))
    return keys


def start(out: Path, stamp: str) -> Path:
    """<out>/runs/<stamp>/ with its tables/ directory made."""
    run = out / "runs" / stamp
    (run / "tables").mkdir(parents=True, exist_ok=True)
    return run


def finish(run: Path, meta: Mapping[str, Any], keep_runs: int) -> None:
    """run.json written last (a run without one is never compared with); then, of the finished runs with this
    run's scope, all but the newest `keep_runs` removed (never the newest that kept records: --since-last
    goes on from it), and when this run kept records, those of the others; and runs that never finished once
    a day old (a run of another scope, or one still being written, is left alone)."""
    (run / "run.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    mine, cut_off = [], []
    for other in sorted(p for p in run.parent.iterdir() if p.is_dir()):
        found = _meta(other)
        if found is None:
            cut_off.append(other)
        elif found["scope"] == meta["scope"]:
            mine.append(other)
    stale = time.time() - STALE_S
    kept = [p for p in mine if (p / RECORDS).is_dir()][-1:]
    old = [p for p in mine[:-keep_runs] if p not in kept] + [p for p in cut_off if p.stat().st_mtime < stale]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    if kept == [run]:
        for other in mine:
            if other != run:
                shutil.rmtree(other / RECORDS, ignore_errors=True)
