"""A redrive task survives `kill -9` of the API process that runs it (issue 7): a throttled redrive of a full
DLQ is killed mid-task, a new process takes the task over once the dead runner's lease lapses and finishes
it, and afterwards every message is exactly once in the source queue or the DLQ (here: all back in the
source, each moved once: redrive_count 1), on Redis (embedded, AOF) and on MongoDB."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "redrive-crash"}
ENV = {"CHARON_REDRIVE_LEASE": "2", "CHARON_SWEEP_INTERVAL": "0.2"}


@pytest.fixture(params=["redis", "mongo"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[CharonProcess, int, int]:
    """(service not started yet, messages, moves a second)."""
    if request.param == "redis":
        return CharonProcess(None, data_dir=tmp_path / "data", env=ENV), 1000, 250
    uri: str = request.getfixturevalue("mongodb_uri")
    return CharonProcess(uri, namespace=f"rc{os.urandom(4).hex()}", env=ENV), 200, 50


def all_ids(c: httpx.Client, queue: str) -> list[str]:
    ids: list[str] = []
    url: str | None = f"/v2/queues/{queue}/messages?limit=20&echo=true&include_claimed=true&provenance=true"
    while url:
        page = c.get(url).json()
        ids += [m["id"] for m in page["messages"] if m["dead_letter"]["redrive_count"] == 1 or queue != "src"]
        url = next((link["href"] for link in page["links"] if link["rel"] == "next"), None)
        url = url if page["messages"] else None
    return ids


def test_kill_9_mid_redrive_then_resume_moves_each_message_once(
    service: tuple[CharonProcess, int, int],
) -> None:
    proc, messages, rate = service
    proc.start()
    try:
        with httpx.Client(base_url=proc.url, headers=HEADERS, timeout=30) as c:
            policy = {"_max_claim_count": 1, "_dead_letter_queue": "src.dlq"}
            assert c.put("/v2/queues/src", json=policy).status_code == 201
            posted: list[str] = []
            for start in range(0, messages, 20):
                r = c.post(
                    "/v2/queues/src/messages",
                    json={"messages": [{"body": n} for n in range(start, start + 20)]},
                )
                posted += [h.rsplit("/", 1)[1] for h in r.json()["resources"]]
                claim = c.post("/v2/queues/src/claims?limit=20", json={"ttl": 60, "grace": 60})
                assert c.delete(claim.headers["location"]).status_code == 204  # all 20 to the DLQ
            assert c.get("/v2/queues/src.dlq/stats").json()["messages"]["total"] == messages

            r = c.post("/v2/queues/src.dlq/redrive", json={"max_per_second": rate})
            assert r.status_code == 202, r.text
            href = r.headers["location"]
            deadline = time.monotonic() + 60
            while (moved := c.get(href).json()["progress"]["moved"]) < messages // 3:
                assert time.monotonic() < deadline, "the redrive made no progress"
                time.sleep(0.05)
        proc.kill()
        print(f"killed with {moved} of {messages} moved")
        proc.start()
        with httpx.Client(base_url=proc.url, headers=HEADERS, timeout=30) as c:
            deadline = time.monotonic() + 90
            while (task := c.get(href).json())["status"] == "running":
                assert time.monotonic() < deadline, f"the task was not resumed: {task}"
                time.sleep(0.2)
            assert task["status"] == "succeeded"
            assert 0 < moved < messages  # killed mid-task
            in_source, in_dlq = all_ids(c, "src"), all_ids(c, "src.dlq")
            assert in_dlq == []
            assert sorted(in_source) == sorted(posted)  # each exactly once, each moved exactly once
            assert len(set(in_source)) == len(in_source)
            if proc.env.get("CHARON_STORAGE_URI") is None:  # Redis: the task's counts are exact
                assert task["progress"]["moved"] == messages
            else:  # MongoDB: short by at most the batch in flight at the kill
                assert messages - rate <= task["progress"]["moved"] <= messages
    finally:
        proc.stop()
