"""Encryption at rest through the HTTP API (docs/encryption.md): `_enable_encrypt_messages: true` with the
service's key, every read answering the clear body (get, list, claim, a claim's messages, pop, the redrive
sample) while the store holds it sealed; bad keys in the settings refused by name; and the key's absence at
read time answered as the service's fault, naming the key."""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from app.settings import Settings, not_valid
from core import sealing
from tests.api.test_dead_letter_features import SPENT, claim
from tests.api.test_flows import JSON_PATCH, post_messages

KEYS = f"old:{base64.b64encode(os.urandom(32)).decode()},new:{base64.b64encode(os.urandom(32)).decode()}"
BODY = {"card": "4111-1111", "n": 1}
ENCRYPTED = {"_enable_encrypt_messages": True}


@pytest.fixture
def settings() -> Settings:
    return Settings(storage_uri="redis://unused", encryption={"keys": KEYS})


@pytest.mark.every_store
async def test_every_read_answers_the_clear_body_of_an_encrypting_queue(client: httpx.AsyncClient) -> None:
    assert (await client.put("/v2/queues/vault", json=ENCRYPTED)).status_code == 201
    assert (await client.get("/v2/queues/vault")).json()["_enable_encrypt_messages"] is True
    [mid, _] = await post_messages(client, "vault", BODY, "text")
    got = (await client.get(f"/v2/queues/vault/messages/{mid}")).json()
    listed = (await client.get("/v2/queues/vault/messages?echo=true")).json()["messages"]
    cid, claimed = await claim(client, "vault")
    held = (await client.get(f"/v2/queues/vault/claims/{cid}")).json()["messages"]
    assert (await client.delete(f"/v2/queues/vault/claims/{cid}")).status_code == 204
    popped = (await client.delete("/v2/queues/vault/messages?pop=2")).json()["messages"]
    for shown in ([got], listed, claimed, held, popped):
        assert sorted(map(str, (m["body"] for m in shown))) == sorted(map(str, [BODY, "text"][: len(shown)]))


@pytest.mark.every_store
async def test_the_redrive_sample_of_an_encrypting_dlq_is_clear(client: httpx.AsyncClient) -> None:
    assert (await client.put("/v2/queues/orders", json={**ENCRYPTED, **SPENT})).status_code == 201
    await post_messages(client, "orders", BODY)
    cid, _ = await claim(client, "orders")
    assert (await client.delete(f"/v2/queues/orders/claims/{cid}")).status_code == 204  # dead-lettered
    r = await client.post("/v2/queues/orders.dlq/redrive", json={"dry_run": True})
    assert r.status_code == 200, r.text
    assert [m["body"] for m in r.json()["sample"]] == [BODY]


async def test_encryption_turned_on_by_patch_and_off_again(client: httpx.AsyncClient) -> None:
    assert (await client.put("/v2/queues/p", json={})).status_code == 201
    patch = [{"op": "add", "path": "/metadata/_enable_encrypt_messages", "value": True}]
    r = await client.patch("/v2/queues/p", json=patch, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 200, r.text
    [sealed] = await post_messages(client, "p", "secret")
    patch = [{"op": "replace", "path": "/metadata/_enable_encrypt_messages", "value": False}]
    r = await client.patch("/v2/queues/p", json=patch, headers={"Content-Type": JSON_PATCH})
    assert r.status_code == 200, r.text
    [clear] = await post_messages(client, "p", "open")
    bodies = {
        m["id"]: m["body"] for m in (await client.get("/v2/queues/p/messages?echo=true")).json()["messages"]
    }
    assert bodies == {sealed: "secret", clear: "open"}


async def test_a_body_whose_key_is_gone_is_the_services_fault_naming_the_key(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.put("/v2/queues/vault", json=ENCRYPTED)).status_code == 201
    [mid, _] = await post_messages(client, "vault", BODY, BODY)  # sealed by `new`, the last key
    ring = sealing.keyring()
    assert ring is not None
    try:
        sealing.use(sealing.Keyring({"old": ring.keys["old"]}))  # `new` removed, as an operator might
        r = await client.get(f"/v2/queues/vault/messages/{mid}")
        assert r.status_code == 503
        problem: dict[str, Any] = r.json()
        assert problem["title"] == "Message unreadable"
        assert "'new'" in problem["description"]
        assert "4111" not in r.text
        # a 5xx never hides what was done
        r = await client.delete("/v2/queues/vault/messages?pop=1")
        assert r.status_code == 503
        assert "taken off the queue all the same" in r.json()["description"]
        r = await client.post("/v2/queues/vault/claims", json={"ttl": 60})
        assert r.status_code == 503
        assert "The claim was made all the same" in r.json()["description"]
    finally:
        sealing.use(ring)


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        ("k1", "entry 1 is not id:base64key"),
        ("k1:not base64!", "key 'k1' is not base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "is 5 bytes; AES-256 takes 32"),
        (f"k1:{base64.b64encode(bytes(32)).decode()},k1:{base64.b64encode(bytes(32)).decode()}", "twice"),
        (f"bad id:{base64.b64encode(bytes(32)).decode()}", "entry 1"),
    ],
)
def test_bad_keys_are_refused_by_name_without_showing_a_key(keys: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment) as refused:
        Settings(storage_uri="redis://unused", encryption={"keys": keys})
    shown = not_valid(refused.value)  # what `charon serve` and `charon config` print
    assert fragment in shown
    assert "AAAA" not in shown
    assert shown.startswith("CHARON_ENCRYPTION__KEYS")


def test_the_key_that_encrypts_is_chosen_and_must_be_listed() -> None:
    chosen = Settings(storage_uri="redis://unused", encryption={"keys": KEYS, "current": "old"})
    ring = chosen.encryption.keyring()
    assert ring is not None
    assert ring.current == "old"  # rotation's first step: the new key known, the old one still encrypting
    assert sealing.key_id(ring.seal(b"1")) == "old"
    default = Settings(storage_uri="redis://unused", encryption={"keys": KEYS}).encryption.keyring()
    assert default is not None
    assert default.current == "new"  # unset: the last one listed
    with pytest.raises(ValidationError) as refused:
        Settings(storage_uri="redis://unused", encryption={"keys": KEYS, "current": "missing"})
    assert "'missing', is not one of the keys listed" in not_valid(refused.value)
    with pytest.raises(ValidationError, match="lists none"):
        Settings(storage_uri="redis://unused", encryption={"current": "old"})
    assert repr(default) == "Keyring(current='new')"  # a keyring never shows its keys
