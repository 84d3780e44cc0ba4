"""What a run brings to the driver (Insights): each table cached whole, and the bounded view of it that was
collected, sized by what the report shows. The job's views (aggregate.py) and the report (report.py) both
read the sizes here, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

GROUP_CARDS = 8  # the (project, source queue, reason) groups with a distribution card in the report
SERIES = 7  # the groups the rate chart draws each in its colour; the rest are summed as "other"


@dataclass
class Insights:
    frames: dict[str, DataFrame]  # every table whole, cached until release()
    tables: dict[str, pa.Table]  # what came to the driver: each table's view (aggregate.view())
    counts: dict[str, int]  # each table's rows
    rate_width_s: int
    total: int
    first_ms: int  # the first and last death analysed
    last_ms: int
    analysed: int = 0  # the messages with provenance (by_source's sum), the first and last of their deaths
    analysed_ms: tuple[int | None, int | None] = (None, None)
    not_ok: dict[str, int] = field(default_factory=dict)  # per quality bucket other than ok, its messages
    top: int = 15
    timings: dict[str, float] = field(default_factory=dict)
    shuffle_partitions: int | None = None  # what the aggregates ran with, when set from the data

    def shown(self, name: str) -> list[dict[str, Any]]:
        """The view's rows, in the table's order (analysis.ORDER)."""
        rows: list[dict[str, Any]] = self.tables[name].to_pylist()
        return rows

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The whole table, brought to the driver and sorted (for a caller that knows it is small: tests,
        notebooks); the command itself never does this."""
        rows: list[dict[str, Any]] = in_order(name, self.frames[name].toArrow()).to_pylist()
        return rows

    def release(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


def in_order(name: str, table: pa.Table) -> pa.Table:
    """A table (or part of one) sorted as analysis.ORDER says, nulls first."""
    from pipeline import analysis

    return table.sort_by([(column, how, "at_start") for column, how in analysis.ORDER[name]])
