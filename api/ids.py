"""The one id parser. Message, claim, redrive-task and subscription ids are 32 lowercase hex digits
(core.limits.is_valid_id); any other text is an id of nothing, answered as a well-formed id that names
nothing is (Zaqar's ids have other forms: its Redis driver's are dashed UUIDs, and its tests send them):

- in the path: 404 with the kind's error (MessageNotFound, ClaimNotFound, NotFound for a task), and 204 for
  a DELETE (of a message, a claim, a subscription), as Zaqar answers both; the store is not asked;
- in `ids`: a listed id that is not one names no message: skipped by a bulk delete (204), and a get of
  nothing but such ids is a 404 (none of the listed messages exists);
- in `claim_id` and `claim_ids`, input to an operation on another resource: a 400 naming the parameter, as
  Zaqar answers a `claim_id` that names no claim on DELETE of a message.

Text in the path that is not an id is never echoed back: the error says it is not an id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from pydantic import GetPydanticSchema, WithJsonSchema
from pydantic_core import core_schema

from core.errors import ClaimNotFound, InvalidInput, MessageNotFound, NotFound, SubscriptionNotFound
from core.limits import is_valid_id
from core.models import ClaimId, MessageId, SubscriptionId, TaskId

ID_PATTERN = "^[0-9a-f]{32}$"
ID_SCHEMA = {"type": "string", "pattern": ID_PATTERN}


def _in_path(request: Request, name: str, unknown: Callable[[str, str], NotFound]) -> str:
    text: str = request.path_params[name]
    if not is_valid_id(text):
        raise unknown("(not an id of this service)", request.path_params.get("queue_name", ""))
    return text


def in_path_to_delete(request: Request, name: str) -> str | None:
    """The path's id `name` for a DELETE, None when it is not one: nothing to delete (204, the store not
    asked), as for an id that names nothing."""
    text: str = request.path_params[name]
    return text if is_valid_id(text) else None


def message_id(request: Request) -> MessageId:
    """The path's message id; 404 when it is not one."""
    return MessageId(_in_path(request, "message_id", _no_message))


def claim_id(request: Request) -> ClaimId:
    """The path's claim id; 404 when it is not one."""
    return ClaimId(_in_path(request, "claim_id", _no_claim))


def task_id(request: Request) -> TaskId:
    """The path's redrive task id; 404 when it is not one."""
    return TaskId(_in_path(request, "task_id", _no_task))


def subscription_id(request: Request) -> SubscriptionId:
    """The path's subscription id; 404 when it is not one."""
    return SubscriptionId(_in_path(request, "subscription_id", _no_subscription))


def _no_subscription(text: str, queue: str) -> NotFound:
    return SubscriptionNotFound(f"Subscription {text} does not exist on queue {queue}.")


def _no_message(text: str, queue: str) -> NotFound:
    return MessageNotFound(f"Message {text} does not exist in queue {queue}.")


def _no_claim(text: str, queue: str) -> NotFound:
    return ClaimNotFound(f"Claim {text} does not exist in queue {queue}.")


def _no_task(text: str, queue: str) -> NotFound:
    return NotFound(f"Queue {queue} has no redrive task {text}.")


async def _message_id(request: Request) -> MessageId:
    return message_id(request)


async def _claim_id(request: Request) -> ClaimId:
    return claim_id(request)


async def _task_id(request: Request) -> TaskId:
    return task_id(request)


async def _subscription_id(request: Request) -> SubscriptionId:
    return subscription_id(request)


# For FastAPI routes, declared after the queue (QueueDep, CallDep): a bad queue name is answered first.
MessageIdDep = Annotated[MessageId, Depends(_message_id)]
ClaimIdDep = Annotated[ClaimId, Depends(_claim_id)]
TaskIdDep = Annotated[TaskId, Depends(_task_id)]
SubscriptionIdDep = Annotated[SubscriptionId, Depends(_subscription_id)]


# A `claim_id` query parameter (in a QueryModel): 400 naming it when it is not an id. Checked by pydantic-core
# (its regex, the one openapi.yaml publishes) rather than a Python validator: half a microsecond a delete.
_CLAIM_ID_PARAM = core_schema.custom_error_schema(
    core_schema.str_schema(pattern=ID_PATTERN),
    custom_error_type="claim_id",
    custom_error_message="must be a claim id (32 lowercase hex digits)",
)
ClaimIdParam = Annotated[
    ClaimId, GetPydanticSchema(lambda _type, _handler: _CLAIM_ID_PARAM), WithJsonSchema(ID_SCHEMA)
]
# A subscription listing's `marker`: the id of the last subscription of the previous page.
_SUBSCRIPTION_ID_PARAM = core_schema.custom_error_schema(
    core_schema.str_schema(pattern=ID_PATTERN),
    custom_error_type="subscription_id",
    custom_error_message="must be a subscription id (32 lowercase hex digits)",
)
SubscriptionIdParam = Annotated[
    SubscriptionId,
    GetPydanticSchema(lambda _type, _handler: _SUBSCRIPTION_ID_PARAM),
    WithJsonSchema(ID_SCHEMA),
]


def _listed(raw: list[str], max_ids: int, name: str, kind: str) -> list[str]:
    """A query parameter listing ids: comma-separated (Zaqar's docs) or repeated (python-zaqarclient sends
    those); at most `max_ids`; else 400 naming `name`."""
    ids = [i for part in raw for i in part.split(",")]
    if len(ids) > max_ids:
        raise InvalidInput(f"{name} may list at most {max_ids} {kind} ids; got {len(ids)}.")
    return ids


def message_ids(raw: list[str], max_ids: int) -> list[MessageId]:
    """The `ids` query parameter: the listed ids that are message ids (any other names no message)."""
    return [MessageId(i) for i in _listed(raw, max_ids, "ids", "message") if is_valid_id(i)]


def claim_ids(raw: list[str], max_ids: int) -> list[ClaimId]:
    """The `claim_ids` query parameter (a bulk delete's claims, Zaqar's `message_delete_with_claim_id`)."""
    ids = _listed(raw, max_ids, "claim_ids", "claim")
    for i in ids:
        if not is_valid_id(i):
            raise InvalidInput(
                f"claim_ids lists claim ids (32 lowercase hex digits) by commas; got {i[:40]!r}."
            )
    return [ClaimId(i) for i in dict.fromkeys(ids)]
