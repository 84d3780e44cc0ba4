"""The dead-letter export (storage/export.py) of a Redis or Redis Cluster store, on synchronous redis-py
clients: it runs in Spark's Python workers, outside any event loop. Every key and field name is keys.py's.

A page is two round trips: ZRANGE BYSCORE over the queue's msgs for the next ids and markers, then one
HMGET per id, the commands packed here in one buffer and sent at once (redis-py's pipeline spent most of its
time packing commands; the earlier Lua script that did the HMGETs inside Redis took 2.5x the server's time
per message: `bench/RESULTS.md`). The message keys carry the project's hash tag, so on a Redis Cluster the
page is read from the one node that holds the queue's slot.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import compress
from typing import Any

import redis
import redis.exceptions

from core.errors import StorageUnavailable
from core.models import PROVENANCE
from storage.export import PAGE_SIZE, Extent, Page, Slice, Value, shown
from storage.redis.keys import DEAD_LETTER_FIELDS, MessageField, ProjectKeys, QueueField, projects_key
from storage.redis.uri import open_sync_client

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # a page of large bodies from a busy server

# The export's columns (after id and marker, which the ZRANGE gives) as message hash fields.
COLUMN_FIELDS = {
    "body": MessageField.BODY,
    "created_ms": MessageField.CREATED,
    "claim_count": MessageField.CLAIM_COUNT,
    **{p.export_column: DEAD_LETTER_FIELDS[p.key] for p in PROVENANCE},
}
# One HMGET in RESP, but for the key: the expiry first (a message whose hash is gone has none), then the
# columns' fields.
_FIELDS = [str(MessageField.EXPIRES), *(str(f) for f in COLUMN_FIELDS.values())]
_HMGET_HEAD = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(_FIELDS))
_HMGET_FIELDS = b"".join(b"$%d\r\n%s\r\n" % (len(f), f.encode()) for f in _FIELDS)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisExport:
    def __init__(self, uri: str, *, namespace: str = "charon") -> None:
        self.uri, self.namespace = uri, namespace

    def _client(self) -> redis.Redis | redis.RedisCluster:
        return open_sync_client(self.uri, connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S)

    def extents(self, project: str | None, names: Sequence[str] | None) -> list[Extent]:
        with self._unavailable_as_error():
            client = self._client()  # a RedisCluster connects as it is made
            try:
                if project:
                    projects = [project]
                else:
                    projects = sorted(_text(p) for p in client.smembers(projects_key(self.namespace)))
                return [e for p in projects for e in self._extents(client, p, names)]
            finally:
                client.close()

    @contextmanager
    def _unavailable_as_error(self) -> Iterator[None]:
        """redis-py's errors, the cluster client's own included (not RedisErrors), as StorageUnavailable."""
        try:
            yield
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            raise StorageUnavailable(f"Cannot read Redis at {shown(self.uri)}: {e}") from e

    def _extents(
        self, client: redis.Redis | redis.RedisCluster, project: str, names: Sequence[str] | None
    ) -> list[Extent]:
        keys = ProjectKeys.of(self.namespace, project)
        if names is None:
            names = self._dead_letter_queues(client, keys)
        pipe = client.pipeline(transaction=False)
        for n in names:
            pipe.zcard(keys.messages(n))
            pipe.zrange(keys.messages(n), 0, 0, withscores=True)
            pipe.zrange(keys.messages(n), -1, -1, withscores=True)
        replies = pipe.execute()
        out = []
        for i, n in enumerate(names):
            count, first, last = replies[3 * i : 3 * i + 3]
            if count:
                out.append(Extent(project, n, count, int(first[0][1]), int(last[0][1])))
        return out

    @staticmethod
    def _dead_letter_queues(client: redis.Redis | redis.RedisCluster, keys: ProjectKeys) -> list[str]:
        """The project's queues that some queue names as its DLQ or that have received dead letters."""
        existing = [_text(n) for n in client.zrange(keys.queues, 0, -1)]
        pipe = client.pipeline(transaction=False)
        for n in existing:
            pipe.hmget(keys.queue(n), [QueueField.DLQ, QueueField.RECEIVED])
        named = set()
        for n, (dlq, received) in zip(existing, pipe.execute(), strict=True):
            if dlq:
                named.add(_text(dlq))
            if received and int(received) > 0:
                named.add(n)
        return sorted(named.intersection(existing))

    def read(self, part: Slice) -> Iterator[Page]:
        with self._unavailable_as_error():
            client = self._client()
            try:
                yield from self._read(client, part)
            finally:
                client.close()

    def _read(self, client: redis.Redis | redis.RedisCluster, part: Slice) -> Iterator[Page]:
        keys = ProjectKeys.of(self.namespace, part.project)
        msgs, prefix = keys.messages(part.queue), keys.message_prefix.encode()
        lo = part.lo
        while lo <= part.hi:
            with _no_gc():
                if isinstance(client, redis.RedisCluster):
                    ids, markers, rows = _fetch_in_cluster(client, msgs, prefix, lo, part.hi)
                else:
                    ids, markers, rows = _fetch(client, msgs, prefix, lo, part.hi)
                columns = _columns(ids, markers, rows, part.now_ms)
            if markers:
                lo = markers[-1] + 1
            if columns is not None:
                yield Page(part.project, part.queue, columns)
            if len(markers) < PAGE_SIZE:
                return


Fetched = tuple[list[Any], list[int], list[Any]]  # ids, markers, and each id's HMGET of _FIELDS


def _fetch(node: redis.Redis, msgs: str, prefix: bytes, lo: int, hi: int) -> Fetched:
    """Up to PAGE_SIZE messages of `msgs` with markers from `lo` to `hi`, from one server: a ZRANGE, then
    the HMGETs packed in one buffer and their replies read as sent."""
    page = _Raw(node)
    try:
        # [[id, marker], ...] in RESP3 (redis-py's default), flat [id, marker, ...] in RESP2; as the server
        # sent it (redis-py's callback, which makes legacy pairs, cost 1.6 us a message)
        found = page.ask(
            page.pack("ZRANGE", msgs, lo, hi, "BYSCORE", "LIMIT", 0, PAGE_SIZE, "WITHSCORES"), 1
        )[0]
        if not found:
            return [], [], []
        if isinstance(found[0], list):
            ids, markers = [m for m, _ in found], [int(score) for _, score in found]
        else:
            ids, markers = found[0::2], [int(score) for score in found[1::2]]
        packed = [
            _HMGET_HEAD + b"$%d\r\n%s\r\n" % (len(prefix) + len(m), prefix + m) + _HMGET_FIELDS for m in ids
        ]
        return ids, markers, page.ask(b"".join(packed), len(ids))
    finally:
        page.done()


def _fetch_in_cluster(client: redis.RedisCluster, msgs: str, prefix: bytes, lo: int, hi: int) -> Fetched:
    """_fetch from the primary that holds the queue's slot (its messages' keys share it); when the slot has
    moved or is moving (MOVED, ASK: a reshard, a failover), the page again through redis-py's cluster
    routing, which follows the redirects and refreshes the slot map for the pages after."""
    node = client.get_node_from_key(msgs).redis_connection  # type: ignore[no-untyped-call]
    assert node is not None
    try:
        return _fetch(node, msgs, prefix, lo, hi)
    except redis.exceptions.AskError:  # MovedError is one too
        pass
    found: Any = client.zrange(msgs, lo, hi, byscore=True, offset=0, num=PAGE_SIZE, withscores=True)
    ids, markers = [m for m, _ in found], [int(score) for _, score in found]
    pipe = client.pipeline(transaction=False)  # type: ignore[no-untyped-call]
    for m in ids:
        pipe.hmget(prefix + m, _FIELDS)
    return ids, markers, pipe.execute()


def _columns(
    ids: list[Any], markers: list[int], rows: list[Any], now_ms: int
) -> dict[str, Sequence[Value]] | None:
    """A page's columns, of the messages whose hash is still there (it may have left the DLQ since the
    ZRANGE) and not expired at `now_ms`; None when none is."""
    if not ids:
        return None
    expires, *values = zip(*rows, strict=True)
    keep = [e is not None and int(e) > now_ms for e in expires]
    columns: dict[str, Sequence[Value]] = {"id": ids, "marker": markers}
    columns.update(zip(COLUMN_FIELDS, values, strict=True))
    if not all(keep):
        if not any(keep):
            return None
        columns = {name: list(compress(column, keep)) for name, column in columns.items()}
    return columns


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a page is read: the page's thousands of short-lived reply
    lists set it off again and again, and its passes were a third of the client's time per message
    (`bench/RESULTS.md`). The lists make no cycles: reference counting frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Raw:
    """Commands sent as packed here and their replies read as the server sent them (no redis-py response
    callback), on one connection of `client`'s pool, which is dropped if anything fails on the way (replies
    may be left unread)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client, self.conn = client, client.connection_pool.get_connection()
        self.failed = False

    def pack(self, *args: Any) -> bytes:
        return b"".join(self.conn.pack_command(*args))  # type: ignore[no-untyped-call]

    def ask(self, packed: bytes, replies: int) -> list[Any]:
        try:
            self.conn.send_packed_command([packed], check_health=False)  # type: ignore[no-untyped-call]
            return [self.conn.read_response() for _ in range(replies)]
        except BaseException:
            self.failed = True
            raise

    def done(self) -> None:
        """The connection back to the pool, closed first if a reply was cut short (whatever that raises)."""
        try:
            if self.failed:
                self.conn.disconnect()  # type: ignore[no-untyped-call]
        finally:
            self.client.connection_pool.release(self.conn)
