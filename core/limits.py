"""Every configurable bound in one place (Zaqar's validation.py, as small functions).

Each check raises InvalidInput with a description that names the field, the bounds and the value given.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from core.errors import InvalidInput, InvalidQueueName
from core.models import MessageId

# Names of queues (DLQs, redrive destinations), pools and flavors: 1 to 64 of these characters, matched in
# full (re.match with "$" would take a trailing newline), except "." and "..", which a URL path cannot hold
# (clients resolve them as dot segments). NAME_SCHEMA publishes exactly this.
NAME_PATTERN = r"^[a-zA-Z0-9_.-]{1,64}$"
NAME_SCHEMA: dict[str, object] = {"type": "string", "pattern": NAME_PATTERN, "not": {"enum": [".", ".."]}}
_NAME_RE = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
NAME_RULE = "1 to 64 ASCII letters, digits, '_', '-' or '.', and not '.' or '..'"
PROJECT_ID_MAX_LEN = 256
_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_JSON_DEPTH = 200  # the most max_json_depth may be set to: well inside the 254 levels orjson writes
MIN_TIME_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
# Largest subscription ttl: now + ttl stays below MAX_TIME_MS for the next 5,000 years.
MAX_SUBSCRIPTION_TTL = 250_000_000_000


class Limits(BaseModel):
    """Zaqar's defaults; every one can be changed with CHARON_LIMITS__<NAME>."""

    model_config = {"frozen": True}

    min_message_ttl: int = Field(60, description="Smallest message ttl, seconds.")
    max_message_ttl: int = Field(1_209_600, description="Largest message ttl, seconds (14 days).")
    default_message_ttl: int = Field(3600, description="Message ttl when a message gives none.")
    max_message_delay: int = Field(900, description="Largest message delay, seconds.")
    min_claim_ttl: int = Field(60, description="Smallest claim ttl, seconds.")
    max_claim_ttl: int = Field(43_200, description="Largest claim ttl, seconds (12 hours).")
    default_claim_ttl: int = Field(300, description="Claim ttl when a claim gives none.")
    max_claim_grace: int = Field(43_200, description="Largest claim grace, seconds.")
    default_claim_grace: int = Field(60, description="Claim grace when a claim gives none.")
    max_messages_per_page: int = Field(20, ge=1, description="Most items a page or a get by `ids` takes.")
    max_messages_per_claim: int = Field(
        20,
        ge=1,
        le=1000,
        description="Most messages a claim or a pop takes (Zaqar's max_messages_per_claim_or_pop), and the "
        "most `ids` a bulk delete takes when that is more than max_messages_per_page (so a claim can be "
        "acknowledged in one call). Larger claims cost fewer requests a message, but a consumer that dies "
        "holds more messages until the claim expires (docs/consuming.md).",
    )
    default_messages_per_page: int = Field(10, description="Page size when `limit` is not given.")
    default_messages_per_claim: int = Field(10, description="Claim size when `limit` is not given.")
    max_claim_wait: int = Field(
        20, ge=0, le=60, description="Longest `wait` of a claim (long polling, EXT), seconds; at most 60."
    )
    max_waiting_claims: int = Field(
        1000,
        ge=1,
        description="Most claims that wait at once (long polling) in one API process; beyond, 503.",
    )
    max_share_seconds: int = Field(
        2_592_000,
        ge=60,
        description="Longest a pre-signed URL may stay valid, seconds (30 days; Zaqar's default is 1 day, "
        "which is also the default here).",
    )
    min_subscription_ttl: int = Field(60, ge=1, description="Smallest subscription ttl, seconds (Zaqar's).")
    max_subscription_ttl: int = Field(
        MAX_SUBSCRIPTION_TTL,
        ge=60,
        le=MAX_SUBSCRIPTION_TTL,
        description="Largest subscription ttl, seconds: by default about 7,900 years, above Heat's "
        "`OS::Zaqar::Subscription` default (220,367,260,800, 'never expire'), and the most allowed.",
    )
    default_subscription_ttl: int = Field(3600, description="Subscription ttl when a subscription has none.")
    max_subscriptions_per_queue: int = Field(
        100,
        ge=1,
        le=1000,
        description="Most subscriptions a queue may have (each posted message makes one notification for "
        "each); at most 1,000.",
    )
    max_subscriber_length: int = Field(
        2048, ge=16, le=8192, description="Longest subscriber URI, characters (at most 8,192)."
    )
    max_subscription_options: int = Field(
        65_536, ge=1024, description="Largest subscription `options` object, bytes of JSON."
    )
    max_messages_post_size: int = Field(262_144, description="Largest message POST body, bytes.")
    max_queue_metadata: int = Field(65_536, description="Largest queue metadata body, bytes.")
    max_json_depth: int = Field(
        64,
        ge=1,
        le=MAX_JSON_DEPTH,
        description="How deep a message body, queue metadata, a pool's options or a flavor's capabilities"
        ' may nest objects and arrays (a number or string is 0 deep, `{"a": [1]}` is 2); at most 200.',
    )


def check_range(value: int, lo: int, hi: int, what: str) -> int:
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} must be between {lo} and {hi}; got {value}.")
    return value


def is_name(name: object) -> bool:
    """Whether `name` is a valid queue, pool or flavor name (NAME_RULE)."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None and name not in (".", "..")


def check_name(name: object, what: str) -> str:
    """`name` when it is a valid name, else InvalidInput naming `what` (e.g. "_dead_letter_queue")."""
    if not is_name(name):
        raise InvalidInput(f"{what} must be {NAME_RULE}; got {_shown(name)}.")
    assert isinstance(name, str)
    return name


def _shown(value: object) -> str:
    return repr(value[:80]) if isinstance(value, str) else repr(value)[:80]


def check_queue_name(name: str, kind: str = "Queue") -> str:
    if not is_name(name):
        raise InvalidQueueName(
            f"{kind} names may only contain ASCII letters, digits, underscores, dashes and dots, "
            f"be 1 to 64 characters long and not be '.' or '..'; got {name[:80]!r}."
        )
    return name


def check_topic_name(name: str) -> str:
    return check_queue_name(name, "Topic")


def check_project(project: str | None) -> str:
    if project is None:
        raise InvalidInput("The X-Project-ID header is missing: every queue lives inside a project.")
    if not project.strip():
        raise InvalidInput("The X-Project-ID header must not be empty.")
    if len(project) > PROJECT_ID_MAX_LEN:
        raise InvalidInput(f"X-Project-ID must be at most {PROJECT_ID_MAX_LEN} characters long.")
    if "," in project:
        # a proxy that appends a second X-Project-ID may fold both into one header, "theirs, ours"
        raise InvalidInput("X-Project-ID must not contain a comma: send exactly one project id.")
    return project


# A UUID as clients send it: 8-4-4-4-12 hex digits (str(uuid4())), or the 32 digits alone (uuid4().hex).
CLIENT_ID_PATTERN = (
    r"^(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})$"
)
_UUID_RE = re.compile(CLIENT_ID_PATTERN)


def check_client_id(client_id: str | None) -> str:
    if client_id is None:
        raise InvalidInput("The Client-ID header is missing; send a UUID that identifies this client.")
    if _UUID_RE.fullmatch(client_id) is None:
        raise InvalidInput(
            f"Client-ID must be a UUID (like 3381af92-2b9e-11e3-b191-71861300734c); got {client_id[:80]!r}."
        )
    return client_id


def is_valid_id(value: str) -> bool:
    """Message and claim ids are 32 lowercase hex digits; anything else cannot exist (404)."""
    return _ID_RE.fullmatch(value) is not None


MAX_MARKER = 2**53  # markers are per-queue counters; every driver (and Lua's doubles) holds these exactly
_MARKER_RE = re.compile(r"[0-9]{1,16}")


def check_marker(marker: str) -> int | MessageId:
    """A message listing's `marker`: the ASCII digits of a previous page's next link, or a message's id
    (openstacksdk pages with the last message's id): the listing goes on after that message. (A counter has
    at most 16 digits, an id 32 characters: neither is taken for the other.)"""
    if is_valid_id(marker):
        return MessageId(marker)
    if _MARKER_RE.fullmatch(marker) is None or int(marker) > MAX_MARKER:
        raise InvalidInput(
            f"marker must be the marker of a previous page's next link (digits, at most {MAX_MARKER}) or a "
            f"message id (32 lowercase hex digits); got {marker[:40]!r}."
        )
    return int(marker)


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` deep (scalars are 0 deep). Iterative, and
    it stops at the first container past the limit, so hostile input costs at most one walk."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def check_json_depth(value: Any, limits: Limits, what: str) -> None:
    if json_depth_exceeds(value, limits.max_json_depth):
        raise InvalidInput(
            f"{what} nests objects and arrays more than {limits.max_json_depth} levels deep; it may nest "
            f"at most {limits.max_json_depth} (CHARON_LIMITS__MAX_JSON_DEPTH)."
        )


def check_time_ms(ms: int, what: str) -> int:
    """A time from a client, as ms since the epoch, within what every driver and the API can write back."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise InvalidInput(f"{what} must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z (in UTC).")
    return ms


def check_message_ttl(ttl: int, limits: Limits, what: str = "ttl") -> int:
    return check_range(ttl, limits.min_message_ttl, limits.max_message_ttl, what)


def check_message_delay(delay: int, limits: Limits, what: str = "delay") -> int:
    return check_range(delay, 0, limits.max_message_delay, what)


def check_claim_ttl(ttl: int, limits: Limits) -> int:
    return check_range(ttl, limits.min_claim_ttl, limits.max_claim_ttl, "Claim ttl")


def check_claim_grace(grace: int, limits: Limits) -> int:
    return check_range(grace, 0, limits.max_claim_grace, "Claim grace")


def check_page_limit(limit: int, limits: Limits, what: str = "limit") -> int:
    return check_range(limit, 1, limits.max_messages_per_page, what)


def check_claim_limit(limit: int, limits: Limits, what: str = "limit") -> int:
    return check_range(limit, 1, limits.max_messages_per_claim, what)


def max_delete_ids(limits: Limits) -> int:
    """The most `ids` a bulk delete takes: a page, or a whole claim when claims may be larger."""
    return max(limits.max_messages_per_page, limits.max_messages_per_claim)


DELAY_DOC = (
    "Seconds before the released messages can be claimed again (EXT, Pulsar's reconsumeLater), 0 to the "
    "longest claim ttl; default: the queue's redelivery backoff (`_redelivery_delay`...), else at once."
)


def check_release_delay(delay: int | None, limits: Limits) -> int | None:
    return None if delay is None else check_range(delay, 0, limits.max_claim_ttl, "delay")
