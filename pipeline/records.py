"""The record every input becomes: one dead-lettered message, flat, with its provenance.

batch() turns a store's export Page (storage/export.py: raw values, column by column) into Arrow in bulk
(Arrow casts, no per-row Python), and the analysis only ever sees this layout, whether the messages came from
Redis, MongoDB, a pooled deployment or a `charon export` file. A column
of provenance is null when the message has none (it was posted to the DLQ directly, say): analysis counts such
messages in their own bucket. `body` is the message body as JSON text, or null when it is longer than the
reader's limit (`body_bytes` still says how long it was). A body stored encrypted (`_enable_encrypt_messages`,
core/sealing.py) is opened with the process's key (CHARON_ENCRYPTION__KEYS; a Spark executor reads it from
its environment); `sealed_key` names the key that sealed it, and without that key `body` is null: the
analysis counts it as `encrypted` instead of analysing ciphertext.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from core import sealing
from core.errors import MessageUnreadable
from pipeline import DEFAULT_MAX_BODY_BYTES
from storage.export import Page

__all__ = ["DDL", "DEFAULT_MAX_BODY_BYTES", "SCHEMA", "batch"]

SCHEMA = pa.schema(
    [
        ("project", pa.string()),
        ("queue", pa.string()),  # the queue the message is in now: the DLQ
        ("id", pa.string()),
        ("marker", pa.int64()),
        ("body", pa.string()),
        ("body_bytes", pa.int64()),
        ("created_ms", pa.int64()),
        ("claim_count", pa.int64()),  # claims in the DLQ since it arrived
        ("source_queue", pa.string()),
        ("reason", pa.string()),  # max_claims | expired | rejected
        ("dl_claim_count", pa.int64()),  # claims it had when it was dead-lettered
        ("dead_lettered_at_ms", pa.int64()),
        ("first_enqueued_at_ms", pa.int64()),
        ("redrive_count", pa.int64()),
        ("rejection_reason", pa.string()),
        ("rejection_description", pa.string()),
        ("consumer", pa.string()),  # the Client-ID of the consumer that failed, None when unknown
        ("sealed_key", pa.string()),  # the id of the key that encrypted the body at rest, None when clear
    ]
)

DDL = ", ".join(
    f"{f.name} {'string' if pa.types.is_string(f.type) else 'bigint'}" for f in SCHEMA
)  # the same layout as Spark sees it


def batch(page: Page, *, max_body_bytes: int | None) -> pa.RecordBatch:
    """A RecordBatch from an export page: its values are bytes or str (text and numbers as Redis returns
    them), ints or None. Numbers are parsed by Arrow's cast; a body over `max_body_bytes` becomes null."""
    columns = {**page.columns, **opened(page.columns["body"])}
    arrays = []
    for f in SCHEMA:
        if f.name in ("project", "queue"):
            arrays.append(pa.array([getattr(page, f.name)] * len(page), pa.string()))
            continue
        if f.name == "body_bytes":
            arrays.append(pc.binary_length(_text(columns["body_stored"])).cast(pa.int64()))
            continue
        values = columns[f.name]
        array = _text(values) if pa.types.is_string(f.type) else _integers(values)
        if f.name == "body" and max_body_bytes is not None:
            too_long = pc.greater(pc.binary_length(array), max_body_bytes)
            array = pc.if_else(too_long, pa.scalar(None, pa.string()), array)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def opened(bodies: Sequence[Any]) -> dict[str, Sequence[Any]]:
    """`body` with each sealed body opened by this process's key, or null without it; `sealed_key` (the id of
    the key of each sealed body); `body_stored`, what `body_bytes` measures (the clear body, or without the
    key the stored ciphertext). Clear bodies cost one prefix check each."""
    sealed = [i for i, b in enumerate(bodies) if b is not None and sealing.is_sealed(b)]
    if not sealed:
        return {"body": bodies, "body_stored": bodies, "sealed_key": [None] * len(bodies)}
    ring = sealing.keyring() or sealing.from_environment()
    body, stored = list(bodies), list(bodies)
    keys: list[str | None] = [None] * len(bodies)
    for i in sealed:
        raw = bodies[i] if isinstance(bodies[i], str) else bytes(bodies[i]).decode()
        kid = keys[i] = sealing.key_id(raw)
        try:
            if ring is None:
                raise MessageUnreadable(kid)
            body[i] = stored[i] = ring.open(raw)
        except MessageUnreadable:  # no key of its id, or one that does not open it
            body[i] = None
    return {"body": body, "body_stored": stored, "sealed_key": keys}


def _text(values: Sequence[Any]) -> pa.Array:
    # bytes or str straight to a string array (UTF-8 checked): a tenth of the time of building a binary
    # array and casting it (pyarrow 26, 2,000 ids: 0.09 ms against 1.1 ms)
    return pa.array(values, pa.string())


def _integers(values: Sequence[Any]) -> pa.Array:
    if values and isinstance(next((v for v in values if v is not None), 0), int):
        return pa.array(values, pa.int64())
    return _text(values).cast(pa.int64())
