"""core.models.PROVENANCE names a dead letter's provenance once: the wire dict (core/wire.py), the API's
schema (api/schemas.py), and each driver's stored names and reads follow from its rows. These tests hold the
derived shapes to what they were when each was written by hand: the JSON byte for byte (python-zaqarclient
refuses unknown fields), the stored names (what earlier versions wrote must still read)."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from api.schemas import DeadLetterOut, MessageOut
from core import wire
from core.models import (
    PROVENANCE,
    DeadLetter,
    Message,
    MessageId,
    Rejection,
)
from storage.mongodb import schema
from storage.redis import keys

NOW = 1_700_000_000_000
REJECTIONS = [None, Rejection(), Rejection("bad"), Rejection(description="boom"), Rejection("", "boom")]
DEAD_LETTERS = [
    DeadLetter("src", reason, 3, NOW - 5_000, NOW - 90_000, redrives, rejection, consumer)
    for reason in ("max_claims", "expired", "rejected")
    for redrives in (0, 2)
    for rejection in REJECTIONS
    for consumer in (None, "", "consumer-1")
]


def by_hand(d: DeadLetter) -> dict[str, Any]:
    """The renderer core/wire.py had before it was derived from PROVENANCE."""
    out: dict[str, Any] = {
        "source_queue": d.source_queue,
        "reason": d.reason,
        "claim_count": d.claim_count,
        "dead_lettered_at": wire.iso(d.dead_lettered_at_ms),
        "first_enqueued_at": wire.iso(d.first_enqueued_at_ms),
        "redrive_count": d.redrive_count,
    }
    if d.consumer is not None:
        out["consumer"] = d.consumer
    if d.rejection is not None:
        out["rejection"] = {
            k: v for k, v in (("reason", d.rejection.reason), ("description", d.rejection.description)) if v
        }
    return out


@pytest.mark.parametrize("d", DEAD_LETTERS)
def test_the_wire_shows_the_provenance_as_it_did_byte_for_byte(d: DeadLetter) -> None:
    assert orjson.dumps(wire.dead_letter(d)) == orjson.dumps(by_hand(d))
    m = Message(MessageId("m"), "dlq", {"a": 1}, 60, NOW - 1_000, NOW + 59_000, dead_letter=d)
    assert "dead_letter" not in wire.message(m, NOW, wire.Shown(provenance=False))
    shown = wire.message(m, NOW)
    assert orjson.dumps(shown["dead_letter"]) == orjson.dumps(by_hand(d))
    assert MessageOut.model_validate(shown).model_dump(exclude_unset=True) == shown


def test_every_provenance_attribute_is_a_row() -> None:
    own = [f.name for f in dataclasses.fields(DeadLetter) if f.name != "rejection"]
    assert sorted(p.attr for p in PROVENANCE if not p.rejection) == sorted(own)
    said = [f.name for f in dataclasses.fields(Rejection)]
    assert sorted(p.attr for p in PROVENANCE if p.rejection) == sorted(said)
    assert len({p.key for p in PROVENANCE}) == len({p.field for p in PROVENANCE}) == len(PROVENANCE)


def test_the_api_schema_has_the_wire_fields_in_the_wire_order() -> None:
    everything = DeadLetter("s", "rejected", 1, NOW, NOW, 1, Rejection("r", "d"), "c")
    m = Message(MessageId("0" * 32), "q", {"n": 1}, 60, NOW, NOW + 60_000, dead_letter=everything)
    read = wire.message(m, NOW, wire.Shown(signature=True))["dead_letter"]  # the API's reads
    assert list(read) == [*wire.dead_letter(everything), "signature"]  # the signature last, computed
    assert list(DeadLetterOut.model_fields) == list(read)
    required = {name for name, f in DeadLetterOut.model_fields.items() if f.is_required()}
    assert required == {p.wire for p in PROVENANCE if not p.optional and not p.rejection}


def test_the_drivers_store_the_provenance_under_the_names_they_always_have() -> None:
    assert list(keys.DEAD_LETTER_FIELDS.values()) == [
        "dsrc", "drsn", "dcc", "dat", "dfirst", "drc", "drr", "drd", "dcl"
    ]  # fmt: skip
    assert dataclasses.astuple(schema.DEAD_LETTER) == (
        "src",
        "rsn",
        "cc",
        "at",
        "first",
        "rc",
        "rr",
        "rd",
        "cl",
    )


@pytest.mark.parametrize("d", DEAD_LETTERS)
def test_each_driver_reads_back_the_provenance_it_stored(d: DeadLetter) -> None:
    stored = {p.field: value for p in PROVENANCE if (value := _value(d, p.attr, p.rejection)) is not None}
    redis_hash = {f"d{f}": str(v) for f, v in stored.items()}
    assert keys.dead_letter_of(redis_hash) == _as_stored(d)
    assert keys.dead_letter_of({}) is None
    doc = {"_id": "m", "q": "dlq", "b": b"1", "t": 60, "cr": NOW, "e": NOW, "cl": "", "cc": 0, "dl": stored}
    assert schema.message_of(doc).dead_letter == _as_stored(d)


def _value(d: DeadLetter, attr: str, rejection: bool) -> Any:
    return getattr(d.rejection, attr, None) if rejection else getattr(d, attr)


def _as_stored(d: DeadLetter) -> DeadLetter:
    """What a store gives back: a rejection with nothing in it is none."""
    r = d.rejection
    return (
        d
        if r is None or r.reason is not None or r.description is not None
        else dataclasses.replace(d, rejection=None)
    )
