"""The dead-letter export (storage/export.py) of a MongoDB store, on a synchronous PyMongo client: it runs in
Spark's Python workers, outside any event loop. Every collection and field name is schema.py's.

A slice is one range scan of the marker index (p, q, k), read in cursor batches of PAGE_SIZE documents: one
query, then one getMore per page.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pymongo
import pymongo.errors
from pymongo.database import Database

from core.errors import StorageUnavailable
from core.models import PROVENANCE
from storage.export import PAGE_SIZE, Extent, Page, Slice, Value, shown
from storage.mongodb.schema import (
    COUNTER,
    COUNTER_PROJECT_PATH,
    MARKER_INDEX,
    PROJECT,
    QUEUE,
    Collection,
    policy_of,
)
from storage.mongodb.schema import DEAD_LETTER as DL
from storage.mongodb.schema import MESSAGE as M

SERVER_SELECTION_TIMEOUT_MS = 5_000

Doc = dict[str, Any]
# The export's provenance columns as fields of a message's `dl` sub-document.
DEAD_LETTER_COLUMNS: dict[str, str] = {p.export_column: getattr(DL, p.key) for p in PROVENANCE}
PROJECTION = {M.MARKER: 1, M.BODY: 1, M.CREATED: 1, M.CLAIM_COUNT: 1, M.DEAD_LETTER: 1}


class MongoExport:
    def __init__(self, uri: str, *, namespace: str = "charon") -> None:
        self.uri, self.namespace = uri, namespace

    def _client(self) -> pymongo.MongoClient[Doc]:
        options: dict[str, Any] = {}
        if "serverselectiontimeoutms" not in self.uri.lower():
            options["serverSelectionTimeoutMS"] = SERVER_SELECTION_TIMEOUT_MS
        return pymongo.MongoClient(self.uri, **options)

    def _unavailable(self, e: Exception) -> StorageUnavailable:
        return StorageUnavailable(f"Cannot read MongoDB at {shown(self.uri)}: {e}")

    def extents(self, project: str | None, names: Sequence[str] | None) -> list[Extent]:
        try:
            with self._client() as client:
                return self._extents(client.get_default_database(default="charon"), project, names)
        except pymongo.errors.PyMongoError as e:
            raise self._unavailable(e) from e

    def _extents(self, db: Database[Doc], project: str | None, names: Sequence[str] | None) -> list[Extent]:
        if names is None:
            queues = self._dead_letter_queues(db, project)
        else:
            projects = (
                [project]
                if project
                else sorted(db[Collection.PROJECTS.of(self.namespace)].distinct(PROJECT.ID))
            )
            queues = [(p, n) for p in projects for n in names]
        messages = db[Collection.MESSAGES.of(self.namespace)]
        out = []
        for p, n in queues:
            key: Doc = {M.PROJECT: p, M.QUEUE: n}
            first = messages.find_one(key, {M.MARKER: 1}, sort=[(M.MARKER, 1)])
            if first is None:
                continue
            last = messages.find_one(key, {M.MARKER: 1}, sort=[(M.MARKER, -1)])
            assert last is not None
            count = messages.count_documents(key)
            out.append(Extent(p, n, count, int(first[M.MARKER]), int(last[M.MARKER])))
        return out

    def _dead_letter_queues(self, db: Database[Doc], project: str | None) -> list[tuple[str, str]]:
        """The queues that some queue names as its DLQ or that have received dead letters."""
        only = {QUEUE.PROJECT: project} if project else {}
        existing, named = set(), set()
        fields = {QUEUE.PROJECT: 1, QUEUE.NAME: 1, QUEUE.POLICY: 1}
        for d in db[Collection.QUEUES.of(self.namespace)].find(only, fields):
            existing.add((d[QUEUE.PROJECT], d[QUEUE.NAME]))
            dlq = policy_of(d).dead_letter_queue
            if dlq is not None:
                named.add((d[QUEUE.PROJECT], dlq))
        C = COUNTER
        received = {C.RECEIVED: {"$gt": 0}, **({COUNTER_PROJECT_PATH: project} if project else {})}
        for d in db[Collection.COUNTERS.of(self.namespace)].find(received, {C.ID: 1}):
            named.add((d[C.ID][C.PROJECT], d[C.ID][C.QUEUE]))
        return sorted(named & existing)

    def read(self, part: Slice) -> Iterator[Page]:
        try:
            with self._client() as client:
                yield from self._read(client.get_default_database(default="charon"), part)
        except pymongo.errors.PyMongoError as e:
            raise self._unavailable(e) from e

    def _read(self, db: Database[Doc], part: Slice) -> Iterator[Page]:
        cursor = db[Collection.MESSAGES.of(self.namespace)].find(
            {
                M.PROJECT: part.project,
                M.QUEUE: part.queue,
                M.MARKER: {"$gte": part.lo, "$lte": part.hi},
                M.EXPIRES: {"$gt": part.now_ms},
            },
            PROJECTION,
            sort=[(M.MARKER, 1)],
            hint=MARKER_INDEX,
            batch_size=PAGE_SIZE,
        )
        docs: list[Doc] = []
        for doc in cursor:
            docs.append(doc)
            if len(docs) == PAGE_SIZE:
                yield self._page(part, docs)
                docs = []
        if docs:
            yield self._page(part, docs)

    @staticmethod
    def _page(part: Slice, docs: list[Doc]) -> Page:
        dl = [d.get(M.DEAD_LETTER) or {} for d in docs]
        columns: dict[str, Sequence[Value]] = {
            "id": [d[M.ID] for d in docs],
            "marker": [d[M.MARKER] for d in docs],
            "body": [bytes(d[M.BODY]) for d in docs],
            "created_ms": [d[M.CREATED] for d in docs],
            "claim_count": [d[M.CLAIM_COUNT] for d in docs],
        }
        for name, field in DEAD_LETTER_COLUMNS.items():
            columns[name] = [d.get(field) for d in dl]
        return Page(part.project, part.queue, columns)
