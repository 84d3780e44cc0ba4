"""Reserved queue metadata: the one table of the reserved keys (RESERVED_KEYS), their validation, the
defaults GET shows, and the policy the drivers apply.

Each reserved key is one `ReservedKey` row: its name, the kind and bounds of its value, its default, what it
does, and, when a driver acts on it, the QueuePolicy value it sets and the name of the policy field that
value is stored under. Everything else is derived from the rows: validation (`ReservedKey.check`, run by
`parse_policy`), the JSON Schema of the published contract (`ReservedKey.schema`, api/contract.py), the
queue routes' description, the stored policy (`policy_fields` / `policy_from_fields`: the Redis queue
hash's fields and their order in lib.lua's write_metadata, the MongoDB `pol` sub-document), and the docs'
table (app/metadata_doc.py). A new key is a row here plus its behaviour: the rule that builds its
QueuePolicy value when it is not the value itself, and the driver code that acts on it.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

from core.errors import InvalidInput
from core.limits import NAME_SCHEMA, Limits, check_name, is_name
from core.retry import parse_retry_policy, retry_policy_schema
from core.sealing import require_key

DEFAULT_MESSAGE_TTL = "_default_message_ttl"
DEFAULT_MESSAGE_DELAY = "_default_message_delay"
MAX_POST_SIZE = "_max_messages_post_size"
MAX_CLAIM_COUNT = "_max_claim_count"
DEAD_LETTER_QUEUE = "_dead_letter_queue"
DEAD_LETTER_TTL = "_dead_letter_queue_messages_ttl"
FLAVOR = "_flavor"
REDELIVERY_DELAY = "_redelivery_delay"
REDELIVERY_MULTIPLIER = "_redelivery_delay_multiplier"
MAX_REDELIVERY_DELAY = "_max_redelivery_delay"
REDELIVERY_JITTER = "_redelivery_jitter"
REDELIVERY_LEVELS = "_redelivery_delay_levels"
DEAD_LETTER_ON_EXPIRY = "_dead_letter_on_expiry"
MAX_MESSAGE_TTL = "_max_message_ttl"
ENCRYPT_MESSAGES = "_enable_encrypt_messages"
RETRY_POLICY = "_retry_policy"

MAX_MULTIPLIER = 100.0
MAX_LEVELS = 32
# Keys that act on claims and dead letters only: a topic (core.models.TOPIC_SPACE) refuses them
CLAIM_KEYS = frozenset(
    {
        MAX_CLAIM_COUNT,
        DEAD_LETTER_QUEUE,
        DEAD_LETTER_TTL,
        REDELIVERY_DELAY,
        REDELIVERY_MULTIPLIER,
        MAX_REDELIVERY_DELAY,
        REDELIVERY_JITTER,
        REDELIVERY_LEVELS,
        DEAD_LETTER_ON_EXPIRY,
    }
)
MAX_CLAIM_COUNT_BOUND = 2**31 - 1
_LEVEL_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_LEVEL_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}
LEVEL_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?(ms|s|m|h)?\s*$"  # _LEVEL_RE as the contract publishes it

# A bound or a default: a number, or the name of the Limits field that sets it (so an operator's limits apply)
Bound = int | float | str
PolicyValue = int | float | str | tuple[int, ...]


class Kind(StrEnum):
    """What a reserved key's value is; each kind is checked, and published, one way."""

    INTEGER = "integer"  # lo to hi (JSON Schema's integer: 5.0 is 5)
    SECONDS = "seconds"  # a number of seconds, lo to hi, fractions allowed
    NUMBER = "number"  # lo to hi
    NAME = "name"  # a queue or flavor name (core.limits.NAME_RULE)
    BOOLEAN = "boolean"
    DELAYS = "delays"  # 1 to MAX_LEVELS delays, each lo to hi seconds: a number or "500ms", "5s", "1m", "2h"
    ENCRYPT = "encrypt"  # a boolean; true needs the service's encryption key (core/sealing.py)
    RETRY_POLICY = "retry policy"  # Zaqar's _retry_policy object (core/retry.py)


@dataclass(frozen=True, slots=True)
class ReservedKey:
    """One reserved metadata key, as a row of RESERVED_KEYS.

    `description` and `default` are markdown for people (the docs' table, the published contract); `shown`
    is the value GET shows while the key is unset (Zaqar's defaults), and then also its default. `policy` is
    the QueuePolicy value the key sets, dotted into a part ("backoff.delay_ms"); `field` the short name the
    drivers store that value under (tests hold every row with one to have the other).
    """

    name: str
    kind: Kind
    description: str
    lo: Bound = 0
    hi: Bound = 0
    unit: str = ""
    default: str = "none"
    shown: Bound | None = None
    ext: bool = False  # Charon's extension, not a key of Zaqar's
    policy: str | None = None
    field: str | None = None

    def bounds(self, limits: Limits) -> tuple[float, float]:
        return bound(self.lo, limits), bound(self.hi, limits)

    def check(self, value: Any, limits: Limits) -> Any:
        """The value validated (None: unset, as null is for every reserved key), as the key's kind takes it.

        Raises:
            InvalidInput: naming the key, what it takes and the value given.
        """
        if value is None:
            return None
        return _CHECKS[self.kind](self, value, limits)

    def schema(self, limits: Limits) -> dict[str, Any]:
        """The JSON Schema of a value (without null)."""
        lo, hi = self.bounds(limits)
        kind = self.kind
        if kind is Kind.INTEGER:
            return {"type": "integer", "minimum": lo, "maximum": hi}
        if kind in (Kind.SECONDS, Kind.NUMBER):
            return {"type": "number", "minimum": lo, "maximum": hi}
        if kind is Kind.NAME:
            return dict(NAME_SCHEMA)
        if kind in (Kind.BOOLEAN, Kind.ENCRYPT):
            return {"type": "boolean"}
        if kind is Kind.DELAYS:
            level = {
                "anyOf": [
                    {"type": "number", "minimum": lo, "maximum": hi},
                    {"type": "string", "pattern": LEVEL_PATTERN},
                ]
            }
            return {"type": "array", "items": level, "minItems": 1, "maxItems": MAX_LEVELS}
        return retry_policy_schema()


def bound(value: Bound, limits: Limits) -> Any:
    """A row's bound or shown default under `limits` (a str names the Limits field)."""
    return getattr(limits, value) if isinstance(value, str) else value


# Every reserved key. The order is the stored policy's (the Redis scripts' ARGV) and the docs' tables'.
RESERVED_KEYS: tuple[ReservedKey, ...] = (
    ReservedKey(
        DEFAULT_MESSAGE_TTL,
        Kind.INTEGER,
        "The ttl of a message posted without one. It may not exceed `_max_message_ttl`.",
        lo="min_message_ttl",
        hi="max_message_ttl",
        unit="seconds",
        shown="default_message_ttl",
        policy="default_message_ttl",
        field="dttl",
    ),
    ReservedKey(
        DEFAULT_MESSAGE_DELAY,
        Kind.INTEGER,
        "The delay of a message posted without one.",
        lo=0,
        hi="max_message_delay",
        unit="seconds",
        shown=0,
        policy="default_message_delay",
        field="ddelay",
    ),
    ReservedKey(
        MAX_POST_SIZE,
        Kind.INTEGER,
        "The largest message POST body the queue takes; a larger one is refused (413).",
        lo=1,
        hi="max_messages_post_size",
        unit="bytes",
        shown="max_messages_post_size",
        policy="max_messages_post_size",
        field="maxpost",
    ),
    ReservedKey(
        MAX_CLAIM_COUNT,
        Kind.INTEGER,
        "How many claims a message may have. A claim that finds a message already claimed that many times "
        "moves it to the DLQ instead of returning it, and keeps looking for other messages to fill its "
        "`limit`; the end of the claim that used up the last one (released or expired) moves it at once.",
        lo=1,
        hi=MAX_CLAIM_COUNT_BOUND,
        default="no limit (or the operator's `CHARON_DEFAULT_MAX_CLAIM_COUNT`)",
        policy="max_claim_count",
        field="maxcc",
    ),
    ReservedKey(
        DEAD_LETTER_QUEUE,
        Kind.NAME,
        "The DLQ's name (same project; not the queue itself; a chain of DLQs must not loop back — the 400 "
        "names the cycle, e.g. `a -> b -> c -> a`). Created on first use. Without one, exhausted messages "
        "are discarded and counted in `discarded`.",
        default="none (or the operator's `CHARON_DEAD_LETTER_QUEUE_TEMPLATE`)",
        policy="dead_letter_queue",
        field="dlq",
    ),
    ReservedKey(
        DEAD_LETTER_TTL,
        Kind.INTEGER,
        "The moved message's new ttl, counted from the move.",
        lo="min_message_ttl",
        hi="max_message_ttl",
        unit="seconds",
        default="none: a moved message keeps its remaining ttl",
        policy="dead_letter_ttl",
        field="dlqttl",
    ),
    ReservedKey(
        FLAVOR,
        Kind.NAME,
        "With pooling: the flavor whose pools the queue is placed in when it is created (docs/storage.md). "
        "Refused by a service without pools.",
        default="none: a pool without a flavor",
    ),
    ReservedKey(
        REDELIVERY_DELAY,
        Kind.SECONDS,
        "How long a message waits after a claim of it ends (released, or expired) before it can be claimed "
        "again.",
        lo=0,
        hi="max_claim_ttl",
        unit="seconds",
        default="0",
        ext=True,
        policy="backoff.delay_ms",
        field="rdelay",
    ),
    ReservedKey(
        REDELIVERY_MULTIPLIER,
        Kind.NUMBER,
        "The n-th wait (n = the message's `claim_count`) is `min(delay * multiplier^(n-1), max)`.",
        lo=1,
        hi=MAX_MULTIPLIER,
        default="1",
        ext=True,
        policy="backoff.multiplier",
        field="rmult",
    ),
    ReservedKey(
        MAX_REDELIVERY_DELAY,
        Kind.SECONDS,
        "The cap of the wait.",
        lo=0,
        hi="max_claim_ttl",
        unit="seconds",
        default="10 times `_redelivery_delay`",
        ext=True,
        policy="backoff.max_ms",
        field="rmax",
    ),
    ReservedKey(
        REDELIVERY_JITTER,
        Kind.NUMBER,
        "Each wait is scaled by a factor in [1 - jitter, 1 + jitter] (Artemis' collision avoidance), taken "
        "from the message id and n, so messages released together come back spread out.",
        lo=0,
        hi=1,
        default="0",
        ext=True,
        policy="backoff.jitter",
        field="rjit",
    ),
    ReservedKey(
        REDELIVERY_LEVELS,
        Kind.DELAYS,
        "Instead of the delay and multiplier: the n-th redelivery waits the n-th level, the last repeats "
        "(Pulsar, RocketMQ).",
        lo=0,
        hi="max_claim_ttl",
        unit="seconds",
        ext=True,
        policy="backoff.levels_ms",
        field="rlevels",
    ),
    ReservedKey(
        DEAD_LETTER_ON_EXPIRY,
        Kind.BOOLEAN,
        "`true`: a message whose ttl runs out moves to the DLQ with reason `expired` instead of vanishing. "
        "Its ttl there is `_dead_letter_queue_messages_ttl`, else the service's default message ttl. Without "
        "a DLQ it is discarded and counted.",
        default="`false`",
        ext=True,
        policy="expired_ttl",
        field="expttl",
    ),
    ReservedKey(
        MAX_MESSAGE_TTL,
        Kind.INTEGER,
        "Caps the ttl of every message posted to the queue (Solace `max-ttl`): a longer ttl is cut to it. "
        "`_default_message_ttl` may not exceed it.",
        lo="min_message_ttl",
        hi="max_message_ttl",
        unit="seconds",
        default="no cap",
        ext=True,
        policy="max_message_ttl",
        field="maxttl",
    ),
    ReservedKey(
        ENCRYPT_MESSAGES,
        Kind.ENCRYPT,
        "Zaqar's encryption of messages at rest: the body of every message posted from then on is stored "
        "encrypted (AES-256-GCM with the service's key, `CHARON_ENCRYPTION__KEYS`) and read back clear by "
        "every read, the notifications and the export. Messages posted before stay as they were stored. "
        "`true` is refused (400) while the service has no key.",
        default="`false`",
        policy="encrypt_messages",
        field="enc",
    ),
    ReservedKey(
        RETRY_POLICY,
        Kind.RETRY_POLICY,
        "How a failed notification to the queue's subscribers is tried again (docs/subscriptions.md); a "
        "subscription's own `_retry_policy` option overrides it unless this one sets "
        "`ignore_subscription_override`.",
        default="Zaqar's",
    ),
)
RESERVED_KEY = {k.name: k for k in RESERVED_KEYS}
RESERVED = tuple(RESERVED_KEY)
# The stored policy: (field name, QueuePolicy value) for every key a driver acts on, in RESERVED_KEYS order
STORED: tuple[tuple[str, str], ...] = tuple(
    (k.field, k.policy) for k in RESERVED_KEYS if k.field and k.policy
)
POLICY_FIELDS: tuple[str, ...] = tuple(name for name, _ in STORED)


def stored_as(key: str) -> str:
    """The name of the policy field reserved key `key` is stored under."""
    field = RESERVED_KEY[key].field
    if field is None:
        raise ValueError(f"{key} is not stored in the policy")
    return field


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
    # _enable_encrypt_messages: bodies posted are stored sealed (core/sealing.py); None: stored clear
    encrypt_messages: bool | None = None

    def exhausted(self, claim_count: int) -> bool:
        """Whether a message claimed `claim_count` times has used up its claims: its next claim, or the end of
        the one that holds it, dead-letters it (lib.lua exhausted() is the Redis scripts' copy)."""
        return self.max_claim_count is not None and claim_count >= self.max_claim_count


def policy_fields(policy: QueuePolicy) -> dict[str, PolicyValue | None]:
    """The stored policy: each field of STORED with its value in `policy` (None: unset), in STORED order."""
    out: dict[str, PolicyValue | None] = {}
    for name, head, attr in _PATHS:
        value = getattr(policy, head)
        out[name] = getattr(value, attr) if attr and value is not None else value
    return out


def policy_from_fields(stored: Mapping[str, Any]) -> QueuePolicy:
    """The policy from its stored fields (policy_fields' inverse; a list reads as a tuple, a missing field as
    unset, a field it does not know is ignored). A part (Backoff) exists when any of its values is stored.
    Drivers read a queue's policy on every claim: comprehensions over fields paired once, below."""
    top = {head: _tuple(v) for name, head in _TOP if (v := stored.get(name)) is not None}
    for head, members in _MEMBERS:
        values = {attr: _tuple(v) for name, attr in members if (v := stored.get(name)) is not None}
        if values:
            top[head] = _PARTS[head](**values)
    return QueuePolicy(**top)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# STORED's paths split once: (field, QueuePolicy attribute, attribute of that part or "")
_PATHS = tuple((name, *path.partition(".")[::2]) for name, path in STORED)
_TOP = tuple((name, head) for name, head, attr in _PATHS if not attr)
_MEMBERS = tuple(
    (head, tuple((name, attr) for name, h, attr in _PATHS if h == head and attr))
    for head in dict.fromkeys(h for _, h, attr in _PATHS if attr)
)
_PARTS: dict[str, Callable[..., Any]] = {"backoff": Backoff}  # QueuePolicy's values made of several keys'


def parse_policy(meta: Mapping[str, Any], limits: Limits, *, queue: str) -> QueuePolicy:
    """Validate the reserved keys of `meta` (for queue `queue`) and return the policy they set.

    Each key is checked by its row (RESERVED_KEYS); a key whose QueuePolicy value is the value itself needs
    nothing more. The rules across keys, and the values built from several, are below.

    Raises:
        InvalidInput: a reserved key has the wrong type or range, or names an impossible DLQ.
    """
    _check_reserved_keys(meta)
    v = {k.name: k.check(meta.get(k.name), limits) for k in RESERVED_KEYS}
    if v[DEAD_LETTER_QUEUE] == queue:
        raise InvalidInput(f"{DEAD_LETTER_QUEUE} must name another queue, not {queue!r} itself.")
    default_ttl, max_ttl = v[DEFAULT_MESSAGE_TTL], v[MAX_MESSAGE_TTL]
    if max_ttl is not None and default_ttl is not None and default_ttl > max_ttl:
        raise InvalidInput(
            f"{DEFAULT_MESSAGE_TTL} ({default_ttl}) must not exceed {MAX_MESSAGE_TTL} ({max_ttl})."
        )
    plain = {k.policy: v[k.name] for k in RESERVED_KEYS if k.policy in _PLAIN}
    return QueuePolicy(
        **plain,
        backoff=_backoff(v, limits),
        expired_ttl=(v[DEAD_LETTER_TTL] or limits.default_message_ttl) if v[DEAD_LETTER_ON_EXPIRY] else None,
        encrypt_messages=True if v[ENCRYPT_MESSAGES] else None,
    )


def _check_reserved_keys(meta: Mapping[str, Any]) -> None:
    """Keys starting with "_" are the service's: an unknown one is a typo that would be silently ignored."""
    for key in meta:
        if key.startswith("_") and key not in RESERVED_KEY:
            close = difflib.get_close_matches(key, RESERVED, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise InvalidInput(
                f"Metadata keys starting with '_' are reserved, and {key[:80]!r} is not one of them "
                f"({', '.join(RESERVED)}).{hint}"
            )


def _backoff(v: Mapping[str, Any], limits: Limits) -> Backoff | None:
    """The redelivery backoff the keys set (`v`: their checked values); the default cap is 10 delays, at
    most the longest claim."""
    delay, levels = v[REDELIVERY_DELAY], v[REDELIVERY_LEVELS]
    if not levels and not delay:
        return None
    delay_ms = math.floor((delay or 0) * 1000)
    cap = v[MAX_REDELIVERY_DELAY]
    return Backoff(
        delay_ms=delay_ms,
        multiplier=v[REDELIVERY_MULTIPLIER] or 1.0,
        max_ms=math.floor(cap * 1000) if cap is not None else min(delay_ms * 10, limits.max_claim_ttl * 1000),
        jitter=v[REDELIVERY_JITTER] or 0.0,
        levels_ms=levels or (),
    )


# -- each kind's check: the value, or InvalidInput naming the key, the bounds and the value -----------------


def _integer(k: ReservedKey, value: Any, limits: Limits) -> int:
    lo, hi = k.bounds(limits)
    if isinstance(value, float) and value.is_integer():  # JSON Schema's integer: 5.0 is 5
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{k.name} must be an integer between {lo} and {hi}; got {value!r}.")
    if not lo <= value <= hi:
        raise InvalidInput(f"{k.name} must be between {lo} and {hi}; got {value}.")
    return value


def _seconds(k: ReservedKey, value: Any, limits: Limits) -> float:
    lo, hi = k.bounds(limits)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidInput(f"{k.name} must be a number of seconds between {lo:g} and {hi:g}; got {value!r}.")
    return float(value)


def _number(k: ReservedKey, value: Any, limits: Limits) -> float:
    lo, hi = k.bounds(limits)
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidInput(f"{k.name} must be a number between {lo:g} and {hi:g}; got {value!r}.")
    return float(value)


def _name(k: ReservedKey, value: Any, limits: Limits) -> str:
    return check_name(value, k.name)


def _boolean(k: ReservedKey, value: Any, limits: Limits) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{k.name} must be true or false; got {value!r}.")
    return value


def _delays(k: ReservedKey, value: Any, limits: Limits) -> tuple[int, ...]:
    """1 to MAX_LEVELS delays, each in ms: seconds as a number, or a string like "500ms", "5s", "1m", "2h"."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LEVELS:
        raise InvalidInput(f"{k.name} must be a list of 1 to {MAX_LEVELS} delays; got {value!r}.")
    lo, hi = k.bounds(limits)
    out = []
    for item in value:
        if isinstance(item, int | float) and not isinstance(item, bool):
            ms = float(item) * 1000
        elif isinstance(item, str) and (m := _LEVEL_RE.match(item.strip())):
            ms = float(m.group(1)) * _LEVEL_UNIT_MS[m.group(2)]
        else:
            raise InvalidInput(
                f'{k.name} lists delays like "1s", "500ms", "5m", "1h" or numbers of seconds; got {item!r}.'
            )
        if not lo * 1000 <= ms <= hi * 1000:
            raise InvalidInput(f"Each of {k.name} must be between {lo:g} and {hi:g} seconds; got {item!r}.")
        out.append(math.floor(ms))
    return tuple(out)


def _encrypt(k: ReservedKey, value: Any, limits: Limits) -> bool:
    value = _boolean(k, value, limits)
    if value:
        require_key(k.name)
    return bool(value)


def _retry_policy(k: ReservedKey, value: Any, limits: Limits) -> Any:
    return parse_retry_policy(value, k.name)  # read by the notifier, not the stores


_CHECKS: dict[Kind, Callable[[ReservedKey, Any, Limits], Any]] = {
    Kind.INTEGER: _integer,
    Kind.SECONDS: _seconds,
    Kind.NUMBER: _number,
    Kind.NAME: _name,
    Kind.BOOLEAN: _boolean,
    Kind.DELAYS: _delays,
    Kind.ENCRYPT: _encrypt,
    Kind.RETRY_POLICY: _retry_policy,
}
# QueuePolicy's values that are a key's checked value itself (the others are built by parse_policy's rules)
_PLAIN = frozenset(f.name for f in fields(QueuePolicy)) - {"backoff", "expired_ttl", "encrypt_messages"}


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
    shown = {k.name: bound(k.shown, limits) for k in RESERVED_KEYS if k.shown is not None}
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
