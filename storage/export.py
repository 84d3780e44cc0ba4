"""The dead-letter export: how the DLQ insights pipeline and `charon export` read a store's dead letters
without knowing its layout.

Each driver implements DeadLetterExport beside its store (storage/redis/export.py, storage/mongodb/export.py,
and storage/pooling/export.py over the pools of a catalogue); storage/registry.py's open_export() picks one
by URI. Unlike the Store, an export is synchronous and holds no connection between calls: Spark calls
extents() once, in a Python process beside its driver, and read() in worker processes, each of which opens
its own export from the same URI and reads the Slice it was shipped.

A read is cut by marker. A message keeps its marker while it stays in its queue, so a marker range read
while the service runs yields no message twice; one that leaves the DLQ during the read may or may not be
seen, and one that arrives after extents() may be missed. Messages past their expiry at the Slice's `now_ms`
are skipped, as the API would.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

PAGE_SIZE = 2_000  # messages per Page: a ZRANGE and its HMGETs (Redis) or one cursor batch (MongoDB)

Value = bytes | str | int | None


@dataclass(frozen=True, slots=True)
class Extent:
    """One DLQ that holds messages: how many, and its lowest and highest marker. `pool` names the pool it
    lives in (a pooled deployment), None for a single store."""

    project: str
    queue: str
    count: int
    lo: int
    hi: int
    pool: str | None = None

    @property
    def key(self) -> tuple[str | None, str, str]:
        """Which DLQ: (pool, project, queue)."""
        return (self.pool, self.project, self.queue)

    def within(self, after: int, upto: int) -> Extent | None:
        """The part of the extent with markers in (after, upto], its count estimated in proportion to the
        marker range (it only weighs the read's partitions); None when nothing is left."""
        lo, hi = max(self.lo, after + 1), min(self.hi, upto)
        if lo > hi:
            return None
        share = (hi - lo + 1) / (self.hi - self.lo + 1)
        return Extent(self.project, self.queue, max(1, round(self.count * share)), lo, hi, self.pool)

    def cut(self, n: int, *, now_ms: int) -> list[Slice]:
        """The extent as (at most) `n` slices of equal marker ranges."""
        width = -(-(self.hi - self.lo + 1) // max(1, n))
        return [
            Slice(self.project, self.queue, lo, min(lo + width - 1, self.hi), now_ms, self.pool)
            for lo in range(self.lo, self.hi + 1, width)
        ]


@dataclass(frozen=True, slots=True)
class Slice:
    """The messages of one DLQ whose markers are in [lo, hi], not expired at `now_ms`. Picklable and free of
    credentials: Spark ships it to the task that reads it."""

    project: str
    queue: str
    lo: int
    hi: int
    now_ms: int
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    """Up to PAGE_SIZE messages of one DLQ, column by column: `columns[name][i]` is message i's value, for
    each name of: id, marker, body (its JSON text, or sealed: core/sealing.py, as stored), created_ms,
    claim_count (claims in the DLQ since it arrived), and the dead_letter provenance, None for a message
    posted to the DLQ directly:
    source_queue, reason (max_claims | expired | rejected), dl_claim_count (claims it had when it was
    dead-lettered), dead_lettered_at_ms, first_enqueued_at_ms, redrive_count (None is 0), rejection_reason,
    rejection_description, consumer (the Client-ID of the consumer that failed, DeadLetter.consumer).
    Values are as the store answers them, for a bulk conversion (pipeline/records.py): bytes or str (text;
    numbers as their decimal text, as Redis answers them), int, or None (absent)."""

    project: str
    queue: str
    columns: Mapping[str, Sequence[Value]]

    def __len__(self) -> int:
        return len(self.columns["id"])


class DeadLetterExport(Protocol):
    def extents(self, project: str | None, names: Sequence[str] | None) -> list[Extent]:
        """The DLQs of `project` (None: of every project) that hold messages, by project then name. With
        `names`, those queues; else every queue that some queue's metadata names as its `_dead_letter_queue`
        or that has received dead letters (the operator's `{queue}.DLQ` template included). Raises
        StorageUnavailable, saying which store, when the store cannot be read."""

    def read(self, part: Slice) -> Iterator[Page]:
        """The slice's messages in marker order, one round trip per Page. Opens its own client (it runs in
        a Spark worker) and closes it when the iterator ends or is closed."""


def shown(uri: str) -> str:
    """`uri` without its passwords (the userinfo's, and any `...password=` option's), for messages."""
    return re.sub(r"([?&][^=&#]*password=)[^&#]*", r"\1***", re.sub(r"//[^@/]*@", "//***@", uri))
