"""PooledStore: the Store protocol over many pools, each queue routed to the pool the catalogue places it in.

The API layer sees one Store and never learns about pools. Each call looks up the queue's pool and hands
the call to that pool's driver, so every atomicity promise is the driver's own: a queue and its DLQ share a
pool, and a dead-letter move stays one step in one backend.

- Placement happens at a queue's first write (create, metadata, post): in its DLQ's pool when its metadata
  names a DLQ that is placed already, else in a pool of its `_flavor` (or a flavorless pool), chosen by
  weighted rendezvous hashing of its project (home_pool); a pool of weight 0 takes no new queue.
- Naming a DLQ places it in the source's pool when it has none yet; a DLQ already placed in another pool is
  refused with 400, naming both pools.
- A queue never placed reads as empty, as in one store (queues are lazy).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from core.clock import Clock, SystemClock
from core.errors import (
    ClaimNotFound,
    InvalidInput,
    MessageNotFound,
    NotFound,
    StorageUnavailable,
    SubscriptionNotFound,
)
from core.metadata import DEAD_LETTER_QUEUE, FLAVOR, DeadLetterDefaults, QueuePolicy
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
)
from core.quotas import COUNTED, Bucket, Counted, Grant
from storage.base import DEFAULT_TIMEOUT_S, QuotaStore, Store, WakeCallback, Wakeups
from storage.pooling.catalogue import Catalogue, Pool
from storage.registry import open_store

T = TypeVar("T")

POOL_REFRESH_S = 5.0  # how long a pool's definition (its URI) is trusted before it is read again
PLACE_ATTEMPTS = 5  # a chosen pool can vanish before the placement lands; choose again this often


@dataclass(slots=True)
class _Open:
    pool: Pool
    store: Store
    checked: float


def no_claim(claim_id: ClaimId) -> ClaimNotFound:
    return ClaimNotFound(f"Claim {claim_id} does not exist or has expired.")


class PooledStore:
    def __init__(
        self,
        catalogue: Catalogue,
        *,
        namespace: str = "charon",
        clock: Clock | None = None,
        defaults: DeadLetterDefaults | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        management: Store | None = None,
        quotas: Counted | None = None,
    ) -> None:
        """`management`: where project-wide records live (quota overrides and request-rate buckets), the store
        on the catalogue's URI; without one (a tool that only moves queues), no project has an override and
        a rate limit cannot be taken."""
        self.catalogue = catalogue
        self._management = management
        self._timeout = timeout
        self._namespace = namespace
        self._clock = clock or SystemClock()
        self._defaults = defaults or DeadLetterDefaults()
        self._quota_defaults = quotas
        self._open: dict[str, _Open] = {}
        self._retired: list[Store] = []

    # -- pools ---------------------------------------------------------------------------------------------

    async def pool_store(self, name: str) -> Store:
        """The driver of pool `name`, opened on first use and reopened when the pool's URI changes."""
        entry = self._open.get(name)
        if entry is not None and time.monotonic() - entry.checked < POOL_REFRESH_S:
            return entry.store
        pool = await self.catalogue.get_pool(name)
        entry = self._open.get(name)  # another request may have opened it meanwhile
        if pool is None:
            if entry is not None:  # being deleted, which it refuses while queues are placed in it
                return entry.store
            raise StorageUnavailable(f"Pool {name!r} holds this queue but is not in the pool catalogue.")
        if entry is not None and (entry.pool.uri, entry.pool.options) == (pool.uri, pool.options):
            entry.checked = time.monotonic()
            entry.pool = pool
            return entry.store
        store = open_store(
            pool.uri,
            namespace=pool_namespace(pool, self._namespace),
            clock=self._clock,
            defaults=self._defaults,
            timeout=self._timeout,
            quotas=self._quota_defaults,
        )
        if entry is not None:
            self._retired.append(entry.store)  # requests in flight may still use it; closed at aclose()
        self._open[name] = _Open(pool, store, time.monotonic())
        return store

    def opened(self) -> dict[str, Store]:
        """The pools' drivers this process has opened, by pool name."""
        return {name: entry.store for name, entry in self._open.items()}

    async def _route(self, q: QueueRef) -> Store | None:
        name = await self.catalogue.lookup(q)
        return None if name is None else await self.pool_store(name)

    async def _choose(self, q: QueueRef, metadata: Mapping[str, Any]) -> str:
        pools = await self.catalogue.list_pools()
        flavor = metadata.get(FLAVOR)
        if flavor is not None:
            if await self.catalogue.get_flavor(flavor) is None:
                raise InvalidInput(
                    f"{FLAVOR} {flavor!r} is not a flavor of this service; GET /v2/flavors lists them."
                )
            candidates = [p for p in pools if p.flavor == flavor]
        else:
            candidates = [p for p in pools if p.flavor is None]
        dlq = self._dead_letter_queue(q, metadata)
        if dlq is not None:
            near = await self.catalogue.lookup(QueueRef(q.project, dlq))
            if near is not None and (flavor is None or any(p.name == near for p in candidates)):
                return near
        weighted = [p for p in candidates if p.weight > 0]
        if not weighted:
            which = f"of flavor {flavor!r}" if flavor is not None else "without a flavor"
            raise StorageUnavailable(
                f"No pool {which} takes new queues: an operator must register one (PUT /v2/pools/{{name}}) "
                "or raise a pool's weight above 0."
            )
        return home_pool(q.project, weighted).name

    def _dead_letter_queue(self, q: QueueRef, metadata: Mapping[str, Any]) -> str | None:
        """The DLQ `metadata` names for `q`, else the one the operator's template names (or None)."""
        dlq = metadata.get(DEAD_LETTER_QUEUE)
        if isinstance(dlq, str):
            return dlq
        return self._defaults.dead_letter_queue_for(q.name)

    async def _place(self, q: QueueRef, metadata: Mapping[str, Any]) -> str:
        """The pool `q` is placed in, placing it now if it is not (and the DLQ the operator's template names
        for it in the same pool, since its metadata does not name one)."""
        current = await self.catalogue.lookup(q)
        if current is not None:
            return current
        for _ in range(PLACE_ATTEMPTS):
            placed = await self.catalogue.place(q, await self._choose(q, metadata))
            if placed is not None:
                auto = self._defaults.dead_letter_queue_for(q.name)
                if auto is not None and DEAD_LETTER_QUEUE not in metadata:
                    await self.catalogue.place(QueueRef(q.project, auto), placed, referrer=q.name)
                return placed
        raise StorageUnavailable(f"Queue {q.name!r} could not be placed: pools kept disappearing.")

    async def _for_metadata(self, q: QueueRef, metadata: Mapping[str, Any], policy: QueuePolicy) -> Store:
        """The driver a metadata write of `q` goes to, with its DLQ placed in the same pool."""
        pool = await self._place(q, metadata)
        if policy.dead_letter_queue is not None:
            dlq = QueueRef(q.project, policy.dead_letter_queue)
            dlq_pool = await self.catalogue.place(dlq, pool, referrer=q.name)
            if dlq_pool is None:
                raise StorageUnavailable(f"Pool {pool!r} was deleted while queue {q.name!r} was written.")
            if dlq_pool != pool:
                raise InvalidInput(
                    f"{DEAD_LETTER_QUEUE} {dlq.name!r} lives in pool {dlq_pool!r} and queue {q.name!r} in "
                    f"pool {pool!r}: a queue and its DLQ must share a pool, so that a move stays one atomic "
                    f"step. Name a DLQ in pool {pool!r}, or one that does not exist yet (it is made there)."
                )
        return await self.pool_store(pool)

    # -- queues --------------------------------------------------------------------------------------------

    async def create_queue(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> bool:
        store = await self._for_metadata(q, metadata, policy)
        return await store.create_queue(
            q, metadata=metadata, policy=policy, expected_version=expected_version
        )

    async def metadata_version(self, q: QueueRef) -> int:
        """The version in q's pool; 0 while q is not placed. A write that then places q passes 0 on to the
        pool, which matches only when no metadata was ever written in the project there: the DLQ check that
        version guards read nothing but empty metadata in that pool, so it still holds."""
        store = await self._route(q)
        return 0 if store is None else await store.metadata_version(q)

    async def get_metadata(self, q: QueueRef) -> dict[str, Any]:
        store = await self._route(q)
        return {} if store is None else await store.get_metadata(q)

    async def set_metadata(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> None:
        store = await self._for_metadata(q, metadata, policy)
        await store.set_metadata(q, metadata=metadata, policy=policy, expected_version=expected_version)

    async def list_queues(
        self, project: str, *, marker: str | None, limit: int, detailed: bool
    ) -> Page[QueueInfo]:
        """Each pool's page, merged in name order; a queue a pool holds but the catalogue places elsewhere
        (left behind by a post racing the queue's deletion) is not shown."""
        pools = await self._each_pool()
        pages = await asyncio.gather(
            *(store.list_queues(project, marker=marker, limit=limit, detailed=detailed) for _, store in pools)
        )
        found = sorted(
            ((info, name) for (name, _), page in zip(pools, pages, strict=True) for info in page.items),
            key=lambda pair: pair[0].name,
        )[:limit]
        placed = await asyncio.gather(*(self.catalogue.lookup(QueueRef(project, i.name)) for i, _ in found))
        infos = [info for (info, pool), where in zip(found, placed, strict=True) if where == pool]
        return Page(items=infos, next_marker=found[-1][0].name if found else None)

    async def count_queues(self, project: str) -> int:
        """Every pool's count, added up."""
        return sum(
            await asyncio.gather(*(store.count_queues(project) for _, store in await self._each_pool()))
        )

    async def held_bytes(self, project: str) -> int:
        """Every pool's bytes, added up (each pool counts the quota on its own: docs/quotas.md)."""
        return sum(await asyncio.gather(*(store.held_bytes(project) for _, store in await self._each_pool())))

    async def delete_queue(self, q: QueueRef) -> None:
        """Delete the queue in its pool, then its placement, unless some queue still names it as DLQ (its
        next move must land where the catalogue says the DLQ lives)."""
        store = await self._route(q)
        if store is None:
            return
        await store.delete_queue(q)
        stale = {}
        for referrer, token in (await self.catalogue.referrers(q)).items():
            if (await self.get_metadata(QueueRef(q.project, referrer))).get(DEAD_LETTER_QUEUE) != q.name:
                stale[referrer] = token
        await self.catalogue.unplace(q, stale=stale)

    async def purge(self, q: QueueRef) -> None:
        store = await self._route(q)
        if store is not None:
            await store.purge(q)

    async def stats(self, q: QueueRef) -> QueueStats:
        store = await self._route(q)
        return QueueStats(free=0, claimed=0, total=0) if store is None else await store.stats(q)

    # -- messages ------------------------------------------------------------------------------------------

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
        store = await self.pool_store(await self._place(q, {}))
        return await store.post_messages(
            q,
            messages,
            client_id=client_id,
            default_ttl=default_ttl,
            default_delay=default_delay,
            body_size=body_size,
            idempotency=idempotency,
        )

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
        store = await self._route(q)
        if store is None:
            return Page(items=[], next_marker=None)
        return await store.list_messages(
            q,
            marker=marker,
            limit=limit,
            echo=echo,
            client_id=client_id,
            include_claimed=include_claimed,
            include_delayed=include_delayed,
        )

    async def get_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> list[Message]:
        store = await self._route(q)
        return [] if store is None else await store.get_messages(q, ids)

    async def delete_message(self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId | None) -> None:
        store = await self._route(q)
        if store is not None:
            await store.delete_message(q, message_id, claim_id=claim_id)

    async def delete_messages(
        self, q: QueueRef, ids: Sequence[MessageId], *, claim_ids: Sequence[ClaimId] | None = None
    ) -> list[NotDeleted]:
        store = await self._route(q)
        return [] if store is None else await store.delete_messages(q, ids, claim_ids=claim_ids)

    async def pop_messages(self, q: QueueRef, *, limit: int) -> list[Message]:
        store = await self._route(q)
        return [] if store is None else await store.pop_messages(q, limit=limit)

    # -- claims --------------------------------------------------------------------------------------------

    async def claim(
        self, q: QueueRef, *, ttl: int, grace: int, limit: int, wait_ms: int = 0, client_id: str = ""
    ) -> ClaimResult:
        store = await self._route(q)
        if store is None:
            if wait_ms > 0:  # a long poll on a queue not placed yet: its first post may go to any pool
                for _, pool_store in await self._each_pool():
                    await pool_store.claim(
                        q, ttl=ttl, grace=grace, limit=limit, wait_ms=wait_ms, client_id=client_id
                    )
            return ClaimResult(claim=None)
        return await store.claim(q, ttl=ttl, grace=grace, limit=limit, wait_ms=wait_ms, client_id=client_id)

    async def acknowledge_claim(self, q: QueueRef, claim_id: ClaimId) -> int:
        store = await self._route(q)
        if store is None:
            raise no_claim(claim_id)
        return await store.acknowledge_claim(q, claim_id)

    async def get_claim(self, q: QueueRef, claim_id: ClaimId) -> Claim:
        store = await self._route(q)
        if store is None:
            raise no_claim(claim_id)
        return await store.get_claim(q, claim_id)

    async def renew_claim(self, q: QueueRef, claim_id: ClaimId, *, ttl: int, grace: int) -> None:
        store = await self._route(q)
        if store is None:
            raise no_claim(claim_id)
        await store.renew_claim(q, claim_id, ttl=ttl, grace=grace)

    async def release_claim(self, q: QueueRef, claim_id: ClaimId, *, delay: int | None = None) -> None:
        store = await self._route(q)
        if store is not None:
            await store.release_claim(q, claim_id, delay=delay)

    async def release_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, delay: int | None = None
    ) -> None:
        await (await self._route_message(q, message_id)).release_message(
            q, message_id, claim_id=claim_id, delay=delay
        )

    async def dead_letter_message(
        self,
        q: QueueRef,
        message_id: MessageId,
        *,
        claim_id: ClaimId,
        rejection: Rejection,
        client_id: str = "",
    ) -> bool:
        return await (await self._route_message(q, message_id)).dead_letter_message(
            q, message_id, claim_id=claim_id, rejection=rejection, client_id=client_id
        )

    async def _route_message(self, q: QueueRef, message_id: MessageId) -> Store:
        store = await self._route(q)
        if store is None:
            raise MessageNotFound(f"Message {message_id} does not exist in queue {q.name}.")
        return store

    # -- redrive -------------------------------------------------------------------------------------------

    async def _route_task(self, q: QueueRef, task_id: TaskId) -> Store:
        store = await self._route(q)
        if store is None:
            raise NotFound(f"Queue {q.name} has no redrive task {task_id}.")
        return store

    async def create_redrive(
        self, q: QueueRef, task_id: TaskId, spec: RedriveSpec, *, owner: str, lease_ms: int
    ) -> RedriveTask:
        """The task lives in the DLQ's pool, and so must every queue it moves messages to: an explicit
        destination is placed there (400 when it lives elsewhere), and so is every queue recorded as naming
        the DLQ (each message's way back), in case it was deleted and its placement with it."""
        pool = await self.catalogue.lookup(q)
        if pool is None:
            raise NotFound(f"Queue {q.name} does not exist.")
        destinations = [spec.destination] if spec.destination else list(await self.catalogue.referrers(q))
        for name in destinations:
            placed = await self.catalogue.place(QueueRef(q.project, name), pool)
            if placed != pool and spec.destination:
                raise InvalidInput(
                    f"Redrive destination {name!r} lives in pool {placed!r} and queue {q.name!r} in pool "
                    f"{pool!r}: a redrive moves messages within one pool. Choose a queue in pool {pool!r}."
                )
        store = await self.pool_store(pool)
        return await store.create_redrive(q, task_id, spec, owner=owner, lease_ms=lease_ms)

    async def get_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        return await (await self._route_task(q, task_id)).get_redrive(q, task_id)

    async def list_redrives(self, q: QueueRef, *, limit: int) -> list[RedriveTask]:
        store = await self._route(q)
        return [] if store is None else await store.list_redrives(q, limit=limit)

    async def cancel_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        return await (await self._route_task(q, task_id)).cancel_redrive(q, task_id)

    async def lease_redrives(self, owner: str, *, lease_ms: int, limit: int) -> list[tuple[QueueRef, TaskId]]:
        """Tasks from each pool in turn (_lease_from_each_pool)."""
        return await self._lease_from_each_pool(
            lambda store, room: store.lease_redrives(owner, lease_ms=lease_ms, limit=room), limit
        )

    async def _lease_from_each_pool(
        self, lease: Callable[[Store, int], Awaitable[list[T]]], limit: int
    ) -> list[T]:
        """Up to `limit` leased from each pool in turn; an unreachable pool does not keep the others' work
        from running (its error is raised only when no pool gave anything)."""
        taken: list[T] = []
        failure: StorageUnavailable | None = None
        for _, store in await self._each_pool():
            if len(taken) >= limit:
                break
            try:
                taken += await lease(store, limit - len(taken))
            except StorageUnavailable as exc:
                failure = exc
        if failure is not None and not taken:
            raise failure
        return taken

    async def release_redrive(self, q: QueueRef, task_id: TaskId, *, owner: str) -> None:
        await (await self._route_task(q, task_id)).release_redrive(q, task_id, owner=owner)

    async def redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        store = await self._route_task(q, task_id)
        return await store.redrive_step(q, task_id, owner=owner, lease_ms=lease_ms, batch=batch)

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
        store = await self.pool_store(await self._place(q, {}))  # subscribing creates the queue, as a post
        return await store.create_subscription(
            q,
            subscription_id,
            subscriber=subscriber,
            ttl=ttl,
            options=options,
            confirmed=confirmed,
            max_per_queue=max_per_queue,
        )

    async def _route_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> Store:
        store = await self._route(q)
        if store is None:
            raise SubscriptionNotFound(f"Subscription {subscription_id} does not exist on queue {q.name}.")
        return store

    async def get_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> Subscription:
        return await (await self._route_subscription(q, subscription_id)).get_subscription(q, subscription_id)

    async def list_subscriptions(self, q: QueueRef, *, marker: str | None, limit: int) -> Page[Subscription]:
        store = await self._route(q)
        if store is None:
            return Page([], None)
        return await store.list_subscriptions(q, marker=marker, limit=limit)

    async def update_subscription(
        self,
        q: QueueRef,
        subscription_id: SubscriptionId,
        *,
        subscriber: str | None = None,
        ttl: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        store = await self._route_subscription(q, subscription_id)
        await store.update_subscription(q, subscription_id, subscriber=subscriber, ttl=ttl, options=options)

    async def confirm_subscription(
        self, q: QueueRef, subscription_id: SubscriptionId, *, confirmed: bool
    ) -> None:
        store = await self._route_subscription(q, subscription_id)
        await store.confirm_subscription(q, subscription_id, confirmed=confirmed)

    async def delete_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> None:
        store = await self._route(q)
        if store is not None:
            await store.delete_subscription(q, subscription_id)

    async def purge_subscriptions(self, q: QueueRef) -> None:
        store = await self._route(q)
        if store is not None:
            await store.purge_subscriptions(q)

    async def lease_deliveries(self, owner: str, *, lease_ms: int, limit: int) -> list[Delivery]:
        """Deliveries from each pool in turn (_lease_from_each_pool)."""
        return await self._lease_from_each_pool(
            lambda store, room: store.lease_deliveries(owner, lease_ms=lease_ms, limit=room), limit
        )

    async def finish_delivery(self, d: Delivery, *, retry_at_ms: int | None, attempted: bool = True) -> None:
        store = await self._route(QueueRef(d.project, d.subscription.queue))
        if store is not None:
            await store.finish_delivery(d, retry_at_ms=retry_at_ms, attempted=attempted)

    async def finish_deliveries(self, done: Sequence[Delivery]) -> None:
        by_pool: dict[int, tuple[Store, list[Delivery]]] = {}
        for d in done:
            store = await self._route(QueueRef(d.project, d.subscription.queue))
            if store is not None:
                by_pool.setdefault(id(store), (store, []))[1].append(d)
        for store, ds in by_pool.values():
            await store.finish_deliveries(ds)

    async def outbox_stats(self) -> tuple[int, int | None]:
        waiting, earliest = 0, None
        for _, store in await self._each_pool():
            n, first = await store.outbox_stats()
            waiting += n
            if first is not None and (earliest is None or first < earliest):
                earliest = first
        return waiting, earliest

    # -- quotas (project-wide: in the management store) ----------------------------------------------------

    def _quotas(self) -> QuotaStore:
        if self._management is None:
            raise StorageUnavailable("This pooled store was opened without its management store.")
        return self._management

    async def get_quota(self, project: str) -> dict[str, float]:
        return {} if self._management is None else await self._management.get_quota(project)

    async def set_quota(self, project: str, overrides: Mapping[str, float | None]) -> dict[str, float]:
        """Kept in the management store; the counted ones also in every pool, whose driver counts them
        against what it holds (a pool registered later gets them at the project's next PUT)."""
        shown = await self._quotas().set_quota(project, overrides)
        counted = {name: value for name, value in overrides.items() if name in COUNTED}
        if counted:
            for _, pool in await self._each_pool():
                await pool.set_quota(project, counted)
        return shown

    async def delete_quota(self, project: str) -> None:
        await self._quotas().delete_quota(project)
        for _, pool in await self._each_pool():
            await pool.delete_quota(project)

    async def take_tokens(
        self, project: str, bucket: Bucket, *, want: int, rate: float, capacity: int
    ) -> Grant:
        return await self._quotas().take_tokens(project, bucket, want=want, rate=rate, capacity=capacity)

    # -- service -------------------------------------------------------------------------------------------

    async def _each_pool(self) -> list[tuple[str, Store]]:
        return [(pool.name, await self.pool_store(pool.name)) for pool in await self.catalogue.list_pools()]

    async def _holding_or_each_pool(self, q: QueueRef) -> list[tuple[str, Store]]:
        """The pool that holds `q`, or every pool while `q` is not placed (its first write may go to any)."""
        name = await self.catalogue.lookup(q)
        return [(name, await self.pool_store(name))] if name is not None else await self._each_pool()

    async def sweep(self, *, lease_ms: int = 0) -> int | None:
        """Sweep every pool (each under its own lease); an unreachable pool does not stop the others."""
        results: list[int | BaseException | None] = await asyncio.gather(
            *(store.sweep(lease_ms=lease_ms) for _, store in await self._each_pool()), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        counts = [r for r in results if isinstance(r, int)]
        return sum(counts) if counts or not results else None

    async def ping(self) -> None:
        await self.catalogue.ping()
        for _, store in await self._each_pool():
            await store.ping()

    async def check_writable(self) -> None:
        for _, store in await self._each_pool():
            await store.check_writable()

    async def pool_health(self) -> dict[str, bool]:
        """Whether each pool answers, by name (the admin's detailed health)."""

        async def reachable(store: Store) -> bool:
            try:
                await store.ping()
            except StorageUnavailable:
                return False
            return True

        pools = await self._each_pool()
        answers = await asyncio.gather(*(reachable(store) for _, store in pools))
        return {name: ok for (name, _), ok in zip(pools, answers, strict=True)}

    def wakeups(self, on_wake: WakeCallback) -> PooledWakeups:
        return PooledWakeups(self, on_wake)

    async def aclose(self) -> None:
        for store in [*self.opened().values(), *self._retired]:
            await store.aclose()
        self._open.clear()
        self._retired.clear()
        if self._management is not None:
            await self._management.aclose()
        await self.catalogue.aclose()

    # -- metrics -------------------------------------------------------------------------------------------

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        """Every pool's queues, merged (storage/pooling/gauges.py)."""
        from storage.pooling import gauges  # on first use: only GET /metrics needs it

        return await gauges.queue_gauges(await self._each_pool(), self.catalogue, limit=limit)


class PooledWakeups:
    """Long-poll wake-ups of the pool that holds each queue; for a queue not placed yet, of every pool (its
    first post places it in one of them)."""

    def __init__(self, pooled: PooledStore, on_wake: WakeCallback) -> None:
        self._pooled, self._on_wake = pooled, on_wake
        self._sources: dict[str, Wakeups] = {}
        self._listening: dict[QueueRef, list[str]] = {}

    def _told(self, q: QueueRef | None, n: int) -> None:
        if q is None:  # a source lost its subscriptions: so does every listen made through it
            self._listening.clear()
        self._on_wake(q, n)

    async def listen(self, q: QueueRef) -> None:
        if q in self._listening:
            return
        pools = await self._pooled._holding_or_each_pool(q)
        for name, store in pools:
            source = self._sources.get(name)
            if source is None:
                source = self._sources[name] = store.wakeups(self._told)
            await source.listen(q)
        self._listening[q] = [name for name, _ in pools]

    async def unlisten(self, q: QueueRef) -> None:
        for name in self._listening.pop(q, []):
            if name in self._sources:
                await self._sources[name].unlisten(q)

    async def aclose(self) -> None:
        for source in self._sources.values():
            await source.aclose()
        self._sources.clear()
        self._listening.clear()


def home_pool(project: str, pools: Sequence[Pool]) -> Pool:
    """The pool of `pools` that takes `project`'s new queues: the highest rendezvous_score."""
    return max(pools, key=lambda p: rendezvous_score(project, p))


def rendezvous_score(project: str, pool: Pool) -> float:
    """Weighted rendezvous hashing: the pool with the highest score takes the project's new queues. Every
    process picks the same pool without asking anyone, a project's queues (and so its DLQ chains) land
    together, each pool gets projects in proportion to its weight, and a pool added or removed moves only
    the projects that pick it."""
    digest = hashlib.blake2b(f"{project}\x00{pool.name}".encode(), digest_size=8).digest()
    unit = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)  # in (0, 1)
    return pool.weight / -math.log(unit)


def pool_namespace(pool: Pool, default: str) -> str:
    """A pool's key/collection prefix: its `namespace` option, else the service's."""
    value = pool.options.get("namespace")
    return value if isinstance(value, str) and value else default
