"""Finding the projects whose outbox has deliveries due, for the notifiers (RedisStore.lease_deliveries).

Each project's outbox (keys.ProjectKeys.outbox) is the truth, written by the scripts in the same step as
what owes a delivery. Which projects to look at is bookkeeping beside it, as for the sweeper: a script that
owed deliveries returns lib.lua marks() with OWED and the driver adds the project to the namespace's
`outbox-touched` set; a notifier takes that set, leases in those projects and in those whose recorded due
time (`outbox-due`) has come, and records each one's next due time. A mark lost with a process (between a
script and its SADD) is repaired by the full scan every FULL_SCAN_MS, which one notifier at a time runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

import redis.asyncio as aioredis

from core.errors import CharonError, MessageUnreadable, StorageFull
from core.models import Delivery, Message, MessageId
from core.sealing import UNREADABLE_PUT_OFF_MS
from storage.redis.keys import (
    DeliveryField,
    MessageField,
    ProjectKeys,
    message_of,
    outbox_due_key,
    outbox_scan_key,
    outbox_touched_key,
    projects_key,
    subscription_of,
)
from storage.redis.runner import unavailable_as_domain_error
from storage.redis.scripts import Scripts

FULL_SCAN_MS = 30_000
MARK_DELAY_S = 0.005  # marks owed within this long go in one SADD (a post need not wait for its own)
PROJECTS_PER_ROUND = 500
STATS_PROJECTS = 1000  # outbox_stats counts the deliveries of at most this many projects (the earliest due)

log = logging.getLogger("charon.redis")

_KIND, _SUB, _QUEUE, _ATTEMPTS, _CREATED, _MESSAGE = (
    DeliveryField.KIND.value,
    DeliveryField.SUBSCRIPTION.value,
    DeliveryField.QUEUE.value,
    DeliveryField.ATTEMPTS.value,
    DeliveryField.CREATED.value,
    DeliveryField.MESSAGE.value,
)
_PACKED = DeliveryField.PACKED.value
_KINDS = {"notification", "confirmation", "unsubscribed"}
_INDEX = "."  # a post's delivery hash's id, this, the message's index in it: the Delivery's id


def unreadable(project: str, delivery: str, e: MessageUnreadable) -> None:
    """A delivery whose message's body this process cannot open (its key is missing) is not sent, and does
    not hold up the others: it is put off (core/sealing.py UNREADABLE_PUT_OFF_MS), until the key is back."""
    log.warning(
        "project %s: delivery %s put off for %d s: %s", project, delivery, UNREADABLE_PUT_OFF_MS // 1000, e
    )


def deliveries_of(
    project: str, delivery_id: str, d: dict[str, str], s: dict[str, str], indexes: Sequence[int]
) -> list[Delivery]:
    """The deliveries leased of a hash, with its subscription's fields (lease_deliveries.lua): the one it
    holds, or for a post's notifications to one subscription (lib.lua notify_post) the messages leased."""
    kind = d[_KIND]
    if kind not in _KINDS:
        raise ValueError(f"unknown delivery kind {kind!r}")
    subscription = subscription_of(d[_SUB], s)
    created = int(d[_CREATED])
    if _PACKED in d:
        packed = d[_PACKED].split("\x1f")
        out = []
        for index in indexes:
            i = index - 1
            mid, ttl, eligible, body = packed[4 * i : 4 * i + 4]
            shown = {
                _QUEUE: d[_QUEUE],
                MessageField.BODY: body,
                MessageField.TTL: ttl,
                MessageField.CREATED: d[_CREATED],
                MessageField.NOT_ELIGIBLE: "0" if eligible == "1" else "1",
            }
            out.append(
                Delivery(
                    id=f"{delivery_id}{_INDEX}{index}",
                    project=project,
                    subscription=subscription,
                    kind="notification",
                    message=message_of(MessageId(mid), shown),
                    attempts=int(d.get(f"_a{index}", 0)),
                    created_ms=created,
                )
            )
        return out
    message: Message | None = None
    if _MESSAGE in d:
        message = message_of(MessageId(d[_MESSAGE]), d)
    return [
        Delivery(
            id=delivery_id,
            project=project,
            subscription=subscription,
            kind=kind,  # type: ignore[arg-type]  # checked against _KINDS above
            message=message,
            attempts=int(d[_ATTEMPTS]),
            created_ms=created,
        )
    ]


def _hash_of(d: Delivery) -> tuple[str, list[int]]:
    """The id of the hash `d` is in, and its index there (none when the hash is its alone)."""
    hash_id, dot, index = d.id.partition(_INDEX)
    return hash_id, [int(index)] if dot else []


class Outbox:
    def __init__(
        self, client: aioredis.Redis | aioredis.RedisCluster, scripts: Scripts, namespace: str, token: str
    ):
        self._client = client
        self._scripts = scripts
        self._ns = namespace
        self._token = token
        self._unmarked: set[str] = set()  # projects whose touched mark failed: marked at the next lease
        self._owing: set[str] = set()  # projects owed deliveries, to be marked by the task below
        self._marking: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()

    async def owed(self, project: str) -> None:
        """After a script owed deliveries in `project`: mark it for the notifiers, within MARK_DELAY_S, in
        one SADD with the other projects owed meanwhile: under load, one round trip serves many posts, and
        none waits for it. The script's work is done, so a failing mark never fails a call: it is tried
        again at this process's next lease, and a mark lost with the process is repaired by the full scan."""
        self._owing.add(project)
        if self._marking is None or self._marking.done():
            self._marking = asyncio.get_running_loop().create_task(self._mark_owing(MARK_DELAY_S))

    async def _mark_owing(self, after: float) -> None:
        await asyncio.sleep(after)
        while self._owing:  # also what was owed while the SADD before was on its way
            await self.flush()

    async def flush(self) -> None:
        """Mark the projects owed deliveries now (a lease does first; a closing store does). Returns once
        every mark this process owed is made, the task's too."""
        async with self._flushing:
            projects, self._owing = list(self._owing), set()
            if projects:
                await self._mark(projects)

    async def _mark(self, projects: list[str]) -> None:
        try:
            async with unavailable_as_domain_error():
                await self._client.sadd(outbox_touched_key(self._ns), *projects)
        except CharonError as exc:
            self._unmarked.update(projects)
            log.debug("outbox mark deferred (%s)", exc.description)
        else:
            self._unmarked.difference_update(projects)

    async def aclose(self) -> None:
        """Before the client closes: the marks still waiting are made (or left to the full scan)."""
        with contextlib.suppress(Exception):
            if self._marking is not None:
                await self._marking
            await self.flush()

    async def projects_due(self, now: int) -> list[str]:
        """Projects that may have deliveries due now: the touched ones (taken), those whose recorded due time
        has come, and every project when the full scan is due."""
        await self.flush()
        if self._unmarked:
            await self._mark(list(self._unmarked))
        ns = self._ns
        async with unavailable_as_domain_error():
            found: dict[str, None] = {}
            try:
                scan = bool(
                    await self._client.set(outbox_scan_key(ns), self._token, nx=True, px=FULL_SCAN_MS)
                )
            except StorageFull:
                scan = False
            if scan:
                found.update(dict.fromkeys(await self._scan(now)))
            # The set is taken before the projects are leased from: a script that owes meanwhile marks its
            # project again.
            while touched := await self._client.spop(outbox_touched_key(ns), PROJECTS_PER_ROUND):
                found.update(dict.fromkeys(map(str, touched)))
            due = await self._client.zrangebyscore(outbox_due_key(ns), "-inf", now)
            found.update(dict.fromkeys(map(str, due)))
        return list(found)

    async def _scan(self, now: int) -> list[str]:
        """Every project's outbox's earliest due time, read (cheaper than a script each) and recorded; the
        projects with deliveries due now."""
        due_now: list[str] = []
        cursor = 0
        while True:
            cursor, page = await self._client.sscan(projects_key(self._ns), cursor, count=PROJECTS_PER_ROUND)
            projects = [str(p) for p in page]
            async with self._client.pipeline(transaction=False) as pipe:
                for p in projects:
                    pipe.zrange(ProjectKeys.of(self._ns, p).outbox, 0, 0, withscores=True)
                firsts = await pipe.execute()
            seen = {p: int(first[0][1]) for p, first in zip(projects, firsts, strict=True) if first}
            due_now.extend(p for p, at in seen.items() if at <= now)
            await self.record(seen)
            if int(cursor) == 0:
                return due_now

    async def record(self, next_due: Mapping[str, int | None]) -> None:
        """Record each project's outbox's earliest due time (None: empty)."""
        if not next_due:
            return
        due = {p: at for p, at in next_due.items() if at is not None}
        idle = [p for p, at in next_due.items() if at is None]
        try:
            async with unavailable_as_domain_error(), self._client.pipeline(transaction=False) as pipe:
                if due:
                    pipe.zadd(outbox_due_key(self._ns), due)
                if idle:
                    pipe.zrem(outbox_due_key(self._ns), *idle)
                await pipe.execute()
        except CharonError as exc:  # the leases are taken; a later round or the full scan repairs this
            self._unmarked.update(due)
            log.debug("outbox due times not recorded (%s)", exc.description)

    async def lease(self, owner: str, *, now: int, lease_ms: int, limit: int) -> list[Delivery]:
        del owner  # a lease is held by time: a delivery is due again when it ends, whoever took it
        out: list[Delivery] = []
        projects = await self.projects_due(now)
        while projects and len(out) < limit:
            # each project of a round gets an equal share of what is left, so no lease is taken and dropped
            room = limit - len(out)
            batch, projects = (
                projects[: min(room, PROJECTS_PER_ROUND)],
                projects[min(room, PROJECTS_PER_ROUND) :],
            )
            keys = [ProjectKeys.of(self._ns, p) for p in batch]
            replies = await self._scripts.lease_deliveries(
                keys, now=now, lease_ms=lease_ms, limit=max(1, room // len(batch))
            )
            for project, reply in zip(batch, replies, strict=True):
                for did, d, s, indexes in reply.leased:
                    try:
                        out.extend(deliveries_of(project, did, d, s, indexes))
                    except MessageUnreadable as e:
                        unreadable(project, did, e)
                        await self._scripts.finish_delivery(
                            ProjectKeys.of(self._ns, project),
                            delivery_id=did,
                            retry_at=now + UNREADABLE_PUT_OFF_MS,
                            attempted=False,
                            indexes=indexes if _PACKED in d else (),
                        )
            await self.record({p: r.next_due_ms for p, r in zip(batch, replies, strict=True)})
        if projects:  # not looked at this time: still due, so recorded as due now for the next call
            await self.record(dict.fromkeys(projects, now))
        return out

    async def finish(self, d: Delivery, *, retry_at_ms: int | None, attempted: bool) -> None:
        project = ProjectKeys.of(self._ns, d.project)
        hash_id, indexes = _hash_of(d)
        first = await self._scripts.finish_delivery(
            project, delivery_id=hash_id, retry_at=retry_at_ms, attempted=attempted, indexes=indexes
        )
        # A retry may move the project's due time earlier (its lease end was recorded), and so may finishing
        # one message of a post's hash whose other messages are due sooner: the project is marked, as after
        # a post (a due time recorded here could be overwritten by a lease's record running meanwhile)
        if first is not None and (retry_at_ms is not None or indexes):
            await self.owed(d.project)

    async def finish_all(self, done: Sequence[Delivery]) -> None:
        """Finish each of `done` as delivered, a script call per hash (a post's messages together), all in
        one round trip. A post's hash is due again at the earliest time of the messages it still owes
        (finish_delivery.lua), which may be sooner than its lease's end, so each project's due time is
        recorded again (lowered only). Not marked, as a retry is (finish): a mark a finish batch made
        cost produce 0.83x against 0.93-0.99x (bench/RESULTS.md, "Third pass")."""
        if not done:
            return
        by_hash: dict[tuple[str, str], list[int]] = {}
        for d in done:
            hash_id, indexes = _hash_of(d)
            by_hash.setdefault((d.project, hash_id), []).extend(indexes)
        calls = [(ProjectKeys.of(self._ns, p), h, indexes) for (p, h), indexes in by_hash.items()]
        async with unavailable_as_domain_error():
            firsts = await self._scripts.finish_deliveries(calls)
        due: dict[str, int] = {}
        for (project, _), first in zip(by_hash, firsts, strict=True):
            if first is not None:
                due[project] = min(first, due.get(project, first))
        if due:
            try:
                async with unavailable_as_domain_error():
                    await self._client.zadd(outbox_due_key(self._ns), due, lt=True)
            except CharonError:
                self._unmarked.update(due)

    async def stats(self) -> tuple[int, int | None]:
        """Counted in the projects marked or recorded (at most STATS_PROJECTS of each, the earliest
        recorded): their outboxes are the truth, the marks a hint that may name an outbox emptied since.
        A project's count is its `outbox:owed` (messages, a post's counted each), never below its outbox's
        entries, and 0 when the outbox is empty."""
        await self.flush()
        async with unavailable_as_domain_error():
            due = await self._client.zrange(outbox_due_key(self._ns), 0, STATS_PROJECTS - 1)
            touched = await self._client.srandmember(outbox_touched_key(self._ns), STATS_PROJECTS)
            recorded = list(dict.fromkeys([*map(str, due), *map(str, touched or [])]))
            if not recorded:
                return 0, None
            async with self._client.pipeline(transaction=False) as pipe:
                for project in recorded:
                    keys = ProjectKeys.of(self._ns, str(project))
                    pipe.zcard(keys.outbox)
                    pipe.get(keys.outbox_owed)
                    pipe.zrange(keys.outbox, 0, 0, withscores=True)
                replies = await pipe.execute()
        waiting, firsts = 0, []
        for entries, owed, first in zip(replies[0::3], replies[1::3], replies[2::3], strict=True):
            if first:
                waiting += max(int(entries), int(owed or 0))
                firsts.append(int(first[0][1]))
        return waiting, min(firsts, default=None)
