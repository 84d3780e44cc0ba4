"""Redis Sentinel URIs (storage/redis/uri.py): both forms read as documented, a malformed one refused with
what to fix (and no password shown), and a real primary behind three sentinels serving the store, the pool
catalogue and the dead-letter export, `?wait_replicas=` acknowledging a write only once a replica has it."""

from __future__ import annotations

import time
import uuid

import pytest

from core.clock import ManualClock
from core.errors import InvalidInput, OutcomeUnknown, StorageUnavailable
from core.limits import Limits
from core.metadata import parse_policy
from core.models import NewMessage, QueueRef
from storage.base import Store
from storage.export import shown
from storage.pooling.catalogue import Pool
from storage.redis.store import RedisStore
from storage.redis.uri import SentinelURI, sentinel_uri, wait_replicas
from storage.registry import open_catalogue, open_export, open_store
from tests.servers import RedisSentinels

S = [("10.0.0.1", 26379), ("10.0.0.2", 26380)]


async def post(store: Store, q: QueueRef, *bodies: object) -> None:
    await store.post_messages(
        q,
        [NewMessage(b, ttl=3600) for b in bodies],
        client_id="c",
        default_ttl=3600,
        default_delay=0,
        body_size=0,
    )


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("redis+sentinel://10.0.0.1,10.0.0.2:26380/mymaster", SentinelURI(tuple(S), "mymaster")),
        (
            "redis+sentinel://app:p%40ss@10.0.0.1,10.0.0.2:26380/mymaster/3?sentinel_password=s3"
            "&sentinel_username=sen&socket_timeout=2.5",
            SentinelURI(
                tuple(S),
                "mymaster",
                db=3,
                username="app",
                password="p@ss",
                sentinel_username="sen",
                sentinel_password="s3",
                socket_timeout=2.5,
            ),
        ),
        ("redis+sentinel://[::1]:5000/m", SentinelURI((("::1", 5000),), "m")),
        # Zaqar's form: redis://sentinels?master=
        ("redis://10.0.0.1,10.0.0.2:26380?master=mymaster", SentinelURI(tuple(S), "mymaster")),
        (
            "redis://:pw@10.0.0.1,10.0.0.2:26380?master=mymaster&dbid=2&sentinel_password=s3&socket_timeout=0.1",
            SentinelURI(
                tuple(S), "mymaster", db=2, password="pw", sentinel_password="s3", socket_timeout=0.1
            ),
        ),
        ("redis://10.0.0.1:26379/4?master=m", SentinelURI((S[0],), "m", db=4)),
    ],
)
def test_both_forms_of_a_sentinel_uri_are_read(uri: str, expected: SentinelURI) -> None:
    assert sentinel_uri(uri) == expected


@pytest.mark.parametrize(
    "uri", ["redis://h:6379/0", "rediss://h", "unix:///tmp/r.sock", "redis+cluster://h:1,h:2", "mongodb://h"]
)
def test_other_uris_are_not_sentinel_ones(uri: str) -> None:
    assert sentinel_uri(uri) is None


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("redis+sentinel://h1,h2/", "No service name"),
        ("redis+sentinel://h1,h2", "No service name"),
        ("redis+sentinel:///m", "No sentinel host"),
        ("redis+sentinel://h1,:26379/m", "A sentinel has no host name"),
        ("redis+sentinel://h1:port/m", "port 'port'"),
        ("redis+sentinel://h1:70000/m", "port '70000'"),
        ("redis+sentinel://::1/m", "write IPv6 as [address]"),
        ("redis+sentinel://h1/m/x", "database number must be a whole number from 0 (got 'x')"),
        ("redis+sentinel://h1/m/-1", "got '-1'"),
        ("redis+sentinel://h1/m?master=m", "Unknown option(s) master"),
        ("redis+sentinel://h1/m?socket_timeout=soon", "socket_timeout must be a positive number"),
        ("redis://h1,h2?master=", "Option master"),
        ("redis://h1?master=m&dbid=one", "got 'one'"),
        ("redis://h1/1?master=m&dbid=2", "both /1 and dbid=2"),
        ("redis://h1,h2", "?master=<service name>"),
        ("redis://h1,h2/0", "several hosts"),
        ("rediss://h1,h2", "several hosts"),
        ("rediss://h1,h2?master=m", "over TLS is not supported"),
    ],
)
def test_a_malformed_sentinel_uri_says_what_to_fix(uri: str, said: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        open_store(uri)
    assert said in str(raised.value)


def test_no_password_is_shown_in_what_is_refused() -> None:
    uri = "redis+sentinel://:data-pw@h1:x/m?sentinel_password=sentinel-pw"
    with pytest.raises(InvalidInput) as raised:
        open_store(uri)
    assert "data-pw" not in str(raised.value)
    assert "sentinel-pw" not in str(raised.value)
    assert shown(uri) == "redis+sentinel://***@h1:x/m?sentinel_password=***"


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("redis://h?wait_replicas=two", "whole number of replicas"),
        ("redis+sentinel://h/m?wait_replicas=-1", "whole number of replicas"),
        ("redis+cluster://h:1,h:2?wait_replicas=1", "not a Redis Cluster"),
    ],
)
def test_wait_replicas_is_a_number_of_replicas_on_one_server_or_sentinel(uri: str, said: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        open_store(uri)
    assert said in str(raised.value)
    assert wait_replicas("redis://h/0?wait_replicas=2") == 2
    assert wait_replicas("redis+sentinel://h/m") == 0


# -- a real primary behind sentinels -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("form", ["redis+sentinel", "zaqar"])
async def test_the_store_catalogue_and_export_work_on_the_primary_the_sentinels_name(
    redis_sentinels: RedisSentinels, form: str
) -> None:
    uri = redis_sentinels.url if form == "redis+sentinel" else redis_sentinels.zaqar_url
    namespace = f"s{uuid.uuid4().hex[:10]}"
    store = open_store(uri, namespace=namespace, clock=ManualClock())
    dlq = QueueRef("p", "dead")
    try:
        await store.create_queue(dlq, metadata={}, policy=parse_policy({}, Limits(), queue="dead"))
        await post(store, dlq, *range(3))
        assert (await store.stats(dlq)).total == 3
    finally:
        await store.aclose()
    primary = redis_sentinels.client(redis_sentinels.primary())
    assert primary.exists(f"{namespace}:projects")

    catalogue = open_catalogue(uri, namespace=namespace)
    try:
        await catalogue.put_pool(Pool("red", "redis://elsewhere", weight=1))
        assert [p.name for p in await catalogue.list_pools()] == ["red"]
    finally:
        await catalogue.aclose()

    export = open_export(uri, namespace=namespace)
    extents = export.extents("p", ["dead"])
    assert [(e.queue, e.count) for e in extents] == [("dead", 3)]


@pytest.mark.slow
@pytest.mark.parametrize("redis_sentinels", [2], indirect=True)
async def test_with_wait_replicas_a_write_no_replica_confirms_is_not_acknowledged(
    redis_sentinels: RedisSentinels,
) -> None:
    """`?wait_replicas=1`: a post returns once a replica has it; while the replicas' links are down it is
    answered OutcomeUnknown (it is on the primary, and a failover now could lose it) within the timeout."""
    timeout = 1.0
    store = RedisStore.from_url(redis_sentinels.url + "&wait_replicas=1", namespace="w", timeout=timeout)
    q = QueueRef("p", "q")
    try:
        await post(store, q, 1)
        replica = next(s for s in redis_sentinels.servers if s is not redis_sentinels.primary())
        assert redis_sentinels.client(replica).exists("w:projects")  # the replica had it when it returned
        with redis_sentinels.replicas_cut_off():
            start = time.monotonic()
            with pytest.raises(OutcomeUnknown) as raised:
                await post(store, q, 2)
            assert time.monotonic() - start < 2 * timeout
        assert "0 of the 1 replicas" in str(raised.value)
    finally:
        await store.aclose()


async def test_wait_replicas_on_one_server_without_replicas_acknowledges_no_write(redis_url: str) -> None:
    """`redis://...?wait_replicas=1` on a server no replica follows: every write is answered OutcomeUnknown
    within the timeout (it is on the server, unconfirmed), and reads go on."""
    store = RedisStore.from_url(
        f"{redis_url}?wait_replicas=1", namespace=f"w{uuid.uuid4().hex[:8]}", timeout=0.3
    )
    q = QueueRef("p", "q")
    try:
        start = time.monotonic()
        with pytest.raises(OutcomeUnknown) as raised:
            await post(store, q, 1)
        assert time.monotonic() - start < 0.6
        assert "0 of the 1 replicas" in str(raised.value)
        assert (await store.stats(q)).total == 1  # written, and readable, but never acknowledged
    finally:
        await store.aclose()


async def test_a_database_number_past_the_servers_is_a_503_saying_so(redis_url: str) -> None:
    """A URI whose database the server does not have (`databases`, 16 by default) cannot be refused before
    connecting; every call then fails StorageUnavailable naming the database number, never a raw error."""
    store = RedisStore.from_url(redis_url.rsplit("/", 1)[0] + "/99", namespace="db")
    try:
        with pytest.raises(StorageUnavailable) as raised:
            await store.stats(QueueRef("p", "q"))
        assert "database number" in str(raised.value)
    finally:
        await store.aclose()
