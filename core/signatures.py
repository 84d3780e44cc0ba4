"""A dead letter's failure signature: what names one cause in `charon insights`, in plain Python.

Defined once here and used three ways: pipeline/analysis.py computes it in Spark SQL from these constants,
pipeline/purepython.py (the insights tests' oracle) and the service's redrive filter `signature` call these
functions, so a signature an insights run printed selects exactly its messages in a redrive.

The error text is the first of ERROR_FIELDS a JSON object body has (an object there: its first
MESSAGE_FIELDS, else its JSON), else the consumer's rejection description, else its rejection reason code;
its first MAX_RAW_ERROR_CHARS normalised by MASKS so that it does not vary with ids, values and times. The
signature is the first SIGNATURE_CHARS hex digits of its SHA-256, or when there is no error text of
"\\n<source queue>\\n<reason>".
A body longer than the reader's limit (insights' --max-body-bytes, DEFAULT_MAX_BODY_BYTES) is not read.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from core.models import Message

DEFAULT_MAX_BODY_BYTES = 65_536  # a longer body is counted as "huge", not parsed
ERROR_FIELDS = ("error", "exception", "reason")
# An error field that holds an object: its text is the first of these (else the object's JSON).
MESSAGE_FIELDS = ("message", "msg", "detail", "description", "error")
MAX_ERROR_CHARS = 200
# the error text masked is its first this many characters (masking is superlinear in the text's length, and a
# producer chooses it; the signature keeps MAX_ERROR_CHARS of the masked text anyway)
MAX_RAW_ERROR_CHARS = 1000
SIGNATURE_CHARS = 16  # hex digits of the SHA-256 of the error text that name a signature

# Normalising failure text so that one cause reads the same whatever ids, values and times it names: each
# pattern in this order, every masked value written <*>. ASCII classes only, so that Java's regex (Spark) and
# Python's `re` match the same text. A token is a run of letters, digits, '_' and '-'.
MASKS = (
    # ISO 8601 / RFC 3339 dates and times, with or without a time, fraction and zone
    (
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?"
        r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?)?",
        "<*>",
    ),
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<*>"),  # UUID
    # an e-mail address (starting where its run of such characters starts: linear however long a run)
    (r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:[.][A-Za-z0-9-]+)+", "<*>"),
    # a quoted value, but not a quoted lower-case identifier ('amount', "order_id": a field's name)
    (r"(?<![0-9A-Za-z])'(?![a-z][a-z_]*')[^'\r\n]*'(?![0-9A-Za-z])", "'<*>'"),
    (r'(?<![0-9A-Za-z])"(?![a-z][a-z_]*")[^"\r\n]*"(?![0-9A-Za-z])', '"<*>"'),
    # an id with a type prefix (cus_, pi_, ...) and a digit or capital in what follows
    (r"(?<![0-9A-Za-z_-])[A-Za-z]{1,12}_(?=[0-9A-Za-z]*[0-9A-Z])[0-9A-Za-z]{8,}(?![0-9A-Za-z_-])", "<*>"),
    # any token with a digit in it (numbers, hex, ids mixing letters and digits) or of 12+ hex digits
    (r"(?<![0-9A-Za-z_-])(?:[0-9A-Za-z_-]*[0-9][0-9A-Za-z_-]*|[0-9a-fA-F]{12,})(?![0-9A-Za-z_-])", "<*>"),
    # 5.2.2, 10:42:07, 1,000, and 1e+20 (how Python writes a float that Spark writes 1.0E20)
    (r"<[*]>(?:[.,:+]<[*]>)+", "<*>"),
    (r"[ \t\r\n]+", " "),
)
_MASKS = tuple((re.compile(p), r) for p, r in MASKS)
SIGNATURE_PATTERN = f"^[0-9a-f]{{{SIGNATURE_CHARS}}}$"


def canonical(value: Any) -> str:
    """The body's JSON with keys sorted, as Spark's to_json of a VARIANT writes it (but for doubles that need
    an exponent: Python writes 1e+300, Spark 1.0E300)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def normalise(text: str | None) -> str | None:
    if text is None:
        return None
    text = text[:MAX_RAW_ERROR_CHARS]
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return text.strip(" ")[:MAX_ERROR_CHARS] or None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else canonical(value)


def error_text(
    body: Mapping[str, Any] | None,
    rejection_description: str | None,
    rejection_reason: str | None,
    clean: Callable[[str | None], str | None] = normalise,
) -> str | None:
    """`body`: the parsed body when it is a JSON object (and was read), else None; `clean`: what is done to
    the text found (the masks; bench/studies/signatures.py gives the text to other groupings unmasked)."""
    for name in ERROR_FIELDS:
        value = (body or {}).get(name)
        if value is None:
            continue
        if isinstance(value, dict):
            inner = next((value[k] for k in MESSAGE_FIELDS if value.get(k) is not None), None)
            return clean(_text(value if inner is None else inner))
        return clean(_text(value))
    return clean(rejection_description if rejection_description is not None else rejection_reason)


def signature(error: str | None, source_queue: str | None = None, reason: str | None = None) -> str:
    if error is None and source_queue is not None and reason is not None:
        error = f"\n{source_queue}\n{reason}"
    return hashlib.sha256((error or "").encode()).hexdigest()[:SIGNATURE_CHARS]


def of_message(m: Message, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> str | None:
    """The signature `charon insights --max-body-bytes max_body_bytes` gives this message (its body is
    measured as the drivers store it); None when it is not a dead letter."""
    d = m.dead_letter
    if d is None:
        return None
    read = len(orjson.dumps(m.body)) <= max_body_bytes
    body = m.body if read and isinstance(m.body, dict) else None
    rejection = d.rejection
    error = error_text(
        body,
        rejection.description if rejection else None,
        rejection.reason if rejection else None,
    )
    return signature(error, d.source_queue, d.reason)
