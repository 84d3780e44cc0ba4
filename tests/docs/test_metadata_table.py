"""The reserved metadata tables of docs/dead-letter-queues.md are what core/metadata.py's rows generate
(app/metadata_doc.py), one row per reserved key, Zaqar's and Charon's extensions in their own table."""

from __future__ import annotations

import re
from pathlib import Path

from app.metadata_doc import BLOCK, render, splice
from core.metadata import RESERVED

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dead-letter-queues.md"


def test_the_tables_are_generated_from_the_rows() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert [m.group(2) for m in BLOCK.finditer(page)] == ["zaqar", "ext"]
    assert page == splice(page), "docs/dead-letter-queues.md is stale: run `python -m app.metadata_doc`"


def test_every_reserved_key_has_one_row() -> None:
    listed = re.findall(r"^\| `(_\w+)` \|", render(ext=False) + render(ext=True), re.M)
    assert sorted(listed) == sorted(RESERVED)
