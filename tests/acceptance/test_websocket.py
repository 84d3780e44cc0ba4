"""Zaqar's websocket transport against a live `charon serve` (api/websocket.py): the unchanged
python-zaqarclient's websocket transport on each store, Keystone's `authenticate`, a pre-signed URL's
headers, MessagePack frames, a connection that subscribes itself (notified by the service's notifier
process), and bad frames answered, never a dropped connection."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import websocket as wsclient  # websocket-client, what python-zaqarclient's transport runs on
from zaqarclient.transport import errors as zerrors
from zaqarclient.transport import request as zrequest
from zaqarclient.transport.ws import WebsocketTransport

from tests.api.test_share import signed as share_headers
from tests.keystone import KeystoneServer
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

PROJECT = "ws-demo"
KEY = "websocket-signing-key"


def ws_url(proc: CharonProcess, path: str = "/") -> str:
    return proc.url.replace("http://", "ws://") + path


@pytest.fixture(params=["redis", "mongo"])
def service(request: pytest.FixtureRequest, redis_url: str, mongodb_uri: str) -> Iterator[CharonProcess]:
    uri = redis_url if request.param == "redis" else mongodb_uri
    env = {"CHARON_AUTH": "noauth", "CHARON_SIGNED_URL_KEY": KEY}
    proc = CharonProcess(uri, namespace=f"ws{uuid.uuid4().hex[:10]}", env=env).start()
    try:
        yield proc
    finally:
        proc.stop()


def zaqar(proc: CharonProcess, token: str = "unused", project: str = PROJECT) -> WebsocketTransport:
    """python-zaqarclient's websocket transport as its docstring uses it (it asks a token even in noauth)."""
    options = {
        "auth_opts": {"backend": "keystone", "options": {"os_auth_token": token, "os_project_id": project}}
    }
    return WebsocketTransport(options)


def send(transport: WebsocketTransport, url: str, action: str, **body: Any) -> Any:
    return transport.send(zrequest.Request(url, action, content=json.dumps(body)))


def test_the_unchanged_zaqarclient_transport_works_on_every_store(service: CharonProcess) -> None:
    url = ws_url(service)
    with zaqar(service) as ws:
        assert send(ws, url, "queue_create", queue_name="jobs", metadata={"team": "red"}).status_code == 201
        posted = send(ws, url, "message_post", queue_name="jobs", messages=[{"body": {"n": 1}}, {"body": 2}])
        assert posted.status_code == 201
        ids = json.loads(posted.content)["message_ids"]
        assert len(ids) == 2
        claimed = send(ws, url, "claim_create", queue_name="jobs", ttl=60, grace=30, limit=1)
        claim = json.loads(claimed.content)
        assert (claimed.status_code, [m["id"] for m in claim["messages"]]) == (201, ids[:1])
        assert claim["messages"][0]["claim_id"] == claim["claim_id"]
        got = send(
            ws, url, "message_delete", queue_name="jobs", message_id=ids[0], claim_id=claim["claim_id"]
        )
        assert got.status_code == 204
        stats = json.loads(send(ws, url, "queue_get_stats", queue_name="jobs").content)["messages"]
        assert (stats["total"], stats["free"]) == (1, 1)
        listed = json.loads(send(ws, url, "message_list", queue_name="jobs", echo=True).content)
        assert [m["body"] for m in listed["messages"]] == [2]
        with pytest.raises(zerrors.MalformedRequest, match="ttl"):
            send(ws, url, "message_post", queue_name="jobs", messages=[{"body": 1, "ttl": 5}])
        with pytest.raises(zerrors.ResourceNotFound):
            send(ws, url, "claim_get", queue_name="jobs", claim_id=uuid.uuid4().hex)
        assert send(ws, url, "queue_delete", queue_name="jobs").status_code == 204
    # what the websocket did, HTTP sees: the same store, the same project
    r = httpx.get(
        f"{service.url}/v2/queues/jobs/stats",
        headers={"X-Project-ID": PROJECT, "Client-ID": str(uuid.uuid4())},
    )
    assert r.json()["messages"]["total"] == 0


def raw(conn: wsclient.WebSocket, payload: Any, *, binary: bool = False) -> dict[str, Any]:
    if binary:
        conn.send_binary(msgpack.packb(payload))
        answer: dict[str, Any] = msgpack.unpackb(conn.recv())
        return answer
    conn.send(payload if isinstance(payload, str) else json.dumps(payload))
    answer = json.loads(conn.recv())
    return answer


HEADERS = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": PROJECT}


def test_bad_frames_are_answered_and_the_connection_goes_on(service: CharonProcess) -> None:
    conn = wsclient.create_connection(ws_url(service, "/v2/ws"))
    try:
        cases: list[tuple[Any, int, str]] = [
            ("not json", 400, "Can't decode text (JSON)"),
            ('{"action": "ping_node", "n": NaN}', 400, "Can't decode"),
            ([1, 2], 400, "Expected dict"),
            ({"headers": HEADERS}, 400, "action"),
            ({"action": "queue_fly", "headers": HEADERS}, 400, "Invalid action"),
            ({"action": "queue_get", "headers": HEADERS, "body": []}, 400, "body"),
            ({"action": "queue_get", "headers": {"Client-ID": 5}, "body": {}}, 400, "headers"),
            ({"action": "queue_get", "headers": HEADERS, "body": {}}, 400, "queue_name"),
            ({"action": "queue_get", "headers": HEADERS, "body": {"queue_name": "a/b"}}, 400, "queue_name"),
            (
                {"action": "queue_get", "headers": HEADERS, "body": {"queue_name": "bad name"}},
                400,
                "Queue names",
            ),
            (
                {"action": "message_list", "headers": HEADERS, "body": {"queue_name": "q", "limit": {}}},
                400,
                "limit",
            ),
            (
                {
                    "action": "subscription_create",
                    "headers": HEADERS,
                    "body": {"queue_name": "q", "subscriber": "websocket://127.0.0.1:1/x"},
                },
                400,
                "subscriber",
            ),
            ({"action": "queue_list", "headers": {"Client-ID": HEADERS["Client-ID"]}}, 400, "X-Project-ID"),
            ("x" * (400 * 1024), 413, "at most"),
            ('{"action": "ping_node", "body": {"x": ' + "[" * 260 + "]" * 260 + "}}", 400, "levels deep"),
            ('{"action": "ping_node", "body": {"x": ' + "[" * 1100 + "]" * 1100 + "}}", 400, "levels deep"),
            (
                '{"action": "message_post", "headers": '
                + json.dumps(HEADERS)
                + ', "body": {"queue_name": "q", "messages": [{"body": {"n": 18446744073709551616}}]}}',
                400,
                "64-bit",
            ),
            (
                {
                    "action": "queue_get",
                    "headers": {**HEADERS, "X-Project-ID": "a\r\nX-Roles: admin"},
                    "body": {},
                },
                400,
                "headers.X-Project-ID",
            ),
        ]
        for frame, status, said in cases:
            answer = raw(conn, frame)
            assert answer["headers"]["status"] == status, (str(frame)[:200], answer)
            assert said in answer["body"]["error"], (str(frame)[:200], answer)
            assert answer["body"]["exception"] == answer["body"]["error"]  # Zaqar's: the detail in both
        ok = raw(conn, {"action": "queue_get", "headers": HEADERS, "body": {"queue_name": "q", "typo": 1}})
        assert (ok["headers"]["status"], ok["headers"]["charon-ignored-parameters"]) == (200, "typo")
        posted = raw(
            conn,
            {
                "action": "message_post",
                "headers": HEADERS,
                "body": {"queue_name": "q", "messages": [{"body": 1}]},
            },
        )
        gone = {"queue_name": "q", "message_ids": posted["body"]["message_ids"]}
        deleted = raw(conn, {"action": "message_delete_many", "headers": HEADERS, "body": gone})
        assert (deleted["headers"]["status"], deleted["body"]) == (204, {})
        packed = raw(
            conn,
            {
                "action": "message_post",
                "headers": HEADERS,
                "body": {"queue_name": "q", "messages": [{"body": "m"}]},
            },
            binary=True,
        )
        assert packed["headers"]["status"] == 201
        refused = raw(conn, {"action": "ping_node", "headers": HEADERS, "body": {"b": b"\x00"}}, binary=True)
        assert refused["headers"]["status"] == 400
        assert raw(conn, {"action": "ping_node", "headers": HEADERS})["headers"]["status"] == 204
    finally:
        conn.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_connection_that_subscribes_itself_is_sent_each_notification(
    service: CharonProcess, binary: bool
) -> None:
    """Zaqar's websocket subscription: `subscription_create` without a subscriber makes the connection the
    subscriber; the notifier (its own process) sends each message posted to the queue, over HTTP by anyone,
    to the connection as a frame in the format it subscribed in. Closing the connection unsubscribes it, and
    nobody may subscribe a connection's address as a subscriber of their own."""
    subs = f"{service.url}/v2/queues/watched/subscriptions"
    conn = wsclient.create_connection(ws_url(service))
    try:
        made = raw(
            conn,
            {
                "action": "subscription_create",
                "headers": HEADERS,
                "body": {"queue_name": "watched", "ttl": 600},
            },
            binary=binary,
        )
        assert made["headers"]["status"] == 201, made
        sid = made["body"]["subscription_id"]
        shown = httpx.get(f"{subs}/{sid}", headers=HEADERS, timeout=30).json()
        assert shown["subscriber"].startswith("websocket://127.0.0.1:")
        forged = httpx.post(subs, json={"subscriber": shown["subscriber"]}, headers=HEADERS, timeout=30)
        assert forged.status_code == 400, forged.text
        assert "subscriber" in forged.json()["description"]

        posted = httpx.post(
            f"{service.url}/v2/queues/watched/messages",
            json={"messages": [{"body": {"n": 1}, "ttl": 300}]},
            headers=HEADERS,
            timeout=30,
        )
        assert posted.status_code == 201, posted.text
        conn.settimeout(30)
        frame = conn.recv()
        assert isinstance(frame, bytes) == binary
        notice = msgpack.unpackb(frame) if binary else json.loads(frame)
        assert (notice["body"], notice["queue_name"], notice["Message_Type"]) == (
            {"n": 1},
            "watched",
            "Notification",
        )
        assert notice["id"] == posted.json()["resources"][0].rsplit("/", 1)[1]
        # the connection still answers its own calls in between
        assert (
            raw(conn, {"action": "ping_node", "headers": HEADERS}, binary=binary)["headers"]["status"] == 204
        )
    finally:
        conn.close()
    for _ in range(100):  # closing deleted it
        if httpx.get(f"{subs}/{sid}", headers=HEADERS, timeout=30).status_code == 404:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the connection's own subscription outlived it")


def test_a_pre_signed_urls_headers_allow_what_it_allows(service: CharonProcess) -> None:
    shared = httpx.post(
        f"{service.url}/v2/queues/shared/share",
        json={"methods": ["GET", "POST"], "paths": ["messages"]},
        headers=HEADERS,
    )
    assert shared.status_code == 200, shared.text
    signed = share_headers(shared.json())
    conn = wsclient.create_connection(ws_url(service))
    try:
        post = {"queue_name": "shared", "messages": [{"body": "signed"}]}
        answer = raw(conn, {"action": "message_post", "headers": signed, "body": post})
        assert answer["headers"]["status"] == 201, answer
        assert "URL-Signature" not in answer["request"]["headers"]  # never echoed
        other = raw(
            conn, {"action": "message_post", "headers": signed, "body": {**post, "queue_name": "other"}}
        )
        assert other["headers"]["status"] == 403
        deleting = raw(conn, {"action": "queue_delete", "headers": signed, "body": {"queue_name": "shared"}})
        assert deleting["headers"]["status"] == 403
    finally:
        conn.close()


def test_keystones_authenticate_holds_for_the_connection(keystone: KeystoneServer, redis_url: str) -> None:
    creds = keystone.service_credentials()
    env = {f"CHARON_KEYSTONE__{key.upper()}": value for key, value in creds.items()}
    proc = CharonProcess(
        redis_url, namespace=f"wsks{uuid.uuid4().hex[:8]}", env={**env, "CHARON_AUTH": "keystone"}
    )
    proc.start()
    alpha = keystone.project_ids["alpha"]
    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": alpha}
    conn = wsclient.create_connection(ws_url(proc))
    try:
        before = raw(conn, {"action": "queue_list", "headers": headers})
        assert before["headers"]["status"] == 401
        wrong = raw(conn, {"action": "authenticate", "headers": {"X-Auth-Token": "not-a-token"}})
        assert (wrong["headers"]["status"], wrong["body"]["error"]) == (401, "Authentication failed.")
        token = keystone.token("alice", "alpha")
        ok = raw(conn, {"action": "authenticate", "headers": {"X-Auth-Token": token}})
        assert (ok["headers"]["status"], ok["body"]) == (200, {"message": "Authentified."})
        assert "X-Auth-Token" not in ok["request"]["headers"]
        made = raw(conn, {"action": "queue_create", "headers": headers, "body": {"queue_name": "ks"}})
        assert made["headers"]["status"] == 201
        beta = {**headers, "X-Project-ID": keystone.project_ids["beta"]}
        assert (
            raw(conn, {"action": "queue_get", "headers": beta, "body": {"queue_name": "ks"}})["headers"][
                "status"
            ]
            == 403
        )
    finally:
        conn.close()
        proc.stop()
    # the unchanged client, with its token
    proc.start()
    try:
        with zaqar(proc, token=keystone.token("alice", "alpha"), project=alpha) as ws:
            assert send(ws, ws_url(proc), "queue_get_stats", queue_name="ks").status_code == 200
    finally:
        proc.stop()


def test_a_browser_page_of_another_origin_may_not_open_one(service: CharonProcess) -> None:
    """Browsers apply no CORS to websockets: a page of any site could drive the API (noauth on loopback, a
    gateway's cookies). A handshake with an Origin other than the service's own (or CORS allows) is 403."""
    with pytest.raises(wsclient.WebSocketBadStatusException) as refused:
        wsclient.create_connection(ws_url(service), origin="https://evil.example.com")
    assert refused.value.status_code == 403
    own = wsclient.create_connection(ws_url(service))  # websocket-client sends the service's own origin
    assert raw(own, {"action": "ping_node", "headers": HEADERS})["headers"]["status"] == 204
    own.close()
    bare = wsclient.create_connection(ws_url(service), suppress_origin=True)  # not a browser: no Origin
    assert raw(bare, {"action": "ping_node", "headers": HEADERS})["headers"]["status"] == 204
    bare.close()


def test_behind_a_trusted_gateway_the_identity_is_the_handshakes(
    redis_url: str, tmp_path: pytest.TempPathFactory
) -> None:
    """CHARON_AUTH=trusted-proxy: the gateway vouched for the handshake's headers and cannot see into frames,
    so a frame's X-Roles and X-Project-ID are not the caller's identity (named as ignored)."""
    policy = tmp_path / "policy.yaml"  # type: ignore[operator]
    policy.write_text('"queues:get_all": "role:admin"\n')
    env = {"CHARON_AUTH": "trusted-proxy", "CHARON_POLICY_FILE": str(policy)}
    proc = CharonProcess(redis_url, namespace=f"wstp{uuid.uuid4().hex[:8]}", env=env).start()
    try:
        vouched = ["X-Identity-Status: Confirmed", "X-User-ID: u1", "X-Project-ID: tenant-a"]
        conn = wsclient.create_connection(ws_url(proc), header=vouched, suppress_origin=True)
        frame = {"action": "queue_list", "headers": {"Client-ID": HEADERS["Client-ID"], "X-Roles": "admin"}}
        listed = raw(conn, frame)
        assert listed["headers"]["status"] == 403, listed
        conn.close()
        no_project = ["X-Identity-Status: Confirmed", "X-User-ID: u1", "X-Roles: admin"]
        conn = wsclient.create_connection(ws_url(proc), header=no_project, suppress_origin=True)
        frame = {
            "action": "queue_create",
            "headers": {"Client-ID": HEADERS["Client-ID"], "X-Project-ID": "victim"},
            "body": {"queue_name": "pwn"},
        }
        made = raw(conn, frame)
        assert made["headers"]["status"] == 400, made  # no project: the gateway named none
        assert "X-Project-ID" in made["body"]["error"]
        assert made["headers"]["charon-ignored-parameters"] == "X-Project-ID"
        conn.close()
    finally:
        proc.stop()
