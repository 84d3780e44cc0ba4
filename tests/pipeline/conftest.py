"""One local[2] SparkSession for every pipeline test, and per driver one store full of real dead letters made
through the HTTP API (scenario.py), with the same records read back through the driver's own listing: the
input of the plain-Python oracle, independent of the pipeline's readers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from pyspark.sql import SparkSession

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from core.models import Message, QueueRef
from pipeline import job
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.registry import open_store
from tests.contract.helpers import all_messages
from tests.pipeline import scenario

PROJECTS = {"shop": (5, 8), "tenant-b": (2, 4)}  # project -> (rounds, messages per queue and round)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = job.session("local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "4")
    yield session
    session.stop()


@dataclass
class DeadLetters:
    uri: str
    namespace: str
    shops: dict[str, scenario.Shop]
    records: list[dict[str, Any]]  # every DLQ message of every project, as the driver lists them

    def of(self, project: str | None = None, queues: set[str] | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records
            if (project is None or r["project"] == project) and (queues is None or r["queue"] in queues)
        ]


@pytest.fixture(scope="module", params=["redis", "mongo"])
async def dead_letters(request: pytest.FixtureRequest) -> AsyncIterator[DeadLetters]:
    uri: str = request.getfixturevalue("redis_url" if request.param == "redis" else "mongodb_uri")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    # The clock starts now and runs ahead of real time: MongoDB's TTL index (SecantusDB's sweeps every
    # second) drops a document once its logical end plus GC_SLACK_MS is past in real time, so a clock
    # started hours ago let it delete the `sessions` messages before the sweeper dead-lettered them (under
    # load, no `expired` dead letter at all).
    clock = ManualClock()
    store = open_store(uri, namespace=namespace, clock=clock)
    app = create_app(Settings(storage_uri=uri, namespace=namespace), store=store, clock=clock)
    shops = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://charon") as http:
        for i, (project, (rounds, per_round)) in enumerate(PROJECTS.items()):
            shops[project] = await scenario.run(
                http, store, clock, project=project, rounds=rounds, per_round=per_round, seed=i
            )
    records = []
    for project, shop in shops.items():
        for dlq in shop.dlqs:
            records += [record(project, m) for m in await listed(store, QueueRef(project, dlq))]
    yield DeadLetters(uri, namespace, shops, records)
    if isinstance(store, MongoStore):
        await store.drop_collections()
    await store.aclose()


async def listed(store: Store, q: QueueRef) -> list[Message]:
    return await all_messages(
        store,
        q,
        limit=100,
        echo=True,
        client_id=scenario.CLIENT_ID,
        include_claimed=True,
        include_delayed=True,
    )


def record(project: str, m: Message, max_body_bytes: int = scenario.TEST_MAX_BODY_BYTES) -> dict[str, Any]:
    """A message as records.SCHEMA has it, from the driver's Message."""
    body = orjson.dumps(m.body)
    d = m.dead_letter
    rejection = d.rejection if d else None
    return {
        "project": project,
        "queue": m.queue,
        "id": m.id,
        "body": body.decode() if len(body) <= max_body_bytes else None,
        "body_bytes": len(body),
        "created_ms": m.created_ms,
        "claim_count": m.claim_count,
        "source_queue": d.source_queue if d else None,
        "reason": d.reason if d else None,
        "dl_claim_count": d.claim_count if d else None,
        "dead_lettered_at_ms": d.dead_lettered_at_ms if d else None,
        "first_enqueued_at_ms": d.first_enqueued_at_ms if d else None,
        "redrive_count": d.redrive_count if d else None,
        "rejection_reason": rejection.reason if rejection else None,
        "rejection_description": rejection.description if rejection else None,
    }
