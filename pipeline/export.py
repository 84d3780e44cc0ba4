"""A store's DLQs as JSON Lines (`charon export`): one message per line with its `dead_letter` provenance
(records.export_lines), for `charon insights --input` or a cluster reading shared storage.

Reads through the store's dead-letter export (storage/export.py), each DLQ whole and in marker order; no
Spark needed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import BinaryIO

from pipeline.records import batch, export_lines
from storage.export import DeadLetterExport, Extent


def write_lines(export: DeadLetterExport, extents: Sequence[Extent], out: BinaryIO) -> int:
    """Every message of `extents` as a line on `out`; returns how many were written."""
    now_ms = int(time.time() * 1000)
    written = 0
    for extent in extents:
        for s in extent.cut(1, now_ms=now_ms):
            for page in export.read(s):
                rb = batch(page, max_body_bytes=None)
                out.writelines(export_lines(rb))
                written += rb.num_rows
    return written
