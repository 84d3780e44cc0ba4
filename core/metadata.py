"""Reserved queue metadata: validation, defaults shown on GET, and the policy the drivers apply."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from core.errors import InvalidInput
from core.limits import Limits, check_name, is_name
from core.retry import parse_retry_policy

DEFAULT_MESSAGE_TTL = "_default_message_ttl"
DEFAULT_MESSAGE_DELAY = "_default_message_delay"
MAX_POST_SIZE = "_max_messages_post_size"
MAX_CLAIM_COUNT = "_max_claim_count"
DEAD_LETTER_QUEUE = "_dead_letter_queue"
DEAD_LETTER_TTL = "_dead_letter_queue_messages_ttl"
FLAVOR = "_flavor"  # with pooling: the flavor whose pools a new queue is placed in
REDELIVERY_DELAY = "_redelivery_delay"
REDELIVERY_MULTIPLIER = "_redelivery_delay_multiplier"
MAX_REDELIVERY_DELAY = "_max_redelivery_delay"
REDELIVERY_JITTER = "_redelivery_jitter"
REDELIVERY_LEVELS = "_redelivery_delay_levels"
DEAD_LETTER_ON_EXPIRY = "_dead_letter_on_expiry"
MAX_MESSAGE_TTL = "_max_message_ttl"
ENCRYPT_MESSAGES = "_enable_encrypt_messages"  # Zaqar's; Charon has no encryption at rest (yet): only false
RETRY_POLICY = "_retry_policy"  # Zaqar's: how subscriptions' deliveries are retried (core/retry.py)

RESERVED = (
    DEFAULT_MESSAGE_TTL,
    DEFAULT_MESSAGE_DELAY,
    MAX_POST_SIZE,
    MAX_CLAIM_COUNT,
    DEAD_LETTER_QUEUE,
    DEAD_LETTER_TTL,
    FLAVOR,
    REDELIVERY_DELAY,
    REDELIVERY_MULTIPLIER,
    MAX_REDELIVERY_DELAY,
    REDELIVERY_JITTER,
    REDELIVERY_LEVELS,
    DEAD_LETTER_ON_EXPIRY,
    MAX_MESSAGE_TTL,
    ENCRYPT_MESSAGES,
    RETRY_POLICY,
)

MAX_MULTIPLIER = 100.0
MAX_LEVELS = 32
_LEVEL_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_LEVEL_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a message waits before it can be claimed again after a claim of it ends (released or
    expired): Artemis' redelivery delay, multiplier, cap and collision avoidance, or Pulsar-style levels.

    The n-th wait (n = the message's claim count) is levels[min(n, len) - 1] when levels are set, else
    min(delay * multiplier^(n-1), max); then scaled by a factor in [1 - jitter, 1 + jitter]. The factor
    comes from the message id and n (a golden-ratio sequence), so every driver, Lua and Python alike, gives
    a message the same wait, and messages released together spread out.
    """

    delay_ms: int = 0
    multiplier: float = 1.0
    max_ms: int = 0
    jitter: float = 0.0
    levels_ms: tuple[int, ...] = ()

    def wait_ms(self, message_id: str, n: int) -> int:
        n = max(n, 1)
        if self.levels_ms:
            wait = float(self.levels_ms[min(n, len(self.levels_ms)) - 1])
        else:
            try:
                wait = min(self.delay_ms * self.multiplier ** (n - 1), self.max_ms)
            except OverflowError:
                wait = self.max_ms
        if self.jitter > 0:
            wait *= 1 + self.jitter * (2 * jitter_unit(message_id, n) - 1)
        return math.floor(wait)


def jitter_unit(message_id: str, n: int) -> float:
    """A number in [0, 1) for the n-th wait of a message (lib.lua jitter_unit computes the same)."""
    return ((int(message_id[:8], 16) + n * 2654435761) % 4294967296) / 4294967296


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """The reserved keys a driver acts on; None means "use the service default" or "off"."""

    default_message_ttl: int | None = None
    default_message_delay: int | None = None
    max_messages_post_size: int | None = None
    max_claim_count: int | None = None
    dead_letter_queue: str | None = None
    dead_letter_ttl: int | None = None
    backoff: Backoff | None = None
    # With _dead_letter_on_expiry: the ttl an expired message gets in the DLQ (its DLQ ttl, else the service's
    # default message ttl); None: an expired message vanishes.
    expired_ttl: int | None = None
    max_message_ttl: int | None = None

    def exhausted(self, claim_count: int) -> bool:
        """Whether a message claimed `claim_count` times has used up its claims: its next claim, or the end of
        the one that holds it, dead-letters it (lib.lua exhausted() is the Redis scripts' copy)."""
        return self.max_claim_count is not None and claim_count >= self.max_claim_count


def _int_in(meta: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # JSON Schema's integer: 5.0 is 5
        value = int(value)
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
    _check_reserved_keys(meta)
    dlq = meta.get(DEAD_LETTER_QUEUE)
    if dlq is not None:
        dlq = check_name(dlq, DEAD_LETTER_QUEUE)
        if dlq == queue:
            raise InvalidInput(f"{DEAD_LETTER_QUEUE} must name another queue, not {queue!r} itself.")
    flavor = meta.get(FLAVOR)
    if flavor is not None:
        check_name(flavor, FLAVOR)
    default_ttl = _int_in(meta, DEFAULT_MESSAGE_TTL, limits.min_message_ttl, limits.max_message_ttl)
    max_ttl = _int_in(meta, MAX_MESSAGE_TTL, limits.min_message_ttl, limits.max_message_ttl)
    if max_ttl is not None and default_ttl is not None and default_ttl > max_ttl:
        raise InvalidInput(
            f"{DEFAULT_MESSAGE_TTL} ({default_ttl}) must not exceed {MAX_MESSAGE_TTL} ({max_ttl})."
        )
    dead_letter_ttl = _int_in(meta, DEAD_LETTER_TTL, limits.min_message_ttl, limits.max_message_ttl)
    if meta.get(RETRY_POLICY) is not None:  # read by the notifier, not the stores
        parse_retry_policy(meta[RETRY_POLICY], RETRY_POLICY)
    on_expiry = meta.get(DEAD_LETTER_ON_EXPIRY)
    on_expiry = False if on_expiry is None else on_expiry  # null: unset, like every reserved key
    if not isinstance(on_expiry, bool):
        raise InvalidInput(f"{DEAD_LETTER_ON_EXPIRY} must be true or false; got {on_expiry!r}.")
    return QueuePolicy(
        default_message_ttl=default_ttl,
        default_message_delay=_int_in(meta, DEFAULT_MESSAGE_DELAY, 0, limits.max_message_delay),
        max_messages_post_size=_int_in(meta, MAX_POST_SIZE, 1, limits.max_messages_post_size),
        max_claim_count=_int_in(meta, MAX_CLAIM_COUNT, 1, 2**31 - 1),
        dead_letter_queue=dlq,
        dead_letter_ttl=dead_letter_ttl,
        backoff=_backoff(meta, limits),
        expired_ttl=(dead_letter_ttl or limits.default_message_ttl) if on_expiry else None,
        max_message_ttl=max_ttl,
    )


def _check_reserved_keys(meta: Mapping[str, Any]) -> None:
    """Keys starting with "_" are the service's: an unknown one is a typo that would be silently ignored."""
    for key in meta:
        if key.startswith("_") and key not in RESERVED:
            close = difflib.get_close_matches(key, RESERVED, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise InvalidInput(
                f"Metadata keys starting with '_' are reserved, and {key[:80]!r} is not one of them "
                f"({', '.join(RESERVED)}).{hint}"
            )
    encrypt = meta.get(ENCRYPT_MESSAGES)
    if encrypt is not None and encrypt is not False:
        raise InvalidInput(
            f"{ENCRYPT_MESSAGES} is not supported: Charon does not encrypt messages at rest, so only false "
            f"is accepted (got {encrypt!r}). Encrypt bodies in the client if they must not be stored clear."
        )


def _seconds_in(meta: Mapping[str, Any], key: str, hi: float) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= hi:
        raise InvalidInput(f"{key} must be a number of seconds between 0 and {hi:g}; got {value!r}.")
    return float(value)


def _number_in(meta: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidInput(f"{key} must be a number between {lo:g} and {hi:g}; got {value!r}.")
    return float(value)


def _level_ms(value: Any, hi_s: int) -> int:
    """One delay level: seconds as a number, or a string like "500ms", "5s", "1m", "2h"."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        ms = float(value) * 1000
    elif isinstance(value, str) and (m := _LEVEL_RE.match(value.strip())):
        ms = float(m.group(1)) * _LEVEL_UNIT_MS[m.group(2)]
    else:
        raise InvalidInput(
            f'{REDELIVERY_LEVELS} lists delays like "1s", "500ms", "5m", "1h" or numbers of seconds; '
            f"got {value!r}."
        )
    if not 0 <= ms <= hi_s * 1000:
        raise InvalidInput(
            f"Each of {REDELIVERY_LEVELS} must be between 0 and {hi_s} seconds; got {value!r}."
        )
    return math.floor(ms)


def _backoff(meta: Mapping[str, Any], limits: Limits) -> Backoff | None:
    """The redelivery backoff the keys set; bounded by the longest claim (limits.max_claim_ttl)."""
    hi = limits.max_claim_ttl
    delay = _seconds_in(meta, REDELIVERY_DELAY, hi)
    multiplier = _number_in(meta, REDELIVERY_MULTIPLIER, 1.0, MAX_MULTIPLIER)
    cap = _seconds_in(meta, MAX_REDELIVERY_DELAY, hi)
    jitter = _number_in(meta, REDELIVERY_JITTER, 0.0, 1.0)
    raw_levels = meta.get(REDELIVERY_LEVELS)
    levels: tuple[int, ...] = ()
    if raw_levels is not None:
        if not isinstance(raw_levels, list) or not 1 <= len(raw_levels) <= MAX_LEVELS:
            raise InvalidInput(
                f"{REDELIVERY_LEVELS} must be a list of 1 to {MAX_LEVELS} delays; got {raw_levels!r}."
            )
        levels = tuple(_level_ms(v, hi) for v in raw_levels)
    if not levels and not delay:
        return None
    delay_ms = math.floor((delay or 0) * 1000)
    return Backoff(
        delay_ms=delay_ms,
        multiplier=multiplier or 1.0,
        max_ms=math.floor(cap * 1000) if cap is not None else min(delay_ms * 10, hi * 1000),
        jitter=jitter or 0.0,
        levels_ms=levels,
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


def with_reserved_defaults(
    meta: Mapping[str, Any], limits: Limits, operator: QueuePolicy | None = None
) -> dict[str, Any]:
    """The metadata as GET shows it: the reserved keys filled with the defaults in force, as Zaqar does, and
    the dead-lettering the operator's defaults (`operator`, DeadLetterDefaults.apply) give a queue that sets
    none itself.

    Unlike Zaqar, unset dead-letter keys are left out rather than shown as null: python-zaqarclient's
    `queue.metadata(new_meta=...)` turns a key shown as null into "add" then "remove" in one patch, so with
    nulls shown it could never set `_max_claim_count` or `_dead_letter_queue`.
    """
    shown: dict[str, Any] = {
        MAX_POST_SIZE: limits.max_messages_post_size,
        DEFAULT_MESSAGE_TTL: limits.default_message_ttl,
        DEFAULT_MESSAGE_DELAY: 0,
    }
    if operator is not None and operator.max_claim_count is not None:
        shown[MAX_CLAIM_COUNT] = operator.max_claim_count
    if operator is not None and operator.dead_letter_queue is not None:
        shown[DEAD_LETTER_QUEUE] = operator.dead_letter_queue
    shown.update(meta)
    return shown


@dataclass(frozen=True, slots=True)
class DeadLetterDefaults:
    """The operator's defaults for queues that set no dead-lettering themselves (Artemis' auto-created DLQs,
    ActiveMQ's individualDeadLetterStrategy, Pulsar's `-DLQ`): `max_claim_count` for a queue without
    `_max_claim_count`, and a DLQ named by `template` (e.g. "{queue}.DLQ") for one without
    `_dead_letter_queue`. A queue whose name fits the template is itself such a DLQ and gets neither."""

    max_claim_count: int | None = None
    template: str | None = None

    @property
    def prefix_suffix(self) -> tuple[str, str] | None:
        if self.template is None:
            return None
        prefix, _, suffix = self.template.partition("{queue}")
        return prefix, suffix

    def is_auto_dead_letter_queue(self, name: str) -> bool:
        ps = self.prefix_suffix
        if ps is None:
            return False
        prefix, suffix = ps
        return len(name) >= len(prefix) + len(suffix) and name.startswith(prefix) and name.endswith(suffix)

    def dead_letter_queue_for(self, name: str) -> str | None:
        """The DLQ the template names for queue `name` (its name cut so the result fits 64 characters)."""
        ps = self.prefix_suffix
        if ps is None or self.is_auto_dead_letter_queue(name):
            return None
        prefix, suffix = ps
        return f"{prefix}{name[: 64 - len(prefix) - len(suffix)]}{suffix}"

    def apply(self, name: str, policy: QueuePolicy) -> QueuePolicy:
        """The policy in force for queue `name`: `policy` with these defaults where it sets nothing."""
        if self.is_auto_dead_letter_queue(name):
            return policy
        changes: dict[str, Any] = {}
        if policy.max_claim_count is None and self.max_claim_count is not None:
            changes["max_claim_count"] = self.max_claim_count
        if policy.dead_letter_queue is None and self.template is not None:
            changes["dead_letter_queue"] = self.dead_letter_queue_for(name)
        return replace(policy, **changes) if changes else policy


def check_template(template: str | None) -> str | None:
    """A DLQ name template: one "{queue}" with at most 32 name characters around it."""
    if template is None:
        return None
    prefix, found, suffix = template.partition("{queue}")
    if not found or "{queue}" in suffix or not is_name(f"{prefix}x{suffix}"):
        raise ValueError(
            'the DLQ name template must hold "{queue}" once, with letters, digits, "_", "-" or "." around '
            f"it; got {template!r}"
        )
    if not prefix and not suffix:
        raise ValueError('the DLQ name template must add something to "{queue}" (e.g. "{queue}.DLQ")')
    if len(prefix) + len(suffix) > 32:
        raise ValueError(f"the DLQ name template adds more than 32 characters: {template!r}")
    return template
