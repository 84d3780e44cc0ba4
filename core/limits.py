"""Every configurable bound in one place (Zaqar's validation.py, as small functions).

Each check raises InvalidInput with a description that names the field, the bounds and the value given.
"""

from __future__ import annotations

import re
import uuid

from pydantic import BaseModel, Field

from core.errors import InvalidInput, InvalidQueueName

QUEUE_NAME_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
PROJECT_ID_MAX_LEN = 256
ID_RE = re.compile(r"^[0-9a-f]{32}$")


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
    max_messages_per_page: int = Field(20, description="Most items a page, a claim, a pop or `ids` takes.")
    default_messages_per_page: int = Field(10, description="Page size when `limit` is not given.")
    default_messages_per_claim: int = Field(10, description="Claim size when `limit` is not given.")
    max_messages_post_size: int = Field(262_144, description="Largest message POST body, bytes.")
    max_queue_metadata: int = Field(65_536, description="Largest queue metadata body, bytes.")


def check_range(value: int, lo: int, hi: int, what: str) -> int:
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} must be between {lo} and {hi}; got {value}.")
    return value


def check_queue_name(name: str) -> str:
    if not QUEUE_NAME_RE.match(name):
        raise InvalidQueueName(
            "Queue names may only contain ASCII letters, digits, underscores, dashes and dots, "
            f"and be 1 to 64 characters long; got {name[:80]!r}."
        )
    return name


def check_project(project: str | None) -> str:
    if project is None:
        raise InvalidInput("The X-Project-ID header is missing: every queue lives inside a project.")
    if not project.strip():
        raise InvalidInput("The X-Project-ID header must not be empty.")
    if len(project) > PROJECT_ID_MAX_LEN:
        raise InvalidInput(f"X-Project-ID must be at most {PROJECT_ID_MAX_LEN} characters long.")
    return project


def check_client_id(client_id: str | None) -> str:
    if client_id is None:
        raise InvalidInput("The Client-ID header is missing; send a UUID that identifies this client.")
    try:
        uuid.UUID(client_id)
    except ValueError:
        raise InvalidInput(f"Client-ID must be a UUID; got {client_id[:80]!r}.") from None
    return client_id


def is_valid_id(value: str) -> bool:
    """Message and claim ids are 32 lowercase hex digits; anything else cannot exist (404)."""
    return bool(ID_RE.match(value))


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


DELAY_DOC = (
    "Seconds before the released messages can be claimed again (EXT, Pulsar's reconsumeLater), 0 to the "
    "longest claim ttl; default: the queue's redelivery backoff (`_redelivery_delay`...), else at once."
)


def check_release_delay(delay: int | None, limits: Limits) -> int | None:
    return None if delay is None else check_range(delay, 0, limits.max_claim_ttl, "delay")
