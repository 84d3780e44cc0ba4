"""The Lua scripts (lua/*.lua, each prefixed with the part of lib.lua it uses), one typed wrapper each.

A wrapper takes the queue it works on as a `Target` and its arguments by name, puts every key it knows in
KEYS (built by keys.py), runs the script through the one `ScriptRunner`, and returns a typed reply. Queue
scripts share their first KEYS and ARGV (lib.lua queue_script): the queue's keys, then the prefix, the
queue name, now, and the operator's dead-letter defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple

import orjson

from core.metadata import DeadLetterDefaults, PolicyValue, QueuePolicy, policy_fields
from core.models import Message, MessageId, MessageStamp, QueueRef, QueueStats, Subscription
from core.quotas import MAX_SKEW_MS, Counted, Grant
from storage.redis.keys import (
    POLICY_FIELDS,
    DeliveryField,
    ProjectKeys,
    QueueKeys,
    TaskField,
    message_of,
    subscription_of,
)
from storage.redis.runner import Script, ScriptRunner

# Scripts that change nothing a client asked for (their housekeeping is the service's own): a failure after
# one was sent is just "unavailable", never "the outcome is unknown".
READ_SCRIPTS = frozenset({"list_messages", "get_messages", "stats", "get_claim"})

SCRIPT_NAMES = (
    "create_queue",
    "set_metadata",
    "drop_messages",
    "stats",
    "post_messages",
    "list_messages",
    "get_messages",
    "delete_message",
    "delete_messages",
    "pop_messages",
    "claim",
    "get_claim",
    "renew_claim",
    "release_claim",
    "acknowledge_claim",
    "release_message",
    "dead_letter_message",
    "sweep",
    "task_create",
    "task_lease",
    "task_cancel",
    "task_release",
    "take_tokens",
    "held_bytes",
    "redrive_step",
    "subscribe",
    "update_subscription",
    "confirm_subscription",
    "unsubscribe",
    "lease_deliveries",
    "finish_delivery",
)


def _source(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


POLICY_FIELDS_SLOT = "{--[[POLICY_FIELDS]]}"


def library() -> str:
    """lib.lua as every script starts: its POLICY_FIELDS table filled with keys.POLICY_FIELDS, so the
    names and order policy_args() sends values in are written once (core.metadata's rows). In the text,
    not in ARGV: a call costs what it cost with the table written by hand."""
    lib = _source("lib")
    if lib.count(POLICY_FIELDS_SLOT) != 1:
        raise RuntimeError(f"lib.lua must hold {POLICY_FIELDS_SLOT} once")
    return lib.replace(POLICY_FIELDS_SLOT, "{" + ", ".join(f"'{f}'" for f in POLICY_FIELDS) + "}")


def defaults_args(defaults: DeadLetterDefaults, quotas: Counted | None = None) -> list[bytes]:
    """lib.lua set_defaults' seven arguments: max claim count, template prefix, suffix, then the counted
    quotas' defaults: queues, messages per queue, subscriptions, message bytes ('' = none)."""
    prefix, suffix = defaults.prefix_suffix or ("", "")
    maxcc = "" if defaults.max_claim_count is None else str(defaults.max_claim_count)
    counted = quotas or Counted()
    limits = [
        b"" if v is None else str(v).encode()
        for v in (counted.queues, counted.messages_per_queue, counted.subscriptions, counted.message_bytes)
    ]
    return [maxcc.encode(), prefix.encode(), suffix.encode(), *limits]


def wrapped(lib: str, body: str) -> str:
    """A script's text: the part of lib.lua it uses (`used`), then its body as a function, whose answer is
    returned after lib.lua's publish_wakes() has told long polls of the messages the body made claimable
    (however it returns)."""
    tail = f"local function main()\n{body}\nend\nlocal reply = main()\npublish_wakes()\nreturn reply\n"
    return f"{used(lib, tail)}\n{tail}"


_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)(\s*,)?", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT_LINE = re.compile(r"^[ \t]*--.*$", re.MULTILINE)
_TOP_LEVEL = re.compile(r"local |end\b|--")  # how each of lib.lua's lines at column 0 begins


def _names(code: str) -> set[str]:
    """The words of `code`, its comment lines left out."""
    return set(_NAME.findall(_COMMENT_LINE.sub("", code)))


def used(lib: str, code: str) -> str:
    """lib.lua's definitions that `code` needs, itself or through one another, in lib.lua's order: each
    top-level `local NAME = ...` or `local function NAME(...) ... end` (a definition runs to the next one,
    the comments before that included), whenever its name is a word of `code` or of a definition kept (comment
    lines left out).

    Every script ran the whole of lib.lua first, a closure made for each of its 81 definitions: 20-25 us of
    redis-server's CPU a call on this machine (bench/RESULTS.md, "Issue 42, second session"). A name found
    in a string (or a comment at a line's end) only keeps a definition more. The text before the first
    definition (lib.lua's header comment) is kept. Refused, as they would be cut wrong: a top-level `local
    a, b = ...` (one name a definition), and a top-level line that is no definition's (a statement of its
    own, a forward declaration's assignment)."""
    found = list(_DEFINITION.finditer(lib))
    if any(m.group(2) for m in found):
        raise ValueError("lib.lua: one name a top-level definition (scripts.used)")
    stray = [line for line in lib.splitlines() if line[:1].strip() and not _TOP_LEVEL.match(line)]
    if stray:  # a statement of its own would go with the definition before it
        raise ValueError(f"lib.lua: only definitions at the top level (scripts.used): {stray[0]!r}")
    starts = [m.start() for m in found]
    if not starts:
        return lib
    chunks = [lib[a:b] for a, b in zip(starts, [*starts[1:], len(lib)], strict=True)]
    names = [m.group(1) for m in found]
    defined = dict(zip(names, chunks, strict=True))
    wanted: set[str] = set()
    todo = _names(code)
    while todo:
        name = todo.pop()
        if name in defined and name not in wanted:
            wanted.add(name)
            todo |= _names(defined[name])
    return lib[: starts[0]] + "".join(c for n, c in zip(names, chunks, strict=True) if n in wanted)


@dataclass(frozen=True, slots=True)
class Target:
    """A queue as the scripts address it: its KEYS and first ARGV, encoded once (on a one-message DELETE,
    building and encoding them was a fifth of the time spent in redis-py) and kept per queue."""

    q: QueueRef
    project: ProjectKeys
    keys: list[bytes]
    head: list[bytes]  # prefix, name

    @classmethod
    def of(cls, namespace: str, q: QueueRef) -> Target:
        qk = QueueKeys.of(namespace, q)
        return cls(q, qk.project, [k.encode() for k in qk.all()], [qk.prefix.encode(), q.name.encode()])


def _messages(views: Sequence[list[Any]]) -> list[Message]:
    """Messages from lib.lua view()s: [id, field, value, field, value, ...]."""
    return [message_of(v[0], dict(zip(v[1::2], v[2::2], strict=True))) for v in views]


def _stats(reply: Sequence[Any]) -> QueueStats:
    """A queue's stats from stats.lua's reply."""
    total, claimed, delayed, n_dl, n_disc, n_rcv, *by_reason, n_rd, old_id, old_cr, new_id, new_cr = reply
    return QueueStats(
        free=total - claimed,
        claimed=claimed,
        delayed=delayed,
        total=total,
        oldest=MessageStamp(MessageId(old_id), int(old_cr)) if old_id else None,
        newest=MessageStamp(MessageId(new_id), int(new_cr)) if new_id else None,
        dead_lettered=n_dl,
        discarded=n_disc,
        dead_letters_received=n_rcv,
        dead_lettered_by_reason={r: n for r, n in zip(DEAD_LETTER_REASONS, by_reason, strict=True) if n},
        redriven=n_rd,
    )


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return dict(zip(flat[0::2], flat[1::2], strict=True))


def _opt(value: object) -> str:
    return "" if value is None else str(value)


# lib.lua marks(), the first of most scripts' replies: what the driver must tell the background loops
LOWERED = 1  # the project's earliest due time moved earlier: the sweeper must look (lib.lua SWEEP)
OWED = 2  # deliveries were written to the project's outbox: the notifier must look (lib.lua OUTBOX)
# stats.lua's per-reason counters, in its order
DEAD_LETTER_REASONS = ("max_claims", "expired", "rejected")


class PostReply(NamedTuple):
    marks: int
    earlier_ids: list[str] | None  # an Idempotency-Key's earlier post: its ids, nothing stored now


class ReadAhead(NamedTuple):
    """A signature task's next step, read by the driver: from cursor `at` up to marker `upto` (None: to the
    end), the ids found of its signature."""

    at: int
    upto: int | None
    only: list[str]


class ListReply(NamedTuple):
    last_marker: int
    more: bool
    messages: list[Message]


class ClaimReply(NamedTuple):
    marks: int
    dead_lettered: int
    discarded: int
    next_ms: int | None  # nothing claimed: when a message becomes claimable by time alone (None: never)
    messages: list[Message]


class ClaimView(NamedTuple):
    ttl: int
    grace: int
    created_ms: int
    expires_ms: int
    messages: list[Message]


class SweepReply(NamedTuple):
    visited: int
    still_due: int
    next_due_ms: int | None
    owed: bool  # a dead-letter move wrote deliveries to the project's outbox


class StepReply(NamedTuple):
    marks: int
    task: dict[str, str]  # the task's hash fields (keys.TaskField) as the step left them


class LeaseReply(NamedTuple):
    next_due_ms: int | None  # the project's outbox's earliest due time after the lease, None when empty
    # delivery id, its hash, its subscription's, the indexes of a post's messages leased (none: not a post's)
    leased: list[tuple[str, dict[str, str], dict[str, str], list[int]]]


class TaskLease(NamedTuple):
    taken: bool
    status: str  # '' when the task is gone


class Scripts:
    """Every script of the driver, typed. `defaults`: the operator's dead-letter defaults, passed to the
    scripts that read a queue's policy (never written into a script's text)."""

    def __init__(
        self,
        runner: ScriptRunner,
        *,
        defaults: DeadLetterDefaults | None = None,
        quotas: Counted | None = None,
    ) -> None:
        lib = library()
        self._run = runner
        self._s = {
            name: Script(name, wrapped(lib, _source(name)), write=name not in READ_SCRIPTS)
            for name in SCRIPT_NAMES
        }
        self._defaults = defaults_args(defaults or DeadLetterDefaults(), quotas)

    async def _queue(
        self, name: str, t: Target, now: int, args: Sequence[Any], extra_keys: Sequence[str] = ()
    ) -> Any:
        keys = [*t.keys, *(k.encode() for k in extra_keys)] if extra_keys else t.keys
        return await self._run(self._s[name], keys, [*t.head, now, *self._defaults, *args])

    # -- queues ---------------------------------------------------------------------------------------

    async def create_queue(self, t: Target, *, now: int, metadata: list[Any]) -> bool:
        """metadata: policy_args(); False when the queue existed (its metadata left as it is)."""
        return bool(await self._queue("create_queue", t, now, metadata, [t.project.metadata_version]))

    async def set_metadata(self, t: Target, *, now: int, metadata: list[Any]) -> None:
        await self._queue("set_metadata", t, now, metadata, [t.project.metadata_version])

    async def drop_messages(self, t: Target, *, now: int, batch: int, delete_queue: bool) -> int:
        """Deletes up to `batch` messages; returns how many are left."""
        return int(await self._queue("drop_messages", t, now, [batch, int(delete_queue)]))

    async def stats(self, t: Target, *, now: int) -> QueueStats:
        return _stats(await self._queue("stats", t, now, []))

    # -- messages -------------------------------------------------------------------------------------

    async def post_messages(
        self,
        t: Target,
        *,
        now: int,
        ids: Sequence[str],
        packed: str,
        client_id: str,
        default_ttl: int,
        default_delay: int,
        body_size: int,
        sealed: bool,
        idempotency: tuple[str, str, int] | None = None,
    ) -> PostReply:
        """packed: post_messages.lua's one-argument form of the messages; sealed: their bodies are sealed
        (else CHARON_SEAL, EncryptionRequired, on a queue that encrypts); idempotency: (record key,
        fingerprint, window ms)."""
        keys = [t.project.message(i) for i in ids]
        args: list[Any] = [client_id, default_ttl, default_delay, body_size, int(sealed), packed]
        if idempotency is not None:
            record, fingerprint, window_ms = idempotency
            keys.insert(0, record)
            args += [fingerprint, window_ms]
        marks, n, *earlier = await self._queue("post_messages", t, now, args, keys)
        return PostReply(marks, earlier[0].split(",") if n == -1 else None)

    async def list_messages(
        self,
        t: Target,
        *,
        now: int,
        marker: int | str,
        limit: int,
        echo: bool,
        client_id: str,
        include_claimed: bool,
        include_delayed: bool,
    ) -> ListReply:
        """`marker`: a counter, or a message id (after that message)."""
        after = f"@{marker}" if isinstance(marker, str) else marker  # list_messages.lua: '@' and an id
        args = [after, limit, int(echo), client_id, int(include_claimed), int(include_delayed)]
        last, more, *views = await self._queue("list_messages", t, now, args)
        return ListReply(int(last), bool(more), _messages(views))

    async def get_messages(self, t: Target, *, now: int, ids: Sequence[str]) -> list[Message]:
        views = await self._queue("get_messages", t, now, ids, [t.project.message(i) for i in ids])
        return _messages(views)

    async def delete_message(self, t: Target, *, now: int, message_id: str, claim_id: str | None) -> bool:
        args = [message_id, claim_id or ""]
        return bool(await self._queue("delete_message", t, now, args, [t.project.message(message_id)]))

    async def delete_messages(
        self, t: Target, *, now: int, ids: Sequence[str], claim_ids: Sequence[str] | None
    ) -> list[tuple[str, str]]:
        """Returns the (id, reason) of each listed live message not deleted (only with claim_ids)."""
        args = [",".join(claim_ids or ()), *ids]
        _deleted, *refused = await self._queue(
            "delete_messages", t, now, args, [t.project.message(i) for i in ids]
        )
        return list(zip(refused[::2], refused[1::2], strict=True))

    async def pop_messages(self, t: Target, *, now: int, limit: int) -> list[Message]:
        return _messages(await self._queue("pop_messages", t, now, [limit]))

    # -- claims ---------------------------------------------------------------------------------------

    def _claim_keys(self, t: Target, claim_id: str) -> list[str]:
        return [t.project.claim(claim_id), t.project.claim_messages(claim_id)]

    async def claim(
        self,
        t: Target,
        *,
        now: int,
        claim_id: str,
        ttl: int,
        grace: int,
        limit: int,
        wait_ms: int = 0,
        client_id: str = "",
    ) -> ClaimReply:
        """wait_ms > 0: a long poll that waits this long if nothing is claimable (sets the queue's `waiting`
        flag, so that what makes a message claimable publishes a wake-up)."""
        keys = self._claim_keys(t, claim_id)
        marks, dead_lettered, discarded, next_ms, *views = await self._queue(
            "claim", t, now, [claim_id, ttl, grace, limit, wait_ms, client_id], keys
        )
        return ClaimReply(marks, dead_lettered, discarded, next_ms or None, _messages(views))

    async def get_claim(self, t: Target, *, now: int, claim_id: str) -> ClaimView:
        out = await self._queue("get_claim", t, now, [claim_id], self._claim_keys(t, claim_id))
        ttl, grace, created, expires, *views = out
        return ClaimView(int(ttl), int(grace), int(created), int(expires), _messages(views))

    async def renew_claim(self, t: Target, *, now: int, claim_id: str, ttl: int, grace: int) -> int:
        """Returns lib.lua marks()."""
        keys = self._claim_keys(t, claim_id)
        marks, _held = await self._queue("renew_claim", t, now, [claim_id, ttl, grace], keys)
        return int(marks)

    async def release_claim(self, t: Target, *, now: int, claim_id: str, wait_ms: int | None) -> int:
        """Returns lib.lua marks()."""
        keys = self._claim_keys(t, claim_id)
        marks, *_counts = await self._queue("release_claim", t, now, [claim_id, _opt(wait_ms)], keys)
        return int(marks)

    async def acknowledge_claim(self, t: Target, *, now: int, claim_id: str) -> int:
        """Deletes the claim and the messages it holds; returns how many. CHARON_NO_CLAIM: no live claim."""
        return int(await self._queue("acknowledge_claim", t, now, [claim_id], self._claim_keys(t, claim_id)))

    async def release_message(
        self, t: Target, *, now: int, message_id: str, claim_id: str, wait_ms: int | None
    ) -> int:
        """Returns lib.lua marks()."""
        args = [message_id, claim_id, _opt(wait_ms)]
        marks, _outcome = await self._queue("release_message", t, now, args, [t.project.message(message_id)])
        return int(marks)

    async def dead_letter_message(
        self,
        t: Target,
        *,
        now: int,
        message_id: str,
        claim_id: str,
        reason: str | None,
        description: str | None,
        client_id: str = "",
    ) -> tuple[int, bool]:
        """lib.lua marks(), and True when moved, False when discarded (the message was not DLQ-eligible)."""
        args = [message_id, claim_id, reason or "", description or "", client_id]
        marks, outcome = await self._queue(
            "dead_letter_message", t, now, args, [t.project.message(message_id)]
        )
        return int(marks), outcome == "moved"

    # -- redrive tasks --------------------------------------------------------------------------------

    async def task_create(
        self,
        t: Target,
        *,
        now: int,
        task_id: str,
        spec: Mapping[str, Any],
        filters: list[Any],
        owner: str,
        lease_ms: int,
        signature: str | None,
    ) -> int:
        """filters: destination, source queue, reason, after ms, before ms, limit, number of listed ids
        (None = not given). Returns where the task stops: the DLQ's last marker, or the number of ids."""
        args = [task_id, orjson.dumps(dict(spec)).decode(), *map(_opt, filters), owner, lease_ms]
        args.append(_opt(signature))
        keys = [t.project.task(task_id), t.project.tasks(t.q.name)]
        return int(await self._queue("task_create", t, now, args, keys))

    async def redrive_step(
        self,
        t: Target,
        *,
        now: int,
        task_id: str,
        owner: str,
        lease_ms: int,
        batch: int,
        read: ReadAhead | None = None,
    ) -> StepReply:
        """`read`: what the driver read for a task with a signature filter (redrive_step.lua)."""
        args: list[Any] = [task_id, owner, lease_ms, batch]
        if read is not None:
            args += [read.at, _opt(read.upto), orjson.dumps(read.only).decode()]
        out = await self._queue("redrive_step", t, now, args, [t.project.task(task_id)])
        marks, *fields = out
        return StepReply(marks, dict(zip(STEP_FIELDS, map(str, fields), strict=True)))

    async def task_lease(self, task_key: str, *, now: int, owner: str, lease_ms: int) -> TaskLease:
        taken, status = await self._run(self._s["task_lease"], [task_key], [owner, now, lease_ms])
        return TaskLease(bool(taken), status)

    async def task_cancel(self, task_key: str, *, now: int, queue: str) -> dict[str, str]:
        """The task's hash fields as the cancel left them."""
        flat = await self._run(self._s["task_cancel"], [task_key], [queue, now])
        return dict(zip(flat[0::2], flat[1::2], strict=True))

    async def task_release(self, task_key: str, *, owner: str) -> bool:
        return bool(await self._run(self._s["task_release"], [task_key], [owner]))

    # -- quotas ---------------------------------------------------------------------------------------

    async def take_tokens(self, bucket_key: str, *, now: int, want: int, rate: float, capacity: int) -> Grant:
        args = [now, want, repr(rate), capacity, MAX_SKEW_MS]
        granted, wait_ms = await self._run(self._s["take_tokens"], [bucket_key], args)
        return Grant(int(granted), int(wait_ms))

    async def held_bytes(self, project: ProjectKeys, *, now: int) -> int:
        return int(
            await self._run(self._s["held_bytes"], [project.message_expiry, project.message_sizes], [now])
        )

    # -- subscriptions and the outbox -----------------------------------------------------------------

    async def subscribe(
        self,
        t: Target,
        *,
        now: int,
        subscription_id: str,
        subscriber: str,
        ttl: int,
        options: str,
        confirmed: bool,
        max_per_queue: int,
    ) -> tuple[int, bool, Subscription]:
        """marks(), whether created, and the subscription as it now is."""
        args = [subscription_id, subscriber, ttl, options, int(confirmed), max_per_queue]
        keys = [t.project.subscription(subscription_id)]
        marks, created, sid, *flat = await self._queue("subscribe", t, now, args, keys)
        return int(marks), bool(created), subscription_of(sid, _pairs(flat))

    async def update_subscription(
        self, t: Target, *, now: int, subscription_id: str, subscriber: str, ttl: str, options: str
    ) -> None:
        """'' = unchanged."""
        await self._queue("update_subscription", t, now, [subscription_id, subscriber, ttl, options])

    async def confirm_subscription(
        self, t: Target, *, now: int, subscription_id: str, confirmed: bool
    ) -> int:
        """Returns marks()."""
        (marks,) = await self._queue("confirm_subscription", t, now, [subscription_id, int(confirmed)])
        return int(marks)

    async def unsubscribe(self, t: Target, *, now: int, subscription_id: str) -> None:
        """'' = every subscription of the queue."""
        await self._queue("unsubscribe", t, now, [subscription_id])

    async def lease_deliveries(
        self, projects: Sequence[ProjectKeys], *, now: int, lease_ms: int, limit: int
    ) -> list[LeaseReply]:
        """lease_deliveries.lua once per project, together."""
        calls = [([p.outbox], [p.prefix, now, lease_ms, limit]) for p in projects]
        replies = await self._run.each(self._s["lease_deliveries"], calls)
        out = []
        for r in replies:
            leased, subscriptions = [], {}
            for did, d, s, indexes in r[1:]:
                fields = _pairs(d)
                sid = fields[DeliveryField.SUBSCRIPTION]
                if s:  # the script sends a subscription's fields with its first delivery only
                    subscriptions[sid] = _pairs(s)
                leased.append((str(did), fields, subscriptions[sid], [int(i) for i in indexes]))
            out.append(LeaseReply(None if int(r[0]) < 0 else int(r[0]), leased))
        return out

    async def finish_delivery(
        self,
        project: ProjectKeys,
        *,
        delivery_id: str,
        retry_at: int | None,
        attempted: bool,
        indexes: Sequence[int] = (),
    ) -> int | None:
        """The project's outbox's earliest due time after it, None when empty. `indexes`: the messages of a
        post's delivery hash to finish (finish_delivery.lua)."""
        first = await self._run(
            self._s["finish_delivery"], *self._finish_call(project, delivery_id, retry_at, attempted, indexes)
        )
        return None if int(first) < 0 else int(first)

    async def finish_deliveries(
        self, done: Sequence[tuple[ProjectKeys, str, Sequence[int]]]
    ) -> list[int | None]:
        """finish_delivery.lua of each (project, delivery id, indexes) as delivered, together: each one's
        project's outbox's earliest due time after it."""
        calls = [self._finish_call(p, did, None, False, indexes) for p, did, indexes in done]
        firsts = await self._run.each(self._s["finish_delivery"], calls)
        return [None if int(first) < 0 else int(first) for first in firsts]

    @staticmethod
    def _finish_call(
        project: ProjectKeys, delivery_id: str, retry_at: int | None, attempted: bool, indexes: Sequence[int]
    ) -> tuple[list[str], list[Any]]:
        keys = [project.outbox, project.delivery(delivery_id), project.outbox_owed]
        return keys, [delivery_id, _opt(retry_at), int(attempted), *indexes]

    # -- the sweeper ----------------------------------------------------------------------------------

    async def sweep(self, projects: Sequence[ProjectKeys], *, now: int, max_queues: int) -> list[SweepReply]:
        """sweep.lua once per project, together (lib.lua housekeep bounds each)."""
        calls = [([p.due], [p.prefix, now, max_queues, *self._defaults]) for p in projects]
        return [
            SweepReply(int(r[0]), int(r[1]), None if int(r[2]) < 0 else int(r[2]), bool(r[3]))
            for r in await self._run.each(self._s["sweep"], calls)
        ]

    # -- metrics --------------------------------------------------------------------------------------

    async def stats_each(self, targets: Sequence[Target], *, now: int) -> list[QueueStats]:
        """stats.lua once per queue, pipelined on one connection (GET /metrics' gauges)."""
        calls = [(t.keys, [*t.head, now, *self._defaults]) for t in targets]
        return [_stats(raw) for raw in await self._run.each(self._s["stats"], calls)]


# the task's hash fields, in the order redrive_step.lua returns them
STEP_FIELDS = (
    TaskField.STATUS,
    TaskField.CURSOR,
    TaskField.SCANNED,
    TaskField.MOVED,
    TaskField.SKIPPED,
    TaskField.END,
    TaskField.CREATED,
    TaskField.UPDATED,
    TaskField.SPEC,
    TaskField.OWNER,
)


def policy_args(metadata: Mapping[str, Any], policy: QueuePolicy, expected_version: int | None) -> list[Any]:
    """ARGV for lib.lua write_metadata: the metadata, then its POLICY_FIELDS in order, then the version."""
    return [
        orjson.dumps(dict(metadata)).decode(),
        *(_policy_arg(v) for v in policy_fields(policy).values()),
        _opt(expected_version),
    ]


def _policy_arg(value: PolicyValue | None) -> Any:
    """A policy field as write_metadata stores it: '' unset (the field is deleted), a list comma-separated,
    a float as Python writes it back (repr)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return 1 if value else ""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, float) else value
