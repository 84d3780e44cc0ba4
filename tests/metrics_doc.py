"""The series docs/operations.md's "Metrics" table documents: what GET /metrics is held to
(tests/api/test_metrics.py) and what the alert rules and the dashboard may name
(tests/deploy/test_monitoring.py)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

README = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
ROW = re.compile(r"^\| `(charon_\w+)` \| (counter|gauge|histogram) \|([\w, ]*)\| .+ \|$", re.M)
SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each documented series: its type and labels."""
    section = README.read_text(encoding="utf-8").split("## Metrics", 1)[1].split("\n## ", 1)[0]
    return {
        name: (kind, tuple(label.strip() for label in labels.split(",") if label.strip()))
        for name, kind, labels in ROW.findall(section)
    }


def sample_names() -> set[str]:
    """Every sample name the documented series may expose (a histogram's _bucket, _sum and _count)."""
    return {f"{name}{suffix}" for name, (kind, _) in documented().items() for suffix in SUFFIXES[kind]}


def samples(text: str) -> list[Sample]:
    """The samples of an exposition in Prometheus' text format."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]
