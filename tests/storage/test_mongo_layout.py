"""storage/mongodb/schema.py owns the MongoDB layout: no other module of the driver spells a collection or
field name, and what the driver writes has exactly the fields schema.py names.

The first test reads the driver's source (ast): a string literal, a constant part of an f-string, or a
keyword argument of dict() / .update() that is a name of the layout, or a dotted path starting with one
("dl.rc", "_id.p", ".messages"), is a name spelled outside schema.py. Literals that are values, not names
("running", "max_claims", "$set"), equal none. The second drives a store through every kind of write and
compares each document of each collection with schema.py's fields, both ways.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import uuid
from importlib import resources
from typing import Any, get_args

import pytest

from core import sealing
from core.clock import ManualClock
from core.models import (
    DeadLetterReason,
    Idempotency,
    MessageId,
    NewMessage,
    QueueRef,
    RedriveSpec,
    Rejection,
    SubscriptionId,
    TaskId,
)
from core.quotas import READS, WRITES
from core.sealing import Keyring
from storage.mongodb import schema
from storage.mongodb.store import MongoStore
from tests.contract.helpers import CLIENT, DLQ, Q, claim_ids, post, set_meta

DRIVER = resources.files("storage.mongodb")
LAYOUT = "schema.py"
COLLECTIONS = {str(c) for c in schema.Collection}
INSTANCES = [v for v in vars(schema).values() if dataclasses.is_dataclass(v) and not isinstance(v, type)]
FIELDS = {str(v) for instance in INSTANCES for v in dataclasses.astuple(instance)}
NAMES = FIELDS | COLLECTIONS
DOTTED = re.compile(r"\.?\w+(\.\w+)+|\.\w+")


def _spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every layout name the module spells itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if value in NAMES or (DOTTED.fullmatch(value) and _names_a_path(value)):
                found.append((node.lineno, value))
        elif isinstance(node, ast.Call) and _builds_a_document(node.func):
            found += [(k.value.lineno, k.arg) for k in node.keywords if k.arg in NAMES]
    return sorted(found)


def _names_a_path(value: str) -> bool:
    """A dotted field path ("dl.rc") or the tail of a collection's full name (".messages")."""
    first, *_ = value.lstrip(".").split(".")
    return first in NAMES


def _builds_a_document(func: ast.expr) -> bool:
    """dict(p=...) or query.update(q=...): keyword names as field names."""
    return (isinstance(func, ast.Name) and func.id == "dict") or (
        isinstance(func, ast.Attribute) and func.attr == "update"
    )


def _driver_sources() -> dict[str, str]:
    return {
        p.name: p.read_text(encoding="utf-8")
        for p in DRIVER.iterdir()
        if p.name.endswith(".py") and p.name != LAYOUT
    }


def test_the_check_knows_the_layout_and_reads_every_module() -> None:
    assert {"_id", "p", "q", "k", "c", "ce", "cc", "dl", "rc", "seq", "n_rcv", "status", "fp"} <= FIELDS
    assert {"messages", "queues", "counters", "claims", "tasks", "leases", "idempotency"} <= COLLECTIONS
    assert {"store.py", "claims.py", "moves.py", "redrive.py", "export.py"} <= set(_driver_sources())
    # It finds a name however it is spelled.
    spelled = 'd = {"cc": 1}; d.update(q=2); f"{ns}.messages"; x = "dl.rc"; s = "running"'
    assert {name for _, name in _spelled_names(spelled)} == {"cc", "q", ".messages", "dl.rc"}


@pytest.mark.parametrize("module", sorted(_driver_sources()))
def test_no_driver_module_spells_a_collection_or_field_name(module: str) -> None:
    assert _spelled_names(_driver_sources()[module]) == [], f"spell these through {LAYOUT}"


# Where each fields instance of schema.py is found: collection -> {path of a (sub-)document: its fields}. A
# compound _id's fields belong to its collection's instance.
M, DL = schema.MESSAGE, schema.DEAD_LETTER
WHERE = {
    schema.Collection.MESSAGES: {(): M, (M.DEAD_LETTER,): DL},
    schema.Collection.QUEUES: {
        (): schema.QUEUE,
        (schema.QUEUE.POLICY,): schema.POLICY,
        (schema.QUEUE.POLICY, schema.POLICY.BACKOFF): schema.BACKOFF,
    },
    schema.Collection.COUNTERS: {(): schema.COUNTER, (schema.COUNTER.ID,): schema.COUNTER},
    schema.Collection.CLAIMS: {(): schema.CLAIM},
    schema.Collection.PROJECTS: {(): schema.PROJECT},
    schema.Collection.QUOTAS: {
        (): schema.PROJECT_QUOTA,
        (schema.PROJECT_QUOTA.QUOTA,): schema.QUOTA_OVERRIDES,
        (schema.PROJECT_QUOTA.RATE,): schema.RATE,
        (schema.PROJECT_QUOTA.RATE, schema.RATE.READS): schema.BUCKET,
        (schema.PROJECT_QUOTA.RATE, schema.RATE.WRITES): schema.BUCKET,
    },
    schema.Collection.LEASES: {(): schema.LEASE},
    schema.Collection.TASKS: {(): schema.TASK},  # its spec is RedriveSpec.to_dict()'s, core's
    schema.Collection.IDEMPOTENCY: {(): schema.IDEMPOTENCY, (schema.IDEMPOTENCY.ID,): schema.IDEMPOTENCY},
    schema.Collection.SUBSCRIPTIONS: {(): schema.SUBSCRIPTION},  # its options are the client's, as JSON text
    # a delivery keeps the message's own fields
    schema.Collection.DELIVERIES: {
        (): schema.DELIVERY,
        (schema.DELIVERY.MESSAGE,): M,
        (schema.DELIVERY.MESSAGE, M.DEAD_LETTER): DL,
    },
}


def _at(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    for name in path:
        inner = doc.get(name)
        if not isinstance(inner, dict):
            return None
        doc = inner
    return doc


async def _every_kind_of_write(store: MongoStore, clock: ManualClock) -> None:
    """Each write of the driver once, leaving every field of the layout set on some document: all the policy,
    a live claim with a redelivery wait, dead letters (one rejected), a discard, a redriven message, a
    finished task, an Idempotency-Key's record, the sweeper's lease, the health probe, subscriptions of the
    queue and of its DLQ (one unconfirmed) and their deliveries, one leased and one retried."""
    await set_meta(
        store,
        Q,
        _default_message_ttl=3600,
        _default_message_delay=1,
        _max_messages_post_size=65536,
        _max_claim_count=2,
        _dead_letter_queue=DLQ.name,
        _dead_letter_queue_messages_ttl=3600,
        _redelivery_delay=1,
        _dead_letter_on_expiry=True,
        _max_message_ttl=7200,
        _enable_encrypt_messages=True,
    )
    # posts under them are transactions (the quota documents are written)
    counted = {"queues": 100, "messages_per_queue": 100, "message_bytes": 10**6, "subscriptions": 100}
    quota = {"reads_per_second": 1.0, "writes_per_second": 2.0, **counted}
    await store.set_quota(Q.project, quota)
    for bucket in (READS, WRITES):
        await store.take_tokens(Q.project, bucket, want=1, rate=1.0, capacity=2)
    for q, subscriber in ((Q, "https://a.example/hook"), (DLQ, "mailto:ops@example.com")):
        await store.create_subscription(
            q,
            SubscriptionId(uuid.uuid4().hex),
            subscriber=subscriber,
            ttl=3600,
            options={"post_data": {"$x": 1}},
            confirmed=True,
            max_per_queue=10,
        )
    unconfirmed = SubscriptionId(uuid.uuid4().hex)
    await store.create_subscription(
        Q, unconfirmed, subscriber="https://b.example", ttl=60, options={}, confirmed=False, max_per_queue=10
    )
    [rejected, *_] = await post(store, Q, "a", "b", "c")
    await post(store, Q, "never a dead letter", eligible=False)
    once = Idempotency(key="post-1", fingerprint="f" * 64, window_ms=60_000)
    await store.post_messages(
        Q,
        [NewMessage(body="i")],
        client_id=CLIENT,
        default_ttl=60,
        default_delay=0,
        body_size=3,
        idempotency=once,
    )
    for _ in range(2):  # the second claim uses up every message's claims: all dead-lettered, one discarded
        clock.advance(5)
        cid, _ = await claim_ids(store, Q)
        if rejected:
            await store.dead_letter_message(
                Q, rejected, claim_id=cid, rejection=Rejection("bad", "why"), client_id=CLIENT
            )
            rejected = None
        await store.renew_claim(Q, cid, ttl=30, grace=30)
        await store.release_claim(Q, cid)
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, RedriveSpec(limit=1), owner="me", lease_ms=10_000)
    task = await store.redrive_step(DLQ, task_id, owner="me", lease_ms=10_000, batch=10)
    assert (task.status, task.moved) == ("succeeded", 1)
    listed = TaskId(uuid.uuid4().hex)  # a task of listed ids (one that names no message: passed over)
    spec = RedriveSpec(message_ids=(MessageId(uuid.uuid4().hex),))
    await store.create_redrive(DLQ, listed, spec, owner="me", lease_ms=10_000)
    task = await store.redrive_step(DLQ, listed, owner="me", lease_ms=10_000, batch=10)
    assert (task.status, task.scanned, task.moved) == ("succeeded", 1, 0)
    signed = TaskId(uuid.uuid4().hex)  # a task with a signature filter (of no message here)
    await store.create_redrive(DLQ, signed, RedriveSpec(signature="0" * 16), owner="me", lease_ms=10_000)
    task = await store.redrive_step(DLQ, signed, owner="me", lease_ms=10_000, batch=10)
    assert (task.status, task.moved) == ("succeeded", 0)
    await post(store, QueueRef(Q.project, "counted"), "a queue made under the quota")
    await post(store, Q, "held", eligible=False)
    clock.advance(5)
    await claim_ids(store, Q)
    assert await store.sweep(lease_ms=1000) is not None
    await store.check_writable()
    retried, _leased = await store.lease_deliveries("notifier", lease_ms=10_000, limit=2)
    await store.finish_delivery(retried, retry_at_ms=clock.now_ms() + 1000)


async def test_what_the_driver_writes_has_exactly_the_fields_schema_names(
    mongo_store: MongoStore, clock: ManualClock
) -> None:
    assert {f for where in WHERE.values() for f in where.values()} == set(INSTANCES)
    sealing.use(Keyring({"k": bytes(32)}))  # the policy's `enc`: _enable_encrypt_messages needs a key
    try:
        await _every_kind_of_write(mongo_store, clock)
    finally:
        sealing.use(None)
    seen: dict[Any, set[str]] = {instance: set() for instance in INSTANCES}
    for collection, where in WHERE.items():
        docs = await getattr(mongo_store.collections, collection.value).find().to_list()
        assert docs, f"nothing written to {collection}"
        for doc in docs:
            for path, fields in where.items():
                inner = _at(doc, path)
                seen[fields] |= set(inner or ())
    unknown = {type(f).__name__: sorted(seen[f] - set(dataclasses.astuple(f))) for f in INSTANCES}
    unused = {type(f).__name__: sorted(set(dataclasses.astuple(f)) - seen[f]) for f in INSTANCES}
    assert {k: v for k, v in unknown.items() if v} == {}, "fields schema.py does not name"
    assert {k: v for k, v in unused.items() if v} == {}, "fields schema.py names that nothing writes"
    # n_rsn is keyed by the reasons themselves
    counted = await mongo_store.collections.counters.find().to_list()
    reasons = {r for doc in counted for r in doc.get(schema.COUNTER.BY_REASON, {})}
    assert {"max_claims", "rejected"} <= reasons <= set(get_args(DeadLetterReason))
