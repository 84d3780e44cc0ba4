"""Read a store's dead letters straight from Redis or MongoDB, in marker ranges that can be read in parallel.

`open_source(uri)` gives a Source. `plan()` runs once (Spark runs it in a Python process beside the driver)
and cuts every DLQ into slices of contiguous markers; `read(slice)` runs wherever a task runs, opens its own
synchronous client and yields Arrow batches (records.py). A marker range is stable while the service runs: a
message keeps its marker while it stays in the queue, so no message is read twice, and one that leaves the
DLQ during the read is simply not seen. Messages past their expiry are skipped, as the API would.

Which queues are DLQs: those given, else every queue that some queue's metadata names as its
`_dead_letter_queue` or that has received dead letters (the operator's `{queue}.DLQ` template included).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import pyarrow as pa

from pipeline.records import batch
from storage.redis.keys import QueueKeys, project_prefix, projects_key
from storage.registry import MONGODB_SCHEMES, REDIS_SCHEMES, unsupported_scheme

READ_CHUNK = 2_000  # messages fetched per round trip (and per Arrow batch)
READ_SCRIPT = Path(__file__).with_name("read_dead_letters.lua")
CONNECT_TIMEOUT_S = 5.0


class SourceError(Exception):
    """The store cannot be read (unreachable, refused, unknown scheme): the message says what to change."""


@dataclass(frozen=True, slots=True)
class Slice:
    """Messages of one DLQ whose markers are in [lo, hi], not expired at `now_ms`. Picklable: Spark ships
    it to the task that reads it."""

    project: str
    queue: str
    lo: int
    hi: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class QueueExtent:
    project: str
    queue: str
    count: int
    lo: int
    hi: int


class Source(Protocol):
    def queues(self, project: str | None, names: Sequence[str] | None) -> list[QueueExtent]: ...

    def read(self, s: Slice, *, max_body_bytes: int | None) -> Iterator[pa.RecordBatch]: ...


def open_source(uri: str, *, namespace: str = "charon") -> Source:
    scheme = urlsplit(uri).scheme
    if scheme in REDIS_SCHEMES:
        return RedisSource(uri, namespace)
    if scheme in MONGODB_SCHEMES:
        return MongoSource(uri, namespace)
    raise SourceError(unsupported_scheme(scheme))


def plan(extents: Sequence[QueueExtent], *, slices: int, now_ms: int | None = None) -> list[Slice]:
    """About `slices` slices over all the queues, each with a share of the messages: a queue gets slices in
    proportion to its count (at least one), cut into equal marker ranges."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    total = sum(e.count for e in extents)
    out: list[Slice] = []
    for e in extents:
        if e.count == 0:
            continue
        n = max(1, min(e.count, round(slices * e.count / total)))
        width = -(-(e.hi - e.lo + 1) // n)
        out.extend(
            Slice(e.project, e.queue, lo, min(lo + width - 1, e.hi), now_ms)
            for lo in range(e.lo, e.hi + 1, width)
        )
    return out


# Message hash fields (storage/redis/lua/lib.lua) in records.SCHEMA's terms.
REDIS_FIELDS = {
    "body": "b",
    "created_ms": "cr",
    "claim_count": "cc",
    "source_queue": "dsrc",
    "reason": "drsn",
    "dl_claim_count": "dcc",
    "dead_lettered_at_ms": "dat",
    "first_enqueued_at_ms": "dfirst",
    "redrive_count": "drc",
    "rejection_reason": "drr",
    "rejection_description": "drd",
}


class RedisSource:
    def __init__(self, uri: str, namespace: str):
        self.uri, self.namespace = uri, namespace

    def _client(self) -> Any:
        import redis

        from storage.redis.store import CLUSTER_SCHEMES, cluster_options

        timeouts: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": 60.0}
        if urlsplit(self.uri).scheme in CLUSTER_SCHEMES:
            return redis.RedisCluster(**cluster_options(self.uri), **timeouts)
        return redis.Redis.from_url(self.uri, **timeouts)

    def queues(self, project: str | None, names: Sequence[str] | None) -> list[QueueExtent]:
        import redis

        client = self._client()
        try:
            if project:
                projects = [project]
            else:
                projects = sorted(p.decode() for p in client.smembers(projects_key(self.namespace)))
            return [e for p in projects for e in self._extents(client, p, names)]
        except redis.RedisError as e:
            raise SourceError(f"Cannot read Redis at {self.uri}: {e}") from e
        finally:
            client.close()

    def _extents(self, client: Any, project: str, names: Sequence[str] | None) -> list[QueueExtent]:
        prefix = project_prefix(self.namespace, project)
        if names is None:
            existing = [n.decode() for n in client.zrange(f"{prefix}queues", 0, -1)]
            pipe = client.pipeline(transaction=False)
            for n in existing:
                pipe.hmget(QueueKeys(prefix, n).queue, "dlq", "n_rcv")
            named = set()
            for n, (dlq, received) in zip(existing, pipe.execute(), strict=True):
                if dlq:
                    named.add(dlq.decode())
                if received and int(received) > 0:
                    named.add(n)
            names = sorted(named.intersection(existing))
        pipe = client.pipeline(transaction=False)
        for n in names:
            msgs = f"{QueueKeys(prefix, n).queue}:msgs"
            pipe.zcard(msgs)
            pipe.zrange(msgs, 0, 0, withscores=True)
            pipe.zrange(msgs, -1, -1, withscores=True)
        replies = pipe.execute()
        out = []
        for i, n in enumerate(names):
            count, first, last = replies[3 * i : 3 * i + 3]
            if count:
                out.append(QueueExtent(project, n, count, int(first[0][1]), int(last[0][1])))
        return out

    def read(self, s: Slice, *, max_body_bytes: int | None) -> Iterator[pa.RecordBatch]:
        client = self._client()
        try:
            yield from self._read(client, s, max_body_bytes)
        finally:
            client.close()

    def _read(self, client: Any, s: Slice, max_body_bytes: int | None) -> Iterator[pa.RecordBatch]:
        """Pages of READ_CHUNK messages, each one script call (read_dead_letters.lua): a pipeline of HMGETs
        spent most of its time packing commands in redis-py, and the page arrives as one flat array."""
        prefix = project_prefix(self.namespace, s.project)
        msgs = f"{QueueKeys(prefix, s.queue).queue}:msgs"
        script = client.register_script(READ_SCRIPT.read_text())
        width = 2 + len(REDIS_FIELDS)
        lo = s.lo
        while lo <= s.hi:
            last, flat = script(
                keys=[msgs], args=[prefix, lo, s.hi, READ_CHUNK, s.now_ms, *REDIS_FIELDS.values()]
            )
            if int(last) < 0:
                return
            lo = int(last) + 1
            if not flat:
                continue
            values: dict[str, Sequence[Any]] = {
                name: flat[j + 2 :: width] for j, name in enumerate(REDIS_FIELDS)
            }
            values["id"] = flat[0::width]
            values["marker"] = flat[1::width]
            values["project"] = [s.project] * (len(flat) // width)
            values["queue"] = [s.queue] * (len(flat) // width)
            yield batch(values, max_body_bytes=max_body_bytes)


class MongoSource:
    def __init__(self, uri: str, namespace: str):
        self.uri, self.namespace = uri, namespace

    def _client(self) -> Any:
        import pymongo

        return pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=int(CONNECT_TIMEOUT_S * 1000))

    def queues(self, project: str | None, names: Sequence[str] | None) -> list[QueueExtent]:
        import pymongo.errors

        try:
            with self._client() as client:
                return self._extents(client.get_default_database(default="charon"), project, names)
        except pymongo.errors.PyMongoError as e:
            raise SourceError(f"Cannot read MongoDB at {self.uri}: {e}") from e

    def _extents(self, db: Any, project: str | None, names: Sequence[str] | None) -> list[QueueExtent]:
        ns = self.namespace
        only = {"p": project} if project else {}
        queues: list[tuple[str, str]] = []
        if names is None:
            existing = {(d["p"], d["n"]) for d in db[f"{ns}.queues"].find(only, {"p": 1, "n": 1})}
            named = {
                (d["p"], d["pol"]["dlq"])
                for d in db[f"{ns}.queues"].find({**only, "pol.dlq": {"$exists": True}})
            }
            received = {
                (d["_id"]["p"], d["_id"]["q"])
                for d in db[f"{ns}.counters"].find(
                    {"n_rcv": {"$gt": 0}, **({"_id.p": project} if project else {})}, {"_id": 1}
                )
            }
            queues = sorted((named | received) & existing)
        else:
            projects = [project] if project else sorted(db[f"{ns}.projects"].distinct("_id"))
            queues = [(p, n) for p in projects for n in names]
        out = []
        messages = db[f"{ns}.messages"]
        for p, n in queues:
            key = {"p": p, "q": n}
            first = messages.find_one(key, {"k": 1}, sort=[("k", 1)])
            if first is None:
                continue
            last = messages.find_one(key, {"k": 1}, sort=[("k", -1)])
            count = messages.count_documents(key)
            out.append(QueueExtent(p, n, count, int(first["k"]), int(last["k"])))
        return out

    def read(self, s: Slice, *, max_body_bytes: int | None) -> Iterator[pa.RecordBatch]:
        with self._client() as client:
            yield from self._read(client.get_default_database(default="charon"), s, max_body_bytes)

    def _read(self, db: Any, s: Slice, max_body_bytes: int | None) -> Iterator[pa.RecordBatch]:
        from storage.mongodb.schema import MARKER_INDEX

        cursor = db[f"{self.namespace}.messages"].find(
            {"p": s.project, "q": s.queue, "k": {"$gte": s.lo, "$lte": s.hi}, "e": {"$gt": s.now_ms}},
            {"b": 1, "k": 1, "cr": 1, "cc": 1, "dl": 1},
            sort=[("k", 1)],
            hint=MARKER_INDEX,
            batch_size=READ_CHUNK,
        )
        docs: list[dict[str, Any]] = []
        for doc in cursor:
            docs.append(doc)
            if len(docs) == READ_CHUNK:
                yield self._batch(s, docs, max_body_bytes)
                docs = []
        if docs:
            yield self._batch(s, docs, max_body_bytes)

    @staticmethod
    def _batch(s: Slice, docs: list[dict[str, Any]], max_body_bytes: int | None) -> pa.RecordBatch:
        dl = [d.get("dl") or {} for d in docs]
        values: dict[str, Sequence[Any]] = {
            "project": [s.project] * len(docs),
            "queue": [s.queue] * len(docs),
            "id": [d["_id"] for d in docs],
            "marker": [d["k"] for d in docs],
            "body": [bytes(d["b"]) for d in docs],
            "created_ms": [d["cr"] for d in docs],
            "claim_count": [d["cc"] for d in docs],
        }
        for name, key in (
            ("source_queue", "src"),
            ("reason", "rsn"),
            ("dl_claim_count", "cc"),
            ("dead_lettered_at_ms", "at"),
            ("first_enqueued_at_ms", "first"),
            ("redrive_count", "rc"),
            ("rejection_reason", "rr"),
            ("rejection_description", "rd"),
        ):
            values[name] = [d.get(key) for d in dl]
        return batch(values, max_body_bytes=max_body_bytes)
