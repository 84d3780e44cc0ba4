"""MongoStore: the Store protocol on MongoDB, through PyMongo's async API (AsyncMongoClient).

Layout and indexes: schema.py. Each operation is atomic where docs/contract.md needs it:
- a claim sets the claim and increments the claim count in one update per message, conditioned on the
  message still being claimable, so no message is ever held by two live claims (promise 5);
- a dead-letter move is one update_one of the message (moves.py, promise 1);
- markers are handed out so that they become visible in order (counters.py), without the transactions that
  a crashed process would leave holding locks.
Transactions (transactions.py) are kept to what needs several documents at once: metadata writes, which
compare-and-set the project's metadata version; a post with an Idempotency-Key (its record); a post to, or a
dead-letter move into, a queue with live confirmed subscriptions (the deliveries it owes, outbox.py); the
subscription writes (subscriptions.py). A queue without subscriptions costs a post or a move nothing more
than the read of its document it did already. Transactions need a replica set (one node is enough) or a
sharded cluster; a standalone mongod is refused with a clear error at first use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import orjson
import pymongo
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.mongo_client import AsyncMongoClient
from pymongo.errors import BulkWriteError, DuplicateKeyError

from core.clock import Clock, SystemClock
from core.errors import (
    ClaimMismatch,
    ClaimNotFound,
    Conflict,
    IdempotencyKeyReused,
    MessageNotFound,
    NotFound,
    PayloadTooLarge,
    StorageUnavailable,
)
from core.metadata import DeadLetterDefaults, QueuePolicy
from core.models import (
    Claim,
    ClaimId,
    ClaimResult,
    Delivery,
    Idempotency,
    Message,
    MessageId,
    MessageStamp,
    NewMessage,
    NotDeleted,
    Page,
    QueueInfo,
    QueueRef,
    QueueStats,
    RedriveSpec,
    RedriveTask,
    Rejection,
    Subscription,
    SubscriptionId,
    TaskId,
    new_id,
    new_ids,
)
from core.quotas import MESSAGE_BYTES, MESSAGES_PER_QUEUE, QUEUES, Bucket, Counted, Grant, exceeded
from core.sealing import stored_body
from storage.base import DEFAULT_TIMEOUT_S, WakeCallback
from storage.mongodb import outbox, quotas, subscriptions
from storage.mongodb.claims import take_messages
from storage.mongodb.counters import (
    MARKER_ATTEMPTS,
    ensure_queue,
    held_bytes,
    insert_in_order,
    live_messages,
    marker_taken,
    queue_stats,
    reserve_markers,
    take_byte_room,
    take_message_room,
)
from storage.mongodb.errors import after_commit, unavailable_as_domain_error
from storage.mongodb.metadata import write_metadata
from storage.mongodb.moves import dead_letter, group_ids, housekeep
from storage.mongodb.outbox import insert_notifying, owe, subscribers
from storage.mongodb.queries import Doc, claimable, held, held_by, listing, not_claimed
from storage.mongodb.redrive import TASK_KEEP_MS, redrive_batch, task_of
from storage.mongodb.schema import (
    CLAIM,
    CLAIMABLE_INDEX,
    CLAIMS_INDEX,
    COUNTER,
    IDEMPOTENCY,
    LEASE,
    MARKER_INDEX,
    PROJECT,
    QUEUE,
    QUEUE_INDEX,
    SOURCE_PATH,
    TASK,
    UNCLAIMED,
    Collections,
    counter_key,
    gc_at,
    idempotency_key,
    message_of,
    policy_of,
    queue_key,
)
from storage.mongodb.schema import MESSAGE as M
from storage.mongodb.sweeper import sweep_all, take_lease
from storage.mongodb.transactions import in_transaction
from storage.mongodb.wakeups import MongoWakeups

P = ParamSpec("P")
R = TypeVar("R")

SERVER_SELECTION_TIMEOUT_MS = 5000  # unless the URI says otherwise: fail fast with 503, not after 30 s
BACKGROUND_TIMEOUT_S = 60.0  # the sweeper's and a redrive step's deadline: more work, nobody waiting

# Operations that change nothing a client asked for: a failure is "unavailable", never "outcome unknown".
READS = frozenset(
    {
        "get_quota",
        "metadata_version",
        "get_metadata",
        "list_queues",
        "stats",
        "list_messages",
        "get_messages",
        "get_claim",
        "get_redrive",
        "list_redrives",
        "ping",
        "lease_redrives",
        "release_redrive",
        "get_subscription",
        "list_subscriptions",
        "lease_deliveries",
        "finish_delivery",
        "outbox_stats",
    }
)
BACKGROUND = frozenset(
    {
        "sweep",
        "redrive_step",
        "lease_redrives",
        "release_redrive",
        "lease_deliveries",
        "finish_delivery",
        "outbox_stats",
    }
)


async def _to_its_end(step: Coroutine[Any, Any, R]) -> R:
    """Await `step`; a cancellation of the caller meanwhile waits for the step to end, then is raised. (A
    second cancellation stops the wait; the step still runs to its end.)"""
    task = asyncio.ensure_future(step)  # with the caller's context: its pymongo.timeout deadline
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its outcome is nobody's now
        await asyncio.wait([task])
        raise


def number(docs: list[Doc], first: int) -> None:
    """Give `docs` consecutive markers from `first`."""
    for n, doc in enumerate(docs):
        doc[M.MARKER] = first + n


def _op(
    method: Callable[Concatenate[MongoStore, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[MongoStore, P], Coroutine[Any, Any, R]]:
    """Wraps every public operation: indexes made before the first query, one deadline for all of it (the
    store's timeout; PyMongo gives each command what is left), connection errors and timeouts mapped to
    StorageUnavailable, or OutcomeUnknown for an operation that writes (it may have got part of the way)."""
    write = method.__name__ not in READS
    background = method.__name__ in BACKGROUND

    async def wrapper(self: MongoStore, *args: P.args, **kwargs: P.kwargs) -> R:
        deadline = max(self._timeout, BACKGROUND_TIMEOUT_S) if background else self._timeout
        with pymongo.timeout(deadline):
            async with unavailable_as_domain_error(write=write):
                await self._ready()
                return await method(self, *args, **kwargs)

    return functools.wraps(method)(wrapper)  # type: ignore[return-value]  # wraps() loses the ParamSpec


class MongoStore:
    def __init__(
        self,
        client: AsyncMongoClient[Doc],
        *,
        database: str = "charon",
        namespace: str = "charon",
        clock: Clock | None = None,
        defaults: DeadLetterDefaults | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        quotas: Counted | None = None,
    ):
        self._client = client
        self._timeout = timeout
        self._c = Collections.of(client[database], namespace, defaults, quotas)
        self._clock = clock or SystemClock()
        self._indexed = False
        self._ready_lock = asyncio.Lock()
        self._lease_token = new_id()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "charon",
        clock: Clock | None = None,
        defaults: DeadLetterDefaults | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        quotas: Counted | None = None,
    ) -> MongoStore:
        """The database is the URI's (mongodb://host/<db>), else "charon"; collections are `<namespace>.*`.
        `timeout`: seconds an operation may take in all before it fails with 503."""
        client, database = cls.client_from_url(url, timeout)
        return cls(
            client,
            database=database,
            namespace=namespace,
            clock=clock,
            defaults=defaults,
            timeout=timeout,
            quotas=quotas,
        )

    @staticmethod
    def client_from_url(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[AsyncMongoClient[Doc], str]:
        """The client and the URI's database (default "charon"). Every operation is bounded by `timeout`
        (PyMongo's timeoutMS), unless the URI sets its own; server selection too."""
        options: dict[str, Any] = {}
        if "serverselectiontimeoutms" not in url.lower():
            options["serverSelectionTimeoutMS"] = min(SERVER_SELECTION_TIMEOUT_MS, int(timeout * 1000))
        if "timeoutms" not in url.lower().replace("selectiontimeoutms", ""):
            options["timeoutMS"] = int(timeout * 1000)
        client: AsyncMongoClient[Doc] = AsyncMongoClient(url, **options)
        return client, client.get_default_database(default="charon").name

    @property
    def collections(self) -> Collections:
        return self._c

    async def _ready(self) -> None:
        if self._indexed:
            return
        async with self._ready_lock:
            if self._indexed:
                return
            hello = await self._client.admin.command("hello")
            if not hello.get("setName") and hello.get("msg") != "isdbgrid":
                raise StorageUnavailable(
                    "MongoDB is a standalone server; Charon needs a replica set (one node is enough: start "
                    "mongod with --replSet rs0 and run rs.initiate()) or a sharded cluster, for transactions."
                )
            await self._c.ensure_indexes()
            self._indexed = True

    async def _transaction(self, fn: Callable[[AsyncClientSession], Coroutine[Any, Any, R]]) -> R:
        return await in_transaction(self._c, fn)

    def _now(self) -> int:
        return self._clock.now_ms()

    # -- queues -------------------------------------------------------------------------------------------

    @_op
    async def create_queue(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> bool:
        limit = (await quotas.counted(self._c, q.project))[QUEUES]

        async def create(s: AsyncClientSession) -> bool:
            if await self._c.queues.find_one(queue_key(q), {QUEUE.ID: 1}, session=s):
                return False  # an existing queue keeps its metadata, as in Zaqar
            await write_metadata(
                self._c, q, metadata, policy, expected_version, now=self._now(), session=s, max_queues=limit
            )
            return True

        return await self._transaction(create)

    # -- quotas -------------------------------------------------------------------------------------------

    @_op
    async def get_quota(self, project: str) -> dict[str, float]:
        return await quotas.get(self._c, project)

    @_op
    async def set_quota(self, project: str, overrides: Mapping[str, float | None]) -> dict[str, float]:
        return await quotas.put(self._c, project, overrides)

    @_op
    async def delete_quota(self, project: str) -> None:
        await quotas.delete(self._c, project)

    @_op
    async def take_tokens(
        self, project: str, bucket: Bucket, *, want: int, rate: float, capacity: int
    ) -> Grant:
        return await quotas.take(
            self._c, project, bucket, now=self._now(), want=want, rate=rate, capacity=capacity
        )

    @_op
    async def metadata_version(self, q: QueueRef) -> int:
        doc = await self._c.projects.find_one({PROJECT.ID: q.project})
        return int(doc[PROJECT.METADATA_VERSION]) if doc else 0

    @_op
    async def get_metadata(self, q: QueueRef) -> dict[str, Any]:
        doc = await self._c.queues.find_one(queue_key(q), {QUEUE.META: 1})
        return dict(orjson.loads(doc[QUEUE.META])) if doc else {}

    @_op
    async def set_metadata(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> None:
        limit = (await quotas.counted(self._c, q.project))[QUEUES]

        async def write(s: AsyncClientSession) -> None:
            await write_metadata(
                self._c, q, metadata, policy, expected_version, now=self._now(), session=s, max_queues=limit
            )

        await self._transaction(write)

    @_op
    async def count_queues(self, project: str) -> int:
        return await self._c.queues.count_documents({QUEUE.PROJECT: project})

    @_op
    async def held_bytes(self, project: str) -> int:
        return await held_bytes(self._c, project, self._now())

    @_op
    async def list_queues(
        self, project: str, *, marker: str | None, limit: int, detailed: bool
    ) -> Page[QueueInfo]:
        query: dict[str, Any] = {QUEUE.PROJECT: project}
        if marker:
            query[QUEUE.NAME] = {"$gt": marker}
        docs = (
            await self._c.queues.find(query, {QUEUE.NAME: 1, QUEUE.META: 1})
            .sort(QUEUE.NAME, 1)
            .hint(QUEUE_INDEX)
            .limit(limit)
            .to_list()
        )
        infos = [
            QueueInfo(name=d[QUEUE.NAME], metadata=dict(orjson.loads(d[QUEUE.META])) if detailed else None)
            for d in docs
        ]
        return Page(items=infos, next_marker=infos[-1].name if infos else None)

    async def _drop_messages(self, q: QueueRef) -> None:
        # Up to the newest marker present: a post or move that lands meanwhile gets a later marker and is
        # kept, so no post acknowledged after the drop began is lost to it.
        top = await self._c.messages.find_one(
            {M.PROJECT: q.project, M.QUEUE: q.name}, {M.MARKER: 1}, sort=[(M.MARKER, -1)], hint=MARKER_INDEX
        )
        if top is not None:
            last = {"$lte": top[M.MARKER]}
            await self._c.messages.delete_many({M.PROJECT: q.project, M.QUEUE: q.name, M.MARKER: last})

    @_op
    async def delete_queue(self, q: QueueRef) -> None:
        began = self._now()
        await self._drop_messages(q)
        # No claim outlives its queue (Zaqar); one made meanwhile, on messages posted after the drop began
        # (which it keeps), is kept with them.
        this = {CLAIM.PROJECT: q.project, CLAIM.QUEUE: q.name, CLAIM.CREATED: {"$lte": began}}
        await self._c.claims.delete_many(this, hint=CLAIMS_INDEX)
        await subscriptions.delete_queue_document(self._c, q)
        await self._c.counters.delete_one(counter_key(q))

    @_op
    async def purge(self, q: QueueRef) -> None:
        await self._drop_messages(q)

    @_op
    async def stats(self, q: QueueRef) -> QueueStats:
        now = self._now()
        await housekeep(self._c, q, now)
        live = {M.PROJECT: q.project, M.QUEUE: q.name, M.EXPIRES: {"$gt": now}}
        messages = self._c.messages
        total = await messages.count_documents(live, hint=MARKER_INDEX)
        claimed = await messages.count_documents({**live, M.CLAIM_END: {"$gt": now}}, hint=MARKER_INDEX)
        delayed = await messages.count_documents({**live, M.AVAILABLE: {"$gt": now}}, hint=MARKER_INDEX)
        ends = []
        for direction in (1, -1):
            doc = await messages.find_one(
                live, {M.CREATED: 1}, sort=[(M.MARKER, direction)], hint=MARKER_INDEX
            )
            ends.append(MessageStamp(MessageId(doc[M.ID]), doc[M.CREATED]) if doc else None)
        counters = await self._c.counters.find_one(counter_key(q)) or {}
        return queue_stats(
            total=total, claimed=claimed, delayed=delayed, oldest=ends[0], newest=ends[1], counters=counters
        )

    # -- messages -----------------------------------------------------------------------------------------

    @_op
    async def post_messages(
        self,
        q: QueueRef,
        messages: Sequence[NewMessage],
        *,
        client_id: str,
        default_ttl: int,
        default_delay: int,
        body_size: int,
        idempotency: Idempotency | None = None,
    ) -> list[MessageId]:
        now = self._now()
        ids = [MessageId(i) for i in new_ids(len(messages))]

        # A queue that does not exist yet has no policy, so creating it before the size check is harmless; a
        # post larger than the queue's message quota alone is refused before (a new queue holds none).
        counted = await quotas.counted(self._c, q.project)
        limit = counted[MESSAGES_PER_QUEUE]
        if limit is not None and len(messages) > limit:
            use = await live_messages(self._c, q, now)
            raise exceeded(
                MESSAGES_PER_QUEUE, use=use, adding=len(messages), limit=limit, where=f"Queue {q.name!r}"
            )
        byte_limit = counted[MESSAGE_BYTES]

        async def refuse_into_new_queue() -> None:  # a new queue does not encrypt: the bodies as they are
            if byte_limit is not None:
                adding = sum(len(stored_body(m.body, seal=False)) for m in messages)
                if (use := await held_bytes(self._c, q.project, now)) + adding > byte_limit:
                    raise exceeded(
                        MESSAGE_BYTES, use=use, adding=adding, limit=byte_limit, where="This project"
                    )

        queue = await ensure_queue(
            self._c, q, now, max_queues=counted[QUEUES], before_creation=refuse_into_new_queue
        )
        policy = policy_of(queue)
        maxpost = policy.max_messages_post_size
        if maxpost is not None and body_size > maxpost:
            raise PayloadTooLarge(
                f"The body is {body_size} bytes; this queue takes at most {maxpost} bytes a post "
                "(_max_messages_post_size)."
            )
        ttl_default = policy.default_message_ttl or default_ttl
        delay_default = (
            default_delay if policy.default_message_delay is None else policy.default_message_delay
        )
        docs = []
        for mid, m in zip(ids, messages, strict=True):
            ttl = ttl_default if m.ttl is None else m.ttl
            if policy.max_message_ttl is not None:
                ttl = min(ttl, policy.max_message_ttl)
            av = now + (delay_default if m.delay is None else m.delay) * 1000
            e = now + ttl * 1000
            doc: Doc = {
                M.ID: mid,
                M.PROJECT: q.project,
                M.QUEUE: q.name,
                M.BODY: stored_body(m.body, seal=bool(policy.encrypt_messages)),
                M.TTL: ttl,
                M.CREATED: now,
                M.EXPIRES: e,
                M.CLIENT: client_id,
                M.CLAIM_COUNT: 0,
                M.AVAILABLE: av,
                M.VISIBLE: av,
                M.GC: gc_at(e),
            }
            if not m.dead_letter_eligible:
                doc[M.NOT_ELIGIBLE] = True
            docs.append(doc)
        owed_to = await subscribers(self._c, q, queue, now)  # reads nothing when the queue has none
        if idempotency is not None or limit is not None or byte_limit is not None:
            bytes_limit = None if byte_limit is None else (byte_limit, sum(len(d[M.BODY]) for d in docs))
            return await self._post_in_transaction(q, docs, idempotency, now, owed_to, limit, bytes_limit)
        if owed_to:
            await insert_notifying(self._c, q, docs, owed_to, now=now)
        else:
            await insert_in_order(self._c, q, docs)  # the markers (k) are set here
        return ids

    async def _post_in_transaction(
        self,
        q: QueueRef,
        docs: list[Doc],
        once: Idempotency | None,
        now: int,
        owed_to: list[str],
        limit: int | None,
        byte_limit: tuple[int, int] | None,
    ) -> list[MessageId]:
        """A post with an Idempotency-Key, or to a queue under a `messages_per_queue` quota (`limit`), or of
        a project under a `message_bytes` quota (`byte_limit`: it, and the bytes the post adds): its
        messages, the key's record, the quotas' counts and the notifications it owes in one transaction, at
        markers reserved for it beforehand (a transaction must not meet another writer's marker; a marker a
        plain writer took meanwhile only costs a new reservation). Under a quota the markers are taken in the
        transaction instead: that write to the queue's counter makes two counted posts conflict (the one
        retried counts again), and their markers follow their commits, so a reader paging by marker passes
        none of them. A record still in its window answers instead, writing nothing."""
        i = IDEMPOTENCY

        async def post(s: AsyncClientSession) -> list[MessageId]:
            if once is not None:
                key = idempotency_key(q, once.key)
                record = await self._c.idempotency.find_one(key, session=s)
                if record is not None and record[i.UNTIL] > now:
                    if record[i.FINGERPRINT] != once.fingerprint:
                        raise IdempotencyKeyReused(
                            "This Idempotency-Key was used for a post of other messages on this queue; use a "
                            "new key for a new post."
                        )
                    return [MessageId(mid) for mid in record[i.IDS]]
                if record is not None:  # its window is over; the TTL index has not dropped it yet
                    await self._c.idempotency.delete_one(key, session=s)
            if limit is not None:  # its markers taken here, where they also keep counted posts apart
                number(docs, await reserve_markers(self._c, q, len(docs), s))
                await take_message_room(self._c, q, len(docs), limit, now, s)
            if byte_limit is not None:
                await take_byte_room(self._c, q.project, byte_limit[1], byte_limit[0], now, s)
            await self._c.messages.insert_many(docs, session=s)
            if once is not None:
                until = now + once.window_ms
                fields = {i.FINGERPRINT: once.fingerprint, i.IDS: [d[M.ID] for d in docs], i.UNTIL: until}
                await self._c.idempotency.insert_one({**key, **fields, i.GC: gc_at(until)}, session=s)
            await owe(self._c, q, owed_to, docs, now=now, session=s)
            return [MessageId(d[M.ID]) for d in docs]

        for _ in range(MARKER_ATTEMPTS):
            if limit is None:
                number(docs, await reserve_markers(self._c, q, len(docs)))
            try:
                return await self._transaction(post)
            except (DuplicateKeyError, BulkWriteError) as exc:
                if not marker_taken(exc):
                    raise
        raise StorageUnavailable(f"Queue {q.name!r} is too busy to take a marker.")

    @_op
    async def list_messages(
        self,
        q: QueueRef,
        *,
        marker: int | MessageId | None,
        limit: int,
        echo: bool,
        client_id: str,
        include_claimed: bool,
        include_delayed: bool,
    ) -> Page[Message]:
        now = self._now()
        if isinstance(marker, str):  # after a message: its marker, and no page when it is not here
            this = {M.ID: marker, M.PROJECT: q.project, M.QUEUE: q.name}  # expired, not yet dropped: there
            found = await self._c.messages.find_one(this, {M.MARKER: 1})
            if found is None:
                return Page(items=[], next_marker=None)
            marker = int(found[M.MARKER])
        docs = await listing(
            self._c,
            q,
            now=now,
            marker=marker or 0,
            limit=limit,
            echo=echo,
            client_id=client_id,
            include_claimed=include_claimed,
            include_delayed=include_delayed,
        ).to_list()
        # As on Redis: a full page links to the next when any message follows, hidden ones included.
        if len(docs) < limit:
            return Page(items=[message_of(d) for d in docs], next_marker=None)
        last = docs[-1][M.MARKER]
        after = await self._c.messages.find_one(
            {M.PROJECT: q.project, M.QUEUE: q.name, M.MARKER: {"$gt": last}}, {M.ID: 1}, hint=MARKER_INDEX
        )
        return Page(items=[message_of(d) for d in docs], next_marker=str(last) if after else None)

    @_op
    async def get_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> list[Message]:
        now = self._now()
        docs = await self._c.messages.find(
            {M.ID: {"$in": list(ids)}, M.PROJECT: q.project, M.QUEUE: q.name, M.EXPIRES: {"$gt": now}}
        ).to_list()
        by_id = {d[M.ID]: d for d in docs}
        return [message_of(by_id[i]) for i in ids if i in by_id]

    @_op
    async def delete_message(self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId | None) -> None:
        now = self._now()
        this = {M.ID: message_id, M.PROJECT: q.project, M.QUEUE: q.name, M.EXPIRES: {"$gt": now}}
        if claim_id is None:
            held: dict[str, Any] = {M.CLAIM_END: not_claimed(now)}
        else:
            held = {M.CLAIM: claim_id, M.CLAIM_END: {"$gt": now}}
        if (await self._c.messages.delete_one({**this, **held})).deleted_count:
            return
        if await self._c.messages.find_one(this, {M.ID: 1}) is None:
            if claim_id is not None and await self._c.messages.find_one(self._lost(q, [message_id], now)):
                raise ClaimMismatch(
                    f"Message {message_id} was not deleted (dead_lettered): its claim expired and it was "
                    "moved to the dead-letter queue, from which it will be delivered again."
                )
            return  # no such live message: deleting is idempotent, as in Zaqar
        if claim_id is None:
            raise ClaimMismatch(
                f"Message {message_id} is claimed; delete it with the claim_id of the claim that holds it."
            )
        raise ClaimMismatch(
            f"Claim {claim_id} does not hold message {message_id} (the claim has expired or another claim "
            "holds the message)."
        )

    @_op
    async def delete_messages(
        self, q: QueueRef, ids: Sequence[MessageId], *, claim_ids: Sequence[ClaimId] | None = None
    ) -> list[NotDeleted]:
        listed = {M.ID: {"$in": list(ids)}, M.PROJECT: q.project, M.QUEUE: q.name}
        if claim_ids is None:
            await self._c.messages.delete_many(listed)
            return []
        now = self._now()
        live = {**listed, M.EXPIRES: {"$gt": now}}
        # each document's delete checks its guard atomically: only a message one of the claims holds now goes
        held = {M.CLAIM: {"$in": list(claim_ids)}, M.CLAIM_END: {"$gt": now}}
        deleted = (await self._c.messages.delete_many({**live, **held})).deleted_count
        if deleted == len(set(ids)):
            return []
        left = {d[M.ID]: d async for d in self._c.messages.find(live, {M.CLAIM_END: 1})}
        lost = {d[M.ID] async for d in self._c.messages.find(self._lost(q, ids, now), {M.ID: 1})}
        return [
            NotDeleted(
                i,
                "dead_lettered"
                if i in lost
                else "claimed_by_another"
                if left[i].get(M.CLAIM_END, 0) > now
                else "not_claimed",
            )
            for i in dict.fromkeys(ids)
            if i in left or i in lost
        ]

    @staticmethod
    def _lost(q: QueueRef, ids: Sequence[MessageId], now: int) -> dict[str, Any]:
        """The live messages among `ids` that a dead-letter move took out of `q` (they keep their ids)."""
        return {
            M.ID: {"$in": list(ids)},
            M.PROJECT: q.project,
            M.QUEUE: {"$ne": q.name},
            SOURCE_PATH: q.name,
            M.EXPIRES: {"$gt": now},
        }

    @_op
    async def pop_messages(self, q: QueueRef, *, limit: int) -> list[Message]:
        now = self._now()
        await housekeep(self._c, q, now)
        out: list[Message] = []
        while len(out) < limit:
            doc = await self._c.messages.find_one_and_delete(
                claimable(q, now),
                sort=[(M.MARKER, 1)],
                hint=CLAIMABLE_INDEX,
            )
            if doc is None:
                break
            out.append(message_of(doc))
        return out

    # -- claims -------------------------------------------------------------------------------------------

    @_op
    async def claim(
        self, q: QueueRef, *, ttl: int, grace: int, limit: int, wait_ms: int = 0, client_id: str = ""
    ) -> ClaimResult:
        """The claim's record first, then its messages: a failure between them leaves a record holding
        nothing (dropped by its TTL index), never messages held by a claim nobody was told of. The messages
        are answered from what the claim read and wrote, without reading them again."""
        now = self._now()
        claim_id = ClaimId(new_id())
        ce = now + ttl * 1000
        keep = ce + grace * 1000
        policy = await self._c.policy(q)
        c = CLAIM
        record = {
            c.ID: claim_id,
            c.PROJECT: q.project,
            c.QUEUE: q.name,
            c.TTL: ttl,
            c.GRACE: grace,
            c.CREATED: now,
            c.EXPIRES: ce,
        }
        await self._c.claims.insert_one({**record, c.GC: gc_at(keep)})
        claimed, moved, discarded = await take_messages(
            self._c, q, policy, claim_id, now=now, until=ce, keep_until=keep, limit=limit, client_id=client_id
        )
        if claimed == []:
            await after_commit(self._c.claims.delete_one({c.ID: claim_id}), "dropping an empty claim")
            next_ms = await self._next_claimable(q, now) if wait_ms > 0 else None
            return ClaimResult(claim=None, dead_lettered=moved, discarded=discarded, next_ms=next_ms)
        held = await self._held(q, claim_id, now) if claimed is None else [message_of(d) for d in claimed]
        claim = Claim(
            id=claim_id, queue=q.name, ttl=ttl, grace=grace, created_ms=now, expires_ms=ce, messages=held
        )
        return ClaimResult(claim=claim, dead_lettered=moved, discarded=discarded)

    async def _next_claimable(self, q: QueueRef, now: int) -> int | None:
        """When the queue's first message becomes claimable by time alone (a delay, a backoff or a claim
        ends), None when none will. Only a long poll that found nothing asks (it reads the queue's live
        messages not claimable now)."""
        query = {M.PROJECT: q.project, M.QUEUE: q.name, M.VISIBLE: {"$gt": now}, M.EXPIRES: {"$gt": now}}
        first = await self._c.messages.find_one(query, {M.VISIBLE: 1}, sort=[(M.VISIBLE, 1)])
        return None if first is None else int(first[M.VISIBLE])

    async def _held(self, q: QueueRef, claim_id: ClaimId, now: int) -> list[Message]:
        return [message_of(d) for d in await held_by(self._c, q, claim_id, now).to_list()]

    @_op
    async def get_claim(self, q: QueueRef, claim_id: ClaimId) -> Claim:
        now = self._now()
        c = CLAIM
        doc = await self._c.claims.find_one(
            {c.ID: claim_id, c.PROJECT: q.project, c.QUEUE: q.name, c.EXPIRES: {"$gt": now}}
        )
        if doc is None:
            raise ClaimNotFound(f"Claim {claim_id} does not exist or has expired.")
        return Claim(
            id=claim_id,
            queue=q.name,
            ttl=doc[c.TTL],
            grace=doc[c.GRACE],
            created_ms=doc[c.CREATED],
            expires_ms=doc[c.EXPIRES],
            messages=await self._held(q, claim_id, now),
        )

    @_op
    async def acknowledge_claim(self, q: QueueRef, claim_id: ClaimId) -> int:
        now = self._now()
        this = {CLAIM.ID: claim_id, CLAIM.PROJECT: q.project, CLAIM.QUEUE: q.name}
        if await self._c.claims.find_one({**this, CLAIM.EXPIRES: {"$gt": now}}, {CLAIM.ID: 1}) is None:
            raise ClaimNotFound(f"Claim {claim_id} does not exist or has expired.")
        deleted = await self._c.messages.delete_many({**held(q, claim_id, now), M.CLAIM_END: {"$gt": now}})
        await after_commit(self._c.claims.delete_one(this), "dropping an acknowledged claim")
        return deleted.deleted_count

    @_op
    async def renew_claim(self, q: QueueRef, claim_id: ClaimId, *, ttl: int, grace: int) -> None:
        now = self._now()
        ce = now + ttl * 1000
        keep = ce + grace * 1000
        c = CLAIM
        doc = await self._c.claims.find_one_and_update(
            {c.ID: claim_id, c.PROJECT: q.project, c.QUEUE: q.name, c.EXPIRES: {"$gt": now}},
            {"$set": {c.TTL: ttl, c.GRACE: grace, c.CREATED: now, c.EXPIRES: ce, c.GC: gc_at(keep)}},
        )
        if doc is None:
            raise ClaimNotFound(f"Claim {claim_id} does not exist or has expired.")
        # A message waits its redelivery backoff (bo) after the claim ends, now the renewed end.
        docs = await self._c.messages.find(held(q, claim_id, now), {M.BACKOFF: 1}).to_list()
        for bo, ids in group_ids(docs, lambda d: d.get(M.BACKOFF, 0)).items():
            await self._c.messages.update_many(
                {M.ID: {"$in": ids}, M.CLAIM: claim_id},
                {"$set": {M.CLAIM_END: ce, M.VISIBLE: ce + bo}, "$max": {M.EXPIRES: keep, M.GC: gc_at(keep)}},
            )

    async def _release(
        self, q: QueueRef, claim_id: ClaimId, docs: list[Doc], *, now: int, delay: int | None
    ) -> None:
        """Take `docs` (held by `claim_id`) out of the claim: exhausted ones move to the DLQ now (promise 7);
        the rest are claimable again after `delay` seconds, or after the queue's redelivery backoff."""
        policy = await self._c.policy(q)
        spent = [
            (d, {M.CLAIM: claim_id, M.CLAIM_COUNT: d[M.CLAIM_COUNT]})
            for d in docs
            if policy.exhausted(d[M.CLAIM_COUNT])
        ]
        await dead_letter(self._c, q, policy, spent, now=now, reason="max_claims")

        def claimable_at(d: Doc) -> int:
            if delay is not None:
                return now + delay * 1000
            return now + (policy.backoff.wait_ms(d[M.ID], d[M.CLAIM_COUNT]) if policy.backoff else 0)

        back = [d for d in docs if not policy.exhausted(d[M.CLAIM_COUNT])]
        for at, ids in group_ids(back, claimable_at).items():
            await self._c.messages.update_many(
                {M.ID: {"$in": ids}, M.CLAIM: claim_id},
                {"$unset": UNCLAIMED, "$set": {M.VISIBLE: at, M.AVAILABLE: at}},
            )

    @_op
    async def release_claim(self, q: QueueRef, claim_id: ClaimId, *, delay: int | None = None) -> None:
        now = self._now()
        docs = await held_by(self._c, q, claim_id, now).to_list()
        await self._release(q, claim_id, docs, now=now, delay=delay)
        record = self._c.claims.delete_one(
            {CLAIM.ID: claim_id, CLAIM.PROJECT: q.project, CLAIM.QUEUE: q.name}
        )
        await after_commit(record, "dropping a released claim")

    async def _held_one(self, q: QueueRef, message_id: MessageId, claim_id: ClaimId, now: int) -> Doc:
        """The message, if `claim_id` holds it now; else MessageNotFound or ClaimMismatch."""
        doc = await self._c.messages.find_one(
            {M.ID: message_id, M.PROJECT: q.project, M.QUEUE: q.name, M.EXPIRES: {"$gt": now}}
        )
        if doc is None:
            raise MessageNotFound(f"Message {message_id} does not exist in queue {q.name}.")
        if doc.get(M.CLAIM) != claim_id or doc.get(M.CLAIM_END, 0) <= now:
            raise ClaimMismatch(
                f"Claim {claim_id} does not hold message {message_id} (the claim has expired or another "
                "claim holds the message)."
            )
        return doc

    @_op
    async def release_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, delay: int | None = None
    ) -> None:
        now = self._now()
        doc = await self._held_one(q, message_id, claim_id, now)
        await self._release(q, claim_id, [doc], now=now, delay=delay)

    @_op
    async def dead_letter_message(
        self,
        q: QueueRef,
        message_id: MessageId,
        *,
        claim_id: ClaimId,
        rejection: Rejection,
        client_id: str = "",
    ) -> bool:
        now = self._now()
        doc = await self._held_one(q, message_id, claim_id, now)
        policy = await self._c.policy(q)
        if policy.dead_letter_queue is None:
            raise Conflict(
                f"Queue {q.name} has no dead-letter queue to move message {message_id} to; set "
                "_dead_letter_queue in its metadata first."
            )
        moved, discarded = await dead_letter(
            self._c,
            q,
            policy,
            [(doc, {M.CLAIM: claim_id, M.CLAIM_END: {"$gt": now}})],
            now=now,
            reason="rejected",
            rejection=rejection,
            consumer=client_id,
        )
        if not moved and not discarded:  # the claim ended between the read and the move
            raise ClaimMismatch(f"Claim {claim_id} no longer holds message {message_id}.")
        return moved > 0

    # -- redrive -------------------------------------------------------------------------------------------

    @_op
    async def create_redrive(
        self, q: QueueRef, task_id: TaskId, spec: RedriveSpec, *, owner: str, lease_ms: int
    ) -> RedriveTask:
        now = self._now()
        counter = await self._c.counters.find_one(counter_key(q), {COUNTER.SEQ: 1}) or {}
        last = int(counter.get(COUNTER.SEQ, 0))
        listed, signed = spec.message_ids is not None, spec.signature is not None and spec.message_ids is None
        t = TASK
        doc = {
            t.ID: task_id,
            t.PROJECT: q.project,
            t.QUEUE: q.name,
            t.STATUS: "running",
            t.SPEC: spec.to_dict(),
            t.CREATED: now,
            t.UPDATED: now,
            # a task of listed ids counts ids (redrive.redrive_batch), one with a signature walks to
            # SIGNATURE_END; their END is 0, so that a process of an earlier version, which walks markers up
            # to END and knows neither, moves nothing of them
            t.END: 0 if listed or signed else last,
            **({t.IDS_END: len(spec.message_ids)} if spec.message_ids is not None else {}),
            **({t.SIGNATURE_END: last} if signed else {}),
            t.CURSOR: 0,
            t.SCANNED: 0,
            t.MOVED: 0,
            t.SKIPPED: 0,
            t.OWNER: owner,
            t.LEASE: now + lease_ms,
        }
        await self._c.tasks.insert_one(dict(doc))  # (insert_one adds nothing to a document with an _id)
        return task_of(doc)

    @_op
    async def get_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        doc = await self._c.tasks.find_one({TASK.ID: task_id, TASK.PROJECT: q.project, TASK.QUEUE: q.name})
        if doc is None:
            raise NotFound(f"Queue {q.name} has no redrive task {task_id}.")
        return task_of(doc)

    @_op
    async def list_redrives(self, q: QueueRef, *, limit: int) -> list[RedriveTask]:
        docs = (
            await self._c.tasks.find({TASK.PROJECT: q.project, TASK.QUEUE: q.name})
            .sort([(TASK.CREATED, -1), (TASK.ID, -1)])
            .limit(limit)
            .to_list()
        )
        return [task_of(d) for d in docs]

    @_op
    async def cancel_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        now = self._now()
        t = TASK
        await self._c.tasks.update_one(
            {t.ID: task_id, t.PROJECT: q.project, t.QUEUE: q.name, t.STATUS: "running"},
            {"$set": {t.STATUS: "cancelled", t.UPDATED: now, t.LEASE: 0, t.GC: gc_at(now + TASK_KEEP_MS)}},
        )
        return await self.get_redrive(q, task_id)

    @_op
    async def lease_redrives(self, owner: str, *, lease_ms: int, limit: int) -> list[tuple[QueueRef, TaskId]]:
        now = self._now()
        taken = []
        t = TASK
        for _ in range(limit):
            doc = await self._c.tasks.find_one_and_update(
                {t.STATUS: "running", t.LEASE: {"$lte": now}},
                {"$set": {t.OWNER: owner, t.LEASE: now + lease_ms}},
                {t.PROJECT: 1, t.QUEUE: 1},
            )
            if doc is None:
                break
            taken.append((QueueRef(doc[t.PROJECT], doc[t.QUEUE]), TaskId(doc[t.ID])))
        return taken

    @_op
    async def release_redrive(self, q: QueueRef, task_id: TaskId, *, owner: str) -> None:
        await self._c.tasks.update_one(
            {TASK.ID: task_id, TASK.PROJECT: q.project, TASK.QUEUE: q.name, TASK.OWNER: owner},
            {"$set": {TASK.LEASE: 0}},
        )

    @_op
    async def redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        """One batch of a redrive task while `owner` holds it (redrive.py). Each move is one update_one;
        the task's cursor and counts are written after the batch. A cancellation (a runner stopping) lets
        the step finish first: cut between the two, the task would resume behind the moves, count none of
        them, and go past its limit by as many. Only a crash can still do that: the resumed task looks at
        those messages again and finds them gone (nothing moves twice), but `moved` falls short by the moves
        of that batch (and a limited task may move that many more)."""
        return await _to_its_end(self._redrive_step(q, task_id, owner=owner, lease_ms=lease_ms, batch=batch))

    async def _redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        now = self._now()
        t = TASK
        mine = {t.ID: task_id, t.PROJECT: q.project, t.QUEUE: q.name, t.STATUS: "running", t.OWNER: owner}
        task = await self._c.tasks.find_one(mine)
        if task is None:
            return await self.get_redrive(q, task_id)
        await housekeep(self._c, q, now)
        step = await redrive_batch(self._c, q, task_of(task), now=now, batch=batch)
        done = {t.GC: gc_at(now + TASK_KEEP_MS)} if step.status != "running" else {}
        await self._c.tasks.update_one(
            mine,
            {
                "$set": {
                    t.STATUS: step.status,
                    t.CURSOR: step.cursor,
                    t.UPDATED: now,
                    t.LEASE: now + lease_ms,
                    **done,
                },
                "$inc": {t.SCANNED: step.scanned, t.MOVED: step.moved, t.SKIPPED: step.skipped},
            },
        )
        return await self.get_redrive(q, task_id)

    # -- subscriptions and the outbox (subscriptions.py, outbox.py) ---------------------------------------

    @_op
    async def create_subscription(
        self,
        q: QueueRef,
        subscription_id: SubscriptionId,
        *,
        subscriber: str,
        ttl: int,
        options: dict[str, Any],
        confirmed: bool,
        max_per_queue: int,
    ) -> tuple[Subscription, bool]:
        return await subscriptions.create(
            self._c,
            q,
            subscription_id,
            subscriber=subscriber,
            ttl=ttl,
            options=options,
            confirmed=confirmed,
            max_per_queue=max_per_queue,
            now=self._now(),
        )

    @_op
    async def get_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> Subscription:
        return await subscriptions.get(self._c, q, subscription_id, now=self._now())

    @_op
    async def list_subscriptions(self, q: QueueRef, *, marker: str | None, limit: int) -> Page[Subscription]:
        return await subscriptions.listing(self._c, q, marker=marker, limit=limit, now=self._now())

    @_op
    async def update_subscription(
        self,
        q: QueueRef,
        subscription_id: SubscriptionId,
        *,
        subscriber: str | None = None,
        ttl: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        await subscriptions.change(
            self._c, q, subscription_id, subscriber=subscriber, ttl=ttl, options=options, now=self._now()
        )

    @_op
    async def confirm_subscription(
        self, q: QueueRef, subscription_id: SubscriptionId, *, confirmed: bool
    ) -> None:
        await subscriptions.confirm(self._c, q, subscription_id, confirmed=confirmed, now=self._now())

    @_op
    async def delete_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> None:
        await subscriptions.delete(self._c, q, subscription_id, now=self._now())

    @_op
    async def purge_subscriptions(self, q: QueueRef) -> None:
        await subscriptions.purge(self._c, q)

    @_op
    async def lease_deliveries(self, owner: str, *, lease_ms: int, limit: int) -> list[Delivery]:
        return await outbox.lease(self._c, owner, now=self._now(), lease_ms=lease_ms, limit=limit)

    @_op
    async def finish_delivery(self, d: Delivery, *, retry_at_ms: int | None, attempted: bool = True) -> None:
        await outbox.finish(self._c, d.id, retry_at_ms, attempted=attempted)

    @_op
    async def finish_deliveries(self, done: Sequence[Delivery]) -> None:
        await outbox.finish_all(self._c, [d.id for d in done])

    @_op
    async def outbox_stats(self) -> tuple[int, int | None]:
        return await outbox.backlog(self._c)

    # -- sweeper ------------------------------------------------------------------------------------------

    @_op
    async def sweep(self, *, lease_ms: int = 0) -> int | None:
        """End every lapsed claim (moving exhausted messages to their DLQ) and delete expired messages, in
        every project. Both are found through an index of their own (lapsed claims, expiry), so the work is
        O(what is due), however many queues exist. With `lease_ms`, only the holder of the namespace's lease
        works a period (else None). Returns the number of queues visited."""
        now = self._now()
        if lease_ms > 0 and not await take_lease(self._c, "sweeper", self._lease_token, now=now, ms=lease_ms):
            return None
        return await sweep_all(self._c, now)

    # -- service ------------------------------------------------------------------------------------------

    def wakeups(self, on_wake: WakeCallback) -> MongoWakeups:
        return MongoWakeups(self._c.messages, on_wake)

    @_op
    async def ping(self) -> None:
        await self._client.admin.command("ping")

    @_op
    async def check_writable(self) -> None:
        await self._c.leases.update_one(
            {LEASE.ID: "health"}, {"$set": {LEASE.UNTIL: self._now()}}, upsert=True
        )

    @_op
    async def drop_collections(self) -> None:
        """Drop every collection of this namespace (tests; decommissioning a namespace)."""
        await self._c.drop()

    async def aclose(self) -> None:
        await self._client.close()

    # -- metrics ------------------------------------------------------------------------------------------

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        from storage.mongodb import gauges  # on first use: only GET /metrics needs it

        return await gauges.queue_gauges(
            self._c, now=self._now(), limit=limit, deadline_s=self._timeout, ready=self._ready
        )
