"""Identity and access through HTTP: Keystone tokens validated by the real Keystone (tests/keystone.py), the
default policy rule by rule, trusted-proxy mode, an operator's policy file."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from api.auth import AuthMode
from api.keystone import KeystoneSettings
from api.policy import ADMIN, RULES
from app.main import authenticator, create_app
from app.settings import Settings
from core.clock import ManualClock
from core.models import QueueRef
from storage.redis.store import RedisStore
from tests.keystone import KeystoneServer
from tests.servers import free_port

CLIENT = {"Client-ID": str(uuid.uuid4())}


def keystone_settings(keystone: KeystoneServer, **overrides: object) -> Settings:
    return Settings(
        storage_uri="redis://unused",
        auth=AuthMode.KEYSTONE,
        keystone=KeystoneSettings(**{**keystone.service_credentials(), **overrides}),
        admin_mode=True,
        signed_url_key="k",
    )


@pytest.fixture
async def redis_store(redis_url: str, clock: ManualClock) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock)
    yield store
    await store.aclose()


async def serve(settings: Settings, store: RedisStore, clock: ManualClock) -> httpx.AsyncClient:
    app = create_app(settings, store=store, clock=clock)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://charon", headers=CLIENT)


@pytest.fixture
async def api(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> AsyncIterator[httpx.AsyncClient]:
    async with await serve(keystone_settings(keystone), redis_store, clock) as c:
        yield c


def token(keystone: KeystoneServer, user: str, project: str = "alpha") -> dict[str, str]:
    return {"X-Auth-Token": keystone.token(user, project)}


# -- authentication ------------------------------------------------------------------------------------------


async def test_a_call_without_a_token_is_401_saying_where_to_get_one(
    api: httpx.AsyncClient, keystone: KeystoneServer
) -> None:
    for method, path in [("GET", "/v2/queues"), ("POST", "/v2/queues/q/messages"), ("GET", "/v2")]:
        r = await api.request(method, path, headers={"X-Project-ID": keystone.project_ids["alpha"]})
        assert r.status_code == 401, (method, path)
        assert r.headers["WWW-Authenticate"] == f'Keystone uri="{keystone.url}"'
        assert "X-Auth-Token" in r.json()["description"]
    # the version document and ping answer anyone
    assert (await api.get("/")).status_code in (200, 300)
    assert (await api.get("/v2/ping")).status_code == 204
    assert (await api.head("/v2/ping")).status_code == 204


@pytest.mark.parametrize(
    "bad",
    ["not-a-token", "gAAAAA" + "x" * 180, "x" * 9000, "caf\u00e9", " "],
    ids=["word", "fernet", "long", "latin", "blank"],
)
async def test_a_malformed_or_unknown_token_is_401(api: httpx.AsyncClient, bad: str) -> None:
    r = await api.get("/v2/queues", headers={"X-Auth-Token": bad.encode()})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Keystone uri=")
    assert set(r.json()) == {"title", "description"}


async def test_a_revoked_token_is_401(api: httpx.AsyncClient, keystone: KeystoneServer) -> None:
    revoked = keystone.token("alice")
    keystone.revoke(revoked)
    r = await api.get("/v2/queues", headers={"X-Auth-Token": revoked})
    assert r.status_code == 401


async def test_the_project_comes_from_the_token(api: httpx.AsyncClient, keystone: KeystoneServer) -> None:
    alice, bob = token(keystone, "alice"), token(keystone, "bob", "beta")
    r = await api.post("/v2/queues/orders/messages", json={"messages": [{"body": {"n": 1}}]}, headers=alice)
    assert r.status_code == 201, r.text
    # with X-Project-ID naming the token's project: the same queue
    same = {**alice, "X-Project-ID": keystone.project_ids["alpha"]}
    assert len((await api.get("/v2/queues/orders/messages?echo=true", headers=same)).json()["messages"]) == 1
    # bob, of another project, sees nothing of alpha's
    assert (await api.get("/v2/queues", headers=bob)).json()["queues"] == []
    r = await api.get("/v2/queues/orders/messages?echo=true", headers=bob)
    assert r.status_code == 200
    assert r.json()["messages"] == []
    # and cannot name alpha: 403, without saying anything about alpha
    r = await api.get("/v2/queues", headers={**bob, "X-Project-ID": keystone.project_ids["alpha"]})
    assert r.status_code == 403
    assert keystone.project_ids["alpha"] not in r.text
    assert "orders" not in r.text


async def test_roles_sent_as_a_header_are_ignored(api: httpx.AsyncClient, keystone: KeystoneServer) -> None:
    r = await api.get("/v2/pools", headers={**token(keystone, "alice"), "X-Roles": "admin"})
    assert r.status_code == 403
    assert r.json()["rule"] == "pools:get_all"


async def test_an_identity_header_sent_twice_is_400(api: httpx.AsyncClient, keystone: KeystoneServer) -> None:
    alice = keystone.token("alice")
    for name, values in [("X-Auth-Token", [alice, alice]), ("X-Project-ID", ["a", "a"])]:
        request = api.build_request("GET", "/v2/queues", headers={"X-Auth-Token": alice})
        request.headers = httpx.Headers(
            [(k, v) for k, v in request.headers.multi_items() if k.lower() != name.lower()]
            + [(name, v) for v in values]
        )
        r = await api.send(request)
        assert r.status_code == 400
        assert name in r.json()["description"]


async def test_a_validated_token_is_cached_until_cache_seconds(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> None:
    """As keystonemiddleware's token_cache_time: a token revoked after it was validated is honoured for
    cache_seconds (so a request does not cost a call to Keystone); with 0, not at all."""
    for seconds, after_revoking in [(300, 200), (0, 401)]:
        settings = keystone_settings(keystone, cache_seconds=seconds)
        async with await serve(settings, redis_store, clock) as api:
            alice = keystone.token("alice")
            assert (await api.get("/v2/queues", headers={"X-Auth-Token": alice})).status_code == 200
            keystone.revoke(alice)
            assert (
                await api.get("/v2/queues", headers={"X-Auth-Token": alice})
            ).status_code == after_revoking


async def test_an_unscoped_token_is_refused_without_asking_keystone_again(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> None:
    """A token scoped to no project is refused (403) and the refusal kept like any other: revoked at
    Keystone after the first request, the second is still told why it was refused, not asked about."""
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {
                    "user": {"name": "alice", "domain": {"id": "default"}, "password": keystone.password}
                },
            }
        }
    }
    async with httpx.AsyncClient() as client:
        made = await client.post(f"{keystone.url}/auth/tokens", json=body, timeout=30)
    assert made.status_code == 201, made.text
    unscoped = {"X-Auth-Token": made.headers["X-Subject-Token"], **CLIENT}
    async with await serve(keystone_settings(keystone), redis_store, clock) as api:
        first = await api.get("/v2/queues", headers=unscoped)
        assert first.status_code == 403, first.text
        assert "not scoped to a project" in first.json()["description"]
        keystone.revoke(unscoped["X-Auth-Token"])
        again = await api.get("/v2/queues", headers=unscoped)
        assert again.status_code == 403, again.text
        assert again.json()["description"] == first.json()["description"]


async def test_keystone_unreachable_is_503_never_allowed(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> None:
    alice = token(keystone, "alice")
    down = keystone_settings(keystone, auth_url=f"http://127.0.0.1:{free_port()}/v3", timeout=2)
    async with await serve(down, redis_store, clock) as api:
        r = await api.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers=alice)
        assert r.status_code == 503
        assert "Keystone" in r.json()["description"]
        assert "Nothing was done" in r.json()["description"]
    wrong = keystone_settings(keystone, password="not-the-password")
    async with await serve(wrong, redis_store, clock) as api:
        r = await api.get("/v2/queues", headers=alice)
        assert r.status_code == 503
        assert "service's own credentials" in r.json()["description"]
        assert r.headers["Retry-After"] == "5"
        # not a login attempt a request (a Keystone with lockout would lock the service user)
        r = await api.get("/v2/queues", headers=token(keystone, "bob", "beta"))
        assert r.status_code == 503
        assert "refused the service's own credentials a moment ago" in r.json()["description"]
    stats = await redis_store.stats(QueueRef(keystone.project_ids["alpha"], "q"))
    assert stats.total == 0  # nothing was posted


# -- the default policy, rule by rule ------------------------------------------------------------------------

ID = "0" * 32
PATHS = {"{queue_name}": "q1", "{message_id}": ID, "{claim_id}": ID, "{task_id}": ID}
PATHS |= {"{pool_name}": "p1", "{flavor_name}": "f1", "{topic_name}": "t1"}


def concrete(path: str) -> str:
    for name, value in PATHS.items():
        path = path.replace(name, value)
    return path


async def test_every_rule_of_the_default_policy(api: httpx.AsyncClient, keystone: KeystoneServer) -> None:
    """Zaqar's defaults: the admin role for pools and for changing flavors, any project member otherwise
    (member; reader: a role that is neither; admin). A refusal is 403 naming the rule; an allowed call may
    still fail for its own reasons (a queue that does not exist, pooling off), never 401/403."""
    tokens = {user: token(keystone, user) for user in ("alice", "carol", "admin")}
    wrong = []
    for rule, check, method, path, _ in RULES:
        if rule == "health:get_detailed":
            continue  # a part of GET /v2/health's answer: test_detailed_health_is_for_admins
        # a project's quotas: its own under quotas:get, another's (the admin's check) under quotas:get_any
        own = "beta" if rule == "quotas:get_any" else "alpha"
        url = concrete(path.replace("{project}", keystone.project_ids[own]))
        url += "?ids=" + ID if method == "DELETE" and path.endswith("/messages") else ""
        body = {"PUT": {}, "POST": {"messages": [{"body": 1}]} if path.endswith("/messages") else {}}
        for user, headers in tokens.items():
            r = await api.request(
                method, url, json=body.get(method, [] if method == "PATCH" else None), headers=headers
            )
            refused = check == ADMIN and user != "admin"
            if refused and (r.status_code != 403 or r.json().get("rule") != rule or rule not in r.text):
                wrong.append((rule, user, r.status_code, r.text[:200]))
            if not refused and r.status_code in (401, 403):
                wrong.append((rule, user, r.status_code, r.text[:200]))
    assert wrong == []


async def test_detailed_health_is_for_admins(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> None:
    """Anyone authenticated learns whether the storage answers; the pool catalogue is the admin's
    (health:get_detailed; here with a pooled store's answer shape checked by tests/api/test_pools.py)."""
    async with await serve(keystone_settings(keystone), redis_store, clock) as api:
        for user in ("alice", "admin"):
            r = await api.get("/v2/health", headers=token(keystone, user))
            assert r.status_code == 200
            assert r.json()["storage_reachable"] is True


# -- an operator's policy file -------------------------------------------------------------------------------


async def test_a_policy_file_overrides_a_default(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"messages:create": "role:member", "queues:purge": "!"}))
    settings = keystone_settings(keystone).model_copy(update={"policy_file": policy})
    async with await serve(settings, redis_store, clock) as api:
        r = await api.post(
            "/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers=token(keystone, "carol")
        )
        assert r.status_code == 403
        assert r.json()["rule"] == "messages:create"
        assert "role:member" in r.json()["description"]
        r = await api.post(
            "/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers=token(keystone, "alice")
        )
        assert r.status_code == 201
        r = await api.post("/v2/queues/q/purge", json={}, headers=token(keystone, "admin"))
        assert r.status_code == 403
        assert r.json()["rule"] == "queues:purge"


def test_a_missing_policy_file_stops_the_service_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        Settings(policy_file=tmp_path / "nope.yaml")


# -- trusted-proxy -------------------------------------------------------------------------------------------


async def test_trusted_proxy_takes_the_gateways_headers_only_when_it_confirmed(
    redis_store: RedisStore, clock: ManualClock
) -> None:
    settings = Settings(storage_uri="redis://unused", auth=AuthMode.TRUSTED_PROXY, admin_mode=True)
    async with await serve(settings, redis_store, clock) as api:
        project = {"X-Project-ID": "p1", "X-Roles": "member"}
        r = await api.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers=project)
        assert r.status_code == 401
        assert "X-Identity-Status" in r.json()["description"]
        r = await api.get("/v2/queues", headers={**project, "X-Identity-Status": "Invalid"})
        assert r.status_code == 401
        confirmed = {**project, "X-Identity-Status": "Confirmed"}
        assert (
            await api.post("/v2/queues/q/messages", json={"messages": [{"body": 1}]}, headers=confirmed)
        ).status_code == 201
        assert (await api.get("/v2/pools", headers=confirmed)).status_code == 403
        r = await api.get("/v2/pools", headers={**confirmed, "X-Roles": "admin"})
        assert r.status_code == 409  # allowed; pooling is off here
        request = api.build_request("GET", "/v2/queues", headers=confirmed)
        request.headers = httpx.Headers([*request.headers.multi_items(), ("X-Identity-Status", "Confirmed")])
        assert (await api.send(request)).status_code == 400


async def test_a_stalled_keystone_does_not_queue_requests_for_ever(
    keystone: KeystoneServer, redis_store: RedisStore, clock: ManualClock
) -> None:
    """Keystone accepts connections and never answers: each validation gives up after the timeout, and a
    request that finds every validation slot busy for that long is answered 503 too (not queued)."""
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(16)  # connections are accepted by the kernel, never answered
    url = f"http://127.0.0.1:{stalled.getsockname()[1]}/v3"
    try:
        settings = keystone_settings(keystone, auth_url=url, timeout=1, max_concurrent=1)
        async with await serve(settings, redis_store, clock) as api:
            calls = [api.get("/v2/queues", headers={"X-Auth-Token": f"gAAAA{n}"}) for n in range(4)]
            answers = await asyncio.gather(*calls)
    finally:
        stalled.close()
    assert [r.status_code for r in answers] == [503] * 4
    busy = [r for r in answers if "validations in flight stayed busy for 1 s" in r.json()["description"]]
    assert len(busy) >= 2


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('"queues:purge": "role:admin or or"', "do not parse: queues:purge"),
        ('"queues:purge": "rule:nonexistent"', "refers to rules it does not define"),
        ("- a list", "could not be read"),
        ('"a": [', "could not be read"),
    ],
    ids=["unparsable", "undefined", "list", "yaml"],
)
def test_a_broken_policy_file_stops_the_service_at_start(tmp_path: Path, text: str, why: str) -> None:
    """oslo.policy would read a rule it cannot parse as "deny everyone" and go on."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    with pytest.raises(ValueError, match=why):
        authenticator(Settings(policy_file=policy), ManualClock())


def test_keystone_mode_without_the_service_password_does_not_start() -> None:
    with pytest.raises(ValueError, match="CHARON_KEYSTONE__PASSWORD"):
        authenticator(Settings(auth=AuthMode.KEYSTONE), ManualClock())


async def test_a_refused_service_password_is_not_tried_again_for_each_trust_token(
    keystone: KeystoneServer,
) -> None:
    """Each token of a trust+ subscriber's trust is a login with the service user's password: once Keystone
    refuses it (changed, say), retried deliveries must not each try it again (a Keystone with lockout would
    lock the service user out, and every request would then be a 503)."""
    from api.keystone import Trustee
    from core.errors import IdentityUnavailable

    wrong = KeystoneSettings(**{**keystone.service_credentials(), "password": "not-the-password"})
    trustee = Trustee(wrong)
    with pytest.raises(IdentityUnavailable, match=r"refused the service's own credentials \("):
        await trustee.token("0" * 32)
    with pytest.raises(IdentityUnavailable, match="a moment ago"):  # not asked
        await trustee.token("1" * 32)
