"""The consume path over HTTP, on every driver: claim-safe bulk acknowledge (`ids` + `claim_ids`), a claim
acknowledged whole (`DELETE .../claims/{id}?acknowledge=true`), long polling (`wait`), and their bad input."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from core.clock import ManualClock
from tests.api.test_flows import post_messages

CLAIM = {"ttl": 60, "grace": 60}


async def claim(client: httpx.AsyncClient, queue: str, **params: object) -> tuple[str, list[str]]:
    r = await client.post(f"/v2/queues/{queue}/claims", params=params, json=CLAIM)
    assert r.status_code == 201, r.text
    cid = r.headers["location"].rsplit("/", 1)[1]
    return cid, [m["id"] for m in r.json()["messages"]]


async def bodies(client: httpx.AsyncClient, queue: str) -> list[object]:
    r = await client.get(f"/v2/queues/{queue}/messages", params={"echo": "true", "include_claimed": "true"})
    return sorted(m["body"] for m in r.json()["messages"])


@pytest.mark.every_store
async def test_a_claim_is_acknowledged_in_one_call(client: httpx.AsyncClient) -> None:
    await post_messages(client, "jobs", *range(12))
    cid, ids = await claim(client, "jobs", limit=10)
    r = await client.delete("/v2/queues/jobs/messages", params={"ids": ",".join(ids), "claim_ids": cid})
    assert r.status_code == 204, r.text
    assert await bodies(client, "jobs") == [10, 11]


@pytest.mark.every_store
async def test_what_no_given_claim_holds_stays_and_the_answer_says_which_and_why(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    free, *_ = await post_messages(client, "jobs", "free", "mine", "theirs")
    mine, (m1,) = await claim(client, "jobs", limit=1)  # "free" is the oldest: claimed then released below
    await client.delete(f"/v2/queues/jobs/claims/{mine}", params={"delay": 0})
    mine, claimed = await claim(client, "jobs", limit=2)
    _, (t1,) = await claim(client, "jobs", limit=1)
    assert claimed[0] == m1 == free
    other_mid = (await post_messages(client, "jobs", "unclaimed"))[0]
    ids = [*claimed, t1, other_mid]
    r = await client.delete("/v2/queues/jobs/messages", params={"ids": ",".join(ids), "claim_ids": mine})
    assert r.status_code == 403
    answer = r.json()
    assert answer["title"] == "Not authorized"
    assert "2 of the listed messages were not deleted" in answer["description"]
    assert answer["not_deleted"] == [
        {"id": t1, "reason": "claimed_by_another"},
        {"id": other_mid, "reason": "not_claimed"},
    ]
    assert await bodies(client, "jobs") == ["theirs", "unclaimed"]


@pytest.mark.every_store
async def test_an_expired_claim_acknowledges_nothing(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await post_messages(client, "jobs", "a")
    cid, ids = await claim(client, "jobs")
    clock.advance(61)
    r = await client.delete("/v2/queues/jobs/messages", params={"ids": ids[0], "claim_ids": cid})
    assert r.status_code == 403
    assert r.json()["description"].startswith("1 of the listed messages was not deleted, since none of the ")
    assert r.json()["not_deleted"] == [{"id": ids[0], "reason": "not_claimed"}]
    assert await bodies(client, "jobs") == ["a"]


@pytest.mark.every_store
async def test_an_acknowledgement_too_late_says_the_message_went_to_the_dlq(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    """The claim expired while the consumer worked, and the claim after it moved the used-up message to the
    DLQ: acknowledging it is a 403 saying `dead_lettered`, not a 204 (it will be processed again)."""
    meta = {"_max_claim_count": 1, "_dead_letter_queue": "jobs.dlq"}
    assert (await client.put("/v2/queues/jobs", json=meta)).status_code == 201
    await post_messages(client, "jobs", "a")
    cid, ids = await claim(client, "jobs")
    clock.advance(61)
    assert (await client.post("/v2/queues/jobs/claims", json=CLAIM)).status_code == 204  # it moved
    r = await client.delete("/v2/queues/jobs/messages", params={"ids": ids[0], "claim_ids": cid})
    assert r.status_code == 403, r.text
    assert r.json()["not_deleted"] == [{"id": ids[0], "reason": "dead_lettered"}]
    assert "dead_lettered: its claim expired and it was moved to the DLQ" in r.json()["description"]
    one = await client.delete(f"/v2/queues/jobs/messages/{ids[0]}", params={"claim_id": cid})
    assert one.status_code == 403, one.text
    assert "dead_lettered" in one.json()["description"]
    assert await bodies(client, "jobs.dlq") == ["a"]


@pytest.mark.every_store
async def test_the_bulk_delete_of_zaqar_ignores_claims_without_claim_ids(client: httpx.AsyncClient) -> None:
    await post_messages(client, "jobs", "a", "b")
    _, ids = await claim(client, "jobs")
    assert (await client.delete("/v2/queues/jobs/messages", params={"ids": ",".join(ids)})).status_code == 204
    assert await bodies(client, "jobs") == []


@pytest.mark.every_store
async def test_a_claim_acknowledged_whole(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await post_messages(client, "jobs", *range(3))
    cid, _ = await claim(client, "jobs", limit=2)
    r = await client.delete(f"/v2/queues/jobs/claims/{cid}", params={"acknowledge": "true"})
    assert r.status_code == 204, r.text
    assert await bodies(client, "jobs") == [2]
    again = await client.delete(f"/v2/queues/jobs/claims/{cid}", params={"acknowledge": "true"})
    assert again.status_code == 404
    assert again.json()["description"] == f"Claim {cid} does not exist or has expired."
    cid, _ = await claim(client, "jobs")
    clock.advance(61)
    assert (await client.delete(f"/v2/queues/jobs/claims/{cid}?acknowledge=true")).status_code == 404
    assert await bodies(client, "jobs") == [2]


@pytest.mark.every_store
async def test_a_long_poll_is_answered_by_a_post(client: httpx.AsyncClient, clock: ManualClock) -> None:
    waiting = asyncio.create_task(client.post("/v2/queues/jobs/claims?wait=20&limit=5", json=CLAIM))
    await asyncio.wait_for(clock.sleepers(1), 10)
    await post_messages(client, "jobs", "news")
    r = await asyncio.wait_for(waiting, 10)
    assert r.status_code == 201
    assert [m["body"] for m in r.json()["messages"]] == ["news"]


@pytest.mark.every_store
async def test_a_long_poll_that_runs_out_answers_204(client: httpx.AsyncClient, clock: ManualClock) -> None:
    waiting = asyncio.create_task(client.post("/v2/queues/jobs/claims?wait=3", json=CLAIM))
    await asyncio.wait_for(clock.sleepers(1), 10)
    clock.advance(3)
    assert (await asyncio.wait_for(waiting, 10)).status_code == 204


@pytest.mark.parametrize(
    ("method", "url", "field", "text"),
    [
        ("POST", "/v2/queues/jobs/claims?wait=21", "wait", "wait must be between 0 and 20; got 21."),
        ("POST", "/v2/queues/jobs/claims?wait=-1", "wait", "wait must be between 0 and 20; got -1."),
        ("POST", "/v2/queues/jobs/claims?wait=soon", "wait", "wait"),
        ("POST", "/v2/queues/jobs/claims?wait=1&wait=2", "wait", "wait"),
        ("POST", "/v2/queues/jobs/claims?limit=21", "limit", "limit must be between 1 and 20; got 21."),
        ("DELETE", f"/v2/queues/jobs/messages?claim_ids={'a' * 32}", "claim_ids", "claim_ids goes with ids"),
        ("DELETE", f"/v2/queues/jobs/messages?ids={'a' * 32}&claim_ids=xyz", "claim_ids", "got 'xyz'"),
        ("DELETE", f"/v2/queues/jobs/messages?ids={'a' * 32}&claim_ids=", "claim_ids", "got ''"),
        (
            "DELETE",
            "/v2/queues/jobs/messages?ids={}&claim_ids={}".format(
                ",".join(["a" * 32] * 21), ",".join(["b" * 32] * 21)
            ),
            "ids",
            "ids may list at most 20 message ids; got 21.",
        ),
        ("DELETE", f"/v2/queues/jobs/claims/{'a' * 32}?acknowledge=maybe", "acknowledge", "acknowledge"),
        ("DELETE", f"/v2/queues/jobs/claims/{'a' * 32}?acknowledge=true&delay=5", "delay", "delay"),
    ],
)
async def test_bad_consume_input_is_400_naming_the_field(
    client: httpx.AsyncClient, method: str, url: str, field: str, text: str
) -> None:
    r = await client.request(method, url, json=CLAIM if method == "POST" else None)
    assert r.status_code == 400, r.text
    assert field in r.json()["description"]
    assert text in r.json()["description"]
