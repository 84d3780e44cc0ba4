"""Redrive: a dry run's preview, starting a task, and the runner that steps tasks (the process that starts one
runs it; any process takes over one whose runner died)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from core import signatures
from core.clock import Clock
from core.errors import CharonError
from core.models import Message, Page, QueueRef, RedriveSpec, RedriveTask, TaskId
from service.metrics import REDRIVE_MOVED, REDRIVE_RUNNING, REDRIVE_SCANNED
from service.outage import Outage, stop_if_cancelled
from storage.base import Store

log = logging.getLogger("charon.redrive")

BATCH = 100  # messages one step looks at
LEASE_MS = 15_000  # default: a runner that has not stepped a task this long loses it to whoever takes it
POLL_S = 2.0  # how often a process looks for tasks nobody holds
TAKE_AT_ONCE = 4  # tasks one look takes


INLINE_LIMIT = 100  # a redrive of at most this many messages, unthrottled, is done before the answer
PREVIEW_PAGE = 500
PREVIEW_SCAN_CAP = 100_000  # messages a dry run looks at, at most
SAMPLE = 10


@dataclass(frozen=True, slots=True)
class Preview:
    """What a redrive would move now (a dry run)."""

    scanned: int
    matched: int
    would_move: int
    claimed: int  # matched, but held by a claim: skipped by a redrive
    by_source_queue: dict[str, int]
    by_reason: dict[str, int]
    by_signature: dict[str, int]  # by failure signature (core/signatures.py: a cause `charon insights` names)
    sample: list[Message]
    complete: bool  # the whole DLQ was read (else PREVIEW_SCAN_CAP stopped the count)


class RedriveRunner:
    """Steps redrive tasks (store.redrive_step) a batch at a time, at most `max_per_second` moves a second
    when the task asks for it. Each process has one, with an owner name of its own. It waits on `clock`
    (the store's), so a test moves time instead of sleeping."""

    def __init__(self, store: Callable[[], Store], *, clock: Clock, lease_ms: int = LEASE_MS) -> None:
        self._store = store
        self._clock = clock
        self.lease_ms = lease_ms
        self.owner = uuid.uuid4().hex
        self._running: dict[TaskId, asyncio.Task[RedriveTask | None]] = {}
        self._queues: dict[TaskId, QueueRef] = {}

    def start(self, q: QueueRef, task_id: TaskId) -> None:
        """Run the task (already held by this runner) in the background."""
        if task_id not in self._running:
            task = asyncio.create_task(self.run(q, task_id), name=f"charon-redrive-{task_id}")
            self._running[task_id] = task
            self._queues[task_id] = q

            def forget(_: object) -> None:
                self._running.pop(task_id, None)
                self._queues.pop(task_id, None)

            task.add_done_callback(forget)

    async def finished(self, task_id: TaskId) -> None:
        """Return when this runner no longer runs the task (at once if it does not)."""
        task = self._running.get(task_id)
        if task is not None:
            await asyncio.wait([task])

    async def run(self, q: QueueRef, task_id: TaskId, *, raise_errors: bool = False) -> RedriveTask | None:
        """Step the task until it ends, is cancelled, or another runner holds it; returns it as it was last
        seen. An error stops the run (and is raised with `raise_errors`, else logged): the lease then
        lapses and a runner takes the task over."""
        with REDRIVE_RUNNING.track_inprogress():
            return await self._run(q, task_id, raise_errors=raise_errors)

    async def _run(self, q: QueueRef, task_id: TaskId, *, raise_errors: bool) -> RedriveTask | None:
        store = self._store()
        task: RedriveTask | None = None
        try:
            while True:
                task = await store.get_redrive(q, task_id) if task is None else task
                rate = task.spec.max_per_second
                batch = min(BATCH, rate) if rate else BATCH
                began = self._clock.now_ms()
                before, scanned = task.moved, task.scanned
                task = await store.redrive_step(
                    q, task_id, owner=self.owner, lease_ms=self.lease_ms, batch=batch
                )
                if task.owner == self.owner:  # else unchanged by this step (another runner holds it)
                    REDRIVE_MOVED.inc(max(task.moved - before, 0))
                    REDRIVE_SCANNED.inc(max(task.scanned - scanned, 0))
                if task.status != "running" or task.owner != self.owner:
                    return task
                stop_if_cancelled()
                # at most `rate` moves a second; without one, only let requests in between batches
                took = (self._clock.now_ms() - began) / 1000
                await self._clock.sleep((task.moved - before) / rate - took if rate else 0)
        except Exception as exc:
            stop_if_cancelled()
            if raise_errors:
                raise
            if isinstance(exc, CharonError):  # storage down, or the task or its queue gone
                log.warning("redrive %s stopped: %s", task_id, exc.description)
            else:
                log.exception("redrive %s failed", task_id)
        return task

    async def adopt(self) -> int:
        """Take the running tasks nobody holds and start them; returns how many."""
        taken = await self._store().lease_redrives(self.owner, lease_ms=self.lease_ms, limit=TAKE_AT_ONCE)
        for q, task_id in taken:
            self.start(q, task_id)
        return len(taken)

    async def run_forever(self) -> None:
        """adopt() every POLL_S seconds until cancelled; then stop the tasks this process runs (their
        leases lapse and another process takes them over)."""
        outage = Outage(log, "redrive adoption", POLL_S)
        try:
            while True:
                try:
                    await self.adopt()
                    wait = outage.ok()
                except Exception as exc:
                    wait = outage.failed(exc)
                stop_if_cancelled()
                await self._clock.sleep(wait)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop the tasks this process runs and end its leases on them, so that another process resumes
        them at once rather than after the lease (a rolling restart)."""
        running, queues = dict(self._running), dict(self._queues)
        for task in running.values():
            task.cancel()
        for task_id, task in running.items():
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(CharonError):
                await self._store().release_redrive(queues[task_id], task_id, owner=self.owner)


async def preview(store: Store, q: QueueRef, spec: RedriveSpec, *, now: int) -> Preview:
    """What a redrive would move now: the DLQ read page by page (nothing changes), counted and sampled."""
    scanned = matched = claimed = 0
    by_source: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    by_signature: Counter[str] = Counter()
    sample: list[Message] = []
    marker: int | None = None
    complete = False
    while scanned < PREVIEW_SCAN_CAP:
        if spec.message_ids is not None:  # listed ids: looked up, each once
            page = Page(await store.get_messages(q, list(spec.message_ids)), None)
            scanned += len(spec.message_ids)
        else:
            page = await store.list_messages(
                q,
                marker=marker,
                limit=PREVIEW_PAGE,
                echo=True,
                client_id="",
                include_claimed=True,
                include_delayed=True,
            )
            scanned += len(page.items)
        for m in page.items:
            if not spec.matches(m) or m.dead_letter is None:
                continue
            matched += 1
            by_source[m.dead_letter.source_queue] += 1
            by_reason[m.dead_letter.reason] += 1
            by_signature[spec.signature or signatures.of_message(m) or ""] += 1
            if m.is_claimed(now):
                claimed += 1
            elif len(sample) < SAMPLE:
                sample.append(m)
        if page.next_marker is None:
            complete = True
            break
        marker = int(page.next_marker)
    movable = matched - claimed
    return Preview(
        scanned=scanned,
        matched=matched,
        would_move=movable if spec.limit is None else min(movable, spec.limit),
        claimed=claimed,
        by_source_queue=dict(by_source),
        by_reason=dict(by_reason),
        by_signature=dict(by_signature),
        sample=sample,
        complete=complete,
    )


async def start(
    store: Store, runner: RedriveRunner, q: QueueRef, spec: RedriveSpec
) -> tuple[RedriveTask, bool]:
    """Record a redrive task of DLQ `q` and run it: a small unthrottled one (limit <= INLINE_LIMIT, no
    max_per_second) now, before this returns (True: done), any other in the background on this process's
    runner (False: running; another process adopts it if this one dies)."""
    task_id = TaskId(uuid.uuid4().hex)
    task = await store.create_redrive(q, task_id, spec, owner=runner.owner, lease_ms=runner.lease_ms)
    if spec.limit is not None and spec.limit <= INLINE_LIMIT and spec.max_per_second is None:
        done = await runner.run(q, task_id, raise_errors=True)
        return done or await store.get_redrive(q, task_id), True
    runner.start(q, task_id)
    return task, False
