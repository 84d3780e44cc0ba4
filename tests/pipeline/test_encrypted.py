"""Dead letters of a queue that encrypts at rest (`_enable_encrypt_messages`) in the pipeline: with the key,
`charon export` writes their clear bodies and the analysis reads them as any other; without it, they are
exported with a null body and the key's id, and the job counts them as `encrypted` in its data-quality
table and signs them by source queue and reason, never analysing ciphertext."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from core import sealing, signatures
from core.clock import ManualClock
from core.models import QueueRef
from core.sealing import Keyring
from pipeline import jsonl, records
from pipeline.load import DeadLetterStore
from storage.export import Page
from storage.mongodb.store import MongoStore
from storage.registry import open_store
from tests.contract.helpers import claim_ids, post, set_meta
from tests.pipeline.test_insights import from_files

KEYRING = Keyring({"k1": os.urandom(32)})
PROJECT = "vault"
Q, DLQ = QueueRef(PROJECT, "pay"), QueueRef(PROJECT, "pay.dlq")
BODIES = [{"error": "card 4111 declined", "n": i} for i in range(3)]


@pytest.fixture
def keyring() -> Iterator[None]:
    sealing.use(KEYRING)
    yield
    sealing.use(None)


@pytest.fixture(params=["redis", "mongo"])
async def sealed_store(request: pytest.FixtureRequest, keyring: None) -> AsyncIterator[DeadLetterStore]:
    """A store with BODIES dead-lettered from an encrypting queue into its DLQ."""
    uri: str = request.getfixturevalue("redis_url" if request.param == "redis" else "mongodb_uri")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    store = open_store(uri, namespace=namespace, clock=ManualClock())
    await set_meta(store, Q, _enable_encrypt_messages=True, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    await post(store, Q, *BODIES)
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    await claim_ids(store, Q)  # each moves to the DLQ, sealed
    yield DeadLetterStore(uri, namespace)
    if isinstance(store, MongoStore):
        await store.drop_collections()
    await store.aclose()


def exported(store: DeadLetterStore, out: Path) -> list[dict[str, Any]]:
    jsonl.export(store, out, project=PROJECT, queues=[DLQ.name])
    return [json.loads(line) for line in out.read_text().splitlines()]


async def test_export_opens_bodies_with_the_key_and_names_the_key_without_it(
    sealed_store: DeadLetterStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_key = exported(sealed_store, tmp_path / "clear.jsonl")
    assert sorted(m["body"]["n"] for m in with_key) == [0, 1, 2]
    assert all("encrypted_with" not in m for m in with_key)
    sealing.use(None)
    monkeypatch.delenv(sealing.VARIABLE, raising=False)
    without = exported(sealed_store, tmp_path / "sealed.jsonl")
    assert [(m["body"], m["encrypted_with"]) for m in without] == [(None, "k1")] * 3
    assert "4111" not in (tmp_path / "sealed.jsonl").read_text()
    # a Spark executor has no keyring of its own: it takes the key from its environment
    monkeypatch.setenv(sealing.VARIABLE, f"k1:{base64.b64encode(KEYRING.keys['k1']).decode()}")
    assert sorted(m["body"]["n"] for m in exported(sealed_store, tmp_path / "env.jsonl")) == [0, 1, 2]


def test_the_job_counts_bodies_it_cannot_open_as_encrypted_and_signs_them_by_source(
    spark: SparkSession, tmp_path: Path
) -> None:
    head = {
        "project": PROJECT,
        "queue": DLQ.name,
        "created": "2026-11-23T10:00:00.000Z",
        "claim_count": 0,
        "dead_letter": {
            "source_queue": Q.name,
            "reason": "max_claims",
            "claim_count": 1,
            "dead_lettered_at": "2026-11-23T10:05:00.000Z",
            "first_enqueued_at": "2026-11-23T10:00:00.000Z",
            "redrive_count": 0,
        },
    }
    lines = [{**head, "id": f"s{i}", "body": None, "encrypted_with": "k1"} for i in range(3)]
    lines.append({**head, "id": "clear", "body": {"error": "card 4111 declined"}})
    path = tmp_path / "dlq.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    insights = from_files(spark, path)
    buckets = {q["bucket"]: q["messages"] for q in insights.rows("quality")}
    assert buckets == {"encrypted": 3, "ok": 1}
    by_signature = {s["signature"]: s["messages"] for s in insights.rows("signatures")}
    assert by_signature[signatures.signature(None, Q.name, "max_claims")] == 3


def test_a_page_of_sealed_bodies_reads_as_records_with_their_key() -> None:
    sealing.use(KEYRING)
    try:
        bodies = [KEYRING.seal(b'{"a":1}'), '{"b":2}', None]
        page = Page(PROJECT, DLQ.name, {f: [None] * 3 for f in records.SCHEMA.names} | {"body": bodies})
        rb = records.batch(page, max_body_bytes=None).to_pydict()
        assert rb["body"] == ['{"a":1}', '{"b":2}', None]
        assert rb["sealed_key"] == ["k1", None, None]
        assert rb["body_bytes"] == [7, 7, None]
    finally:
        sealing.use(None)
