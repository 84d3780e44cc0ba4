"""Wire shapes: request bodies (validated) and response bodies (documented in openapi.yaml)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetPydanticSchema,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    create_model,
)
from pydantic_core import core_schema

from api.ids import ID_PATTERN, ID_SCHEMA
from core.limits import NAME_RULE, NAME_SCHEMA, is_name
from core.models import (
    PROVENANCE,
    REJECTION_DESCRIPTION,
    DeadLetterReason,
    NotDeletedReason,
    ProvenanceField,
)
from core.quotas import QUOTAS
from core.signatures import DEFAULT_MAX_BODY_BYTES, SIGNATURE_CHARS, SIGNATURE_PATTERN
from storage.registry import MONGODB_SCHEMES, REDIS_SCHEMES, unsupported_scheme


def _name(value: str) -> str:
    if not is_name(value):
        raise ValueError(f"must be {NAME_RULE}")
    return value


# A queue, pool or flavor name, fully matched (core.limits.is_name), published as NAME_SCHEMA.
Name = Annotated[str, AfterValidator(_name), WithJsonSchema(dict(NAME_SCHEMA))]


def _integral(value: float) -> int:
    if not value.is_integer():
        raise ValueError("not a whole number")
    return int(value)


# An int, or a float with no fraction (60.0 is 60); never a boolean or a string. Ints take pydantic-core's
# own path (a Python validator for every field was 8 us a post); one error, not one per branch of the union.
_WHOLE = core_schema.union_schema(
    [
        core_schema.int_schema(strict=True),
        core_schema.no_info_after_validator_function(_integral, core_schema.float_schema(strict=True)),
    ],
    custom_error_type="whole_number",
    custom_error_message="must be a whole number",
)


def whole(lo: int | None = None, hi: int | None = None) -> Any:
    """An integer as JSON Schema (and so openapi.yaml) means it, within [lo, hi]."""

    def bounded(value: int) -> int:
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(f"must be between {lo} and {hi}")
        return value

    schema: dict[str, Any] = {"type": "integer"}
    schema.update({k: v for k, v in (("minimum", lo), ("maximum", hi)) if v is not None})
    checked: core_schema.CoreSchema = _WHOLE
    if lo is not None or hi is not None:
        checked = core_schema.no_info_after_validator_function(bounded, _WHOLE)
    return Annotated[int, GetPydanticSchema(lambda _type, _handler: checked), WithJsonSchema(schema)]


if TYPE_CHECKING:  # what the fields hold, for mypy: ints
    Whole: TypeAlias = int
    Count: TypeAlias = int
    Rate: TypeAlias = int
    Weight: TypeAlias = int
else:
    Whole = whole()
    Count = whole(1, 10**9)
    Rate = whole(1, 10_000)
    Weight = whole(0, 2**32 - 1)


def _timestamp(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError("Input should be an ISO 8601 date and time with a zone, as a string")
    return value


# An ISO 8601 date-time with a zone, given as a string (never a number of seconds).
Timestamp = Annotated[
    AwareDatetime, BeforeValidator(_timestamp), WithJsonSchema({"type": "string", "format": "date-time"})
]


def json_body(model: type[BaseModel], *, required: bool = False) -> dict[str, Any]:
    """`openapi_extra` documenting a route's JSON body as `model` (bodies are read by hand: size limit
    first, then validate_body)."""
    body: dict[str, Any] = {
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    }
    if required:
        body = {"required": True, **body}
    return {"requestBody": body}


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MessageIn(_In):
    body: Any = Field(..., description="Any JSON value.")
    ttl: Whole | None = Field(None, description="Seconds the message lives; the queue default if absent.")
    delay: Whole | None = Field(None, description="Seconds before the message can be claimed.")
    dead_letter_eligible: StrictBool = Field(
        True,
        description="False: where the message would move to a DLQ (claims used up, expiry with "
        "`_dead_letter_on_expiry`, rejection) it is discarded and counted instead (Solace's DMQ-eligible).",
    )


class PostMessagesIn(_In):
    messages: list[MessageIn] = Field(..., min_length=1)


class ClaimIn(_In):
    ttl: Whole | None = Field(None, description="Seconds the claim lasts.")
    grace: Whole | None = Field(None, description="Seconds the claimed messages outlive the claim.")


class ClaimCreateIn(ClaimIn):
    limit: Whole | None = Field(
        None,
        description="Most messages to claim, as the query's `limit` (openstacksdk sends it here); when both "
        "are given the query's wins.",
    )


class RejectIn(_In):
    reason: str | None = Field(None, max_length=256, description="Why the consumer gave up on the message.")
    description: str | None = Field(None, max_length=4096, description="More detail, e.g. the error text.")


MAX_REDRIVE_IDS = 1000  # message ids a redrive may list (`charon insights` writes requests this big)
MessageIdText = Annotated[str, StringConstraints(pattern=ID_PATTERN), WithJsonSchema(dict(ID_SCHEMA))]


class RedriveFilter(_In):
    source_queue: Name | None = None
    reason: DeadLetterReason | None = None
    dead_lettered_after: Timestamp | None = Field(None, description="ISO 8601 with a zone, e.g. ...Z.")
    dead_lettered_before: Timestamp | None = None
    message_ids: list[MessageIdText] | None = Field(
        None,
        min_length=1,
        max_length=MAX_REDRIVE_IDS,
        description=f"Only these messages (at most {MAX_REDRIVE_IDS} ids; a repeated id counts once), each "
        "looked up rather than the DLQ walked: `charon insights` writes such requests for each failure "
        "signature. The other filters apply too; an id that is not a message of this DLQ, or that was "
        "dead-lettered after the redrive began, is passed over.",
    )
    signature: str | None = Field(
        None,
        pattern=SIGNATURE_PATTERN,
        description=f"Only the messages of this failure signature ({SIGNATURE_CHARS} lower-case hex digits), "
        "as `charon insights` names it at its default --max-body-bytes "
        f"({DEFAULT_MAX_BODY_BYTES:,}; a longer body is not read for its error text): every message of "
        "that cause, however many, so a fixed consumer gets exactly those again. The server computes each "
        "dead letter's signature as it walks the DLQ; the other filters apply too.",
    )


class RedriveIn(_In):
    destination: Name | None = Field(
        None, description="Where to move the messages; default: each one back to its `source_queue`."
    )
    filter: RedriveFilter | None = None
    limit: Count | None = Field(None, description="Most messages to move.")
    max_per_second: Rate | None = Field(None, description="Moves a second at most.")
    dry_run: StrictBool = Field(False, description="Count and sample what would move; move nothing.")


class PurgeIn(_In):
    resource_types: list[Literal["messages", "subscriptions"]] | None = None


class ShareIn(_In):
    paths: list[Literal["messages", "subscriptions", "claims"]] | None = Field(
        None,
        min_length=1,
        max_length=3,
        description="What of the queue the URL may reach (and the resources under it). "
        'Default: ["messages"].',
    )
    methods: list[Literal["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]] | None = Field(
        None,
        min_length=1,
        max_length=6,
        description='The HTTP methods it allows (GET allows HEAD too). Default: ["GET"].',
    )
    expires: str | None = Field(
        None,
        max_length=64,
        json_schema_extra={"format": "date-time"},
        description="When it stops working: an ISO 8601 time (UTC unless it names a zone), in the future and "
        "at most CHARON_LIMITS__MAX_SHARE_SECONDS ahead. Default: a day from now.",
    )


class ShareOut(BaseModel):
    paths: list[str] = Field(description="The signed paths, sorted.")
    methods: list[str] = Field(description="The signed methods, sorted.")
    project: str
    expires: str = Field(description="YYYY-MM-DDTHH:MM:SS, UTC.")
    signature: str = Field(description="HMAC-SHA256 of the above, hex.")


class PatchOp(_In):
    op: Literal["add", "replace", "remove"]
    path: str = Field(
        ...,
        description="/metadata/<key>: one top-level key as a JSON Pointer (/ in the key as ~1, ~ as ~0).",
        json_schema_extra={"pattern": "^/metadata/([^/~]|~[01])+$"},  # checked in routes/queues.py
    )
    value: Any = None


URI_PATTERN = "^(" + "|".join(re.escape(s) for s in REDIS_SCHEMES + MONGODB_SCHEMES) + ")://"
URI_DOC = (
    "redis://, rediss://, unix://, redis+cluster://host:port,..., "
    "redis+sentinel://host:port,.../<service>[/<db>], mongodb:// or mongodb+srv://; it answers."
)


def _storage_uri(value: str) -> str:
    if len(value) > 2048:
        raise ValueError("must be at most 2048 characters")
    if re.match(URI_PATTERN, value) is None:
        raise ValueError(unsupported_scheme(urlsplit(value).scheme))
    return value


StorageUri = Annotated[
    str,
    AfterValidator(_storage_uri),
    WithJsonSchema({"type": "string", "pattern": URI_PATTERN, "maxLength": 2048}),
]


class PoolIn(_In):
    uri: StorageUri = Field(..., description=URI_DOC)
    weight: Weight = Field(..., description="Share of new projects' queues; 0 takes no new queue.")
    flavor: Name | None = Field(None, description="The flavor this pool belongs to.")
    options: dict[str, Any] | None = Field(
        None, description="Driver options; `namespace` overrides the service's key/collection prefix."
    )


class PoolPatch(_In):
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})  # 400 when it changes nothing

    uri: StorageUri | None = Field(None, description=URI_DOC)
    weight: Weight | None = None
    flavor: Name | None = None
    options: dict[str, Any] | None = None


class FlavorIn(_In):
    pool_list: list[Name] | None = Field(None, description="Pools to put in this flavor (each must exist).")
    capabilities: dict[str, Any] | None = Field(None, description="Free-form: what the flavor offers.")


class FlavorPatch(FlavorIn):
    model_config = ConfigDict(json_schema_extra={"minProperties": 1})  # 400 when it changes nothing


SUBSCRIBER_DOC = (
    "Who is told of each message: an `http://` or `https://` URL (a webhook: each message is POSTed to it "
    "as JSON), a `trust+http://` or `trust+https://` one (Zaqar's trust notifier: with CHARON_AUTH=keystone, "
    "the service makes a Keystone trust from the caller to itself, kept in `options.trust_id`, and sends the "
    "webhook a token of it in X-Auth-Token), or a `mailto:` address (an e-mail through the service's SMTP "
    "server, subject from `?subject=`). At most CHARON_LIMITS__MAX_SUBSCRIBER_LENGTH (2,048) characters, "
    "no user:password@; a webhook on a loopback, link-local or otherwise reserved address is refused unless "
    "the operator allows its network (CHARON_NOTIFICATIONS__ALLOWED_NETWORKS)."
)
OPTIONS_DOC = (
    "Zaqar's options, kept as given (at most CHARON_LIMITS__MAX_SUBSCRIPTION_OPTIONS bytes): `post_data` "
    '(a string: the webhook\'s body, where `"$zaqar_message$"` is replaced by the notification), '
    "`post_headers` (an object of header strings), `_retry_policy` (as the queue's: overrides it unless the "
    "queue's says `ignore_subscription_override`), `subject` and `from` for mailto; `trust_id` is the "
    "service's for a trust+ subscriber (400 when another is given)."
)


class SubscriptionIn(_In):
    subscriber: str = Field(description=SUBSCRIBER_DOC)
    ttl: Whole | None = Field(
        None,
        description="Seconds the subscription lasts, 60 to CHARON_LIMITS__MAX_SUBSCRIPTION_TTL; "
        "CHARON_LIMITS__DEFAULT_SUBSCRIPTION_TTL (3600) if absent.",
    )
    options: dict[str, Any] | None = Field(None, description=OPTIONS_DOC)


class SubscriptionPatch(_In):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    subscriber: str | None = Field(None, description=f"{SUBSCRIBER_DOC} Absent or null: unchanged.")
    ttl: Whole | None = Field(None, description="A new ttl, counted from now. Absent or null: unchanged.")
    options: dict[str, Any] | None = Field(
        None, description="The new options (replace the old ones). Absent or null: unchanged."
    )


class ConfirmIn(_In):
    confirmed: StrictBool = Field(description="true: confirm; false: unsubscribe (it is told so).")


# PUT /v2/quotas/{project}: a field a quota (core/quotas.py QUOTAS), null to go back to the default
_QUOTA_FIELDS: dict[str, Any] = {
    q.name: (
        # a number (a whole one for a counted quota): not true, not "5", not 2.5 queues
        Annotated[int if q.counted else float, Field(strict=True)] | None,
        Field(None, ge=q.lo, le=q.hi, description=f"{q.description} In {q.unit}; null: the default."),
    )
    for q in QUOTAS
}
QuotaIn: type[BaseModel] = create_model("QuotaIn", __base__=_In, **_QUOTA_FIELDS)


class QuotaOut(BaseModel):
    project: str
    quotas: dict[str, float | None] = Field(
        description="What the project may do: each quota's override, else the service's default (null: no "
        "limit)."
    )
    overrides: dict[str, float] = Field(description="The project's own values, set by an admin.")
    defaults: dict[str, float | None] = Field(description="The service's defaults (CHARON_QUOTAS__*).")
    use: dict[str, int] | None = Field(
        None,
        description="GET only: what the project holds of its counted quotas, `queues`, and "
        "`message_bytes` when that quota applies; a queue's messages are in its stats "
        "(`messages_per_queue` applies to each).",
    )


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    QuotaIn,
    SubscriptionIn,
    SubscriptionPatch,
    ConfirmIn,
    PostMessagesIn,
    RejectIn,
    RedriveIn,
    ClaimIn,
    ClaimCreateIn,
    PurgeIn,
    ShareIn,
    PatchOp,
    PoolIn,
    PoolPatch,
    FlavorIn,
    FlavorPatch,
)


class Link(BaseModel):
    rel: str
    href: str


def _provenance_model(name: str, rows: list[ProvenanceField], **more: Any) -> type[BaseModel]:
    """A response model of provenance rows (core.models.PROVENANCE), as core/wire.py renders them."""
    types: dict[str, Any] = {"text": str, "reason": DeadLetterReason, "count": int, "time": str}
    fields: dict[str, Any] = {}
    for p in rows:
        kind = types[p.kind]
        if p.optional or p.rejection:
            fields[p.wire] = (kind | None, Field(None, description=p.description))
        else:
            fields[p.wire] = (kind, Field(..., description=p.description))
    return create_model(name, **fields, **more)


if TYPE_CHECKING:  # what the models hold, for mypy

    class DeadLetterOut(BaseModel): ...

else:
    RejectionOut = _provenance_model("RejectionOut", [p for p in PROVENANCE if p.rejection])
    DeadLetterOut = _provenance_model(
        "DeadLetterOut",
        [p for p in PROVENANCE if not p.rejection],
        rejection=(RejectionOut | None, Field(None, description=REJECTION_DESCRIPTION)),
        signature=(
            str | None,
            Field(
                None,
                description="The dead letter's failure signature, as `charon insights` names its cause; "
                "a redrive's `filter.signature` selects the dead letters that have it (EXT; in the API's "
                "reads, not in notifications).",
                pattern="^[0-9a-f]{16}$",
            ),
        ),
    )


class MessageOut(BaseModel):
    id: str
    href: str
    ttl: int
    age: int
    body: Any
    claim_count: int
    checksum: str | None = Field(
        None,
        description="`MD5:<hex>`, the MD5 of the body as Python's json.dumps writes it; only with "
        "CHARON_ENABLE_CHECKSUM (Zaqar's `enable_checksum`).",
        pattern="^MD5:[0-9a-f]{32}$",
    )
    dead_letter: DeadLetterOut | None = Field(
        None, description="Only on dead-lettered (and redriven) messages (EXT)."
    )
    dead_letter_eligible: bool | None = Field(None, description="Shown (false) only when posted so.")


class MessagesPage(BaseModel):
    messages: list[MessageOut]
    links: list[Link] = Field(default_factory=list, description="Absent when messages are asked by `ids`.")


class MessagesOut(BaseModel):
    messages: list[MessageOut]


class PostedOut(BaseModel):
    resources: list[str]


class ClaimOut(BaseModel):
    age: int
    ttl: int
    grace: int
    href: str
    messages: list[MessageOut]


class QueueOut(BaseModel):
    name: str
    href: str
    metadata: dict[str, Any] | None = None


class SubscriptionOut(BaseModel):
    id: str
    source: str = Field(description="The queue.")
    subscriber: str
    ttl: int
    age: int = Field(description="Seconds since it was created.")
    options: dict[str, Any]
    confirmed: bool


class SubscriptionsPage(BaseModel):
    subscriptions: list[SubscriptionOut]
    links: list[Link]


class SubscriptionCreated(BaseModel):
    subscription_id: str


class QueuesPage(BaseModel):
    queues: list[QueueOut]
    links: list[Link]


class TopicsPage(BaseModel):
    topics: list[QueueOut]
    links: list[Link]


class Stamp(BaseModel):
    href: str
    age: int
    created: str


class MessageCounts(BaseModel):
    free: int
    claimed: int
    total: int
    delayed: int
    dead_lettered: int = Field(..., description="Messages moved out of this queue to its DLQ (EXT).")
    discarded: int = Field(..., description="Exhausted messages dropped for want of a DLQ (EXT).")
    dead_letters_received: int = Field(
        ..., description="Messages other queues dead-lettered into this one, as their DLQ (EXT)."
    )
    oldest: Stamp | None = None
    newest: Stamp | None = None


class StatsOut(BaseModel):
    messages: MessageCounts


class PoolHealth(BaseModel):
    storage_reachable: bool


class HealthOut(BaseModel):
    storage_reachable: bool
    storage_writable: bool | None = Field(
        None, description="The storage takes writes (absent when unreachable)."
    )
    catalog_reachable: bool | None = Field(None, description="With pooling, for admins only.")
    pools: dict[str, PoolHealth] | None = Field(None, description="With pooling, for admins only.")


class PoolOut(BaseModel):
    name: str
    href: str
    uri: str
    weight: int
    flavor: str | None
    options: dict[str, Any] | None = Field(None, description="Shown with detailed=true.")


class PoolsPage(BaseModel):
    pools: list[PoolOut]
    links: list[Link]


class FlavorOut(BaseModel):
    name: str
    href: str
    pool_list: list[str]
    capabilities: dict[str, Any] | None = Field(None, description="In a listing, with detailed=true.")


class FlavorsPage(BaseModel):
    flavors: list[FlavorOut]
    links: list[Link]


class RejectOut(BaseModel):
    outcome: Literal["moved", "discarded"]


class RedriveProgress(BaseModel):
    scanned: int
    moved: int
    skipped: int = Field(..., description="Matched but claimed, or with nowhere to go.")


class RedriveTaskOut(BaseModel):
    id: str
    href: str
    queue: str
    status: Literal["running", "succeeded", "cancelled"]
    created: str
    updated: str
    request: dict[str, Any]
    progress: RedriveProgress


class RedriveTasksOut(BaseModel):
    tasks: list[RedriveTaskOut]


class RedrivePreviewOut(BaseModel):
    dry_run: Literal[True]
    scanned: int
    matched: int
    would_move: int
    claimed: int = Field(..., description="Matched but claimed now: a redrive would skip them.")
    by_source_queue: dict[str, int]
    by_reason: dict[str, int]
    by_signature: dict[str, int] = Field(
        ...,
        description="By failure signature, as `charon insights` names a cause and `filter.signature` selects "
        "it (EXT).",
    )
    sample: list[MessageOut]
    complete: bool = Field(..., description="False when the scan stopped at its cap before the DLQ's end.")


class ErrorOut(BaseModel):
    title: str
    description: str
    rule: str | None = Field(None, description="403 from the policy: the rule that refused the caller.")
    quota: str | None = Field(
        None,
        description="403 past a counted quota (docs/quotas.md): its name, `queues`, `messages_per_queue`, "
        "`message_bytes` or `subscriptions`.",
    )


class NotDeletedItem(BaseModel):
    id: str
    reason: NotDeletedReason = Field(
        description="not_claimed: no live claim holds it (the claim expired, or it was never claimed); "
        "claimed_by_another: a claim that was not listed holds it; dead_lettered: the claim expired and the "
        "message was moved to the DLQ meanwhile (it will be delivered again from there)."
    )


class NotDeletedOut(ErrorOut):
    """403 of a claim-safe bulk delete that left some listed messages in place (the others were deleted)."""

    not_deleted: list[NotDeletedItem]


# Documented by hand in openapi.yaml's components (a response some route answers besides its model).
REQUEST_MODELS += (RedrivePreviewOut,)
