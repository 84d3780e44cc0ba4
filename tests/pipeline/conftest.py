"""One local[2] SparkSession for every pipeline test, and per driver one store full of real dead letters made
through the HTTP API (scenario.py), with the same records read back through the driver's own listing: the
input of the plain-Python oracle, independent of the pipeline's readers. `pooled_dead_letters` makes them in
a pooled deployment: two Redis pools behind a catalogue, one project in each."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from core.models import Message, QueueRef
from pipeline import hadoop, trends
from pipeline.insights import in_order
from pipeline.load import DeadLetterStore
from pipeline.spark import session
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.pooling.store import PooledStore, home_pool
from storage.registry import open_store
from tests.conftest import close_pooled
from tests.contract.helpers import all_messages
from tests.pipeline import scenario
from tests.servers import RedisServer


def written(out: Path, name: str) -> list[dict[str, Any]]:
    """A table as Spark wrote it into `out` (a directory of Parquet files, in no order), in its order."""
    rows: list[dict[str, Any]] = in_order(name, pq.read_table(out / "tables" / f"{name}.parquet")).to_pylist()
    return rows


def previous(spark: SparkSession, out: Path, scope: dict[str, Any], **kw: Any) -> trends.Run | None:
    """trends.previous in a local directory."""
    uri = hadoop.location(out)
    return trends.previous(hadoop.Files(spark, uri), uri, scope, **kw)


PROJECTS = {"shop": (5, 8), "tenant-b": (2, 4)}  # project -> (rounds, messages per queue and round)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    spark = session("local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    # How plans run, not what they compute: on the tests' few hundred rows, compiling generated code and
    # re-planning each stage took a third of the JVM's CPU. The runs in a process of their own (test_cli,
    # test_cluster, tests/deploy) keep Spark's defaults, so those paths stay tested.
    for key in ("spark.sql.codegen.wholeStage", "spark.sql.adaptive.enabled"):
        spark.conf.set(key, "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    yield spark
    spark.stop()


@pytest.fixture(autouse=True)
def _uncache() -> Iterator[None]:
    """Each test's cached tables dropped after it (aggregate.analyse caches them until release(), which a
    test keeping its Insights does not call): the session's executor is the driver's 1 GiB heap."""
    yield
    active = SparkSession.getActiveSession()
    if active is not None:
        active.catalog.clearCache()


@dataclass
class DeadLetters:
    store: DeadLetterStore  # where the pipeline reads them
    shops: dict[str, scenario.Shop]
    records: list[dict[str, Any]]  # every DLQ message of every project, as the driver lists them
    pools: dict[str, str] | None = None  # pooled: the pool of each project

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
    settings = Settings(storage_uri=uri, namespace=namespace)
    shops, records = await fill(store, settings, clock)
    yield DeadLetters(DeadLetterStore(uri, namespace), shops, records)
    if isinstance(store, MongoStore):
        await store.drop_collections()
    await store.aclose()


@pytest.fixture(scope="module")
async def pooled_dead_letters(redis_url: str) -> AsyncIterator[DeadLetters]:
    """Pool red<i> (the catalogue's Redis, keys under its own `namespace` option) and pool blue<i> (a second
    redis-server, the service's namespace), each holding the queues of one of the two projects."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    second = RedisServer().start()
    pools = split_pools(
        {"red": (redis_url, {"namespace": f"{namespace}-red"}), "blue": (second.url, {})}, list(PROJECTS)
    )
    catalogue = RedisCatalogue.from_url(redis_url, namespace=namespace)
    for pool in pools:
        await catalogue.put_pool(pool)
    clock = ManualClock()
    store = PooledStore(catalogue, namespace=namespace, clock=clock)
    settings = Settings(storage_uri=redis_url, namespace=namespace, pooling=True)
    try:
        shops, records = await fill(store, settings, clock)
        where = {p: home_pool(p, pools).name for p in PROJECTS}
        yield DeadLetters(DeadLetterStore(redis_url, namespace, pooled=True), shops, records, where)
    finally:
        await close_pooled(store)
        second.stop()


def split_pools(pools: dict[str, tuple[str, dict[str, Any]]], projects: list[str]) -> list[Pool]:
    """The pools, named so that the two projects are placed in different ones."""
    for i in range(1000):
        named = [Pool(f"{name}{i}", uri, weight=10, options=opts) for name, (uri, opts) in pools.items()]
        if len({home_pool(p, named).name for p in projects}) == len(projects):
            return named
    raise AssertionError("no pool names split the projects")


async def fill(
    store: Store, settings: Settings, clock: ManualClock
) -> tuple[dict[str, scenario.Shop], list[dict[str, Any]]]:
    """The scenario of every project through the HTTP API over `store`; what it did, and the DLQs' records."""
    app = create_app(settings, store=store, clock=clock)
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
    return shops, records


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
        "consumer": d.consumer if d else None,
    }
