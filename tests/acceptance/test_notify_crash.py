"""Notifications survive `kill -9` (the outbox's promise): a live service with a subscriber on a queue and on
its DLQ is killed twice while it delivers, at random moments, and restarted. Every posted message and every
dead letter reaches its subscriber at least once; none is lost. On Redis the service runs its embedded
store (AOF on), which dies and restarts with it; on MongoDB the database lives on."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID
from tests.receivers import HttpReceiver, notification_env
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "notify-crash"}


@pytest.fixture(params=["redis", "mongo"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> CharonProcess:
    env = notification_env(webhook_timeout="2")
    if request.param == "redis":
        return CharonProcess(None, data_dir=tmp_path / "data", env=env)
    uri: str = request.getfixturevalue("mongodb_uri")
    return CharonProcess(uri, namespace=f"nc{os.urandom(4).hex()}", env=env)


def ids_of(hooks: list[dict[str, object]]) -> Counter[str]:
    return Counter(str(h["id"]) for h in hooks)


def test_kill_9_while_delivering_loses_no_notification(
    service: CharonProcess, webhook_receiver: HttpReceiver
) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    webhook_receiver.delay = 0.02  # a subscriber that takes its time: the kills land mid-delivery
    messages = 200
    service.start()
    try:
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=30) as c:
            c.put("/v2/queues/events", json={"_max_claim_count": 1, "_dead_letter_queue": "events.dlq"})
            for queue in ("events", "events.dlq"):
                r = c.post(
                    f"/v2/queues/{queue}/subscriptions",
                    json={"subscriber": webhook_receiver.url_for(f"/{queue}")},
                )
                assert r.status_code == 201, r.text
            posted: list[str] = []
            for start in range(0, messages, 20):
                r = c.post(
                    "/v2/queues/events/messages",
                    json={"messages": [{"body": n} for n in range(start, start + 20)]},
                )
                posted += [href.rsplit("/", 1)[1] for href in r.json()["resources"]]
            # a claim of 20 and its release, 5 times: every message moves to the DLQ (claimed once already)
            rejected: list[str] = []
            for _ in range(messages // 20):
                claim = c.post("/v2/queues/events/claims?limit=20", json={"ttl": 60})
                assert claim.status_code == 201
                rejected += [m["id"] for m in claim.json()["messages"]]
                assert c.delete(claim.headers["location"]).status_code == 204
        for share in (rng.uniform(0.1, 0.4), rng.uniform(0.5, 0.8)):
            webhook_receiver.wait_for(int(2 * messages * share), within=120)
            service.kill()
            service.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            hooks = [r.json() for r in webhook_receiver.requests]
            to_queue = ids_of([h for h in hooks if h["queue_name"] == "events"])
            to_dlq = ids_of([h for h in hooks if h["queue_name"] == "events.dlq"])
            if set(to_queue) >= set(posted) and set(to_dlq) >= set(rejected):
                break
            time.sleep(0.2)
        assert set(to_queue) == set(posted)
        assert set(to_dlq) == set(rejected) == set(posted)
        again = sum(to_queue.values()) + sum(to_dlq.values()) - 2 * messages
        print(f"delivered twice after the kills: {again} of {2 * messages}")
        assert again <= 2 * 2 * 32  # at most what was in flight at each kill (max_concurrent 32)
    finally:
        service.stop()
