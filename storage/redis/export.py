"""The dead-letter export (storage/export.py) of a Redis or Redis Cluster store, on synchronous redis-py
clients: it runs in Spark's Python workers, outside any event loop. Every key and field name is keys.py's.

A page is one call of export_dead_letters.lua (ZRANGE BYSCORE over the queue's msgs, then one HMGET per
message inside Redis) and arrives as one flat array: a pipeline of HMGETs spent most of its time packing
commands in redis-py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import redis

from core.errors import StorageUnavailable
from storage.export import PAGE_SIZE, Extent, Page, Slice, Value, shown
from storage.redis.keys import MessageField, ProjectKeys, QueueField, projects_key
from storage.redis.store import CLUSTER_SCHEMES, cluster_options

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # a page of large bodies from a busy server

# The export's columns (after id and marker, which the script adds) as message hash fields.
COLUMN_FIELDS = {
    "body": MessageField.BODY,
    "created_ms": MessageField.CREATED,
    "claim_count": MessageField.CLAIM_COUNT,
    "source_queue": MessageField.DL_SOURCE,
    "reason": MessageField.DL_REASON,
    "dl_claim_count": MessageField.DL_CLAIM_COUNT,
    "dead_lettered_at_ms": MessageField.DL_AT,
    "first_enqueued_at_ms": MessageField.DL_FIRST,
    "redrive_count": MessageField.REDRIVES,
    "rejection_reason": MessageField.REJECT_REASON,
    "rejection_description": MessageField.REJECT_DESCRIPTION,
    "consumer": MessageField.DL_CONSUMER,
}
_FIELD_ARGS = [str(MessageField.EXPIRES), *(str(f) for f in COLUMN_FIELDS.values())]
_WIDTH = 2 + len(COLUMN_FIELDS)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _script() -> str:
    return (resources.files(__package__) / "lua" / "export_dead_letters.lua").read_text(encoding="utf-8")


class RedisExport:
    def __init__(self, uri: str, *, namespace: str = "charon") -> None:
        self.uri, self.namespace = uri, namespace

    def _client(self) -> redis.Redis | redis.RedisCluster:
        timeouts: dict[str, Any] = {
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "socket_timeout": READ_TIMEOUT_S,
        }
        if urlsplit(self.uri).scheme in CLUSTER_SCHEMES:
            return redis.RedisCluster(**cluster_options(self.uri), **timeouts)
        return redis.Redis.from_url(self.uri, **timeouts)

    def _unavailable(self, e: Exception) -> StorageUnavailable:
        return StorageUnavailable(f"Cannot read Redis at {shown(self.uri)}: {e}")

    def extents(self, project: str | None, names: Sequence[str] | None) -> list[Extent]:
        client = self._client()
        try:
            if project:
                projects = [project]
            else:
                projects = sorted(_text(p) for p in client.smembers(projects_key(self.namespace)))
            return [e for p in projects for e in self._extents(client, p, names)]
        except redis.RedisError as e:
            raise self._unavailable(e) from e
        finally:
            client.close()

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
        client = self._client()
        try:
            yield from self._read(client, part)
        except redis.RedisError as e:
            raise self._unavailable(e) from e
        finally:
            client.close()

    def _read(self, client: redis.Redis | redis.RedisCluster, part: Slice) -> Iterator[Page]:
        keys = ProjectKeys.of(self.namespace, part.project)
        msgs, prefix = keys.messages(part.queue), keys.message_prefix
        script = client.register_script(_script())
        lo = part.lo
        while lo <= part.hi:
            last, flat = script(keys=[msgs], args=[prefix, lo, part.hi, PAGE_SIZE, part.now_ms, *_FIELD_ARGS])
            if int(last) < 0:
                return
            lo = int(last) + 1
            if not flat:
                continue
            columns: dict[str, Sequence[Value]] = {"id": flat[0::_WIDTH], "marker": flat[1::_WIDTH]}
            for j, name in enumerate(COLUMN_FIELDS):
                columns[name] = flat[j + 2 :: _WIDTH]
            yield Page(part.project, part.queue, columns)
