"""Failure signatures equal causes: on a generated corpus of known causes (corpus.py), every cause is one
signature and every message is in its cause's signature, in Spark and in the plain-Python oracle alike."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from pyspark.sql import SparkSession

from core import signatures
from core.models import DeadLetter, Message, MessageId, Rejection
from pipeline import DEFAULT_MAX_BODY_BYTES, aggregate, analysis, purepython
from pipeline.aggregate import TABLES
from pipeline.records import DDL
from tests.pipeline import corpus
from tests.pipeline.conftest import record

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def generated() -> tuple[list[dict[str, Any]], dict[str, str]]:
    return corpus.generate()


def test_every_cause_is_one_signature(
    spark: SparkSession, generated: tuple[list[dict[str, Any]], dict[str, str]]
) -> None:
    records, cause_of = generated
    enriched = analysis.enrich(spark.createDataFrame(records, DDL)).select("id", "signature").collect()
    assert len(enriched) == len(records)
    causes_of: dict[str, set[str]] = defaultdict(set)
    signatures_of: dict[str, set[str]] = defaultdict(set)
    for row in enriched:
        causes_of[row.signature].add(cause_of[row.id])
        signatures_of[cause_of[row.id]].add(row.signature)
    assert {c: len(s) for c, s in signatures_of.items() if len(s) > 1} == {}  # no cause split
    assert {s: c for s, c in causes_of.items() if len(c) > 1} == {}  # no two causes in one
    assert len(causes_of) == len(set(cause_of.values())) == 15


def test_the_tables_equal_plain_python_and_say_what_sets_a_cause_apart(
    spark: SparkSession, generated: tuple[list[dict[str, Any]], dict[str, str]]
) -> None:
    records, _ = generated
    insights = aggregate.analyse(spark, spark.createDataFrame(records, DDL))
    expected = purepython.analyse(records)
    for name in TABLES:
        assert insights.rows(name) == expected[name], name
    assert len(insights.rows("signatures")) == 15
    # the two causes without error text: one signature each, by how their messages died
    untitled = [s for s in insights.rows("signatures") if s["error"] is None]
    assert sorted(s["reasons"] for s in untitled) == [["expired"], ["max_claims"]]
    sigs = {s["error"]: s for s in insights.rows("signatures")}
    assert set(sigs) >= {
        "customer <*> not found",
        "payment <*> declined: insufficient funds at <*>",
        'user "<*>" is locked since <*>',
        "stock for sku <*> is <*>",  # the message of a nested error object
        "missing field 'amount'",  # a quoted field name stays; a quoted value does not
        "missing field 'currency'",
        "cannot parse the body at byte <*>",  # bodies that are not JSON objects: the rejection's text
        "bad_sku",  # a rejection with only its reason code
    }
    missing = sigs["missing field 'amount'"]
    assert missing["shapes"] == 2  # with and without the optional coupon: one signature all the same
    fields = {
        f["field"]: f for f in insights.rows("signature_fields") if f["signature"] == missing["signature"]
    }
    assert fields["amount"]["share"] == 0
    assert fields["amount"]["elsewhere"] > 0.5
    assert 0 < fields["coupon"]["share"] < 1  # optional
    assert "order_id" not in fields  # in every body here and elsewhere: says nothing
    unparseable = sigs["cannot parse the body at byte <*>"]
    assert (unparseable["bad_bodies"], unparseable["shape"]) == (60, None)
    assert unparseable["rejection_reasons"] == ["unparseable"]
    rejected = {r["rejection_reason"]: r["messages"] for r in insights.rows("rejections")}
    assert rejected == {"unparseable": 60, "bad_sku": 60}
    example = sigs["customer <*> not found"]["examples"][0]
    assert example["dlq"] == "orders.dlq"
    assert '"error":"customer ' in example["example"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("customer cus_9fK2LmQx81PzaB not found", "customer 88120391 not found"),
        ("order 4f2a9c01d2e4 failed", "order 112233445566 failed"),  # 12 hex digits, all digits
        (
            "payment 7c9e6679-7425-40de-944b-e07fc1f90ae7 at 2026-11-24T10:00:00Z",
            "payment 12 at 1795000000000",
        ),
        ("invalid address 'dana.smith@example.com'", "invalid address 'Bob'"),
        ("GET https://a.example/v1/users/42?page=3", "GET https://a.example/v2/users/a81fZ?page=10"),
        ("mailbox full (552 5.2.2)", "mailbox full (452 5.2.0)"),
    ],
)
def test_one_cause_reads_the_same_whatever_its_ids(a: str, b: str) -> None:
    assert purepython.normalise(a) == purepython.normalise(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("missing field 'amount'", "missing field 'currency'"),
        ("timeout calling inventory", "timeout calling payments"),
        ("java.lang.IllegalStateException: closed", "java.lang.IllegalArgumentException: closed"),
    ],
)
def test_two_causes_stay_two(a: str, b: str) -> None:
    assert purepython.normalise(a) != purepython.normalise(b)


ODD_BODIES: list[Any] = [
    {"error": {"code": "E1", "limit": 1e20}},  # Python writes 1e+20, Spark 1.0E20
    {"error": {"code": "E2", "limit": -1.5e300, "floor": 2.5e-7}},
    {"error": 12345678901234567},
    {"error": 1e16},
    {"error": True},
    {"error": ["a", 1, None]},
    {"error": {"message": None, "detail": "the detail wins"}},
    {"error": ""},
    {"error": None, "exception": "Übergröße: ключ 42 fehlt ✓"},
    {"error": "x" * 5000},  # longer than what is masked
    {"error": "a" * 1500 + " 99"},
    {"error": "boom", "pad": "x" * DEFAULT_MAX_BODY_BYTES},  # not read: signed by its death
    ["an", "array"],
    "a string",
    12.5,
    None,
]


def test_the_server_signs_every_message_as_the_spark_job_does(spark: SparkSession) -> None:
    """core/signatures.of_message (the redrive filter) against analysis.enrich (the job), on the bodies where
    Python's JSON and Spark's VARIANT write values differently."""
    messages = []
    for i, body in enumerate(ODD_BODIES):
        rejection = Rejection("bad_body", "rejected: body 7 of 9") if i % 3 == 0 else None
        dead = DeadLetter(
            "orders", "rejected" if rejection else "max_claims", 3, 2_000 + i, 1_000, 0, rejection
        )
        messages.append(
            Message(MessageId(f"{i:032x}"), "orders.dlq", body, 60, 1_000, 61_000, dead_letter=dead)
        )
    records = [record("shop", m, max_body_bytes=DEFAULT_MAX_BODY_BYTES) for m in messages]
    enriched = analysis.enrich(spark.createDataFrame(records, DDL)).select("id", "signature", "error")
    by_spark = {r.id: (r.signature, r.error) for r in enriched.collect()}
    for m in messages:
        assert (signatures.of_message(m), m.body) == (by_spark[m.id][0], m.body), by_spark[m.id][1]
