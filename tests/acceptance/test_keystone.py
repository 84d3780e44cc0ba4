"""CHARON_AUTH=keystone end to end: a live `charon serve` process (pooling on, admin mode, pre-signed URLs)
validating tokens with the real Keystone (tests/keystone.py), driven by the unchanged python-zaqarclient
(keystone and signed-url auth backends) and the `openstack messaging` CLI (python-openstackclient with
python-zaqarclient's plugin), which finds the service in Keystone's catalog; and trust+ subscribers,
notified by the service's notifier process with tokens of the Keystone trusts their creators made."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openstack as openstacksdk
import pytest
from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import session as ks_session
from keystoneauth1.identity import v3
from zaqarclient.queues.v2 import core
from zaqarclient.queues.v2.client import Client
from zaqarclient.transport import errors as zerrors

from tests.conftest import CLIENT_ID
from tests.keystone import DOMAIN_NAME, KeystoneServer
from tests.receivers import HttpReceiver, notification_env
from tests.servers import CharonProcess

OPENSTACK = Path(sys.executable).with_name("openstack")
SIGNING_KEY = "acceptance-signing-key"
BASE_POOL = "ks-general"


def with_db(redis_url: str, db: int) -> str:
    """The same redis-server, another database: a second pool URI."""
    return redis_url.rsplit("/", 1)[0] + f"/{db}"


class Service:
    def __init__(self, proc: CharonProcess, keystone: KeystoneServer, redis_url: str) -> None:
        self.proc = proc
        self.keystone = keystone
        self.redis_url = redis_url

    @property
    def url(self) -> str:
        return self.proc.url


@pytest.fixture(scope="module")
def service(keystone: KeystoneServer, redis_url: str) -> Iterator[Service]:
    creds = keystone.service_credentials()
    env = {f"CHARON_KEYSTONE__{key.upper()}": value for key, value in creds.items()}
    env |= {
        "CHARON_AUTH": "keystone",
        # the test Keystone (one gunicorn, SQLite) can take seconds when the CLI's processes log in at once
        "CHARON_KEYSTONE__TIMEOUT": "30",
        "CHARON_SIGNED_URL_KEY": SIGNING_KEY,
        "CHARON_ADMIN_MODE": "true",
        "CHARON_POOLING": "true",
        "CHARON_MANAGEMENT_URI": redis_url,
        **notification_env(),  # webhooks on loopback: the trust+ subscribers' receiver
    }
    namespace = f"ks{uuid.uuid4().hex[:10]}"
    proc = CharonProcess(None, namespace=namespace, env=env).start()
    try:
        # With pooling, a queue needs a pool (without a flavor) to live in: the admin registers one.
        r = httpx.put(
            f"{proc.url}/v2/pools/{BASE_POOL}",
            json={"uri": redis_url, "weight": 100},
            headers={"X-Auth-Token": keystone.token("admin", "alpha"), "Client-ID": CLIENT_ID},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        yield Service(proc, keystone, redis_url)
    finally:
        proc.stop()


def keystone_client(
    service: Service,
    user: str,
    project: str,
    *,
    send_project_id: bool = False,
    password: str | None = None,
    per_request: bool = False,
) -> Any:
    """python-zaqarclient with its keystone auth backend. Given only the options, it asks Keystone for a new
    token on every call (and Charon validates each one: two Keystone calls a request); so, as a long-lived
    user of the client would, the tests give it a keystoneauth1 session made of the same options, whose
    token it reuses, unless `per_request`."""
    ks = service.keystone
    options = {
        "os_auth_url": ks.url,
        "os_username": user,
        "os_password": ks.password if password is None else password,
        "os_project_name": project,
        "os_user_domain_name": DOMAIN_NAME,
        "os_project_domain_name": DOMAIN_NAME,
    }
    if send_project_id:
        options["os_project_id"] = ks.project_ids[project]
    conf = {"auth_opts": {"backend": "keystone", "options": options}}
    session = None
    if not per_request:
        auth = v3.Password(
            auth_url=ks.url,
            username=user,
            password=options["os_password"],
            project_name=project,
            user_domain_name=DOMAIN_NAME,
            project_domain_name=DOMAIN_NAME,
        )
        session = ks_session.Session(auth=auth)
    return Client(service.url, version=2, conf=conf, session=session)


def names(client: Any) -> set[str]:
    return {q.name for q in client.queues()[0].stream()}


# -- 1. queues, messages and claims through the keystone backend ---------------------------------------------


@pytest.mark.parametrize("send_project_id", [True, False], ids=["with-project-id", "token-only"])
def test_queues_messages_and_claims_through_zaqarclient(service: Service, send_project_id: bool) -> None:
    alice = keystone_client(service, "alice", "alpha", send_project_id=send_project_id)
    bob = keystone_client(service, "bob", "beta", send_project_id=send_project_id)
    name = f"ks-work-{'pid' if send_project_id else 'tok'}"

    q = alice.queue(name, force_create=True)
    assert q.exists()
    q.metadata(new_meta={"team": "red", "_max_claim_count": 5})
    meta = q.metadata(force_reload=True)
    assert (meta["team"], meta["_max_claim_count"]) == ("red", 5)
    assert name in names(alice)
    assert name not in names(bob)  # bob's project is beta: alice's queue is not his

    q.post([{"body": {"n": i}, "ttl": 300} for i in range(4)])
    listed = list(q.messages(echo=True))
    assert [m.body for m in listed] == [{"n": i} for i in range(4)]
    assert q.message(listed[0].id).body == {"n": 0}
    q.message(listed[0].id).delete()
    with pytest.raises(zerrors.ResourceNotFound):
        q.message(listed[0].id)
    # bob's queue of the same name is another queue: empty, and alice's message ids are not found in it
    assert list(bob.queue(name, auto_create=False).messages(echo=True)) == []
    with pytest.raises(zerrors.ResourceNotFound):
        bob.queue(name, auto_create=False).message(listed[1].id)

    claim = q.claim(ttl=120, grace=60, limit=2)
    claimed = list(claim)
    assert [m.body for m in claimed] == [{"n": 1}, {"n": 2}]
    claim.update(ttl=180)
    assert alice.queue(name, auto_create=False).claim(id=claim.id).ttl == 180
    claimed[0].delete()  # with its claim id
    claim.delete()  # releases {"n": 2}
    again = list(q.claim(ttl=60, grace=60, limit=5))
    assert sorted(m.body["n"] for m in again) == [2, 3]
    assert q.stats["messages"]["claimed"] == 2

    q.delete()
    assert name not in names(alice)
    assert list(bob.queue(name, auto_create=False).messages(echo=True)) == []


def test_x_project_id_naming_another_project_is_refused(service: Service) -> None:
    """The client sends os_project_id as X-Project-Id, and keystoneauth scopes the token by it too: a header
    naming another project than the token's is sent by hand on the client's own request."""
    alice = keystone_client(service, "alice", "alpha")
    req, trans = alice._request_and_transport()
    req.headers["X-Project-Id"] = service.keystone.project_ids["beta"]
    with pytest.raises(zerrors.ForbiddenError, match="another project than the token's"):
        core.queue_list(trans, req)


def test_options_alone_a_token_per_call(service: Service) -> None:
    """The client as configured by its options only (no session): each call gets its own token."""
    for send_project_id in (True, False):
        alice = keystone_client(service, "alice", "alpha", send_project_id=send_project_id, per_request=True)
        q = alice.queue("ks-per-call", force_create=True)
        q.post({"body": send_project_id, "ttl": 300})
        [claimed] = list(q.claim(ttl=60, grace=60, limit=5))
        assert claimed.body is send_project_id
        claimed.delete()
        assert "ks-per-call" in names(alice)
        q.delete()


# -- 2. the admin API through the client ---------------------------------------------------------------------


def test_admin_registers_a_pool_and_a_flavor_alice_may_not(service: Service) -> None:
    admin = keystone_client(service, "admin", "alpha")
    pool_name, flavor_name = "ks-gold-pool", "ks-gold"
    admin.pool(pool_name, uri=with_db(service.redis_url, 1), weight=10)
    admin.flavor(flavor_name, pool_list=[pool_name])
    pools = {p.name: p for p in admin.pools(detailed=True)}
    assert {BASE_POOL, pool_name} <= set(pools)
    assert pools[pool_name].weight == 10
    assert pools[pool_name].flavor == flavor_name
    flavors = {f.name: f for f in admin.flavors(detailed=True)}
    assert flavors[flavor_name].pool_list == [pool_name]
    assert admin.pool(pool_name, auto_create=False).get()["uri"] == with_db(service.redis_url, 1)

    alice = keystone_client(service, "alice", "alpha")
    for attempt, rule in [
        (lambda: alice.pool("ks-alices-pool", uri=with_db(service.redis_url, 2), weight=1), "pools:create"),
        (lambda: list(alice.pools()), "pools:get_all"),
        (lambda: alice.pool(pool_name, auto_create=False).get(), "pools:get"),
        (lambda: alice.pool(pool_name, auto_create=False).delete(), "pools:delete"),
        (lambda: alice.flavor("ks-alices-flavor", pool_list=[pool_name]), "flavors:create"),
        (lambda: alice.flavor(flavor_name, auto_create=False).delete(), "flavors:delete"),
    ]:
        with pytest.raises(zerrors.ForbiddenError) as caught:
            attempt()
        assert caught.value.code == 403
        assert repr(rule) in str(caught.value), str(caught.value)
    assert {BASE_POOL, pool_name} <= {p.name for p in admin.pools()}
    assert flavor_name in {f.name for f in admin.flavors()}
    # flavors:get_all and flavors:get are Zaqar's unprotected rules: any caller lists and reads flavors
    assert flavor_name in {f.name for f in alice.flavors()}
    assert alice.flavor(flavor_name, auto_create=False).get()["name"] == flavor_name


# -- 3. no credentials, wrong credentials --------------------------------------------------------------------


def test_wrong_password_and_missing_token(service: Service) -> None:
    wrong = keystone_client(service, "alice", "alpha", password="not-the-password", per_request=True)
    with pytest.raises(ks_exceptions.Unauthorized):  # Keystone itself refuses to issue a token
        list(wrong.queues()[0])

    anonymous = Client(service.url, version=2, conf={"auth_opts": {"backend": "noauth", "options": {}}})
    with pytest.raises(zerrors.UnauthorizedError, match="X-Auth-Token"):
        anonymous.queues()

    for method, path in [("GET", "/v2/queues"), ("PUT", "/v2/queues/q"), ("GET", "/v2/pools")]:
        r = httpx.request(method, service.url + path, headers={"Client-ID": CLIENT_ID}, timeout=30)
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["WWW-Authenticate"] == f'Keystone uri="{service.keystone.url}"'
    r = httpx.get(
        service.url + "/v2/queues",
        headers={"Client-ID": CLIENT_ID, "X-Auth-Token": "gAAAAA-not-a-token"},
        timeout=30,
    )
    assert r.status_code == 401, r.text
    assert r.headers["WWW-Authenticate"] == f'Keystone uri="{service.keystone.url}"'


# -- 4. pre-signed URLs --------------------------------------------------------------------------------------


def share(service: Service, queue: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(
        f"{service.url}/v2/queues/{queue}/share",
        json=body,
        headers={"X-Auth-Token": service.keystone.token("alice", "alpha"), "Client-ID": CLIENT_ID},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    grant: dict[str, Any] = r.json()
    return grant


def signed_client(service: Service, grant: dict[str, Any]) -> Any:
    options = {
        "signature": grant["signature"],
        "expires": grant["expires"],
        "methods": grant["methods"],
        "paths": grant["paths"],
        "os_project_id": grant["project"],
    }
    return Client(service.url, version=2, conf={"auth_opts": {"backend": "signed-url", "options": options}})


def test_pre_signed_url_through_the_signed_url_backend(service: Service) -> None:
    alice = keystone_client(service, "alice", "alpha")
    alice.queue("ks-shared", force_create=True)
    alice.queue("ks-unshared", force_create=True)
    grant = share(service, "ks-shared", {"paths": ["messages"], "methods": ["GET", "POST"]})
    assert grant["project"] == service.keystone.project_ids["alpha"]
    assert grant["paths"] == ["/v2/queues/ks-shared/messages"]
    assert grant["methods"] == ["GET", "POST"]

    signed = signed_client(service, grant)
    shared = signed.queue("ks-shared", auto_create=False)
    shared.post([{"body": {"via": "signed"}}, {"body": 2}])
    listed = list(shared.messages(echo=True))
    assert [m.body for m in listed] == [{"via": "signed"}, 2]
    assert shared.message(listed[0].id).body == {"via": "signed"}  # a resource under a signed path
    # alice (with her token) sees what the signed client posted
    assert [m.body for m in alice.queue("ks-shared", auto_create=False).messages(echo=True)] == [
        {"via": "signed"},
        2,
    ]

    refused = [
        (lambda: signed.queue("ks-unshared", auto_create=False).post({"body": 1}), "not POST"),
        (lambda: list(signed.queue("ks-unshared", auto_create=False).messages(echo=True)), "not GET"),
        (lambda: shared.delete_messages(listed[0].id), "not DELETE"),
        (lambda: shared.message(listed[0].id).delete(), "not DELETE"),
        (lambda: shared.claim(ttl=60, grace=60), "not POST"),  # .../claims is not signed
        (lambda: signed.queue("ks-new", force_create=True), "not PUT"),
        (lambda: signed.queues(), "not GET"),
    ]
    for attempt, said in refused:
        with pytest.raises(zerrors.ForbiddenError, match=said):
            attempt()
    assert list(alice.queue("ks-unshared", auto_create=False).messages(echo=True)) == []
    assert "ks-new" not in names(alice)

    # the same grant with another project, or tampered with, no longer verifies
    for forged in (
        {**grant, "project": service.keystone.project_ids["beta"]},
        {**grant, "methods": ["DELETE", "GET", "POST"]},
        {**grant, "paths": ["/v2/queues/ks-unshared/messages"]},
    ):
        with pytest.raises(zerrors.ForbiddenError, match="URL-Signature does not match"):
            list(signed_client(service, forged).queue("ks-shared", auto_create=False).messages(echo=True))

    # the client's own share call (queue.signed_url) makes a grant the signed-url backend takes as it is
    made = alice.queue("ks-shared", auto_create=False).signed_url(
        paths=["messages", "claims"], methods=["GET", "POST", "DELETE", "PATCH"], ttl_seconds=600
    )
    consumer = signed_client(service, made).queue("ks-shared", auto_create=False)
    claimed = list(consumer.claim(ttl=60, grace=60, limit=5))
    assert sorted(str(m.body) for m in claimed) == sorted(str(m.body) for m in listed)
    for message in claimed:
        message.delete()  # DELETE .../messages/{id}?claim_id=...: signed now
    assert list(consumer.messages(echo=True, include_claimed=True)) == []


# -- 5. the openstack CLI ------------------------------------------------------------------------------------


def openstack(keystone: KeystoneServer, user: str, project: str, *args: str) -> subprocess.Popen[str]:
    """`openstack messaging <args>` as `user` on `project`, started (the caller waits: `done`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env |= {
        "OS_AUTH_URL": keystone.url,
        "OS_USERNAME": user,
        "OS_PASSWORD": keystone.password,
        "OS_PROJECT_NAME": project,
        "OS_USER_DOMAIN_NAME": DOMAIN_NAME,
        "OS_PROJECT_DOMAIN_NAME": DOMAIN_NAME,
        "OS_IDENTITY_API_VERSION": "3",
    }
    proc = subprocess.Popen(
        [str(OPENSTACK), "messaging", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(proc)
    return proc


STARTED: list[subprocess.Popen[str]] = []  # every `openstack` started, reaped after its test (reap_cli)


@pytest.fixture(autouse=True)
def reap_cli() -> Iterator[None]:
    """Every `openstack` a test started is ended and its pipes closed, even when the test failed before it
    waited for them (their pipes would otherwise be reported unclosed in whatever test runs next)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None and not proc.stdout.closed:
            proc.communicate(timeout=30)
        proc.wait(timeout=30)


def done(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def ok(proc: subprocess.Popen[str]) -> Any:
    code, out, err = done(proc)
    assert code == 0, f"{proc.args!r} exited {code}:\n{out}\n{err}"
    return json.loads(out) if out.strip().startswith(("[", "{")) else out


@pytest.mark.filterwarnings("ignore::openstack.warnings._RemovedInSDKWarning")  # its own, not ours
def test_openstacksdk_pages_messages_and_claims_as_it_sends_them(service: Service) -> None:
    """openstacksdk, unchanged: it finds the endpoint in the catalog, pages a listing with the last message's
    id as the marker, and sends a claim's `limit` in its body (issue 43)."""
    ks = service.keystone
    ks.register_messaging(service.url)
    conn = openstacksdk.connect(
        auth_url=ks.url,
        username="alice",
        password=ks.password,
        project_name="alpha",
        user_domain_name=DOMAIN_NAME,
        project_domain_name=DOMAIN_NAME,
        region_name="RegionOne",
    )
    queue = f"sdk-{uuid.uuid4().hex[:8]}"
    conn.message.create_queue(name=queue)
    conn.message.post_message(queue, [{"body": n, "ttl": 300} for n in range(25)])
    assert [m.body for m in conn.message.messages(queue, limit=10)] == list(range(25))  # 3 pages
    # openstacksdk 4.22 then fails on its own: it reads the claim's id from a `location` attribute that the
    # Claim resource never maps (so it does against Zaqar too); what it sent was taken, limit and all
    with contextlib.suppress(AttributeError):
        conn.message.create_claim(queue, ttl=60, grace=60, limit=3)
    headers = {"X-Auth-Token": ks.token("alice", "alpha"), "Client-ID": CLIENT_ID}
    stats = httpx.get(f"{service.url}/v2/queues/{queue}/stats", headers=headers, timeout=30).json()
    assert stats["messages"]["claimed"] == 3
    conn.message.delete_queue(queue)


@pytest.mark.slow  # about 25 s: twelve `openstack` processes, seconds each
def test_openstack_messaging_cli(service: Service) -> None:
    """The CLI finds Charon in Keystone's catalog (service type messaging, public, RegionOne) and talks API
    v2 (the plugin's default, OS_QUEUES_API_VERSION). The admin's calls and alice's refused one run while
    alice's own go one after another: each `openstack` takes seconds to start."""
    ks = service.keystone
    ks.register_messaging(service.url)
    admin_pools = openstack(ks, "admin", "alpha", "pool", "list", "-f", "json")
    admin_flavors = openstack(ks, "admin", "alpha", "flavor", "list", "-f", "json")
    refused = openstack(ks, "alice", "alpha", "pool", "list", "-f", "json")

    def alice(*args: str) -> Any:
        return ok(openstack(ks, "alice", "alpha", *args))

    assert alice("queue", "create", "q1", "-f", "json") == {"Name": "q1"}
    signing = openstack(
        ks, "alice", "alpha", "queue", "signed", "url", "q1", "--methods", "GET,POST", "-f", "json"
    )
    assert "q1" in [row["Name"] for row in alice("queue", "list", "-f", "json")]
    alice("message", "post", "q1", '[{"body": {"a": 1}, "ttl": 300}]', "--client-id", CLIENT_ID)
    listed = alice("message", "list", "q1", "--echo", "--client-id", CLIENT_ID, "-f", "json")
    assert [(row["Body"], row["TTL"]) for row in listed] == [({"a": 1}, 300)]
    claimed = alice("claim", "create", "q1", "--ttl", "120", "--grace", "60", "-f", "json")
    assert [(row["Messages"], row["Message_ID"]) for row in claimed] == [({"a": 1}, listed[0]["ID"])]
    assert claimed[0]["Claim_ID"]
    made = alice("subscription", "create", "q1", "https://hooks.example.com/cli", "600", "-f", "json")
    assert (made["Subscriber"], made["TTL"]) == ("https://hooks.example.com/cli", 600)
    subs = alice("subscription", "list", "q1", "-f", "json")
    assert [(row["ID"], row["Confirmed"]) for row in subs] == [(made["ID"], True)]
    alice("subscription", "update", "q1", made["ID"], "--ttl", "7200")  # sends the other fields as null
    shown = alice("subscription", "show", "q1", made["ID"], "-f", "json")
    assert (shown["Subscriber"], shown["TTL"]) == ("https://hooks.example.com/cli", 7200)
    alice("subscription", "delete", "q1", made["ID"])

    assert BASE_POOL in [row["Name"] for row in ok(admin_pools)]
    assert isinstance(ok(admin_flavors), list)
    signed = ok(signing)
    assert (signed["Paths"], signed["Methods"]) == ("/v2/queues/q1/messages", "GET,POST")
    assert signed["Project ID"] == ks.project_ids["alpha"]
    grant = {
        "signature": signed["Signature"],
        "expires": signed["Expires"],
        "methods": signed["Methods"].split(","),
        "paths": signed["Paths"].split(","),
        "project": signed["Project ID"],
    }
    queue = signed_client(service, grant).queue("q1", auto_create=False)
    assert [m.body for m in queue.messages(echo=True, include_claimed=True)] == [{"a": 1}]
    code, _out, err = done(refused)
    assert code != 0
    assert "403" in err, err
    assert "pools:get_all" in err, err
    # what the CLI did, alice's client sees (and bob's does not)
    assert "q1" in names(keystone_client(service, "alice", "alpha"))
    assert "q1" not in names(keystone_client(service, "bob", "beta"))


# -- trust+ subscribers: notified with a token of the creator's Keystone trust ---------------------------


def trusts_of(service: Service, user: str) -> list[dict[str, Any]]:
    """The Keystone trusts `user` (of project alpha) has made, as Keystone lists them to the user."""
    ks = service.keystone
    r = httpx.get(
        f"{ks.url}/OS-TRUST/trusts",
        params={"trustor_user_id": ks.user_ids[user]},
        headers={"X-Auth-Token": ks.token(user, "alpha")},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return list(r.json()["trusts"])


def test_a_trust_subscriber_is_notified_with_a_token_acting_as_its_creator(
    service: Service, webhook_receiver: HttpReceiver
) -> None:
    """Zaqar's trust notifier: alice subscribes `trust+http://...`; Charon makes a trust from alice to its
    service user, and the webhook gets X-Auth-Token, a token of that trust, with which it reads alice's
    queue as alice. A repeated subscription, a new ttl and bad input leave no trust behind."""
    ks = service.keystone
    token = ks.token("alice", "alpha")
    headers = {"X-Auth-Token": token, "Client-ID": CLIENT_ID}
    subs = f"{service.url}/v2/queues/trusted/subscriptions"
    before = {t["id"] for t in trusts_of(service, "alice")}
    receiver = webhook_receiver
    body = {
        "subscriber": "trust+" + receiver.url_for("/hook"),
        "ttl": 600,
        "options": {"post_headers": {"X-Test": "kept"}},
    }
    made = httpx.post(subs, json=body, headers=headers, timeout=30)
    assert made.status_code == 201, made.text
    sid = made.json()["subscription_id"]
    shown = httpx.get(f"{subs}/{sid}", headers=headers, timeout=30).json()
    trust = shown["options"]["trust_id"]
    assert shown["options"]["post_headers"] == {"X-Test": "kept"}
    mine = [t for t in trusts_of(service, "alice") if t["id"] not in before]
    assert [(t["id"], t["trustee_user_id"], t["project_id"], t["impersonation"]) for t in mine] == [
        (trust, ks.user_ids["charon"], ks.project_ids["alpha"], True)
    ]

    again = httpx.post(subs, json=body, headers=headers, timeout=30)  # the same subscriber: same id
    assert (again.status_code, again.json()["subscription_id"]) == (201, sid)
    assert [t["id"] for t in trusts_of(service, "alice") if t["id"] not in before] == [trust]

    posted = httpx.post(
        f"{service.url}/v2/queues/trusted/messages",
        json={"messages": [{"body": {"order": 7}, "ttl": 300}]},
        headers=headers,
        timeout=30,
    )
    assert posted.status_code == 201, posted.text
    [hook] = receiver.wait_for(1, within=30)
    assert hook.json()["body"] == {"order": 7}
    assert hook.headers["x-test"] == "kept"
    # the webhook acts as alice with the token it was given: it reads alice's queue
    as_alice = httpx.get(
        f"{service.url}/v2/queues/trusted/messages?echo=true",
        headers={"X-Auth-Token": hook.headers["x-auth-token"], "Client-ID": CLIENT_ID},
        timeout=30,
    )
    assert as_alice.status_code == 200, as_alice.text
    assert [m["body"] for m in as_alice.json()["messages"]] == [{"order": 7}]

    # a longer life needs a new trust; the old one is deleted
    patched = httpx.patch(f"{subs}/{sid}", json={"ttl": 1200}, headers=headers, timeout=30)
    assert patched.status_code == 204, patched.text
    renewed = httpx.get(f"{subs}/{sid}", headers=headers, timeout=30).json()["options"]
    assert renewed["trust_id"] != trust
    assert renewed["post_headers"] == {"X-Test": "kept"}
    assert [t["id"] for t in trusts_of(service, "alice") if t["id"] not in before] == [renewed["trust_id"]]

    # the trust is the service's to make: another one is refused, naming the option
    forged = {**body, "subscriber": "trust+" + receiver.url_for("/other"), "options": {"trust_id": trust}}
    refused = httpx.post(subs, json=forged, headers=headers, timeout=30)
    assert refused.status_code == 400, refused.text
    assert "options.trust_id" in refused.json()["description"]
    changed = httpx.patch(f"{subs}/{sid}", json={"options": {"trust_id": "x" * 32}}, headers=headers)
    assert changed.status_code == 400, changed.text

    # any change is made as its caller: another member of alpha (the admin) changing the headers notifies
    # as itself from then on, never with alice's trust
    admin = {"X-Auth-Token": ks.token("admin", "alpha"), "Client-ID": CLIENT_ID}
    new_headers = {"options": {"post_headers": {"X-Test": "admin's"}}}
    assert httpx.patch(f"{subs}/{sid}", json=new_headers, headers=admin, timeout=30).status_code == 204
    as_admin = httpx.get(f"{subs}/{sid}", headers=headers, timeout=30).json()["options"]["trust_id"]
    [made] = [t for t in trusts_of(service, "admin") if t["id"] == as_admin]
    assert made["trustor_user_id"] == ks.user_ids["admin"]
    # no longer trust+: no trust kept
    plain = {"subscriber": receiver.url_for("/plain")}
    assert httpx.patch(f"{subs}/{sid}", json=plain, headers=admin, timeout=30).status_code == 204
    assert "trust_id" not in httpx.get(f"{subs}/{sid}", headers=headers, timeout=30).json()["options"]
    assert as_admin not in [t["id"] for t in trusts_of(service, "admin")]
    assert httpx.delete(f"{subs}/{sid}", headers=headers, timeout=30).status_code == 204
