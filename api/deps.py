"""Request dependencies: the store, the limits, and the checked Client-ID / project / queue name (the project
is the identity's that api/auth.py found: X-Project-ID itself only in noauth and trusted-proxy modes).

Every dependency is `async def` and takes at most the Request: FastAPI runs a plain `def` dependency in its
thread pool (a thread hop per dependency per request), and resolves each declared Header/Path parameter and
sub-dependency per request: a route declaring the two headers, the queue name and a claim id answered
less than half the requests a second of one reading them from the Request (bench/README.md, "What the
profile showed"). The headers and the queue name are therefore read from the
request here, and api/contract.py puts them in the OpenAPI document of every queue route. Query parameters
come from each route's query model (api/params.py), path ids from api/ids.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

import orjson
from fastapi import Depends, Request
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import ClientDisconnect

from api.auth import identity_of
from api.errors import describe_errors
from api.params import QUERY, QueryModel
from api.render import Shown
from api.state import state_of
from core.clock import Clock
from core.errors import InvalidBody, PayloadTooLarge, RequestTimeout, UnsupportedMediaType
from core.limits import Limits, check_client_id, check_project, check_queue_name, check_topic_name
from core.metadata import DeadLetterDefaults
from core.models import QueueRef, topics_of
from service.redrive import RedriveRunner
from storage.base import Store

M = TypeVar("M", bound=BaseModel)


async def get_store(request: Request) -> Store:
    return state_of(request).store


async def get_limits(request: Request) -> Limits:
    return state_of(request).limits


async def get_clock(request: Request) -> Clock:
    return state_of(request).clock


async def get_defaults(request: Request) -> DeadLetterDefaults:
    return state_of(request).defaults


async def get_redrive(request: Request) -> RedriveRunner:
    return state_of(request).redrive


PROVENANCE_DOC = (
    "Show the `dead_letter` object on dead-lettered (and redriven) messages, and `dead_letter_eligible` on "
    "messages posted with it false (EXT). Default: off, so python-zaqarclient, which refuses fields it "
    "does not know, reads every queue unchanged; CHARON_PROVENANCE=true turns it on for a deployment."
)


class ProvenanceQuery(QueryModel):
    """The query of a route that shows messages: `provenance`, and the route's own parameters (subclasses)."""

    provenance: bool | None = Field(None, description=PROVENANCE_DOC)


async def shown(request: Request, params: Annotated[ProvenanceQuery, QUERY]) -> Shown:
    state = state_of(request)
    provenance = state.provenance if params.provenance is None else params.provenance
    kind: Literal["queues", "topics"] = "topics" if in_topics(request) else "queues"
    return Shown(provenance=provenance, checksum=state.checksum, kind=kind, signature=provenance)


TOPIC_NAME = "topic_name"  # the path parameter of /v2/topics/{topic_name}/... (api/routes/topics.py)


def in_topics(request: Request) -> bool:
    """Whether the request is on Zaqar's /v2/topics, whose queues live in the project's topic space."""
    path: str = request.scope["path"]
    return path.startswith("/v2/topics")


async def project_id(request: Request) -> str:
    """The caller's project, or its topic space on /v2/topics (core.models.topics_of)."""
    project = check_project(identity_of(request).project)
    return topics_of(project) if in_topics(request) else project


async def client_id(request: Request) -> str:
    return check_client_id(identity_of(request).client)


def _queue_and_client(request: Request) -> tuple[QueueRef, str]:
    identity = identity_of(request)
    project = check_project(identity.project)
    if in_topics(request):
        q = QueueRef(project=topics_of(project), name=check_topic_name(request.path_params[TOPIC_NAME]))
    else:
        q = QueueRef(project=project, name=check_queue_name(request.path_params["queue_name"]))
    return q, check_client_id(identity.client)


async def queue_ref(request: Request) -> QueueRef:
    return _queue_and_client(request)[0]


@dataclass(frozen=True, slots=True)
class QueueCall:
    """All a message or claim route needs, from one dependency (`CallDep`): the hot routes (post, claim,
    delete, release, renew) took four or five, and FastAPI spends 10-20 us on each one every request."""

    q: QueueRef
    client: str
    store: Store
    limits: Limits
    clock: Clock
    provenance: bool  # the service's default for showing `dead_letter`; `show()` applies ?provenance=
    checksum: bool  # CHARON_ENABLE_CHECKSUM

    def show(self, provenance: bool | None) -> Shown:
        shown = self.provenance if provenance is None else provenance
        return Shown(provenance=shown, checksum=self.checksum, kind=self.q.kind, signature=shown)


def call_of(request: Request) -> QueueCall:
    """The QueueCall of a request, for the plain routes (api/routing.py), which take the Request."""
    q, client = _queue_and_client(request)
    state = state_of(request)
    return QueueCall(q, client, state.store, state.limits, state.clock, state.provenance, state.checksum)


async def queue_call(request: Request) -> QueueCall:
    return call_of(request)


def header_parameter(name: str, description: str, **schema: Any) -> dict[str, Any]:
    """The OpenAPI entry of an optional header a route reads by hand (`schema`: its constraints)."""
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": {"type": "string", **schema, "description": description},
        "description": description,
    }


StoreDep = Annotated[Store, Depends(get_store)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
ClockDep = Annotated[Clock, Depends(get_clock)]
ProjectDep = Annotated[str, Depends(project_id)]
ClientIdDep = Annotated[str, Depends(client_id)]
QueueDep = Annotated[QueueRef, Depends(queue_ref)]
ShownDep = Annotated[Shown, Depends(shown)]
CallDep = Annotated[QueueCall, Depends(queue_call)]
DefaultsDep = Annotated[DeadLetterDefaults, Depends(get_defaults)]
RedriveDep = Annotated[RedriveRunner, Depends(get_redrive)]


class JsonBody(NamedTuple):
    value: Any  # None when the body is empty
    size: int  # bytes
    containers: int  # '[' and '{' in the text: a bound on how deep it nests, so most bodies skip the walk


# A run of 19 digits (2**63 has 19; a shorter integer is always in range), found by mapping every digit to
# "0" and all else to " " and searching for the run: a tenth of the time of re.search(rb"[0-9]{19}"), which
# cost 22 us on a 10-message post (bench/README.md).
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19
INT_RANGE = (-(2**63), 2**64 - 1)  # what orjson reads as an int; beyond, it would read a float


async def read_json(request: Request, *, max_size: int, what: str) -> JsonBody:
    """The parsed JSON body (None when empty) and its size in bytes; 413 past `max_size`, 400 for text that
    is not JSON (a lone surrogate, invalid UTF-8, NaN, a number beyond a double) or holds an integer that
    could not come back exactly (outside INT_RANGE: orjson would read it as a float)."""
    _check_charset(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_size:
        raise PayloadTooLarge(f"{what} may be at most {max_size} bytes; got {declared}.")
    raw = await read_at_most(request, max_size, what)
    if not raw.strip():
        return JsonBody(None, 0, 0)
    value = parse_json(raw, state_of(request).limits.max_json_depth)
    return JsonBody(value, len(raw), raw.count(b"[") + raw.count(b"{"))


async def read_at_most(request: Request, max_size: int, what: str) -> bytes:
    """The body, read as it arrives and refused (413) once it passes `max_size`: a body without a
    Content-Length (chunked) is never taken in whole before its size is known. The rest is left unread
    (the server closes the connection after the answer)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_size:
                raise PayloadTooLarge(f"{what} may be at most {max_size} bytes; got more.")
            chunks.append(chunk)
    except ClientDisconnect:  # gone, or cut for its slowness (app/http.py): answered to nobody, logged 408
        raise RequestTimeout(
            f"{what} did not arrive whole: the client went away, or took longer than "
            "CHARON_HTTP__BODY_TIMEOUT to send it. Nothing was done."
        ) from None
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    request._body = raw  # read again by whoever asks (Starlette's Request.body() keeps it so too)
    return raw


def parse_json(raw: bytes, max_depth: int) -> Any:
    """`raw` as JSON, as strictly as every body is read (read_json; Zaqar's websocket frames,
    api/websocket.py): 400 for text that is not JSON, holds an integer outside INT_RANGE, or nests past what
    is read at all."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            raise _too_deep(max_depth) from None
        raise InvalidBody(f"Request body could not be parsed: it is not valid JSON ({exc}).") from None
    if _LONG_RUN in raw.translate(_DIGITS):
        try:
            _check_integers(raw)
        except RecursionError:  # deeper than the standard library reads: far past any depth limit
            raise _too_deep(max_depth) from None
    return value


def _check_charset(content_type: str | None) -> None:
    """415 when the Content-Type declares a charset other than UTF-8 (bodies are read as UTF-8 JSON, RFC 8259:
    `charset=iso-8859-1` would otherwise be ignored). The media type itself is not checked: Zaqar reads any
    body as JSON, and curl -d sends application/x-www-form-urlencoded."""
    if content_type is None or ";" not in content_type:
        return
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"')
        if name.strip().lower() == "charset" and charset.lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(
                f"Bodies are JSON in UTF-8; the Content-Type says charset={charset[:40]}."
            )


def _check_integers(raw: bytes) -> None:
    """400 when an integer literal of the (valid) JSON `raw` is outside INT_RANGE: read again with the
    standard library, whose parse_int sees each literal (only for bodies with a run of 19 digits)."""

    def parse_int(text: str) -> int:
        number = int(text)
        if not INT_RANGE[0] <= number <= INT_RANGE[1]:
            raise InvalidBody(
                f"The body holds the integer {text[:40]}, outside the 64-bit range -2**63 to 2**64 - 1 that "
                "is kept exactly; send it as a string."
            )
        return number

    json.loads(raw, parse_int=parse_int)


def _too_deep(limit: int) -> InvalidBody:
    return InvalidBody(
        f"The body nests objects and arrays hundreds of levels deep; message bodies and metadata may nest "
        f"at most {limit} (CHARON_LIMITS__MAX_JSON_DEPTH)."
    )


async def read_object(request: Request, *, max_size: int, what: str) -> dict[str, Any]:
    """A JSON object body; {} when the body is empty; 400 for any other JSON value (null, [], 0, false, ""
    are not "no body")."""
    body = await read_json(request, max_size=max_size, what=what)
    return {} if body.size == 0 else _json_object(body.value, what)


def _json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        kinds = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}
        kind = "an array" if isinstance(value, list) else kinds.get(type(value), "another JSON value")
        raise InvalidBody(f"{what} must be a JSON object; got {kind}.")
    return value


def validate_body(model: type[M], data: Any, what: str = "The body") -> M:
    """`data` (a JSON object) as `model`; 400 naming each field that is wrong, and how."""
    try:
        return model.model_validate(_json_object(data, what))
    except ValidationError as exc:
        raise InvalidBody(describe_errors(exc.errors())) from None
