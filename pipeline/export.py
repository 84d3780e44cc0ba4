"""`charon export --queue DLQ`: a DLQ's messages as JSON Lines, one message per line with its `dead_letter`
provenance (records.export_lines), for `charon insights --input` or a cluster reading shared storage.

Reads the store directly, with the same readers as the Spark data source, in marker order; no Spark needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import BinaryIO

from pipeline.job import EXIT_FAILED, InsightsError, probe, store_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-uri", help="the store (default: CHARON_STORAGE_URI)")
    p.add_argument(
        "--namespace", default=None, help="key/collection prefix (default: CHARON_NAMESPACE or charon)"
    )
    p.add_argument("--project", help="one project only (default: every project with such a queue)")
    p.add_argument(
        "--queue", action="append", dest="queues", metavar="DLQ", required=True, help="the DLQ (repeatable)"
    )
    p.add_argument("--out", default="-", help="output file (default: standard output)")


def run(args: argparse.Namespace) -> int:
    from pipeline.records import export_lines
    from pipeline.sources import open_source, plan

    uri, namespace = store_of(args)
    if not uri:
        print("charon export: say which store: --storage-uri URI (or CHARON_STORAGE_URI)", file=sys.stderr)
        return EXIT_FAILED
    try:
        extents = probe(uri, namespace, args.project, args.queues)
    except InsightsError as e:
        print(f"charon export: {e}", file=sys.stderr)
        return e.exit_code
    source = open_source(uri, namespace=namespace)
    written = 0
    out: BinaryIO = sys.stdout.buffer if args.out == "-" else Path(args.out).open("wb")  # noqa: SIM115
    try:
        for s in plan(extents, slices=len(extents)):
            for rb in source.read(s, max_body_bytes=None):
                for line in export_lines(rb):
                    out.write(line)
                written += rb.num_rows
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    print(f"charon export: {written:,} messages from {len(extents)} queue(s)", file=sys.stderr)
    return 0
