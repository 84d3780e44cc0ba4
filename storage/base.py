"""The storage driver interface: one coroutine per API operation, each atomic in its backend.

Every method takes a `QueueRef` (project + queue name) first and keyword-only arguments after it. Time comes
from the Clock the driver was built with. Drivers raise only `core.errors` classes: `StorageUnavailable`
when the backend cannot be reached, the others as each method says. The API layer never calls two store
methods where a crash between them could break a promise of docs/contract.md.

Queues are lazy, as in Zaqar v2: a queue that was never created reads as empty (no metadata, zero stats,
nothing to list or claim), and posting to it creates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from core.metadata import QueuePolicy
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
from core.quotas import Bucket, Grant

DEFAULT_TIMEOUT_S = 5.0  # seconds a storage operation may take before it fails (Settings.storage_timeout)

# Told that n messages of a queue became claimable (now, or later: a delayed one); (None, 0) when the source
# may have missed some (its connection failed): every waiter should claim again and listen afresh.
WakeCallback = Callable[[QueueRef | None, int], None]


class Wakeups(Protocol):
    """Where long polls learn that messages became claimable (Store.wakeups)."""

    async def listen(self, q: QueueRef) -> None:
        """Start telling `on_wake` about `q`; returns once a message made claimable from then on is told.
        Idempotent. Raises StorageUnavailable when the store does not take it."""

    async def unlisten(self, q: QueueRef) -> None:
        """Stop telling about `q` (nothing when not listening)."""

    async def aclose(self) -> None: ...


class QueueStore(Protocol):
    async def create_queue(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> bool:
        """Create `q` with `metadata`; True when created. An existing queue keeps its metadata (False).

        With `expected_version`, raises MetadataChanged (and creates nothing) unless the project's metadata
        version still is that (see metadata_version)."""

    async def metadata_version(self, q: QueueRef) -> int:
        """A number that changes with every metadata write to the queues of `q`'s project that share its
        backend (0 before the first): in one store, the whole project; in a pooled store, q's pool, which
        holds q's DLQ chain too.

        A writer that validates against several queues' metadata (the DLQ cycle check) reads it first and
        passes it as `expected_version`, so that no concurrent write slips between its reads and its write.
        """

    async def get_metadata(self, q: QueueRef) -> dict[str, Any]:
        """The stored metadata; {} for a queue never created."""

    async def set_metadata(
        self,
        q: QueueRef,
        *,
        metadata: Mapping[str, Any],
        policy: QueuePolicy,
        expected_version: int | None = None,
    ) -> None:
        """Replace the metadata (already validated into `policy`), creating the queue when absent.

        With `expected_version`, raises MetadataChanged (and writes nothing) unless the project's metadata
        version still is that."""

    async def list_queues(
        self, project: str, *, marker: str | None, limit: int, detailed: bool
    ) -> Page[QueueInfo]:
        """Queues of `project` in name order after `marker`; metadata only when `detailed`."""

    async def count_queues(self, project: str) -> int:
        """How many queues `project` has (its use of the `queues` quota)."""

    async def held_bytes(self, project: str) -> int:
        """The bytes of the bodies of `project`'s live messages, as stored (its use of `message_bytes`)."""

    async def delete_queue(self, q: QueueRef) -> None:
        """Delete the queue and its messages. Deleting a missing queue is not an error."""

    async def purge(self, q: QueueRef) -> None:
        """Delete every message of the queue and keep the queue and its metadata."""

    async def stats(self, q: QueueRef) -> QueueStats:
        """Counts of free, claimed, delayed and all live messages, oldest/newest, and DLQ counters."""


class MessageStore(Protocol):
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
        """Append `messages` in order (FIFO), creating the queue when absent; returns their ids.

        A message's ttl/delay of None takes the queue's `_default_message_*`, else `default_ttl`/`_delay`.
        With `idempotency`, the post and the key's record are written in one atomic step; a post whose key
        has a record (within its window) stores nothing and returns the ids the record holds.

        Raises:
            PayloadTooLarge: `body_size` is over the queue's `_max_messages_post_size`.
            IdempotencyKeyReused: the key's record is of a post with other messages.
        """

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
        """Live messages after `marker` in posting order. `echo=False` hides `client_id`'s own messages.
        `marker`: a page's `next_marker`, or a message id: after that message (an empty page, the end,
        when no live message of the queue has that id)."""

    async def get_messages(self, q: QueueRef, ids: Sequence[MessageId]) -> list[Message]:
        """The live messages of `q` among `ids` (unknown ids are left out)."""

    async def delete_message(self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId | None) -> None:
        """Delete one message; deleting a missing one is not an error.

        Raises:
            ClaimMismatch: the message is claimed and `claim_id` is not the claim that holds it, or
                `claim_id` is given and no claim holds the message any more.
        """

    async def delete_messages(
        self, q: QueueRef, ids: Sequence[MessageId], *, claim_ids: Sequence[ClaimId] | None = None
    ) -> list[NotDeleted]:
        """Delete the live messages with these ids (ids of missing messages are skipped).

        Without `claim_ids`, claimed or not (Zaqar's bulk delete). With them (a set), a message is deleted
        only if one of those claims holds it now, each message by a guarded write (atomic per message; one
        step for the whole call on Redis); the others stay and are returned with the reason. Returns [] when
        every listed live message was deleted."""

    async def pop_messages(self, q: QueueRef, *, limit: int) -> list[Message]:
        """Take up to `limit` of the oldest claimable messages and delete them in the same step."""


class ClaimStore(Protocol):
    async def claim(
        self, q: QueueRef, *, ttl: int, grace: int, limit: int, wait_ms: int = 0, client_id: str = ""
    ) -> ClaimResult:
        """Claim up to `limit` claimable messages, oldest first, in one atomic step.

        Each claimed message's claim_count is incremented in that step and it lives at least until the claim
        ends plus `grace`; `client_id` (the claimer's Client-ID) is kept on it as its last claimer, the
        consumer a dead-letter move out of this queue names (DeadLetter.consumer). A message whose
        claim_count already equals the queue's `_max_claim_count` is moved to the DLQ (or discarded when
        none is set) instead, and picking goes on until `limit` messages are claimed or none is left.
        `claim` is None when nothing was claimed; then `next_ms` says when a message becomes claimable by
        time alone. `wait_ms` > 0: a long poll that will wait that long when nothing is claimable, and
        wants to be told (`wakeups`) when something becomes so.
        """

    async def get_claim(self, q: QueueRef, claim_id: ClaimId) -> Claim:
        """The claim with the live messages it still holds. Raises ClaimNotFound (also once expired)."""

    async def acknowledge_claim(self, q: QueueRef, claim_id: ClaimId) -> int:
        """Delete the messages the claim holds now, and the claim, in one step (per message on MongoDB, the
        claim last). Returns how many messages. Raises ClaimNotFound (also once expired)."""

    async def renew_claim(self, q: QueueRef, claim_id: ClaimId, *, ttl: int, grace: int) -> None:
        """Restart the claim with a new ttl and grace. Raises ClaimNotFound."""

    async def release_claim(self, q: QueueRef, claim_id: ClaimId, *, delay: int | None = None) -> None:
        """Return the claim's messages to the queue; exhausted ones move to the DLQ now.

        Each message is claimable again after `delay` seconds, or, when None, after the queue's redelivery
        backoff (QueuePolicy.backoff, counted by its claim count; no wait without one). A claim that expires
        instead gives its messages the backoff from the moment it ended. Releasing an unknown or expired
        claim does nothing.
        """

    async def release_message(
        self, q: QueueRef, message_id: MessageId, *, claim_id: ClaimId, delay: int | None = None
    ) -> None:
        """release_claim for one message of the claim; the claim keeps the others.

        Raises:
            MessageNotFound: no such live message in `q`.
            ClaimMismatch: `claim_id` does not hold the message now.
        """

    async def dead_letter_message(
        self,
        q: QueueRef,
        message_id: MessageId,
        *,
        claim_id: ClaimId,
        rejection: Rejection,
        client_id: str = "",
    ) -> bool:
        """Move a message the claim holds to the queue's DLQ now, reason "rejected" with `rejection` and
        the rejecter's `client_id` (DeadLetter.consumer; '' = the last claimer's) in its provenance; True
        when moved, False when discarded (posted with dead_letter_eligible false).

        Raises:
            MessageNotFound, ClaimMismatch: as release_message.
            Conflict: the queue has no DLQ.
        """


class RedriveStore(Protocol):
    """Redrive tasks: durable records of moving messages out of a DLQ, run a batch at a time by whichever
    API process holds the task's lease, so a task outlives the process that started it."""

    async def create_redrive(
        self, q: QueueRef, task_id: TaskId, spec: RedriveSpec, *, owner: str, lease_ms: int
    ) -> RedriveTask:
        """Record a running task over DLQ `q`'s messages up to its last marker now, held by `owner` for
        `lease_ms` (if it does not step within that, another runner may take it over)."""

    async def get_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        """Raises NotFound."""

    async def list_redrives(self, q: QueueRef, *, limit: int) -> list[RedriveTask]:
        """DLQ `q`'s tasks, newest first, up to `limit` (finished ones are kept 7 days)."""

    async def cancel_redrive(self, q: QueueRef, task_id: TaskId) -> RedriveTask:
        """Stop a running task before its next batch (a finished one is left as it is). Raises NotFound."""

    async def lease_redrives(self, owner: str, *, lease_ms: int, limit: int) -> list[tuple[QueueRef, TaskId]]:
        """Take up to `limit` running tasks nobody holds (their runner died, or none took them yet) for
        `lease_ms`; each redrive_step by the owner extends the lease."""

    async def release_redrive(self, q: QueueRef, task_id: TaskId, *, owner: str) -> None:
        """End `owner`'s lease on the task now (a process shutting down), so any runner may take it over."""

    async def redrive_step(
        self, q: QueueRef, task_id: TaskId, *, owner: str, lease_ms: int, batch: int
    ) -> RedriveTask:
        """While `owner` holds the running task: look at the next `batch` messages after its cursor and move
        each match (RedriveSpec.matches, unclaimed, live) to its destination, atomically per message, with
        claim count 0 and redrive count + 1; the task ends (succeeded) at its end marker or its limit.
        Returns the task as it is now (unchanged when `owner` does not hold it)."""


class SubscriptionStore(Protocol):
    """Zaqar's subscriptions, and the outbox of notifications owed to them.

    Notifications are written in the same atomic step as what causes them: `post_messages` writes one
    delivery for every message and every live confirmed subscription of the queue, and every dead-letter
    move (a claim, a release, the sweeper, a reject) writes one for every live confirmed subscription of the
    DLQ, the message's provenance with it. A delivery then lives until a notifier finishes it, so no crash
    or restart loses one; a notifier that dies holding a lease leaves it to another once the lease ends
    (at least once). A subscription that is deleted or expires drops what it is still owed."""

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
        """Subscribe `subscriber` to `q` (creating the queue when absent) until now + ttl; True when created.

        A live subscription of `q` with the same subscriber is returned as it is with False, and nothing is
        written, except that an unconfirmed one is owed a confirmation request again. A new one that is not
        `confirmed` is owed a confirmation request (kind "confirmation"), written with it.

        Raises:
            Conflict: `q` has `max_per_queue` live subscriptions already.
        """

    async def get_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> Subscription:
        """Raises SubscriptionNotFound (also once expired)."""

    async def list_subscriptions(self, q: QueueRef, *, marker: str | None, limit: int) -> Page[Subscription]:
        """Live subscriptions of `q` in id order after `marker` (an id)."""

    async def update_subscription(
        self,
        q: QueueRef,
        subscription_id: SubscriptionId,
        *,
        subscriber: str | None = None,
        ttl: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Change what is given (a new ttl counts from now). Raises SubscriptionNotFound, and
        SubscriptionExists when another live subscription of `q` has `subscriber`."""

    async def confirm_subscription(
        self, q: QueueRef, subscription_id: SubscriptionId, *, confirmed: bool
    ) -> None:
        """Set whether it is confirmed; confirmed False (unsubscribing) also owes it a delivery of kind
        "unsubscribed" (telling it how to subscribe again). Raises SubscriptionNotFound."""

    async def delete_subscription(self, q: QueueRef, subscription_id: SubscriptionId) -> None:
        """Delete it and what it is owed; deleting a missing one is not an error."""

    async def purge_subscriptions(self, q: QueueRef) -> None:
        """Delete every subscription of `q` (and what they are owed). delete_queue does this too."""

    async def lease_deliveries(self, owner: str, *, lease_ms: int, limit: int) -> list[Delivery]:
        """Take up to `limit` deliveries that are due (in every project; oldest due first within a
        project) for `lease_ms`: none is leased to two owners at once while its lease runs. Deliveries
        whose subscription is gone or expired are deleted here instead of returned."""

    async def finish_delivery(self, d: Delivery, *, retry_at_ms: int | None, attempted: bool = True) -> None:
        """End a leased delivery: None deletes it (delivered, or given up); otherwise it is due again at
        `retry_at_ms`, with attempts + 1 when it was `attempted` (not when the notifier put it off without
        trying). Finishing one that is gone is not an error."""

    async def finish_deliveries(self, done: Sequence[Delivery]) -> None:
        """finish_delivery(d, retry_at_ms=None) of each of `done` (delivered, or given up), in fewer round
        trips: what a notifier does with most of what it leases."""

    async def outbox_stats(self) -> tuple[int, int | None]:
        """(deliveries waiting in every project, due time in ms of the earliest one or None): the
        notifier's backlog and lag."""


class QuotaStore(Protocol):
    """A project's quota overrides and its request-rate token buckets (core/quotas.py): project-wide, so a
    pooled store keeps them in its management store."""

    async def get_quota(self, project: str) -> dict[str, float]:
        """The project's overrides, quota name -> value; {} when it has none."""

    async def set_quota(self, project: str, overrides: Mapping[str, float | None]) -> dict[str, float]:
        """Set each of `overrides` (None removes that one, back to the service's default), atomically, and
        return the project's overrides after. The project's token buckets start again, full: a changed rate
        applies at once."""

    async def delete_quota(self, project: str) -> None:
        """Remove every override of the project (and its token buckets); removing none is not an error."""

    async def take_tokens(
        self, project: str, bucket: Bucket, *, want: int, rate: float, capacity: int
    ) -> Grant:
        """Take up to `want` tokens from the project's bucket, refilled at `rate` a second since its last take
        up to `capacity` (a new one starts full), in one atomic step: however many processes take at once,
        no more tokens are granted than the bucket held. When none is left, the grant says how long until
        one is."""


class Store(QueueStore, MessageStore, ClaimStore, RedriveStore, SubscriptionStore, QuotaStore, Protocol):
    async def sweep(self, *, lease_ms: int = 0) -> int | None:
        """Bring every queue whose next claim or message expiry has come up to now, in every project.

        An expired claim ends here, and a message that used up its claims moves to its DLQ (or is discarded)
        now, not when the queue is next used (docs/contract.md promise 7). Safe to run from any number of
        processes at once: each queue's step is atomic, so no message is moved twice. With `lease_ms`, the
        call does the work only if it wins the store-wide lease for that long (else returns None), so many
        API processes share the load instead of repeating it. Returns the number of queues visited.
        """

    def wakeups(self, on_wake: WakeCallback) -> Wakeups:
        """A source of long-poll wake-ups that calls `on_wake` (from this event loop)."""

    async def ping(self) -> None:
        """Raises StorageUnavailable when the backend does not answer."""

    async def check_writable(self) -> None:
        """Write a probe the backend keeps for a few seconds. Raises StorageFull when the backend refuses
        writes (full), StorageUnavailable when it does not answer."""

    async def aclose(self) -> None: ...

    async def queue_gauges(self, *, limit: int) -> tuple[list[tuple[QueueRef, QueueStats]], bool]:
        """Every queue of every project with its stats, in (project, name) order, at most `limit` of them;
        True when more queues exist than those returned (GET /metrics' per-queue series).

        Each queue's stats are counted as `stats` counts them, except that a driver may leave out the
        housekeeping `stats` does first (what came due since the last sweep is then counted as the sweeper
        left it). The whole is no snapshot: queues are read batch after batch. The work is bounded by `limit`
        queues (on MongoDB, their live messages; on Redis, with the names of the projects), however many
        queues the store holds.
        """
