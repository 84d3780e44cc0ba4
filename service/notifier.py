"""The notifier: `charon serve` runs one in a process of its own (app/notify.py), or every API process runs
one (CHARON_NOTIFICATIONS__PROCESS=false). It drains the store's outbox (storage/base.py SubscriptionStore):
leases the deliveries that are due, sends each to its subscriber (service/delivery), and finishes it —
delivered, due again later by the retry policy, or given up when the policy is used up or the subscriber
refuses it for good. Delivered and given-up ones are finished together (Store.finish_deliveries).

Delivery is at least once: a delivery stays in the store until it is finished, and one whose notifier died
(or whose finish failed) comes due again when its lease ends. A subscriber that keeps failing waits longer
between tries (its own deliveries' due times move; the queue and other subscribers go on), and the
Deliverer bounds how many deliveries are in flight, in all and for one subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from core.clock import Clock
from core.errors import CharonError
from core.limits import MAX_TIME_MS
from core.metadata import RETRY_POLICY
from core.models import Delivery, QueueRef, kind_of
from core.retry import RetryPolicy, effective_policy, parse_retry_policy
from core.wire import Shown, message
from service.delivery import Deliverer, Outcome, confirmation_document
from service.metrics import NOTIFICATION_LATENCY, NOTIFICATIONS
from service.outage import Outage, stop_if_cancelled
from storage.base import Store

log = logging.getLogger("charon.notifier")

POLICY_CACHE_S = 5.0  # how long a queue's _retry_policy is used before it is read again
NO_SLOT_WAIT_MS = 1000  # a delivery that found no free slot is due again this much later (not counted)
REST_MS = 1000  # a subscription whose try failed gets no other try for at least this long (even "no delay")
BUSY_WAIT_S = 1.0  # while the API is busy (Notifier's `busy`), a full batch is followed by this wait
FINISH_DELAY_S = 0.005  # deliveries done within this long are finished together (Store.finish_deliveries)
FINISH_BATCH = 256  # ... at most this many at once


def notification_document(d: Delivery, now_ms: int) -> dict[str, Any]:
    """What a subscriber is sent for a message: Zaqar's notification (the message as the API shows it, with
    `queue_name` and `Message_Type`), and for a dead letter its provenance under `dead_letter`."""
    assert d.message is not None
    doc = message(d.message, now_ms, Shown(kind=kind_of(d.project)))
    doc["queue_name"] = d.subscription.queue
    doc["Message_Type"] = "Notification"
    return doc


class Notifier:
    def __init__(
        self,
        store: Any,  # a Store, or a callable giving the app's current one
        deliverer: Deliverer,
        *,
        clock: Clock,
        lease_ms: int,
        batch: int,
        interval: float,
        signing_key: bytes | None,
        notice_ttl: int = 3600,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        """`busy`: whether the API processes this notifier yields to are busy now (app/notify.py
        ServiceLoad); while they are, a full batch is followed by BUSY_WAIT_S instead of the next one."""
        self._store = store
        self._deliverer = deliverer
        self._clock = clock
        self._lease_ms = lease_ms
        self._batch = batch
        self._interval = interval
        self._signing_key = signing_key
        self._notice_ttl = notice_ttl
        self._busy = busy
        self._owner = f"notifier-{uuid.uuid4().hex[:12]}"
        self._policies: dict[QueueRef, tuple[float, RetryPolicy | None]] = {}
        # subscription id -> until when (clock ms) its deliveries are put off after a failed try: a subscriber
        # that fails (or hangs until the timeout) is tried once, not once for each delivery it is owed, so it
        # cannot hold the process's slots while other subscribers wait
        self._resting: dict[str, int] = {}
        self._in_flight: set[asyncio.Task[None]] = set()
        self._done: list[Delivery] = []  # delivered or given up, to be finished together
        self._finishing: asyncio.Task[None] | None = None  # the one that waits FINISH_DELAY_S first
        self._finishes: set[asyncio.Task[None]] = set()  # never cancelled: what they finish was sent

    @property
    def store(self) -> Store:
        s: Store = self._store() if callable(self._store) else self._store
        return s

    async def run(self) -> None:
        """Lease and send until cancelled; while the store fails, log once and back off (service.outage)."""
        outage = Outage(log, "notifier", self._interval)
        try:
            while True:
                if self._room_for() == 0:  # every slot busy: go on as soon as one is free
                    await asyncio.wait(set(self._in_flight), return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    room = self._room_for()
                    leased = await self.step()
                    wait = outage.ok()
                    if leased and leased >= room:  # a full batch: more may be due now
                        wait = BUSY_WAIT_S if self._busy is not None and self._busy() else 0.0
                except Exception as exc:  # a bug must not stop notifications for the life of the process
                    wait = outage.failed(exc)
                stop_if_cancelled()
                await asyncio.sleep(wait)
        finally:
            await self.aclose()

    def _room_for(self) -> int:
        return max(0, self._batch - len(self._in_flight))

    async def step(self) -> int:
        """Lease what is due (as much as there is room for) and start sending it; the number leased."""
        room = self._room_for()
        if room == 0:
            return 0
        deliveries = await self.store.lease_deliveries(self._owner, lease_ms=self._lease_ms, limit=room)
        for d in deliveries:
            task = asyncio.create_task(self._send(d), name=f"charon-notify-{d.id}")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
        return len(deliveries)

    async def drain(self) -> None:
        """Wait for the deliveries in flight, and their finishing (tests, shutdown)."""
        while self._in_flight or self._finishes:
            await asyncio.wait(self._in_flight | self._finishes)
        await self._finish_done()

    async def aclose(self) -> None:
        """Stop sending: what is in flight is cancelled and comes due again when its lease ends; what was
        delivered is finished (so a restart sends it again only after a crash)."""
        for task in list(self._in_flight):
            task.cancel()
        for task in list(self._in_flight):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for task in list(self._finishes):
            with contextlib.suppress(Exception):
                await task
        await self._finish_done()

    def _done_with(self, d: Delivery) -> None:
        """`d` is delivered or given up: finished with the others done within FINISH_DELAY_S."""
        self._done.append(d)
        if len(self._done) >= FINISH_BATCH:
            task = asyncio.get_running_loop().create_task(self._finish_done())
        elif self._finishing is None or self._finishing.done():
            self._finishing = task = asyncio.get_running_loop().create_task(self._finish_done(FINISH_DELAY_S))
        else:
            return
        self._finishes.add(task)
        task.add_done_callback(self._finishes.discard)

    async def _finish_done(self, after: float = 0.0) -> None:
        if after:
            await asyncio.sleep(after)
        done, self._done = self._done, []
        if not done:
            return
        try:
            await self.store.finish_deliveries(done)
        except CharonError as exc:  # they come due again when their leases end (at least once)
            log.warning("%d delivered notifications not finished: %s", len(done), exc.description)
        except Exception:
            log.exception("%d delivered notifications not finished", len(done))

    async def _send(self, d: Delivery) -> None:
        try:
            resting = self._resting.get(d.subscription.id, 0)
            if resting > self._clock.now_ms():  # put off, not tried: its subscriber just failed
                await self.store.finish_delivery(d, retry_at_ms=resting, attempted=False)
                return
            outcome = await self._deliverer.deliver(d.subscription, self._document(d))
            if not outcome.attempted:  # no free slot in time: nothing was sent, so nothing failed
                retry_at = self._clock.now_ms() + NO_SLOT_WAIT_MS
                await self.store.finish_delivery(d, retry_at_ms=retry_at, attempted=False)
                return
            await self._finish(d, outcome)
        except CharonError as exc:  # the finish failed: the delivery comes due again when its lease ends
            log.warning(
                "delivery %s to %s not finished: %s", d.id, d.subscription.subscriber, exc.description
            )
        except Exception:
            log.exception("delivery %s to %s failed unexpectedly", d.id, d.subscription.subscriber)

    def _document(self, d: Delivery) -> dict[str, Any]:
        now = self._clock.now_ms()
        if d.kind == "notification":
            return notification_document(d, now)
        if self._signing_key is None:  # refused at start when confirmation is required (app/settings.py)
            raise ValueError("confirmation requests need CHARON_SIGNED_URL_KEY")
        unsubscribed = d.kind == "unsubscribed"
        # Zaqar: a request is valid for the subscription's ttl, a notice for the default subscription ttl
        ttl = self._notice_ttl if unsubscribed else d.subscription.ttl
        expires = datetime.fromtimestamp(min(now / 1000 + ttl, MAX_TIME_MS / 1000), UTC)
        return confirmation_document(
            d.subscription,
            project=d.project,
            key=self._signing_key,
            expires=expires,
            unsubscribed=unsubscribed,
        )

    async def _finish(self, d: Delivery, outcome: Outcome) -> None:
        if outcome.delivered:
            self._resting.pop(d.subscription.id, None)
            self._done_with(d)
            NOTIFICATIONS.labels(d.kind, "delivered").inc()
            NOTIFICATION_LATENCY.observe(max(0, self._clock.now_ms() - d.created_ms) / 1000)
            return
        delay = None
        if outcome.result == "retry":
            policy = await self._policy(d)
            delay = policy.delay_after(d.attempts + 1)
        if delay is None:
            NOTIFICATIONS.labels(d.kind, "failed" if outcome.attempted else "dropped").inc()
            log.warning(
                "gave up on delivery %s (%s) to %s after %d tries: %s",
                d.id,
                d.kind,
                d.subscription.subscriber,
                d.attempts + 1,
                outcome.reason,
            )
            self._done_with(d)
            return
        now = self._clock.now_ms()
        retry_at = now + int(delay * 1000)
        if len(self._resting) >= 10_000:
            self._resting.clear()
        self._resting[d.subscription.id] = max(retry_at, now + REST_MS)
        await self.store.finish_delivery(d, retry_at_ms=retry_at)
        NOTIFICATIONS.labels(d.kind, "retried").inc()

    async def _policy(self, d: Delivery) -> RetryPolicy:
        """The queue's _retry_policy (read at most every POLICY_CACHE_S) with the subscription's own, by
        Zaqar's ignore_subscription_override rule. A stored value that no longer parses counts as unset."""
        q = QueueRef(d.project, d.subscription.queue)
        cached = self._policies.get(q)
        if cached is None or time.monotonic() - cached[0] > POLICY_CACHE_S:
            metadata = await self.store.get_metadata(q)
            if len(self._policies) >= 10_000:
                self._policies.clear()
            cached = self._policies[q] = (time.monotonic(), _parsed(metadata.get(RETRY_POLICY)))
        return effective_policy(cached[1], _parsed(d.subscription.options.get(RETRY_POLICY)))


def _parsed(value: object) -> RetryPolicy | None:
    if value is None:
        return None
    try:
        return parse_retry_policy(value)
    except CharonError:
        return None
