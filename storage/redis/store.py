"""RedisStore: the Store protocol on Redis (redis-py asyncio); every operation is one script call.

Durability is Redis' own: run the server with AOF (`appendonly yes`, `appendfsync everysec` or `always`).
Scripts are plain EVALSHA (no FUNCTION), so Redis 6.2 and later work, and every key a script touches shares
the project's hash tag (keys.py), so Redis Cluster works too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, cast

import orjson
import redis.asyncio as aioredis

from core.clock import Clock, SystemClock
from core.errors import CharonError, EncryptionRequired, NotFound, StorageFull, SubscriptionNotFound
from core.metadata import DeadLetterDefaults, QueuePolicy
from core.models import (
    Claim,
    ClaimId,
    ClaimResult,
    Delivery,
    Idempotency,
    Message,
    MessageId,
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
from core.quotas import READS, WRITES, Bucket, Counted, Grant
from core.sealing import stored_body
from storage.base import DEFAULT_TIMEOUT_S, WakeCallback
from storage.redis.keys import (
    ProjectKeys,
    QueueField,
    QueueKeys,
    SubscriptionField,
    TaskField,
    due_projects_key,
    full_scan_key,
    health_key,
    projects_key,
    subscription_of,
    sweeper_lease_key,
    tasks_key,
    touched_key,
)
from storage.redis.outbox import Outbox
from storage.redis.runner import ScriptRunner, unavailable_as_domain_error
from storage.redis.scripts import LOWERED, OWED, ReadAhead, Scripts, Target, policy_args
from storage.redis.uri import cluster_options as cluster_options  # re-exported: tests import it from here
from storage.redis.uri import open_client, wait_replicas
from storage.redis.wakeups import RedisWakeups

DROP_BATCH = 500
SWEEP_QUEUES_PER_CALL = 50  # due queues one sweep.lua call visits (each bounded by lib.lua's housekeep)
SWEEP_PROJECTS_PER_ROUND = 500  # projects looked at in one pipeline
FULL_SCAN_MS = 30_000  # how often some sweeper walks every project, to repair what a crash left unmarked


log = logging.getLogger("charon.redis")


def _task_member(q: QueueRef, task_id: str) -> str:
    return orjson.dumps([q.project, q.name, task_id]).decode()


T = TaskField


def _task(q: QueueRef, task_id: str, f: Mapping[Any, Any]) -> RedriveTask:
    """A task from its hash (the client decodes responses, so every field and value is a str)."""
    return RedriveTask(
        id=TaskId(task_id),
        queue=q.name,
        spec=RedriveSpec.from_dict(orjson.loads(f[T.SPEC])),
        status=f[T.STATUS],  # the scripts write only TaskStatus values
        created_ms=int(f[T.CREATED]),
        updated_ms=int(f[T.UPDATED]),
        end_marker=int(f.get(T.IDS) or f.get(T.SIGNATURE_END) or f[T.END]),  # listed ids: how many
        cursor=int(f[T.CURSOR]),
        scanned=int(f[T.SCANNED]),
        moved=int(f[T.MOVED]),
        skipped=int(f[T.SKIPPED]),
        owner=f[T.OWNER],
    )


def _opt(value: object) -> str:
    return "" if value is None else str(value)


SEALING_MEMORY_S = 60.0  # how long a process seals a queue's posts at once after the queue asked it to


class RedisStore:
    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        namespace: str = "charon",
        clock: Clock | None = None,
        defaults: DeadLetterDefaults | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        wait_replicas: int = 0,
        quotas: Counted | None = None,
    ):
        """`wait_replicas`: replicas each write script waits for before it is acknowledged (uri.py)."""
        self._client = client
        self._unmarked: set[str] = set()  # projects whose touched mark failed: marked at the next sweep
        self._namespace = namespace
        self._clock = clock or SystemClock()
        self._timeout = timeout
        self._runner = ScriptRunner(client, timeout=timeout, wait_replicas=wait_replicas)
        self._scripts = Scripts(self._runner, defaults=defaults, quotas=quotas)
        self._registered: set[str] = set()  # projects this process has put in the sweeper's list
        self._targets: dict[QueueRef, Target] = {}
        self._sealing: dict[QueueRef, float] = {}  # queues found to encrypt, until (monotonic s)
        self._lease_token = new_id()
        self._outbox = Outbox(client, self._scripts, namespace, self._lease_token)

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
    ) -> RedisStore:
        """`redis://`, `rediss://` or `unix://` for one server; `redis+cluster://host:port,host:port,...`
        (or `rediss+cluster://` for TLS) for a Redis Cluster, given any of its nodes; `redis+sentinel://
        host:port,host:port,.../service[/db]` (or Zaqar's `redis://host:port,...?master=service`) for the
        primary Redis Sentinel names (uri.py). `timeout`: seconds a call may wait for the server (connecting,
        or for an answer) before it fails with 503."""
        waits = wait_replicas(url)
        client = open_client(url, timeout)
        return cls(
            client,
            namespace=namespace,
            clock=clock,
            defaults=defaults,
            timeout=timeout,
            wait_replicas=waits,
            quotas=quotas,
        )

    async def _target(self, q: QueueRef) -> Target:
        """The queue as the scripts address it (kept per queue), its project in the sweeper's list."""
        target = self._targets.get(q)
        if target is None:
            if len(self._targets) >= 10_000:
                self._targets.clear()
            target = self._targets[q] = Target.of(self._namespace, q)
        if q.project not in self._registered:
            await self._register(q.project)
        return target

    async def _register(self, project: str) -> None:
        """Put the project in the sweeper's list (its periodic full scan walks it), once per process.
        Marked first, so that a burst of first calls sends one SADD, not one each. A full Redis refuses the
        SADD: the call goes on (it may free space) and a later one registers the project."""
        self._registered.add(project)
        try:
            async with unavailable_as_domain_error():
                await self._client.sadd(projects_key(self._namespace), project)
        except StorageFull:
            self._registered.discard(project)
        except BaseException:
            self._registered.discard(project)
            raise

    async def _scheduled(self, q: QueueRef, marks: int) -> None:
        """After a script that may move the project's earliest due time earlier (lib.lua SWEEP) did: mark the
        project touched so the sweeper looks at it; after one that owed deliveries (lib.lua OUTBOX), for the
        notifiers. The script's work is done by then, so a failing mark never fails the call: it is tried
        again at this process's next sweep (or lease), and a mark lost with the process is repaired by the
        periodic full scan."""
        if marks & LOWERED:
            await self._mark_touched([q.project])
        if marks & OWED:
            await self._outbox.owed(q.project)

    async def _mark_touched(self, projects: list[str]) -> None:
        try:
            async with unavailable_as_domain_error():
                await self._client.sadd(touched_key(self._namespace), *projects)
        except CharonError as exc:
            self._unmarked.update(projects)
            log.debug("touched mark deferred (%s)", exc.description)
        else:
            self._unmarked.difference_update(projects)

    # -- queues -------------------------------------------------------------------------------------------

    async def create_queue(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> bool:
        args = policy_args(metadata, policy, expected_version)
        return await self._scripts.create_queue(
            await self._target(q), now=self._clock.now_ms(), metadata=args
        )

    async def metadata_version(self, q: QueueRef) -> int:
        async with unavailable_as_domain_error():
            raw = await self._client.get(ProjectKeys.of(self._namespace, q.project).metadata_version)
        return int(raw or 0)

    async def get_metadata(self, q: QueueRef) -> dict[str, Any]:
        async with unavailable_as_domain_error():
            raw = await self._client.hget(QueueKeys.of(self._namespace, q).queue, QueueField.META)
        return dict(orjson.loads(raw)) if raw else {}

    async def set_metadata(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> None:
        args = policy_args(metadata, policy, expected_version)
        await self._scripts.set_metadata(await self._target(q), now=self._clock.now_ms(), metadata=args)

    async def count_queues(self, project: str) -> int:
        async with unavailable_as_domain_error():
            return int(await self._client.zcard(ProjectKeys.of(self._namespace, project).queues))

    async def held_bytes(self, project: str) -> int:
        return await self._scripts.held_bytes(
            ProjectKeys.of(self._namespace, project), now=self._clock.now_ms()
        )

    async def list_queues(
        self, project: str, *, marker: str | None, limit: int, detailed: bool
    ) -> Page[QueueInfo]:
        keys = ProjectKeys.of(self._namespace, project)
        start = f"({marker}" if marker else "-"
        async with unavailable_as_domain_error():
            names = [str(n) for n in await self._client.zrangebylex(keys.queues, start, "+", 0, limit)]
            metas: list[str | None] = []
            if detailed and names:
                async with self._client.pipeline(transaction=False) as pipe:
                    for name in names:
                        pipe.hget(keys.queue(name), QueueField.META)
                    metas = await pipe.execute()
        infos = [
            QueueInfo(name=n, metadata=(dict(orjson.loads(m)) if m else {}) if detailed else None)
            for n, m in zip(names, metas or [None] * len(names), strict=True)
        ]
        return Page(items=infos, next_marker=names[-1] if names else None)

    async def _drop(self, q: QueueRef, *, delete_queue: bool) -> None:
        # Batched so no single script blocks Redis on a huge queue; each batch is atomic on its own.
        t = await self._target(q)
        while await self._scripts.drop_messages(
            t, now=self._clock.now_ms(), batch=DROP_BATCH, delete_queue=delete_queue
        ):
            pass

    async def delete_queue(self, q: QueueRef) -> None:
        await self._drop(q, delete_queue=True)

    async def purge(self, q: QueueRef) -> None:
        await self._drop(q, delete_queue=False)

    async def stats(self, q: QueueRef) -> QueueStats:
        return await self._scripts.stats(await self._target(q), now=self._clock.now_ms())

    # -- messages -----------------------------------------------------------------------------------------

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
        ids = [MessageId(i) for i in new_ids(len(messages))]
        record = None
        if idempotency is not None:
            key = QueueKeys.of(self._namespace, q).idempotency(idempotency.key)
            record = (key, idempotency.fingerprint, idempotency.window_ms)
        # The script knows whether the queue encrypts (its policy); it refuses clear bodies there, and this
        # process then seals them and remembers the queue for a minute, so one post of it costs one call.
        seal = self._sealing.get(q, 0.0) > time.monotonic()
        while True:
            fields: list[str] = []
            for mid, m in zip(ids, messages, strict=True):
                fields += [
                    mid,
                    "-1" if m.ttl is None else str(m.ttl),
                    "-1" if m.delay is None else str(m.delay),
                    "1" if m.dead_letter_eligible else "0",
                    stored_body(m.body, seal=seal).decode(),  # orjson escapes "\x1f"; sealed is base64
                ]
            try:
                reply = await self._scripts.post_messages(
                    await self._target(q),
                    now=self._clock.now_ms(),
                    ids=ids,
                    packed="\x1f".join(fields),
                    client_id=client_id,
                    default_ttl=default_ttl,
                    default_delay=default_delay,
                    body_size=body_size,
                    sealed=seal,
                    idempotency=record,
                )
            except EncryptionRequired:
                if seal:
                    raise
                if len(self._sealing) >= 10_000:
                    self._sealing.clear()
                self._sealing[q] = time.monotonic() + SEALING_MEMORY_S
                seal = True
                continue
            break
        await self._scheduled(q, reply.marks)
        return ids if reply.earlier_ids is None else [MessageId(i) for i in reply.earlier_ids]

    # -- quotas -------------------------------------------------------------------------------------------

    async def get_quota(self, project: str) -> dict[str, float]:
        async with unavailable_as_domain_error():
            stored = await self._client.hgetall(ProjectKeys.of(self._namespace, project).quota)
        return {str(name): float(value) for name, value in stored.items()}

    async def set_quota(self, project: str, overrides: Mapping[str, float | None]) -> dict[str, float]:
        keys = ProjectKeys.of(self._namespace, project)
        key = keys.quota
        setting: dict[Any, Any] = {name: repr(v) for name, v in overrides.items() if v is not None}
        removing = [name for name, v in overrides.items() if v is None]
        async with unavailable_as_domain_error(write=True), self._client.pipeline(transaction=True) as p:
            if setting:  # one key: MULTI/EXEC is atomic
                p.hset(key, mapping=setting)
            if removing:
                p.hdel(key, *removing)
            # a changed rate applies at once: its bucket starts again, full
            p.delete(*(keys.bucket(b) for b in (READS, WRITES)))
            p.hgetall(key)
            done = await p.execute()
        return {name: float(value) for name, value in done[-1].items()}

    async def delete_quota(self, project: str) -> None:
        keys = ProjectKeys.of(self._namespace, project)
        async with unavailable_as_domain_error(write=True):
            for key in (keys.quota, *(keys.bucket(b) for b in (READS, WRITES))):
                await self._client.delete(key)

    async def take_tokens(
        self, project: str, bucket: Bucket, *, want: int, rate: float, capacity: int
    ) -> Grant:
        key = ProjectKeys.of(self._namespace, project).bucket(bucket)
        now = self._clock.now_ms()
        return await self._scripts.take_tokens(key, now=now, want=want, rate=rate, capacity=capacity)

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
        r = await self._scripts.list_messages(
            await self._target(q),
            now=self._clock.now_ms(),
            marker=marker or 0,
            limit=limit,
            echo=echo,
            client_id=client_id,
            include_claimed=include_claimed,
            include_delayed=include_delayed,
        )
        return Page(items=r.messages, next_marker=str(r.last_marker) if r.more else None)

    async def get_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> list[Message]:
        return await self._scripts.get_messages(await self._target(q), now=self._clock.now_ms(), ids=ids)

    async def delete_message(self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId | None) -> None:
        t = await self._target(q)
        await self._scripts.delete_message(
            t, now=self._clock.now_ms(), message_id=message_id, claim_id=claim_id
        )

    async def delete_messages(
        self, q: QueueRef, ids: Sequence[MessageId], *, claim_ids: Sequence[ClaimId] | None = None
    ) -> list[NotDeleted]:
        refused = await self._scripts.delete_messages(
            await self._target(q), now=self._clock.now_ms(), ids=ids, claim_ids=claim_ids
        )
        return [NotDeleted(MessageId(i), reason) for i, reason in refused]  # type: ignore[arg-type]

    async def pop_messages(self, q: QueueRef, *, limit: int) -> list[Message]:
        return await self._scripts.pop_messages(await self._target(q), now=self._clock.now_ms(), limit=limit)

    # -- claims -------------------------------------------------------------------------------------------

    async def claim(
        self, q: QueueRef, *, ttl: int, grace: int, limit: int, wait_ms: int = 0, client_id: str = ""
    ) -> ClaimResult:
        claim_id = ClaimId(new_id())
        t = await self._target(q)
        now = self._clock.now_ms()
        r = await self._scripts.claim(
            t,
            now=now,
            claim_id=claim_id,
            ttl=ttl,
            grace=grace,
            limit=limit,
            wait_ms=wait_ms,
            client_id=client_id,
        )
        await self._scheduled(q, r.marks)
        claim = None
        if r.messages:
            claim = Claim(
                id=claim_id,
                queue=q.name,
                ttl=ttl,
                grace=grace,
                created_ms=now,
                expires_ms=now + ttl * 1000,
                messages=r.messages,
            )
        return ClaimResult(
            claim=claim, dead_lettered=r.dead_lettered, discarded=r.discarded, next_ms=r.next_ms
        )

    async def get_claim(self, q: QueueRef, claim_id: ClaimId) -> Claim:
        c = await self._scripts.get_claim(await self._target(q), now=self._clock.now_ms(), claim_id=claim_id)
        return Claim(
            id=claim_id,
            queue=q.name,
            ttl=c.ttl,
            grace=c.grace,
            created_ms=c.created_ms,
            expires_ms=c.expires_ms,
            messages=c.messages,
        )

    async def renew_claim(self, q: QueueRef, claim_id: ClaimId, *, ttl: int, grace: int) -> None:
        t = await self._target(q)
        marks = await self._scripts.renew_claim(
            t, now=self._clock.now_ms(), claim_id=claim_id, ttl=ttl, grace=grace
        )
        await self._scheduled(q, marks)

    async def acknowledge_claim(self, q: QueueRef, claim_id: ClaimId) -> int:
        t = await self._target(q)
        return await self._scripts.acknowledge_claim(t, now=self._clock.now_ms(), claim_id=claim_id)

    async def release_claim(self, q: QueueRef, claim_id: ClaimId, *, delay: int | None = None) -> None:
        t = await self._target(q)
        marks = await self._scripts.release_claim(
            t, now=self._clock.now_ms(), claim_id=claim_id, wait_ms=delay and delay * 1000
        )
        await self._scheduled(q, marks)

    async def release_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, delay: int | None = None
    ) -> None:
        t = await self._target(q)
        marks = await self._scripts.release_message(
            t,
            now=self._clock.now_ms(),
            message_id=message_id,
            claim_id=claim_id,
            wait_ms=delay and delay * 1000,
        )
        await self._scheduled(q, marks)

    async def dead_letter_message(
        self,
        q: QueueRef,
        message_id: MessageId,
        *,
        claim_id: ClaimId,
        rejection: Rejection,
        client_id: str = "",
    ) -> bool:
        marks, moved = await self._scripts.dead_letter_message(
            await self._target(q),
            now=self._clock.now_ms(),
            message_id=message_id,
            claim_id=claim_id,
            reason=rejection.reason,
            description=rejection.description,
            client_id=client_id,
        )
        await self._scheduled(q, marks)
        return moved

    # -- subscriptions and the outbox -----------------------------------------------------------------------

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
        marks, created, subscription = await self._scripts.subscribe(
            await self._target(q),
            now=self._clock.now_ms(),
            subscription_id=subscription_id,
            subscriber=subscriber,
            ttl=ttl,
            options=orjson.dumps(options).decode(),
            confirmed=confirmed,
            max_per_queue=max_per_queue,
        )
        await self._scheduled(q, marks)
        return subscription, created

    async def get_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> Subscription:
        key = ProjectKeys.of(self._namespace, q.project).subscription(subscription_id)
        async with unavailable_as_domain_error():
            f = cast(dict[str, str], await self._client.hgetall(key))
        if (
            not f
            or f[SubscriptionField.QUEUE] != q.name
            or int(f[SubscriptionField.EXPIRES]) <= self._clock.now_ms()
        ):
            raise SubscriptionNotFound(f"Subscription {subscription_id} does not exist on queue {q.name}.")
        return subscription_of(subscription_id, f)

    async def list_subscriptions(self, q: QueueRef, *, marker: str | None, limit: int) -> Page[Subscription]:
        qk = QueueKeys.of(self._namespace, q)
        now, found = self._clock.now_ms(), list[Subscription]()
        start = f"({marker}" if marker else "-"
        async with unavailable_as_domain_error():
            while len(found) < limit:
                ids = cast(
                    list[str],
                    await self._client.zrangebylex(qk.subscriptions, start, "+", start=0, num=limit + 1),
                )
                if not ids:
                    break
                async with self._client.pipeline(transaction=False) as pipe:
                    for sid in ids:
                        pipe.hgetall(qk.project.subscription(sid))
                    hashes = await pipe.execute()
                for sid, f in zip(ids, hashes, strict=True):
                    if f and int(f[SubscriptionField.EXPIRES]) > now:
                        found.append(subscription_of(sid, f))
                start = f"({ids[-1]}"
                if len(ids) <= limit:
                    break
        more = len(found) > limit
        items = found[:limit]
        return Page(items, items[-1].id if more else None)

    async def update_subscription(
        self,
        q: QueueRef,
        subscription_id: SubscriptionId,
        *,
        subscriber: str | None = None,
        ttl: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        await self._scripts.update_subscription(
            await self._target(q),
            now=self._clock.now_ms(),
            subscription_id=subscription_id,
            subscriber=subscriber or "",
            ttl=_opt(ttl),
            options="" if options is None else orjson.dumps(options).decode(),
        )

    async def confirm_subscription(
        self, q: QueueRef, subscription_id: SubscriptionId, *, confirmed: bool
    ) -> None:
        marks = await self._scripts.confirm_subscription(
            await self._target(q),
            now=self._clock.now_ms(),
            subscription_id=subscription_id,
            confirmed=confirmed,
        )
        await self._scheduled(q, marks)

    async def delete_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> None:
        await self._scripts.unsubscribe(
            await self._target(q), now=self._clock.now_ms(), subscription_id=subscription_id
        )

    async def purge_subscriptions(self, q: QueueRef) -> None:
        await self._scripts.unsubscribe(await self._target(q), now=self._clock.now_ms(), subscription_id="")

    async def lease_deliveries(self, owner: str, *, lease_ms: int, limit: int) -> list[Delivery]:
        return await self._outbox.lease(owner, now=self._clock.now_ms(), lease_ms=lease_ms, limit=limit)

    async def finish_delivery(self, d: Delivery, *, retry_at_ms: int | None, attempted: bool = True) -> None:
        await self._outbox.finish(d, retry_at_ms=retry_at_ms, attempted=attempted)

    async def finish_deliveries(self, done: Sequence[Delivery]) -> None:
        await self._outbox.finish_all(done)

    async def outbox_stats(self) -> tuple[int, int | None]:
        return await self._outbox.stats()

    # -- redrive -------------------------------------------------------------------------------------------

    def _task_key(self, q: QueueRef, task_id: str) -> str:
        return ProjectKeys.of(self._namespace, q.project).task(task_id)

    async def create_redrive(
        self, q: QueueRef, task_id: TaskId, spec: RedriveSpec, *, owner: str, lease_ms: int
    ) -> RedriveTask:
        """The global index entry first (one pointing at no task is dropped by lease_redrives), then the task
        with the DLQ's index (one script): a crash between them leaves nothing a runner cannot adopt, and
        once the script ran the task is answered from what it returned, with no read that could fail."""
        now = self._clock.now_ms()
        async with unavailable_as_domain_error(write=True):
            await self._client.zadd(tasks_key(self._namespace), {_task_member(q, task_id): now + lease_ms})
        filters = [
            spec.destination,
            spec.source_queue,
            spec.reason,
            spec.after_ms,
            spec.before_ms,
            spec.limit,
            None if spec.message_ids is None else len(spec.message_ids),
        ]
        last = await self._scripts.task_create(
            await self._target(q),
            now=now,
            task_id=task_id,
            spec=spec.to_dict(),
            filters=filters,
            owner=owner,
            lease_ms=lease_ms,
            signature=spec.signature,
        )
        return RedriveTask(
            id=task_id,
            queue=q.name,
            spec=spec,
            status="running",
            created_ms=now,
            updated_ms=now,
            end_marker=last,
            owner=owner,
        )

    async def get_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        async with unavailable_as_domain_error():
            f = await self._client.hgetall(self._task_key(q, task_id))
        if f.get(TaskField.QUEUE) != q.name:
            raise NotFound(f"Queue {q.name} has no redrive task {task_id}.")
        return _task(q, task_id, f)

    async def list_redrives(self, q: QueueRef, *, limit: int) -> list[RedriveTask]:
        keys = ProjectKeys.of(self._namespace, q.project)
        index = keys.tasks(q.name)
        async with unavailable_as_domain_error():
            ids = [str(i) for i in await self._client.zrevrange(index, 0, limit - 1)]
            async with self._client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.hgetall(keys.task(task_id))
                hashes = await pipe.execute()
            # A finished task's hash expires after TASK_KEEP_MS; its index entry goes when it is next listed.
            gone = [task_id for task_id, f in zip(ids, hashes, strict=True) if not f]
            if gone:
                await self._client.zrem(index, *gone)
        return [_task(q, task_id, f) for task_id, f in zip(ids, hashes, strict=True) if f]

    async def cancel_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        """One script cancels the task and returns it; the global index (a hint: task_lease drops an entry
        whose task is not running) is brought along after, and a failure there never fails the cancel."""
        f = await self._scripts.task_cancel(
            self._task_key(q, task_id), now=self._clock.now_ms(), queue=q.name
        )
        await self._drop_index_entry(q, task_id)
        return _task(q, task_id, f)

    async def _drop_index_entry(self, q: QueueRef, task_id: str) -> None:
        try:
            async with unavailable_as_domain_error():
                await self._client.zrem(tasks_key(self._namespace), _task_member(q, task_id))
        except CharonError as exc:
            log.debug("redrive index not updated (%s)", exc.description)

    async def lease_redrives(self, owner: str, *, lease_ms: int, limit: int) -> list[tuple[QueueRef, TaskId]]:
        now = self._clock.now_ms()
        index = tasks_key(self._namespace)
        taken = []
        async with unavailable_as_domain_error():
            due = await self._client.zrangebyscore(index, "-inf", now, start=0, num=limit)
        for member in map(str, due):
            project, name, task_id = orjson.loads(member)
            q = QueueRef(project, name)
            lease = await self._scripts.task_lease(
                self._task_key(q, task_id), now=now, owner=owner, lease_ms=lease_ms
            )
            async with unavailable_as_domain_error():
                if lease.status != "running":
                    await self._client.zrem(index, member)
                elif lease.taken:
                    await self._client.zadd(index, {member: now + lease_ms})
                    taken.append((q, TaskId(task_id)))
        return taken

    async def release_redrive(self, q: QueueRef, task_id: TaskId, *, owner: str) -> None:
        if await self._scripts.task_release(self._task_key(q, task_id), owner=owner):
            async with unavailable_as_domain_error():
                await self._client.zadd(tasks_key(self._namespace), {_task_member(q, task_id): 0}, xx=True)

    async def _read_ahead(self, q: QueueRef, task_id: TaskId, batch: int) -> ReadAhead | None:
        """For a running task with a signature filter: the next `batch` messages it looks at (listed ids, or
        from its cursor on), read as list_messages reads the DLQ, and the ids of those its filters match. None
        for any other task (one round trip to find out)."""
        async with unavailable_as_domain_error():
            status, signature, raw, cursor = await self._client.hmget(
                self._task_key(q, task_id), [T.STATUS, T.SIGNATURE, T.SPEC, T.CURSOR]
            )
        if status != "running" or not signature or raw is None or cursor is None:
            return None
        spec, at = RedriveSpec.from_dict(orjson.loads(raw)), int(cursor)
        upto: int | None = None
        if spec.message_ids is not None:
            found = await self.get_messages(q, list(spec.message_ids[at : at + batch]))
        else:
            page = await self.list_messages(
                q,
                marker=at,
                limit=batch,
                echo=True,
                client_id="",
                include_claimed=True,
                include_delayed=True,
            )
            found, upto = page.items, (None if page.next_marker is None else int(page.next_marker))
        return ReadAhead(at, upto, [m.id for m in found if spec.matches(m)])

    async def redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        """The step is one script, which returns the task as it leaves it; the global index is then brought
        along. That is a hint only (task_lease reads the task's own lease), so a failure there never fails a
        step whose moves are done. A task with a signature filter first has its next messages read here
        (Lua cannot compute a signature) and the script moves only those found of it."""
        read = await self._read_ahead(q, task_id, batch)
        r = await self._scripts.redrive_step(
            await self._target(q),
            now=self._clock.now_ms(),
            task_id=task_id,
            owner=owner,
            lease_ms=lease_ms,
            batch=batch,
            read=read,
        )
        await self._scheduled(q, r.marks)
        task = _task(q, task_id, r.task)
        if task.status != "running":
            await self._drop_index_entry(q, task_id)
            return task
        try:
            async with unavailable_as_domain_error():
                await self._client.zadd(
                    tasks_key(self._namespace), {_task_member(q, task_id): task.updated_ms + lease_ms}
                )
        except CharonError as exc:
            log.debug("redrive index not updated (%s)", exc.description)
        return task

    # -- sweeper ------------------------------------------------------------------------------------------

    async def sweep(self, *, lease_ms: int = 0) -> int | None:
        """Visit every queue whose next claim or message expiry has come (sweep.lua), in every project.

        The projects looked at are those touched since the last sweep and those whose recorded due time has
        come; every FULL_SCAN_MS one sweeper looks at all of them, which repairs the record after a sweeper
        died between taking the touched set and recording what it found. With `lease_ms`, only one process a
        period does the work: it sweeps if it takes the namespace's lease for that long, and returns None
        otherwise. Correctness never depends on the lease (each queue's step is atomic); it only keeps many
        API processes from repeating each other's work. Returns the number of queues visited.
        """
        now = self._clock.now_ms()
        ns = self._namespace
        if self._unmarked:
            await self._mark_touched(list(self._unmarked))
        async with unavailable_as_domain_error():
            # A full Redis refuses SET (it may grow memory): sweep then without the lease (the work frees
            # memory, and doing it twice is harmless) and without the full scan (its mark is a SET too).
            if lease_ms > 0 and not await self._unless_full(
                self._client.set(sweeper_lease_key(ns), self._lease_token, nx=True, px=lease_ms), True
            ):
                return None
            visited = 0
            if await self._unless_full(
                self._client.set(full_scan_key(ns), self._lease_token, nx=True, px=FULL_SCAN_MS), False
            ):
                cursor = 0
                while True:
                    cursor, page = await self._client.sscan(
                        projects_key(ns), cursor, count=SWEEP_PROJECTS_PER_ROUND
                    )
                    visited += await self._sweep_projects([str(p) for p in page], now)
                    if int(cursor) == 0:
                        return visited
            # The set is taken before the projects are swept: a script that runs meanwhile marks its
            # project again, so it is looked at next time too.
            while touched := await self._client.spop(touched_key(ns), SWEEP_PROJECTS_PER_ROUND):
                visited += await self._sweep_projects([str(p) for p in touched], now)
            due = await self._client.zrangebyscore(due_projects_key(ns), "-inf", now)
            for i in range(0, len(due), SWEEP_PROJECTS_PER_ROUND):
                visited += await self._sweep_projects(
                    [str(p) for p in due[i : i + SWEEP_PROJECTS_PER_ROUND]], now
                )
            return visited

    @staticmethod
    async def _unless_full(command: Awaitable[Any], when_full: bool) -> bool:
        """Whether a bookkeeping SET succeeded; `when_full` if Redis refused it for want of memory."""
        try:
            async with unavailable_as_domain_error():
                return bool(await command)
        except StorageFull:
            return when_full

    async def _sweep_projects(self, projects: list[str], now: int) -> int:
        """Sweep what is due in `projects` and record each one's next due time."""
        if not projects:
            return 0
        keys = {p: ProjectKeys.of(self._namespace, p) for p in projects}
        # A plain read first: most projects have nothing due yet, and a read is far cheaper than a script.
        async with self._client.pipeline(transaction=False) as pipe:
            for k in keys.values():
                pipe.zrange(k.due, 0, 0, withscores=True)
            firsts = await pipe.execute()
        next_due: dict[str, float] = {}
        pending: list[str] = []
        for project, first in zip(projects, firsts, strict=True):
            if first and first[0][1] <= now:
                pending.append(project)
            elif first:
                next_due[project] = first[0][1]
        visited = 0
        while pending:
            results = await self._scripts.sweep(
                [keys[p] for p in pending], now=now, max_queues=SWEEP_QUEUES_PER_CALL
            )
            visited += sum(r.visited for r in results)
            for project, r in zip(pending, results, strict=True):
                if r.next_due_ms is not None:
                    next_due[project] = r.next_due_ms
                if r.owed:
                    await self._outbox.owed(project)
            pending = [p for p, r in zip(pending, results, strict=True) if r.still_due > 0]
        try:
            async with unavailable_as_domain_error(), self._client.pipeline(transaction=False) as pipe:
                if next_due:
                    pipe.zadd(due_projects_key(self._namespace), next_due)
                idle = [p for p in projects if p not in next_due]
                if idle:
                    pipe.zrem(due_projects_key(self._namespace), *idle)
                await pipe.execute()
        except StorageFull:  # the work is done; the record is repaired by a later sweep or the full scan
            self._unmarked.update(next_due)
        return visited

    # -- service ------------------------------------------------------------------------------------------

    async def ping(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.ping()

    async def check_writable(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.set(health_key(self._namespace), self._lease_token, px=10_000)

    def wakeups(self, on_wake: WakeCallback) -> RedisWakeups:
        return RedisWakeups(self._client, self._namespace, on_wake, self._timeout)

    async def aclose(self) -> None:
        await self._outbox.aclose()
        await self._runner.aclose()
        await self._client.aclose()

    # -- metrics ------------------------------------------------------------------------------------------

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        from storage.redis import gauges  # on first use: only GET /metrics needs it

        return await gauges.queue_gauges(
            self._client, self._scripts, self._namespace, now=self._clock.now_ms(), limit=limit
        )
