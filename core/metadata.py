"""Reserved queue metadata: validation, defaults shown on GET, and the policy the drivers apply."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInput
from core.limits import QUEUE_NAME_RE, Limits

DEFAULT_MESSAGE_TTL = "_default_message_ttl"
DEFAULT_MESSAGE_DELAY = "_default_message_delay"
MAX_POST_SIZE = "_max_messages_post_size"
MAX_CLAIM_COUNT = "_max_claim_count"
DEAD_LETTER_QUEUE = "_dead_letter_queue"
DEAD_LETTER_TTL = "_dead_letter_queue_messages_ttl"
FLAVOR = "_flavor"  # with pooling: the flavor whose pools a new queue is placed in


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The reserved keys a driver acts on; None means "use the service default" or "off"."""

    default_message_ttl: int | None = None
    default_message_delay: int | None = None
    max_messages_post_size: int | None = None
    max_claim_count: int | None = None
    dead_letter_queue: str | None = None
    dead_letter_ttl: int | None = None


def _int_in(meta: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{key} must be an integer between {lo} and {hi}; got {value!r}.")
    if not lo <= value <= hi:
        raise InvalidInput(f"{key} must be between {lo} and {hi}; got {value}.")
    return value


def parse_policy(meta: Mapping[str, Any], limits: Limits, *, queue: str) -> QueuePolicy:
    """Validate the reserved keys of `meta` (for queue `queue`) and return the policy they set.

    Raises:
        InvalidInput: a reserved key has the wrong type or range, or names an impossible DLQ.
    """
    dlq = meta.get(DEAD_LETTER_QUEUE)
    if dlq is not None:
        if not isinstance(dlq, str) or not QUEUE_NAME_RE.match(dlq):
            raise InvalidInput(
                f"{DEAD_LETTER_QUEUE} must be a queue name (letters, digits, '_', '-', '.', "
                f"1 to 64 characters); got {dlq!r}."
            )
        if dlq == queue:
            raise InvalidInput(f"{DEAD_LETTER_QUEUE} must name another queue, not {queue!r} itself.")
    flavor = meta.get(FLAVOR)
    if flavor is not None and (not isinstance(flavor, str) or not QUEUE_NAME_RE.match(flavor)):
        raise InvalidInput(f"{FLAVOR} must be a flavor name (as GET /v2/flavors lists them); got {flavor!r}.")
    return QueuePolicy(
        default_message_ttl=_int_in(
            meta, DEFAULT_MESSAGE_TTL, limits.min_message_ttl, limits.max_message_ttl
        ),
        default_message_delay=_int_in(meta, DEFAULT_MESSAGE_DELAY, 0, limits.max_message_delay),
        max_messages_post_size=_int_in(meta, MAX_POST_SIZE, 1, limits.max_messages_post_size),
        max_claim_count=_int_in(meta, MAX_CLAIM_COUNT, 1, 2**31 - 1),
        dead_letter_queue=dlq,
        dead_letter_ttl=_int_in(meta, DEAD_LETTER_TTL, limits.min_message_ttl, limits.max_message_ttl),
    )


MAX_DEAD_LETTER_HOPS = 1000  # a chain longer than this is not walked to its end (and cannot be a cycle here)


async def check_dead_letter_chain(
    queue: str, dead_letter_queue: str, dead_letter_queue_of: Callable[[str], Awaitable[str | None]]
) -> None:
    """Raise InvalidInput when pointing `queue` at `dead_letter_queue` would close a cycle of DLQs.

    `dead_letter_queue_of(name)` is the `_dead_letter_queue` set on queue `name` (None when unset or no such
    queue). Only a cycle through `queue` is this write's doing; the description names all of it.
    """
    chain = [queue, dead_letter_queue]
    seen = {queue}
    current = dead_letter_queue
    while current not in seen and len(chain) <= MAX_DEAD_LETTER_HOPS:
        seen.add(current)
        nxt = await dead_letter_queue_of(current)
        if nxt is None:
            return
        chain.append(nxt)
        current = nxt
    if current == queue:
        raise InvalidInput(
            f"{DEAD_LETTER_QUEUE} {dead_letter_queue!r} would make a cycle of dead-letter queues: "
            f"{' -> '.join(chain)}. Point one of them at a queue outside the cycle, or remove its "
            f"{DEAD_LETTER_QUEUE}."
        )


def with_reserved_defaults(meta: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """The metadata as GET shows it: the reserved keys filled with the defaults in force, as Zaqar does.

    Unlike Zaqar, unset dead-letter keys are left out rather than shown as null: python-zaqarclient's
    `queue.metadata(new_meta=...)` turns a key shown as null into "add" then "remove" in one patch, so with
    nulls shown it could never set `_max_claim_count` or `_dead_letter_queue`.
    """
    shown: dict[str, Any] = {
        MAX_POST_SIZE: limits.max_messages_post_size,
        DEFAULT_MESSAGE_TTL: limits.default_message_ttl,
        DEFAULT_MESSAGE_DELAY: 0,
    }
    shown.update(meta)
    return shown
