"""The real Keystone fixture (tests/keystone.py): tokens issue, the service user validates them, revoked ones
are gone."""

from __future__ import annotations

import httpx
import pytest

from tests.keystone import KeystoneServer, etc_keystone_state

pytestmark = pytest.mark.slow


def validate(keystone: KeystoneServer, service_token: str, token: str) -> httpx.Response:
    headers = {"X-Auth-Token": service_token, "X-Subject-Token": token}
    return httpx.get(f"{keystone.url}/auth/tokens", headers=headers, timeout=30)


def test_service_user_validates_and_revoked_tokens_are_gone(keystone: KeystoneServer) -> None:
    before = etc_keystone_state()
    creds = keystone.service_credentials()
    assert creds["auth_url"] == keystone.url
    assert creds["username"] == "charon"
    service = keystone.token("charon", project=creds["project_name"])
    alice, bob = keystone.token("alice"), keystone.token("bob", project="beta")

    answer = validate(keystone, service, alice)
    assert answer.status_code == 200, answer.text
    token = answer.json()["token"]
    assert token["project"]["id"] == keystone.project_ids["alpha"]
    assert token["user"]["name"] == "alice"
    assert {r["name"] for r in token["roles"]} == {"member", "reader"}  # reader: implied by member

    answer = validate(keystone, service, bob)
    assert answer.json()["token"]["project"]["id"] == keystone.project_ids["beta"]

    carol = validate(keystone, service, keystone.token("carol")).json()["token"]
    assert {r["name"] for r in carol["roles"]} == {"reader"}

    keystone.revoke(alice)
    assert validate(keystone, service, alice).status_code == 404
    assert validate(keystone, service, bob).status_code == 200
    assert etc_keystone_state() == before
