"""Encryption at rest (`_enable_encrypt_messages`, core/sealing.py) on every driver: the bodies of an
encrypting queue are stored sealed and read back clear by every read (get, list, claim, a claim's messages,
pop, the notifications of the outbox, a dead-letter move and a redrive); the raw store holds no clear body;
keys rotate; and a body sealed with a key the process lacks is refused by name, never shown as ciphertext."""

from __future__ import annotations

import base64
import dataclasses
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from core import sealing
from core.clock import ManualClock
from core.errors import MessageUnreadable
from core.models import QueueRef, RedriveSpec, TaskId
from core.sealing import Keyring
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.redis.store import RedisStore
from tests.contract.helpers import CLIENT, DLQ, Q, all_messages, claim_ids, post, set_meta
from tests.contract.test_outbox import LEASE_MS, drain
from tests.contract.test_subscriptions import HOOK, subscribe

pytestmark = pytest.mark.every_store

SECRET = "the-plaintext-nobody-may-store-7f3a"
BODY = {"card": SECRET, "amount": 12}


def key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def keys() -> Iterator[Keyring]:
    """A keyring of one key (`k1`) as this process's, and none again after the test."""
    ring = Keyring.parse(f"k1:{key()}")
    sealing.use(ring)
    yield ring
    sealing.use(None)


async def everything_read(store: Store) -> list[Any]:
    """Every message of Q as each read path returns it."""
    listed = await all_messages(
        store, Q, limit=20, echo=True, client_id=CLIENT, include_claimed=True, include_delayed=True
    )
    got = await store.get_messages(Q, [m.id for m in listed])
    cid, _ = await claim_ids(store, Q)
    claim = await store.get_claim(Q, cid)
    await store.release_claim(Q, cid)
    popped = await store.pop_messages(Q, limit=20)
    return [m.body for m in [*listed, *got, *claim.messages, *popped]]


async def test_an_encrypting_queues_bodies_read_back_clear_everywhere(store: Store, keys: Keyring) -> None:
    await set_meta(store, Q, _enable_encrypt_messages=True)
    await post(store, Q, BODY, "plain text", None)
    bodies = await everything_read(store)
    assert bodies.count(BODY) == 4  # listed, got, claimed, popped
    assert bodies.count("plain text") == 4
    assert bodies.count(None) == 4


async def test_the_raw_store_holds_no_clear_body_of_an_encrypting_queue(store: Store, keys: Keyring) -> None:
    if not isinstance(store, RedisStore | MongoStore):
        pytest.skip("reads one store's raw contents (a pooled store is these stores)")
    await set_meta(store, Q, _enable_encrypt_messages=True, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    await subscribe(store, Q, HOOK)
    await subscribe(store, DLQ, HOOK)
    [first, _] = await post(store, Q, BODY, {"again": SECRET})
    cid, _ = await claim_ids(store, Q, limit=1)
    await store.release_claim(Q, cid)
    await claim_ids(store, Q)  # `first` moves to the DLQ: its copy there and its notification stay sealed
    assert [m.id for m in await store.get_messages(DLQ, [first])] == [first]
    raw = await raw_contents(store)
    assert SECRET not in raw
    assert sealing.SEALED in raw  # the bodies are there, sealed
    # a clear queue beside it: the same scan finds its body (the check can fail)
    await post(store, QueueRef(Q.project, "clear"), {"open": SECRET})
    assert SECRET in await raw_contents(store)


async def test_a_dead_letter_and_its_redrive_stay_sealed_and_readable(store: Store, keys: Keyring) -> None:
    await set_meta(store, Q, _enable_encrypt_messages=True, _max_claim_count=1, _dead_letter_queue=DLQ.name)
    [mid] = await post(store, Q, BODY)
    cid, _ = await claim_ids(store, Q)
    await store.release_claim(Q, cid)
    await claim_ids(store, Q)  # dead-letters it
    [dead] = await store.get_messages(DLQ, [mid])
    assert dead.body == BODY
    assert dead.dead_letter is not None
    task_id = TaskId(uuid.uuid4().hex)
    await store.create_redrive(DLQ, task_id, RedriveSpec(), owner="r", lease_ms=10_000)
    task = await store.redrive_step(DLQ, task_id, owner="r", lease_ms=10_000, batch=10)
    assert task.moved == 1
    [back] = await store.get_messages(Q, [mid])
    assert back.body == BODY


async def test_notifications_of_an_encrypting_queue_carry_the_clear_body(store: Store, keys: Keyring) -> None:
    await set_meta(store, Q, _enable_encrypt_messages=True)
    await subscribe(store, Q, HOOK)
    await post(store, Q, BODY, [1, 2])
    bodies = [d.message.body for d in await drain(store) if d.message is not None]
    assert sorted(map(str, bodies)) == sorted(map(str, [BODY, [1, 2]]))


async def test_keys_rotate_and_a_missing_key_is_named(store: Store, keys: Keyring) -> None:
    await set_meta(store, Q, _enable_encrypt_messages=True)
    [old] = await post(store, Q, "sealed by k1")
    rotated = Keyring({**keys.keys, "k2": base64.b64decode(key())})
    sealing.use(rotated)
    [new] = await post(store, Q, "sealed by k2")
    assert [m.body for m in await store.get_messages(Q, [old, new])] == ["sealed by k1", "sealed by k2"]
    sealing.use(Keyring({"k2": rotated.keys["k2"]}))  # k1 removed while a message still uses it
    with pytest.raises(MessageUnreadable, match="'k1'"):
        await store.get_messages(Q, [old])
    assert [m.body for m in await store.get_messages(Q, [new])] == ["sealed by k2"]


async def test_turning_encryption_off_stores_later_posts_clear_and_keeps_earlier_ones_readable(
    store: Store, keys: Keyring
) -> None:
    await set_meta(store, Q, _enable_encrypt_messages=True)
    [sealed] = await post(store, Q, "before")
    await set_meta(store, Q, _enable_encrypt_messages=False)
    [clear] = await post(store, Q, "after")
    assert [m.body for m in await store.get_messages(Q, [sealed, clear])] == ["before", "after"]


async def raw_contents(store: Store) -> str:
    """Every value of the store's namespace, as one text (Redis: each key's; MongoDB: each document)."""
    out: list[str] = []
    if isinstance(store, RedisStore):
        client = store._client
        async for k in client.scan_iter(match=f"{store._namespace}*", count=1000):
            kind = await client.type(k)
            if kind == "hash":
                out += _texts(await client.hgetall(k))
            elif kind == "string":
                out += _texts(await client.get(k))
            elif kind == "zset":
                out += _texts(await client.zrange(k, 0, -1))
            elif kind in ("set", "list"):
                out += _texts(await (client.smembers(k) if kind == "set" else client.lrange(k, 0, -1)))
    else:
        assert isinstance(store, MongoStore)
        for f in dataclasses.fields(store._c):
            coll = getattr(store._c, f.name)
            if hasattr(coll, "find"):
                async for doc in coll.find({}):
                    out += _texts(doc)
    return "\n".join(out)


def _texts(value: Any) -> list[str]:
    """Every string in `value` (bytes decoded), nested containers walked, keys included."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k), *_texts(v))]
    if isinstance(value, list | tuple | set):
        return [t for v in value for t in _texts(v)]
    if isinstance(value, bytes):
        return [value.decode(errors="replace")]
    return [str(value)]


async def test_a_notification_whose_key_is_missing_waits_and_holds_up_no_other(
    store: Store, keys: Keyring, clock: ManualClock
) -> None:
    other = QueueRef(Q.project, "clear")
    await set_meta(store, Q, _enable_encrypt_messages=True)
    await subscribe(store, Q, HOOK)
    await subscribe(store, other, HOOK)
    await post(store, Q, BODY)
    await post(store, other, "clear body")
    sealing.use(None)  # the key is gone from this process
    assert [d.message.body for d in await drain(store) if d.message] == ["clear body"]
    clock.advance(LEASE_MS / 1000 + 1)  # put off for longer than a lease: not leased again meanwhile
    assert await drain(store) == []
    sealing.use(keys)  # back: the put-off notification comes when it is due again
    clock.advance(sealing.UNREADABLE_PUT_OFF_MS / 1000)
    assert [d.message.body for d in await drain(store) if d.message] == [BODY]
