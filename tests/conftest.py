"""Fixtures: a real redis-server and a real MongoDB wire-protocol server per session, a fresh namespace and a
manual clock per test.

`store` is parametrised over every driver, so every contract and API test runs on each of them.
Set CHARON_TEST_REDIS_URL to use a Redis you run instead of starting one, and MONGODB_URI to use a real
mongod (a replica set; one node is enough) instead of the SecantusDB server the session starts. On a mongod
the tests use a database `charon_test_<random>`, dropped at the end.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

from api.state import state_of
from app.embedded import die_with_parent
from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from core.metadata import DeadLetterDefaults
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.pooling.store import PooledStore
from storage.redis.store import RedisStore
from tests.keystone import KEYSTONE_VENV, KeystoneServer
from tests.keystone import available as keystone_available
from tests.receivers import HttpReceiver, SmtpReceiver
from tests.servers import (
    MongoServer,
    RedisCluster,
    RedisSentinels,
    RedisServer,
    ReplicatedRedisCluster,
    reap,
)

PROJECT = "project-a"
# SecantusDB is a Python server whose answers under the contract suite's load take seconds, far past what a
# real mongod needs; its stores get this timeout (CHARON_STORAGE_TIMEOUT) instead of the default 5 s.
SLOW_SERVER_TIMEOUT_S = 60.0
CLIENT_ID = "3381af92-2b9e-11e3-b191-71861300734c"
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# --- An interrupted run stops its servers -------------------------------------------------------------------
# SIGTERM, as SIGINT, ends the run through KeyboardInterrupt, so that the fixtures' teardown stops what they
# started (by default SIGTERM kills pytest at once). SIGINT is honoured even when inherited ignored, as a
# script's `make test &` starts it. Whatever teardown did not stop, reap() kills as the run ends.
_PREVIOUS_HANDLERS: dict[signal.Signals, Any] = {}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def pytest_configure(config: pytest.Config) -> None:
    for sig, handler in ((signal.SIGTERM, _interrupt), (signal.SIGINT, signal.default_int_handler)):
        _PREVIOUS_HANDLERS[sig] = signal.signal(sig, handler)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: SIGTERM, so its teardown, when the run dies
        die_with_parent(signal.SIGTERM)
    # The tests' JVMs (Spark's: the session, `charon insights`, spark-submit, a standalone cluster) compile
    # with C1 alone and collect with the serial GC: on the tests' small data, 19 % less CPU for
    # tests/pipeline/test_insights.py (138 -> 113 s) in the same wall time, which a parallel run gains.
    os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)


def pytest_unconfigure(config: pytest.Config) -> None:
    reap()
    for sig, handler in _PREVIOUS_HANDLERS.items():
        signal.signal(sig, handler)
    _PREVIOUS_HANDLERS.clear()


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """Each test leaves os.environ as it found it. `charon --config FILE`, run in-process, sets CHARON_CONFIG
    for the processes it starts; left over, it sent every `charon serve` started later in the same worker to
    that test's file and its long-gone Redis."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("CHARON_TEST_REDIS_URL")
    if external:
        yield external
        return
    server = RedisServer().start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A real 3-primary Redis Cluster (CHARON_TEST_REDIS_CLUSTER_URL to use one you run)."""
    external = os.environ.get("CHARON_TEST_REDIS_CLUSTER_URL")
    if external:
        yield external
        return
    cluster = RedisCluster().start()
    yield cluster.url
    cluster.stop()


def with_database(uri: str, database: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def mongodb_uri() -> Iterator[str]:
    external = os.environ.get("MONGODB_URI")
    server = None if external else MongoServer().start()
    base = external or server.url  # type: ignore[union-attr]
    database = f"charon_test_{uuid.uuid4().hex[:8]}"
    yield with_database(base, database)
    if server is not None:
        server.stop()
        return
    with pymongo.MongoClient(base) as client:
        client.drop_database(database)


@pytest.fixture(scope="module", params=["redis", "mongo"])
def storage_uri(request: pytest.FixtureRequest) -> str:
    """The URI of each driver's test server, for tests that run a live service process."""
    uri: str = request.getfixturevalue("redis_url" if request.param == "redis" else "mongodb_uri")
    return uri


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def redis_store(redis_url: str, clock: ManualClock) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock)
    yield store
    await store.aclose()


@pytest.fixture
async def cluster_store(redis_cluster_url: str, clock: ManualClock) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_cluster_url, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock)
    yield store
    await store.aclose()


@pytest.fixture
async def mongo_store(mongodb_uri: str, clock: ManualClock) -> AsyncIterator[MongoStore]:
    store = MongoStore.from_url(
        mongodb_uri, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock, timeout=SLOW_SERVER_TIMEOUT_S
    )
    yield store
    await store.drop_collections()
    await store.aclose()


async def pooled(
    redis_url: str,
    mongodb_uri: str,
    clock: ManualClock,
    *,
    heavy: str,
    defaults: DeadLetterDefaults | None = None,
) -> AsyncIterator[PooledStore]:
    """A Redis pool and a MongoDB pool behind one API, the catalogue in Redis. The `heavy` pool weighs 1000
    and the other 1, so the test's project lands in the heavy one (its DLQs with it)."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    catalogue = RedisCatalogue.from_url(redis_url, namespace=namespace)
    for name, uri in (("redis", redis_url), ("mongo", mongodb_uri)):
        weight = 1000 if name == heavy else 1
        await catalogue.put_pool(Pool(name, uri, weight=weight, options={"namespace": namespace}))
    store = PooledStore(
        catalogue,
        namespace=namespace,
        clock=clock,
        defaults=defaults,
        timeout=SLOW_SERVER_TIMEOUT_S,
        management=RedisStore.from_url(redis_url, namespace=namespace, clock=clock),  # quotas
    )
    yield store
    await close_pooled(store)


async def close_pooled(store: PooledStore) -> None:
    """Drop what a test left in its MongoDB pools (Redis namespaces are per test), then close every pool."""
    for driver in store.opened().values():
        if isinstance(driver, MongoStore):
            await driver.drop_collections()
    await store.aclose()


@pytest.fixture
async def pooled_redis(redis_url: str, mongodb_uri: str, clock: ManualClock) -> AsyncIterator[PooledStore]:
    async for store in pooled(redis_url, mongodb_uri, clock, heavy="redis"):
        yield store


@pytest.fixture
async def pooled_mongo(redis_url: str, mongodb_uri: str, clock: ManualClock) -> AsyncIterator[PooledStore]:
    async for store in pooled(redis_url, mongodb_uri, clock, heavy="mongo"):
        yield store


# The five stores a test marked `every_store` runs on (the contract suite, and API tests whose behaviour
# depends on the store); every other test that takes `store` (or `client`) runs on Redis alone. `--store ID`
# (repeatable) narrows the five: `make test-fast` runs `--store redis`.
STORES = {
    "redis": "redis_store",
    "mongo": "mongo_store",
    "cluster": "cluster_store",
    "pooled-redis": "pooled_redis",
    "pooled-mongo": "pooled_mongo",
}
ONE_STORE = "redis"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store",
        action="append",
        choices=list(STORES),
        help="run the every_store tests on this store only (repeatable; default: all five)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store" not in metafunc.fixturenames:
        return
    chosen = metafunc.config.getoption("store") or list(STORES)
    if metafunc.definition.get_closest_marker("every_store") is not None:
        ids = [i for i in STORES if i in chosen]
    else:
        ids = [ONE_STORE]
    metafunc.parametrize("store", [STORES[i] for i in ids], ids=ids, indirect=True)


SPARK_TESTS = "tests/pipeline/"
# Started first, in this order: the longest units of work, so that no worker idles at the end. Zaqar's tempest
# tests (about 3 minutes) mostly sleep (one test's 140 s), as do the zaqar package's (61 s, in the same file):
# beside Spark on the other worker, that is free.
FIRST = (SPARK_TESTS, "tests/acceptance/test_tempest.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """What a test needs, as markers `-m` selects on: a real Keystone (`keystone`), Spark (`spark`). The
    FIRST tests come first."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "keystone" in names:
            item.add_marker(pytest.mark.keystone)
        if item.nodeid.startswith(SPARK_TESTS):
            item.add_marker(pytest.mark.spark)
    rank = {prefix: i for i, prefix in enumerate(FIRST)}
    items.sort(key=lambda item: next((i for p, i in rank.items() if item.nodeid.startswith(p)), len(FIRST)))


class _FilesSparkAsOne(LoadFileScheduling):
    """pytest-xdist's `--dist loadfile` (a file's tests to one worker, so its module fixtures are made once),
    with every Spark test in one unit: one worker starts a JVM, not each."""

    def _split_scope(self, nodeid: str) -> str:
        return SPARK_TESTS if nodeid.startswith(SPARK_TESTS) else super()._split_scope(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    """`make test` runs `pytest -n auto --dist loadfile`: the tests go to the workers by _FilesSparkAsOne."""
    return _FilesSparkAsOne(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Store:
    """The store of the test's parameter (pytest_generate_tests): Redis, or each of STORES for every_store."""
    driver: Store = request.getfixturevalue(request.param)
    return driver


@pytest.fixture
def scale(store: Store) -> float:
    """The share of a load test's full size to run: SecantusDB is a Python server, two orders of magnitude
    slower than mongod under contention, so load tests on it run at a tenth (in full on a real mongod)."""
    if isinstance(store, MongoStore | PooledStore) and not os.environ.get(
        "MONGODB_URI"
    ):  # a pooled one: both
        return 0.1
    return 1.0


@pytest.fixture
def settings() -> Settings:
    return Settings(storage_uri="redis://unused")


def api_client(app: FastAPI) -> httpx.AsyncClient:
    """An HTTP client on `app` (in process, no lifespan) with the Client-ID and project headers set."""
    headers = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://charon", headers=headers
    )


@pytest.fixture
async def client(store: Store, clock: ManualClock, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, store=store, clock=clock)
    async with api_client(app) as c:
        yield c
    await state_of(
        app
    ).long_polls.aclose()  # no lifespan here: its long polls' subscriptions end with the test


AUTO_DLQ = DeadLetterDefaults(max_claim_count=2, template="{queue}.DLQ")


@pytest.fixture(params=["redis", "mongo", "pooled-redis"])
async def defaulted_store(
    request: pytest.FixtureRequest, redis_url: str, mongodb_uri: str, clock: ManualClock
) -> AsyncIterator[Store]:
    """A store of each kind run with the operator's dead-letter defaults AUTO_DLQ."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "pooled-redis":
        async for pooled_store in pooled(redis_url, mongodb_uri, clock, heavy="redis", defaults=AUTO_DLQ):
            yield pooled_store
        return
    if request.param == "redis":
        store: Store = RedisStore.from_url(redis_url, namespace=namespace, clock=clock, defaults=AUTO_DLQ)
    else:
        store = MongoStore.from_url(
            mongodb_uri, namespace=namespace, clock=clock, defaults=AUTO_DLQ, timeout=SLOW_SERVER_TIMEOUT_S
        )
    yield store
    if isinstance(store, MongoStore):
        await store.drop_collections()
    await store.aclose()


@pytest.fixture(scope="session")
def keystone() -> Iterator[KeystoneServer]:
    """A real Keystone (tests/keystone.py) from .venv-keystone, which `make install` makes: missing, the tests
    that use it fail (they are not skipped)."""
    if not keystone_available():
        pytest.fail(
            f"Keystone is not installed ({KEYSTONE_VENV} is missing): run `make install`", pytrace=False
        )
    server = KeystoneServer().start()
    yield server
    server.stop()


# --- Notification receivers (tests/receivers.py) -----------------------------------------------------------
# Real servers on free loopback ports, each in a thread of its own: usable from async tests in this process
# (`await receiver.arrived(n)`) and from a live `charon serve` (`CharonProcess(uri,
# env=notification_env(smtp_receiver))`, then `receiver.wait_for(n)`). Webhooks to them need loopback
# allowed: NotificationSettings(allowed_networks=LOOPBACK_NETWORKS), which notification_env sets.


@pytest.fixture
def webhook_receiver() -> Iterator[HttpReceiver]:
    """An HTTP receiver answering 200 (change it with .answer(status), .fail(n), .hang())."""
    receiver = HttpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def failing_receiver() -> Iterator[HttpReceiver]:
    """An HTTP receiver answering its first 2 requests 503, then 200 (.fail(n, status) to change that)."""
    receiver = HttpReceiver().start()
    receiver.fail(2)
    yield receiver
    receiver.stop()


@pytest.fixture
def hanging_receiver() -> Iterator[HttpReceiver]:
    """An HTTP receiver that records every request and never answers (until the test ends)."""
    receiver = HttpReceiver().start()
    receiver.hang()
    yield receiver
    receiver.stop()


@pytest.fixture
def smtp_receiver() -> Iterator[SmtpReceiver]:
    """An SMTP server (aiosmtpd) recording every mail; .fail(n) refuses the next n with a 451."""
    receiver = SmtpReceiver().start()
    yield receiver
    receiver.stop()


# --- Replicated Redis (tests/servers.py): the failover tests change who is primary, so none is shared ------


@pytest.fixture
def redis_sentinels(request: pytest.FixtureRequest) -> Iterator[RedisSentinels]:
    """A Redis primary, one replica (or as many as the test's indirect parameter says) and three sentinels,
    of the test's own; `.url` is its redis+sentinel:// URI, `.zaqar_url` the same in Zaqar's form."""
    group = RedisSentinels(replicas=getattr(request, "param", 1))
    try:
        yield group.start()
    finally:
        group.stop()


@pytest.fixture
def replicated_cluster() -> Iterator[ReplicatedRedisCluster]:
    """A Redis Cluster of 3 primaries, a replica each, a 1 s cluster-node-timeout; of the test's own."""
    cluster = ReplicatedRedisCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
