"""The real python-zaqarclient (API v2), unchanged, against a live `charon serve` process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from zaqarclient.queues.v2 import core
from zaqarclient.queues.v2.client import Client
from zaqarclient.transport import errors as zerrors

from tests.receivers import HttpReceiver, notification_env
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(storage_uri: str) -> Iterator[CharonProcess]:
    proc = CharonProcess(storage_uri, namespace=f"zc{uuid.uuid4().hex[:8]}", env=notification_env()).start()
    yield proc
    proc.stop()


def make_client(server: CharonProcess, project: str = "zc-project") -> Any:
    conf = {"auth_opts": {"backend": "noauth", "options": {"os_project_id": project}}}
    return Client(server.url, version=2, conf=conf)


def test_service_calls(server: CharonProcess) -> None:
    client = make_client(server)
    assert client.ping() is True
    assert client.health() == {"storage_reachable": True, "storage_writable": True}
    assert "rel/queues" in client.homedoc()["resources"]


def test_queue_metadata_stats_and_listing(server: CharonProcess) -> None:
    client = make_client(server)
    q = client.queue("zc-meta", force_create=True)
    assert q.exists()
    q.metadata(new_meta={"color": "red", "_max_claim_count": 5})
    meta = q.metadata(force_reload=True)
    assert (meta["color"], meta["_max_claim_count"]) == ("red", 5)
    q.metadata(new_meta={"color": "blue"})  # replaces color, removes the rest
    meta = q.metadata(force_reload=True)
    assert (meta["color"], "_max_claim_count" in meta) == ("blue", False)
    for i in range(3):
        client.queue(f"zc-list-{i}", force_create=True)
    queues, _ = client.queues(limit=2)
    names = [queue.name for queue in queues.stream()]
    assert {"zc-meta", "zc-list-0", "zc-list-1", "zc-list-2"} <= set(names)
    assert q.stats["messages"]["total"] == 0
    q.delete()
    assert "zc-meta" not in [queue.name for queue in client.queues()[0].stream()]


def test_post_list_get_delete_pop(server: CharonProcess) -> None:
    client = make_client(server)
    q = client.queue("zc-messages")
    q.post([{"body": {"n": i}, "ttl": 300} for i in range(5)])
    q.post({"body": "single"})
    listed = list(q.messages(echo=True, limit=2).stream())
    assert [m.body for m in listed] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}, "single"]
    assert listed[0].ttl == 300
    assert listed[5].ttl == 3600
    one = q.message(listed[0].id)
    assert one.body == {"n": 0}
    one.delete()
    with pytest.raises(zerrors.ResourceNotFound):
        q.message(listed[0].id)
    got = list(q.messages(listed[1].id, listed[2].id))
    assert [m.body for m in got] == [{"n": 1}, {"n": 2}]
    q.delete_messages(listed[1].id, listed[2].id)
    popped = list(q.pop(count=2))
    assert [m.body for m in popped] == [{"n": 3}, {"n": 4}]
    assert q.stats["messages"]["total"] == 1
    q.purge()
    assert q.stats["messages"]["total"] == 0


def test_claim_get_update_delete(server: CharonProcess) -> None:
    client = make_client(server)
    q = client.queue("zc-claims")
    q.post([{"body": i} for i in range(3)])
    claim = q.claim(ttl=120, grace=60, limit=2)
    msgs = list(claim)
    assert [m.body for m in msgs] == [0, 1]
    assert all(m.claim_id == claim.id for m in msgs)
    assert claim.ttl == 120
    claim.update(ttl=180)
    assert client.queue("zc-claims", auto_create=False).claim(id=claim.id).ttl == 180
    msgs[0].delete()  # deletes with the claim id taken from the message href
    req, trans = client._request_and_transport()
    with pytest.raises(zerrors.ForbiddenError):  # a claimed message needs its claim id
        core.message_delete(trans, req, "zc-claims", msgs[1].id)
    second = q.claim(ttl=60, grace=60, limit=5)
    assert [m.body for m in second] == [2]
    claim.delete()
    third = q.claim(ttl=60, grace=60, limit=5)
    assert [(m.body, m.claim_count) for m in third] == [(1, 2)]
    assert list(q.claim(limit=5)) == []  # 204: nothing left to claim


def test_bulk_delete_of_claimed_messages_and_long_polling_unchanged(server: CharonProcess) -> None:
    """The client's bulk delete sends `ids` only (no claim ids): it deletes claimed messages too, as Zaqar's
    does by default; and a claim through the client, which never sends `wait`, does not wait."""
    client = make_client(server)
    q = client.queue("zc-bulk")
    q.post([{"body": i} for i in range(4)])
    claimed = list(q.claim(ttl=60, grace=60, limit=3))
    q.delete_messages(*[m.id for m in claimed])
    assert [m.body for m in q.messages(echo=True, include_claimed=True)] == [3]
    q.delete_messages(*[m.id for m in claimed])  # again: already gone, still fine
    list(q.claim(limit=5))
    assert list(q.claim(limit=5)) == []  # 204 at once


def test_projects_are_isolated(server: CharonProcess) -> None:
    a, b = make_client(server, "zc-tenant-a"), make_client(server, "zc-tenant-b")
    a.queue("zc-private").post({"body": "a's"})
    assert b.queue("zc-private").stats["messages"]["total"] == 0
    assert list(b.queue("zc-private").messages(echo=True)) == []
    assert a.queue("zc-private").stats["messages"]["total"] == 1


def test_bad_input_raises_client_errors(server: CharonProcess) -> None:
    client = make_client(server)
    q = client.queue("zc-bad")
    with pytest.raises(zerrors.MalformedRequest):
        q.post({"body": 1, "ttl": 1})
    with pytest.raises(zerrors.MalformedRequest):
        q.claim(ttl=1)


def dead_letter_one(client: Any, queue: str) -> Any:
    """Post one message to `queue` (2 claims at most, DLQ `<queue>-dlq`), claim and release it twice."""
    q = client.queue(queue)
    q.metadata(new_meta={"_max_claim_count": 2, "_dead_letter_queue": f"{queue}-dlq"})
    q.post({"body": "poison"})
    for _ in range(2):
        claim = q.claim(ttl=60, grace=60, limit=5)
        assert [m.body for m in claim] == ["poison"]
        claim.delete()
    assert list(q.claim(limit=5)) == []
    assert q.stats["messages"]["dead_lettered"] == 1
    return client.queue(f"{queue}-dlq", auto_create=False)


def test_dlq_consumers_with_default_settings(server: CharonProcess) -> None:
    """python-zaqarclient refuses message fields it does not know: with the service's defaults, claims, gets,
    listings and pops of a DLQ work unchanged (provenance is one parameter away, not on by default)."""
    dlq = dead_letter_one(make_client(server), "zc-work")
    [listed] = list(dlq.messages(echo=True))
    assert dlq.message(listed.id).body == "poison"
    assert [m.body for m in dlq.messages(listed.id)] == ["poison"]
    [claimed] = list(dlq.claim(ttl=60, grace=60, limit=5))
    assert claimed.body == "poison"
    claimed.delete()
    assert dlq.stats["messages"]["total"] == 0
    again = dead_letter_one(make_client(server), "zc-work-pop")
    assert [m.body for m in again.pop(count=1)] == ["poison"]


def test_provenance_on_by_setting_can_be_turned_off_per_request(storage_uri: str) -> None:
    """A deployment with CHARON_PROVENANCE=true: the client asks without it (`provenance=False` passes
    through the client's listing arguments) and reads the DLQ."""
    proc = CharonProcess(
        storage_uri, namespace=f"zc{uuid.uuid4().hex[:8]}", env={"CHARON_PROVENANCE": "true"}
    )
    proc.start()
    try:
        dlq = dead_letter_one(make_client(proc), "zc-work2")
        assert [m.body for m in dlq.messages(echo=True, provenance=False)] == ["poison"]
        with pytest.raises(TypeError, match="dead_letter"):
            list(dlq.messages(echo=True))
    finally:
        proc.stop()


def test_subscriptions_and_the_notifications_they_get(
    server: CharonProcess, webhook_receiver: HttpReceiver
) -> None:
    """The client's subscription calls, unchanged, and a DLQ subscriber told of a dead letter (a live
    service: its notifier, a real receiver)."""
    client = make_client(server)
    sub = client.subscription("zc-subs", subscriber="https://hooks.example.com/a", ttl=600, options={"x": 1})
    assert sub.id
    again = client.subscription("zc-subs", id=sub.id)
    assert (again.subscriber, again.ttl, again.options, again.confirmed) == (
        "https://hooks.example.com/a",
        600,
        {"x": 1},
        True,
    )
    sub.update({"ttl": 3600, "options": {"x": 2}})
    listed = list(client.subscriptions("zc-subs"))
    assert [(s.id, s.ttl, s.options) for s in listed] == [(sub.id, 3600, {"x": 2})]
    # the same subscriber again: its subscription (Zaqar's 201 with the existing id), unchanged
    assert client.subscription("zc-subs", subscriber="https://hooks.example.com/a", ttl=60).id == sub.id
    assert [s.ttl for s in client.subscriptions("zc-subs")] == [3600]
    sub.delete()
    assert list(client.subscriptions("zc-subs")) == []

    q = client.queue("zc-orders")
    q.metadata(new_meta={"_max_claim_count": 1, "_dead_letter_queue": "zc-orders-dlq"})
    client.subscription("zc-orders-dlq", subscriber=webhook_receiver.url_for("/dlq"), ttl=600)
    q.post({"body": {"sku": "x-1"}})
    claim = q.claim(ttl=60, grace=60)
    [message] = list(claim)
    # the reject is Charon's (EXT), which the client has no call for: plain HTTP
    href = f"{server.url}/v2/queues/zc-orders/messages/{message.id}/dead_letter?claim_id={claim.id}"
    headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": "zc-project"}
    assert httpx.post(href, headers=headers, json={"reason": "bad_sku"}).status_code in (200, 204)
    [hook] = webhook_receiver.wait_for(1)
    doc = hook.json()
    assert (doc["id"], doc["queue_name"], doc["dead_letter"]["source_queue"]) == (
        message.id,
        "zc-orders-dlq",
        "zc-orders",
    )
    dlq = client.queue("zc-orders-dlq", auto_create=False)
    dlq.purge(resource_types=["subscriptions"])
    assert list(client.subscriptions("zc-orders-dlq")) == []
    assert dlq.stats["messages"]["total"] == 1  # the messages stay
