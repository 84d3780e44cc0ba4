"""CHARON_AUTH=trusted-proxy behind the gateway it is meant for: keystonemiddleware's auth_token (the real
one, validating tokens with the real Keystone of tests/keystone.py) in front of a live `charon serve`, driven
by the unchanged python-zaqarclient with its keystone backend. The gateway removes the identity headers
clients send and sets its own, which Charon then trusts."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest
from keystonemiddleware import auth_token
from zaqarclient.queues.v2.client import Client
from zaqarclient.transport import errors as zerrors

from tests.conftest import CLIENT_ID
from tests.keystone import DOMAIN_NAME, KeystoneServer
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow  # live processes

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}


class ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def forwarder(client: httpx.Client) -> Callable[..., Iterable[bytes]]:
    """A WSGI app that sends each request on with `client` (to Charon) as it is (the headers
    keystonemiddleware set included) and answers what it answered."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers = [
            (key[5:].replace("_", "-"), value)
            for key, value in environ.items()
            if key.startswith("HTTP_")
            and value is not None
            and key[5:].replace("_", "-").lower() not in HOP_BY_HOP
        ]
        if environ.get("CONTENT_TYPE"):
            headers.append(("Content-Type", environ["CONTENT_TYPE"]))
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        query = environ.get("QUERY_STRING")
        url = environ["PATH_INFO"] + (f"?{query}" if query else "")
        r = client.request(environ["REQUEST_METHOD"], url, headers=headers, content=body)
        kept = [(k, v) for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}]
        start_response(f"{r.status_code} {r.reason_phrase}", [*kept, ("Content-Length", str(len(r.content)))])
        return [r.content]

    return app


@pytest.fixture(scope="module")
def gateway(keystone: KeystoneServer, redis_url: str) -> Iterator[str]:
    env = {"CHARON_AUTH": "trusted-proxy", "CHARON_ADMIN_MODE": "true"}
    charon = CharonProcess(redis_url, namespace=f"tp{uuid.uuid4().hex[:10]}", env=env).start()
    creds = keystone.service_credentials()
    conf = {
        "auth_type": "password",
        "auth_url": creds["auth_url"],
        "username": creds["username"],
        "password": creds["password"],
        "project_name": creds["project_name"],
        "user_domain_name": creds["user_domain_name"],
        "project_domain_name": creds["project_domain_name"],
        "www_authenticate_uri": keystone.url,
        "delay_auth_decision": "false",
    }
    upstream = httpx.Client(base_url=charon.url, timeout=30)
    app = auth_token.AuthProtocol(forwarder(upstream), conf)
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        upstream.close()
        charon.stop()


def client(gateway: str, keystone: KeystoneServer, user: str, project: str = "alpha") -> Client:
    options = {
        "os_auth_url": keystone.url,
        "os_username": user,
        "os_password": keystone.password,
        "os_project_name": project,
        "os_user_domain_name": DOMAIN_NAME,
        "os_project_domain_name": DOMAIN_NAME,
    }
    conf = {"auth_opts": {"backend": "keystone", "options": options}, "client_uuid": CLIENT_ID}
    return Client(gateway, version=2, conf=conf)


def test_the_unchanged_client_through_keystonemiddleware(gateway: str, keystone: KeystoneServer) -> None:
    alice = client(gateway, keystone, "alice")
    queue = alice.queue("tp-orders")
    queue.post([{"body": {"order": 1}, "ttl": 300}, {"body": {"order": 2}, "ttl": 300}])
    claim = queue.claim(ttl=60, grace=60, limit=5)
    claimed = list(claim)
    assert sorted(m.body["order"] for m in claimed) == [1, 2]
    for message in claimed:
        message.delete()
    assert queue.stats["messages"]["total"] == 0
    assert "tp-orders" in [q.name for q in alice.queues()[0].stream()]
    # bob, of another project, does not see alice's queue
    assert "tp-orders" not in [q.name for q in client(gateway, keystone, "bob", "beta").queues()[0].stream()]


def test_roles_come_from_the_token_the_gateway_validated(gateway: str, keystone: KeystoneServer) -> None:
    with pytest.raises(zerrors.ConflictError, match="Pooling is off"):  # allowed: pooling is off here
        list(client(gateway, keystone, "admin").pools())
    with pytest.raises(zerrors.ForbiddenError, match="pools:get_all"):
        list(client(gateway, keystone, "alice").pools())


def test_identity_headers_a_client_forges_do_not_reach_charon(gateway: str, keystone: KeystoneServer) -> None:
    forged = {
        "Client-ID": CLIENT_ID,
        "X-Identity-Status": "Confirmed",
        "X-Project-ID": keystone.project_ids["alpha"],
        "X-Roles": "admin",
    }
    r = httpx.get(f"{gateway}/v2/queues", headers=forged)
    assert r.status_code == 401  # keystonemiddleware: no token
    # with bob's token, the forged project and role are replaced by the token's
    r = httpx.get(f"{gateway}/v2/queues", headers={**forged, "X-Auth-Token": keystone.token("bob", "beta")})
    assert r.status_code == 200
    assert "tp-orders" not in r.text
    r = httpx.get(f"{gateway}/v2/pools", headers={**forged, "X-Auth-Token": keystone.token("bob", "beta")})
    assert r.status_code == 403
