"""Long-poll wake-ups from a MongoDB change stream on the messages collection (a replica set is needed, as
for the driver's transactions). Open only while some queue is listened to by this process.

The stream passes the events that make a message claimable: an insert (a post), an update that clears a
message's claim (a release, a claim that ended, a move to a DLQ) and one that sets its queue (a move, a
redrive). Each event names one message, so it wakes one waiter of its queue. When the stream fails, every
listened queue is forgotten and `on_wake(None, 0)` wakes every waiter to claim again and listen afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import PyMongoError

from core.errors import StorageUnavailable
from core.models import QueueRef
from storage.base import WakeCallback
from storage.mongodb.schema import MESSAGE as M

log = logging.getLogger("charon.mongodb")

CLOSE_WAIT_S = 5.0  # the longest a closing stream and its reader are waited for

CLAIMABLE_EVENTS = [
    {
        "$match": {
            "$or": [
                {"operationType": "insert"},
                {"operationType": "update", "updateDescription.removedFields": M.CLAIM},
                {"operationType": "update", f"updateDescription.updatedFields.{M.QUEUE}": {"$exists": True}},
            ]
        }
    }
]


class MongoWakeups:
    def __init__(self, messages: AsyncCollection[Any], on_wake: WakeCallback) -> None:
        self._messages, self._on_wake = messages, on_wake
        self._queues: set[tuple[str, str]] = set()
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._opening: asyncio.Lock = asyncio.Lock()

    async def listen(self, q: QueueRef) -> None:
        self._queues.add((q.project, q.name))
        async with self._opening:
            if self._stream is not None:
                return
            try:
                # watch() returns once the server has opened the stream: later changes are in it
                stream = await self._messages.watch(CLAIMABLE_EVENTS, full_document="updateLookup")
            except PyMongoError as exc:
                self._queues.discard((q.project, q.name))
                raise StorageUnavailable(
                    f"MongoDB did not open the long poll's change stream ({exc})."
                ) from exc
            self._stream = stream
            self._reader = asyncio.create_task(self._read(stream), name="charon-wakeups")

    async def unlisten(self, q: QueueRef) -> None:
        self._queues.discard((q.project, q.name))
        if not self._queues:
            await self._close()

    async def _read(self, stream: Any) -> None:
        ended = "the change stream ended"
        try:
            async for change in stream:
                doc = change.get("fullDocument") or {}
                key = (doc.get(M.PROJECT), doc.get(M.QUEUE))
                if key in self._queues:
                    self._on_wake(QueueRef(*key), 1)
        except PyMongoError as exc:
            ended = f"the change stream failed ({exc})"
        # ended or failed (a stream that simply ends would leave every later listen deaf)
        if self._stream is stream:
            log.warning("long-poll wake-ups: %s; waking every waiter", ended)
            self._stream = None
            self._queues.clear()
            self._on_wake(None, 0)
        with contextlib.suppress(PyMongoError):
            await stream.close()

    async def _close(self) -> None:
        """The stream first: a cancelled read of a change stream can be retried inside PyMongo rather than
        end, so the reader is ended by closing its stream, and waited for a bounded time only."""
        stream, reader = self._stream, self._reader
        self._stream = self._reader = None
        if stream is not None:
            with contextlib.suppress(PyMongoError, TimeoutError):
                await asyncio.wait_for(stream.close(), CLOSE_WAIT_S)
        if reader is not None:
            reader.cancel()
            await asyncio.wait([reader], timeout=CLOSE_WAIT_S)

    async def aclose(self) -> None:
        self._queues.clear()
        await self._close()
