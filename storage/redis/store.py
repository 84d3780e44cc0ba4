"""RedisStore: the Store protocol on Redis (redis-py asyncio); every operation is one script call.

Durability is Redis' own: run the server with AOF (`appendonly yes`, `appendfsync everysec` or `always`).
Scripts are plain EVALSHA (no FUNCTION), so Redis 6.2 and later work, and every key a script touches shares
the project's hash tag (keys.py), so Redis Cluster works too.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from core.clock import Clock, SystemClock
from core.errors import CharonError, InvalidInput, NotFound, StorageFull
from core.metadata import DeadLetterDefaults, QueuePolicy
from core.models import (
    Claim,
    ClaimId,
    ClaimResult,
    Idempotency,
    Message,
    MessageId,
    MessageStamp,
    NewMessage,
    Page,
    QueueInfo,
    QueueRef,
    QueueStats,
    RedriveSpec,
    RedriveTask,
    Rejection,
    TaskId,
)
from storage.base import DEFAULT_TIMEOUT_S
from storage.redis.keys import (
    ProjectKeys,
    QueueKeys,
    due_projects_key,
    full_scan_key,
    health_key,
    message_of,
    project_prefix,
    projects_key,
    sweeper_lease_key,
    tasks_key,
    touched_key,
)
from storage.redis.scripts import (
    READ_SCRIPTS,
    DirectScripts,
    load_scripts,
    run,
    unavailable_as_domain_error,
)

DROP_BATCH = 500
SWEEP_QUEUES_PER_CALL = 50  # due queues one sweep.lua call visits (each bounded by lib.lua's housekeep)
SWEEP_PROJECTS_PER_ROUND = 500  # projects looked at in one pipeline
CLUSTER_SWEEP_CONCURRENCY = 32  # sweep.lua calls in flight at once on a Redis Cluster
FULL_SCAN_MS = 30_000  # how often some sweeper walks every project, to repair what a crash left unmarked


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
Client = aioredis.Redis | aioredis.RedisCluster

log = logging.getLogger("charon.redis")


class Cluster(aioredis.RedisCluster):
    """A RedisCluster that finishes initializing before its first command starts. redis-py 8 resolves a
    command's policy before it initializes, and concurrent first commands then met connections the
    initialization closed ("Connection closed by server"): with no retries (a script sent again could run
    twice), 358 of 480 such commands failed in a check here, none with this."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


def cluster_options(url: str) -> dict[str, Any]:
    """RedisCluster's arguments from `redis+cluster://[user:password@]host:port,host:port/`."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for address in hosts.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInput(f"A Redis Cluster URI lists host:port pairs; got {address!r} in {url!r}.")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    options: dict[str, Any] = {"startup_nodes": nodes, "ssl": parts.scheme == "rediss+cluster"}
    if credentials:
        user, _, password = credentials.partition(":")
        options.update(username=unquote(user) or None, password=unquote(password) or None)
    return options


def new_id() -> str:
    """32 random hex digits (as uuid4().hex, without building a UUID: ten of those were 5% of a post)."""
    return os.urandom(16).hex()


def _task_member(q: QueueRef, task_id: str) -> str:
    return orjson.dumps([q.project, q.name, task_id]).decode()


def _message(flat: list[Any]) -> Message:
    """A message from a script's view: [id, field, value, field, value, ...] (lib.lua view())."""
    return message_of(flat[0], dict(zip(flat[1::2], flat[2::2], strict=True)))


def _policy_args(metadata: Mapping[str, Any], policy: QueuePolicy, expected_version: int | None) -> list[Any]:
    """ARGV for lib.lua write_metadata: the metadata, then its POLICY_FIELDS in order, then the version."""

    def opt(value: float | str | None) -> float | str:
        return "" if value is None else value

    b = policy.backoff
    return [
        orjson.dumps(dict(metadata)).decode(),
        opt(policy.default_message_ttl),
        opt(policy.default_message_delay),
        opt(policy.max_messages_post_size),
        opt(policy.max_claim_count),
        opt(policy.dead_letter_queue),
        opt(policy.dead_letter_ttl),
        opt(b.delay_ms if b else None),
        opt(repr(b.multiplier) if b else None),
        opt(b.max_ms if b else None),
        opt(repr(b.jitter) if b else None),
        opt(",".join(map(str, b.levels_ms)) if b and b.levels_ms else None),
        opt(policy.expired_ttl),
        opt(policy.max_message_ttl),
        opt(expected_version),
    ]


STEP_FIELDS = ("status", "cursor", "scanned", "moved", "skipped", "end", "cr", "up", "spec", "owner")


def _task(q: QueueRef, task_id: str, f: Mapping[Any, Any]) -> RedriveTask:
    """A task from its hash (the client decodes responses, so every field and value is a str)."""
    return RedriveTask(
        id=TaskId(task_id),
        queue=q.name,
        spec=RedriveSpec.from_dict(orjson.loads(f["spec"])),
        status=f["status"],  # the scripts write only TaskStatus values
        created_ms=int(f["cr"]),
        updated_ms=int(f["up"]),
        end_marker=int(f["end"]),
        cursor=int(f["cursor"]),
        scanned=int(f["scanned"]),
        moved=int(f["moved"]),
        skipped=int(f["skipped"]),
        owner=f["owner"],
    )


def _opt(value: object) -> str:
    return "" if value is None else str(value)


class RedisStore:
    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        namespace: str = "charon",
        clock: Clock | None = None,
        defaults: DeadLetterDefaults | None = None,
    ):
        self._client = client
        self._unmarked: set[str] = set()  # projects whose touched mark failed: marked at the next sweep
        self._namespace = namespace
        self._clock = clock or SystemClock()
        self._scripts = load_scripts(client, defaults)
        self._direct = DirectScripts(client, self._scripts) if isinstance(client, aioredis.Redis) else None
        self._registered: set[str] = set()  # projects this process has put in the sweeper's list
        self._keys: dict[QueueRef, tuple[list[bytes], bytes, bytes]] = {}
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
    ) -> RedisStore:
        """`redis://`, `rediss://` or `unix://` for one server; `redis+cluster://host:port,host:port,...`
        (or `rediss+cluster://` for TLS) for a Redis Cluster, given any of its nodes. `timeout`: seconds a
        call may wait for the server (connecting, or for an answer) before it fails with 503."""
        return cls(cls.client_from_url(url, timeout), namespace=namespace, clock=clock, defaults=defaults)

    @staticmethod
    def client_from_url(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> Client:
        """redis-py retries a command whose connection failed; here only once, and never after a timeout:
        a script sent again after it timed out could run twice (queue scripts take the DirectScripts path,
        which retries only when nothing was sent; a cluster's scripts are not retried at all)."""
        bounded: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if urlsplit(url).scheme in CLUSTER_SCHEMES:
            return Cluster(
                **cluster_options(url), decode_responses=True, retry=Retry(NoBackoff(), 0), **bounded
            )
        once = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        return aioredis.Redis.from_url(
            url, decode_responses=True, health_check_interval=30, retry=once, **bounded
        )

    def _script_keys(self, q: QueueRef) -> tuple[list[bytes], bytes, bytes]:
        """A queue script's KEYS and its first two ARGV (prefix, name), encoded once per queue and kept: on
        a one-message DELETE, building and encoding them was a fifth of the time spent in redis-py."""
        cached = self._keys.get(q)
        if cached is None:
            if len(self._keys) >= 10_000:
                self._keys.clear()
            qk = QueueKeys.of(self._namespace, q)
            cached = ([k.encode() for k in qk.all()], qk.prefix.encode(), q.name.encode())
            self._keys[q] = cached
        return cached

    async def _call(self, name: str, q: QueueRef, *args: Any, extra_keys: Sequence[str] = ()) -> Any:
        keys, prefix, queue_name = self._script_keys(q)
        if extra_keys:
            keys = [*keys, *(k.encode() for k in extra_keys)]
        if q.project not in self._registered:
            await self._register(q.project)
        write = name not in READ_SCRIPTS
        argv = [prefix, queue_name, self._clock.now_ms(), *args]
        if self._direct is not None:
            return await self._direct(name, keys, argv, write=write)
        async with unavailable_as_domain_error(write=write):
            return await run(self._scripts[name], keys, argv)

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

    async def _call_scheduling(
        self, name: str, q: QueueRef, *args: Any, extra_keys: Sequence[str] = ()
    ) -> list[Any]:
        """_call() for the scripts that may move the project's earliest due time earlier (lib.lua SWEEP):
        they return that flag first, and then the project is marked touched so the sweeper looks at it.
        The script's work is done by then, so a failing mark never fails the call: it is tried again at
        this process's next sweep, and a mark lost with the process is repaired by the periodic full scan."""
        out: list[Any] = await self._call(name, q, *args, extra_keys=extra_keys)
        lowered, *result = out
        if lowered:
            await self._mark_touched([q.project])
        return result

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
        return bool(await self._call("create_queue", q, *_policy_args(metadata, policy, expected_version)))

    async def metadata_version(self, q: QueueRef) -> int:
        async with unavailable_as_domain_error():
            raw = await self._client.get(f"{project_prefix(self._namespace, q.project)}mver")
        return int(raw or 0)

    async def get_metadata(self, q: QueueRef) -> dict[str, Any]:
        async with unavailable_as_domain_error():
            raw = await self._client.hget(QueueKeys.of(self._namespace, q).queue, "meta")
        return dict(orjson.loads(raw)) if raw else {}

    async def set_metadata(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> None:
        await self._call("set_metadata", q, *_policy_args(metadata, policy, expected_version))

    async def list_queues(
        self, project: str, *, marker: str | None, limit: int, detailed: bool
    ) -> Page[QueueInfo]:
        prefix = project_prefix(self._namespace, project)
        start = f"({marker}" if marker else "-"
        async with unavailable_as_domain_error():
            names = [str(n) for n in await self._client.zrangebylex(f"{prefix}queues", start, "+", 0, limit)]
            metas: list[str | None] = []
            if detailed and names:
                async with self._client.pipeline(transaction=False) as pipe:
                    for name in names:
                        pipe.hget(f"{prefix}q:{name}", "meta")
                    metas = await pipe.execute()
        infos = [
            QueueInfo(name=n, metadata=(dict(orjson.loads(m)) if m else {}) if detailed else None)
            for n, m in zip(names, metas or [None] * len(names), strict=True)
        ]
        return Page(items=infos, next_marker=names[-1] if names else None)

    async def _drop(self, q: QueueRef, *, delete_queue: bool) -> None:
        # Batched so no single script blocks Redis on a huge queue; each batch is atomic on its own.
        while await self._call("drop_messages", q, DROP_BATCH, int(delete_queue)) > 0:
            pass

    async def delete_queue(self, q: QueueRef) -> None:
        await self._drop(q, delete_queue=True)

    async def purge(self, q: QueueRef) -> None:
        await self._drop(q, delete_queue=False)

    async def stats(self, q: QueueRef) -> QueueStats:
        total, claimed, delayed, n_dl, n_disc, n_rcv, old_id, old_cr, new_id_, new_cr = await self._call(
            "stats", q
        )
        return QueueStats(
            free=total - claimed,
            claimed=claimed,
            delayed=delayed,
            total=total,
            oldest=MessageStamp(MessageId(old_id), int(old_cr)) if old_id else None,
            newest=MessageStamp(MessageId(new_id_), int(new_cr)) if new_id_ else None,
            dead_lettered=n_dl,
            discarded=n_disc,
            dead_letters_received=n_rcv,
        )

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
        ids = [MessageId(new_id()) for _ in messages]
        fields: list[str] = []
        for mid, m in zip(ids, messages, strict=True):
            fields += [
                mid,
                "-1" if m.ttl is None else str(m.ttl),
                "-1" if m.delay is None else str(m.delay),
                "1" if m.dead_letter_eligible else "0",
                orjson.dumps(m.body).decode(),  # orjson escapes every control character: no raw "\x1f"
            ]
        packed = "\x1f".join(fields)
        args: list[Any] = [client_id, default_ttl, default_delay, body_size, packed]
        if idempotency is None:
            await self._call_scheduling("post_messages", q, *args)
            return ids
        record = QueueKeys.of(self._namespace, q).idempotency(idempotency.key)
        args += [idempotency.fingerprint, idempotency.window_ms]
        n, *earlier = await self._call_scheduling("post_messages", q, *args, extra_keys=[record])
        return [MessageId(i) for i in earlier[0].split(",")] if n == -1 else ids

    async def list_messages(
        self,
        q: QueueRef,
        *,
        marker: int | None,
        limit: int,
        echo: bool,
        client_id: str,
        include_claimed: bool,
        include_delayed: bool,
    ) -> Page[Message]:
        last, more, *views = await self._call(
            "list_messages",
            q,
            marker or 0,
            limit,
            int(echo),
            client_id,
            int(include_claimed),
            int(include_delayed),
        )
        return Page(items=[_message(v) for v in views], next_marker=str(last) if more else None)

    async def get_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> list[Message]:
        return [_message(v) for v in await self._call("get_messages", q, *ids)]

    async def delete_message(self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId | None) -> None:
        await self._call("delete_message", q, message_id, claim_id or "")

    async def delete_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> None:
        await self._call("delete_messages", q, *ids)

    async def pop_messages(self, q: QueueRef, *, limit: int) -> list[Message]:
        return [_message(v) for v in await self._call("pop_messages", q, limit)]

    # -- claims -------------------------------------------------------------------------------------------

    async def claim(self, q: QueueRef, *, ttl: int, grace: int, limit: int) -> ClaimResult:
        claim_id = ClaimId(new_id())
        now = self._clock.now_ms()
        dead_lettered, discarded, *views = await self._call_scheduling(
            "claim", q, claim_id, ttl, grace, limit
        )
        claim = None
        if views:
            claim = Claim(
                id=claim_id,
                queue=q.name,
                ttl=ttl,
                grace=grace,
                created_ms=now,
                expires_ms=now + ttl * 1000,
                messages=[_message(v) for v in views],
            )
        return ClaimResult(claim=claim, dead_lettered=dead_lettered, discarded=discarded)

    async def get_claim(self, q: QueueRef, claim_id: ClaimId) -> Claim:
        ttl, grace, created, expires, *views = await self._call("get_claim", q, claim_id)
        return Claim(
            id=claim_id,
            queue=q.name,
            ttl=int(ttl),
            grace=int(grace),
            created_ms=int(created),
            expires_ms=int(expires),
            messages=[_message(v) for v in views],
        )

    async def renew_claim(self, q: QueueRef, claim_id: ClaimId, *, ttl: int, grace: int) -> None:
        await self._call_scheduling("renew_claim", q, claim_id, ttl, grace)

    async def release_claim(self, q: QueueRef, claim_id: ClaimId, *, delay: int | None = None) -> None:
        await self._call_scheduling("release_claim", q, claim_id, _opt(delay and delay * 1000))

    async def release_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, delay: int | None = None
    ) -> None:
        await self._call_scheduling("release_message", q, message_id, claim_id, _opt(delay and delay * 1000))

    async def dead_letter_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, rejection: Rejection
    ) -> bool:
        outcome = await self._call(
            "dead_letter_message",
            q,
            message_id,
            claim_id,
            rejection.reason or "",
            rejection.description or "",
        )
        return bool(outcome == "moved")

    # -- redrive -------------------------------------------------------------------------------------------

    async def create_redrive(
        self, q: QueueRef, task_id: TaskId, spec: RedriveSpec, *, owner: str, lease_ms: int
    ) -> RedriveTask:
        """The global index entry first (one pointing at no task is dropped by lease_redrives), then the task
        with the DLQ's index (one script): a crash between them leaves nothing a runner cannot adopt, and
        once the script ran the task is answered from what it returned, with no read that could fail."""
        now = self._clock.now_ms()
        async with unavailable_as_domain_error(write=True):
            await self._client.zadd(tasks_key(self._namespace), {_task_member(q, task_id): now + lease_ms})
        last = await self._call(
            "task_create",
            q,
            task_id,
            orjson.dumps(spec.to_dict()).decode(),
            _opt(spec.destination),
            _opt(spec.source_queue),
            _opt(spec.reason),
            _opt(spec.after_ms),
            _opt(spec.before_ms),
            _opt(spec.limit),
            owner,
            lease_ms,
        )
        return RedriveTask(
            id=task_id,
            queue=q.name,
            spec=spec,
            status="running",
            created_ms=now,
            updated_ms=now,
            end_marker=int(last),
            owner=owner,
        )

    async def get_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        async with unavailable_as_domain_error():
            f = await self._client.hgetall(ProjectKeys.of(self._namespace, q.project).task(task_id))
        if f.get("q") != q.name:
            raise NotFound(f"Queue {q.name} has no redrive task {task_id}.")
        return _task(q, task_id, f)

    async def list_redrives(self, q: QueueRef, *, limit: int) -> list[RedriveTask]:
        index = ProjectKeys.of(self._namespace, q.project).tasks(q.name)
        async with unavailable_as_domain_error():
            ids = [str(i) for i in await self._client.zrevrange(index, 0, limit - 1)]
            async with self._client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.hgetall(ProjectKeys.of(self._namespace, q.project).task(task_id))
                hashes = await pipe.execute()
            # A finished task's hash expires after TASK_KEEP_MS; its index entry goes when it is next listed.
            gone = [task_id for task_id, f in zip(ids, hashes, strict=True) if not f]
            if gone:
                await self._client.zrem(index, *gone)
        return [_task(q, task_id, f) for task_id, f in zip(ids, hashes, strict=True) if f]

    async def cancel_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        tk = ProjectKeys.of(self._namespace, q.project).task(task_id)
        async with unavailable_as_domain_error():
            await run(self._scripts["task_cancel"], [tk], [q.name, self._clock.now_ms()])
            await self._client.zrem(tasks_key(self._namespace), _task_member(q, task_id))
        return await self.get_redrive(q, task_id)

    async def lease_redrives(self, owner: str, *, lease_ms: int, limit: int) -> list[tuple[QueueRef, TaskId]]:
        now = self._clock.now_ms()
        index = tasks_key(self._namespace)
        taken = []
        async with unavailable_as_domain_error():
            due = await self._client.zrangebyscore(index, "-inf", now, start=0, num=limit)
            for member in map(str, due):
                project, name, task_id = orjson.loads(member)
                tk = ProjectKeys.of(self._namespace, project).task(task_id)
                got, status = await run(self._scripts["task_lease"], [tk], [owner, now, lease_ms])
                if status != "running":
                    await self._client.zrem(index, member)
                elif got:
                    await self._client.zadd(index, {member: now + lease_ms})
                    taken.append((QueueRef(project, name), TaskId(task_id)))
        return taken

    async def release_redrive(self, q: QueueRef, task_id: TaskId, *, owner: str) -> None:
        tk = ProjectKeys.of(self._namespace, q.project).task(task_id)
        async with unavailable_as_domain_error():
            if await run(self._scripts["task_release"], [tk], [owner]):
                await self._client.zadd(tasks_key(self._namespace), {_task_member(q, task_id): 0}, xx=True)

    async def redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        """The step is one script, which returns the task as it leaves it; the global index is then brought
        along. That is a hint only (task_lease reads the task's own lease), so a failure there never fails a
        step whose moves are done."""
        out = await self._call_scheduling("redrive_step", q, task_id, owner, lease_ms, batch)
        # the task's hash fields, in the order redrive_step.lua returns them
        task = _task(q, task_id, dict(zip(STEP_FIELDS, out, strict=True)))
        member = _task_member(q, task_id)
        try:
            async with unavailable_as_domain_error():
                if task.status == "running":
                    await self._client.zadd(tasks_key(self._namespace), {member: task.updated_ms + lease_ms})
                else:
                    await self._client.zrem(tasks_key(self._namespace), member)
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
        prefixes = {p: project_prefix(self._namespace, p) for p in projects}
        # A plain read first: most projects have nothing due yet, and a read is far cheaper than a script.
        async with self._client.pipeline(transaction=False) as pipe:
            for prefix in prefixes.values():
                pipe.zrange(f"{prefix}due", 0, 0, withscores=True)
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
            results = await self._sweep_scripts([prefixes[p] for p in pending], now)
            visited += sum(int(r[0]) for r in results)
            for project, r in zip(pending, results, strict=True):
                if int(r[2]) >= 0:
                    next_due[project] = int(r[2])
            pending = [p for p, r in zip(pending, results, strict=True) if int(r[1]) > 0]
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

    async def _sweep_scripts(self, prefixes: list[str], now: int) -> list[Any]:
        """sweep.lua once per project prefix: pipelined on one server; on a Redis Cluster, which refuses
        scripts in a pipeline, as concurrent calls (each routed to its project's node), a batch at a time."""
        script = self._scripts["sweep"]
        if isinstance(self._client, aioredis.RedisCluster):
            results: list[Any] = []
            for i in range(0, len(prefixes), CLUSTER_SWEEP_CONCURRENCY):
                batch = prefixes[i : i + CLUSTER_SWEEP_CONCURRENCY]
                results += await asyncio.gather(
                    *(script(keys=[f"{p}due"], args=[p, now, SWEEP_QUEUES_PER_CALL]) for p in batch)
                )
            return results
        async with self._client.pipeline(transaction=False) as pipe:
            for prefix in prefixes:
                await script(keys=[f"{prefix}due"], args=[prefix, now, SWEEP_QUEUES_PER_CALL], client=pipe)
            return list(await pipe.execute())

    # -- service ------------------------------------------------------------------------------------------

    async def ping(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.ping()

    async def check_writable(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.set(health_key(self._namespace), self._lease_token, px=10_000)

    async def aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        await self._client.aclose()
