"""Queue use cases: a metadata write checked against the project's other queues (the DLQ chain) and retried
when another write lands in between, and the filtered queue listing."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import orjson

from core.errors import Conflict, InvalidBody, InvalidInput, MetadataChanged, PayloadTooLarge
from core.limits import Limits, check_json_depth
from core.metadata import (
    CLAIM_KEYS,
    DEAD_LETTER_QUEUE,
    FLAVOR,
    DeadLetterDefaults,
    QueuePolicy,
    check_dead_letter_chain,
    parse_policy,
)
from core.models import QueueInfo, QueueRef
from core.queue_filter import QueueFilter
from storage.base import Store
from storage.pooling.store import PooledStore
from storage.traced import unwrapped

T = TypeVar("T")
METADATA_WRITE_ATTEMPTS = 8
KEPT_CHANGING = "Queue metadata in this project kept changing while this write was being checked; retry it."
SCAN_PAGE = 100  # queues read at a time when a filter picks among them
PatchChange = tuple[str, str, Any]  # op (add, replace, remove), path (/metadata/<key>), value


async def create(
    store: Store, q: QueueRef, metadata: Any, *, limits: Limits, defaults: DeadLetterDefaults
) -> bool:
    """Create the queue with `metadata` (checked); False when it existed (its metadata is left as it is)."""

    async def given() -> Any:
        return metadata

    async def create(meta: dict[str, Any], policy: QueuePolicy, version: int) -> bool:
        return await store.create_queue(q, metadata=meta, policy=policy, expected_version=version)

    _, created = await _write_checked(q, store, limits, defaults, given, create)
    return created


async def patch(
    store: Store, q: QueueRef, changes: Sequence[PatchChange], *, limits: Limits, defaults: DeadLetterDefaults
) -> dict[str, Any]:
    """Apply a JSON patch to the queue's metadata (checked); returns the metadata written."""

    async def patched() -> Any:
        return apply_patch(await store.get_metadata(q), changes)

    async def replace(meta: dict[str, Any], policy: QueuePolicy, version: int) -> None:
        await store.set_metadata(q, metadata=meta, policy=policy, expected_version=version)

    metadata, _ = await _write_checked(q, store, limits, defaults, patched, replace)
    return metadata


async def check(
    q: QueueRef, metadata: Any, limits: Limits, store: Store, defaults: DeadLetterDefaults
) -> QueuePolicy:
    if not isinstance(metadata, dict):
        raise InvalidBody("Queue metadata must be a JSON object.")
    check_json_depth(metadata, limits, "Queue metadata")
    size = len(orjson.dumps(metadata))
    if size > limits.max_queue_metadata:
        raise PayloadTooLarge(f"Queue metadata may be at most {limits.max_queue_metadata} bytes; got {size}.")
    if q.kind == "topics" and (claims := sorted(CLAIM_KEYS.intersection(metadata))):
        raise InvalidInput(
            f"A topic has no claims and no dead-letter queue, so {', '.join(claims)} would have no effect "
            "on it. Leave them out."
        )
    policy = parse_policy(metadata, limits, queue=q.name)
    if metadata.get(FLAVOR) is not None and not isinstance(unwrapped(store), PooledStore):
        raise InvalidInput(
            f"{FLAVOR} chooses the pool a queue is placed in, and this service runs without pools "
            "(CHARON_POOLING=false): it would have no effect. Leave it out."
        )
    if policy.dead_letter_queue is not None:

        async def dead_letter_queue_of(name: str) -> str | None:
            value = (await store.get_metadata(QueueRef(q.project, name))).get(DEAD_LETTER_QUEUE)
            return value if isinstance(value, str) else defaults.dead_letter_queue_for(name)

        await check_dead_letter_chain(q.name, policy.dead_letter_queue, dead_letter_queue_of)
    return policy


async def _write_checked(
    q: QueueRef,
    store: Store,
    limits: Limits,
    defaults: DeadLetterDefaults,
    metadata_now: Callable[[], Awaitable[Any]],
    write: Callable[[dict[str, Any], QueuePolicy, int], Awaitable[T]],
) -> tuple[dict[str, Any], T]:
    """Compute the metadata to write, check it (DLQ chain included) and write it, unless another metadata
    write landed in the project in between: then all again. No lost update, and the DLQ cycle check always
    sees what the write lands on. Returns the metadata written and what `write` returned."""
    for _ in range(METADATA_WRITE_ATTEMPTS):
        version = await store.metadata_version(q)
        metadata = await metadata_now()
        policy = await check(q, metadata, limits, store, defaults)
        with contextlib.suppress(MetadataChanged):
            return metadata, await write(metadata, policy, version)
    raise MetadataChanged(KEPT_CHANGING)


def apply_patch(metadata: dict[str, Any], changes: Sequence[PatchChange]) -> dict[str, Any]:
    patched = dict(metadata)
    for op, path, value in changes:
        pointer = path.removeprefix("/metadata/")
        if pointer == path or not pointer or "/" in pointer or re.search("~(?![01])", pointer):
            raise InvalidBody(
                "A patch path names one key of the metadata as a JSON Pointer, /metadata/<key>, with / in "
                f"the key written ~1 and ~ written ~0 (RFC 6901); got {path[:300]!r}."
            )
        key = pointer.replace("~1", "/").replace("~0", "~")
        reserved = key.startswith("_")
        if op in ("replace", "remove") and key not in patched and not reserved:
            raise Conflict(f"Cannot {op} metadata key {key!r}: the queue has no such key.")
        if op == "remove":
            patched.pop(key, None)
        else:
            patched[key] = value
    return patched


async def page(
    store: Store, project: str, chosen: QueueFilter, marker: str | None, size: int, detailed: bool
) -> tuple[list[QueueInfo], str | None]:
    """One page of the listing and the marker of the next (None at the end)."""
    if not chosen.active:
        page = await store.list_queues(project, marker=marker, limit=size, detailed=detailed)
        full = page.next_marker is not None and len(page.items) == size
        return page.items, page.next_marker if full else None
    found: list[QueueInfo] = []
    async for info in scan(store, project, chosen, marker):
        found.append(info)
        if len(found) == size:
            return found, info.name
    return found, None


async def scan(
    store: Store, project: str, chosen: QueueFilter, marker: str | None
) -> AsyncIterator[QueueInfo]:
    """The project's queues after `marker` that `chosen` matches, in name order, read SCAN_PAGE at a time."""
    while True:
        page = await store.list_queues(
            project, marker=marker, limit=SCAN_PAGE, detailed=bool(chosen.metadata)
        )
        for info in page.items:
            if chosen.matches(info.name, info.metadata):
                yield info
        if len(page.items) < SCAN_PAGE or page.next_marker is None:
            return
        marker = page.next_marker


async def count(store: Store, project: str, chosen: QueueFilter) -> int:
    return sum([1 async for _ in scan(store, project, chosen, None)])
