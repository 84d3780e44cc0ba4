"""The published contract: the OpenAPI document FastAPI writes, made to say exactly what the server enforces.

FastAPI documents what routes declare (their query models and paths: api/params.py); much of what Charon
checks is read by hand (the identity headers, bodies parsed after a size limit) or depends on the configured
limits. This module is the one place that writes all of it into the document: every parameter's exact schema
(names matched in full, ids, bounds from `Limits`), the required headers, the reserved metadata keys,
every status an operation can answer, and the request id (X-OpenStack-Request-Id) every answer carries. The
served document follows the service's settings; `openapi.yaml` is the one with the defaults (a test keeps
them equal). `tests/acceptance/test_contract_fuzz.py` holds the server to it.
"""

from __future__ import annotations

import copy
from typing import Any

from api.access import WELL_FORMED
from api.auth import UNCOUNTED
from api.ids import ID_SCHEMA
from api.routes.queues import ListQuery
from core.limits import (
    CLIENT_ID_PATTERN,
    MAX_MARKER,
    NAME_RULE,
    NAME_SCHEMA,
    PROJECT_ID_MAX_LEN,
    Limits,
    max_delete_ids,
)
from core.metadata import CLAIM_KEYS, RESERVED_KEYS, ReservedKey, bound
from core.queue_filter import MAX_FILTER_VALUE, MAX_FILTERS

Schema = dict[str, Any]

PROJECT_SCHEMA: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": PROJECT_ID_MAX_LEN,
    "pattern": r"^[^,]*[^\s,][^,]*$",  # not blank, no comma (core.limits.check_project)
}
CLIENT_ID_SCHEMA: Schema = {"type": "string", "pattern": CLIENT_ID_PATTERN}
ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
STATUS_TEXT = {
    400: "Bad input: the description names the field and the limit.",
    401: "No valid credentials (CHARON_AUTH=keystone: a missing, malformed, expired or revoked "
    "X-Auth-Token; trusted-proxy: the gateway did not confirm the caller). WWW-Authenticate: Keystone "
    "uri=... says where to get a token.",
    403: "Not allowed: the operation's policy rule refused the caller (`rule` names it), a pre-signed URL "
    "that does not allow this request, a token of another project than X-Project-ID, a claim that does "
    "not hold the message, or a change past a counted quota (`quota` names it: `queues` for a new queue, "
    "`messages_per_queue` for a post, which then did nothing; docs/quotas.md).",
    404: "No such message, claim, task, pool or flavor.",
    409: "Conflict: the description says with what.",
    413: "The body is larger than the limit the description names.",
    415: "Wrong Content-Type for this body.",
    422: "An Idempotency-Key used before for other messages.",
    429: "The project used up its request rate (docs/quotas.md); nothing was done. Retry-After says in how "
    "many seconds a request may be served.",
    503: "The storage does not answer (in time). The description says whether the change may have been made.",
    507: "The storage is full and refuses writes; nothing was changed.",
}
WRITES = frozenset({"put", "post", "patch", "delete"})
REQUEST_ID = "X-OpenStack-Request-Id"
# In every operation and every answer, by reference (components/parameters, components/headers)
REQUEST_ID_PARAMETER: Schema = {
    "name": REQUEST_ID,
    "in": "header",
    "required": False,
    "schema": {"type": "string"},  # anything is taken: a malformed id is replaced, not refused
    "description": "The request's id, kept when it is `req-` and a UUID in lowercase hex (oslo.middleware's "
    "form), else replaced by a fresh one (never refused).",
}
REQUEST_ID_HEADER: Schema = {
    "required": True,
    "schema": {"type": "string", "pattern": f"^{WELL_FORMED.pattern.decode()}$"},
    "description": "The request's id: the one sent when well-formed, else a fresh `req-<uuid4>`. The "
    "service's log lines about the request carry it.",
}


def _headers(auth: str) -> list[Schema]:
    def header(name: str, schema: Schema, description: str, required: bool = True) -> Schema:
        return {
            "name": name,
            "in": "header",
            "required": required,
            "schema": schema,
            "description": description,
        }

    project = "The project (tenant) the queue lives in; sent once, no comma."
    if auth == "keystone":
        project = (
            "Optional: the project comes from the token; if sent, it must be the token's (403 otherwise)."
        )
    return [
        header("X-Project-ID", PROJECT_SCHEMA, project, required=auth != "keystone"),
        header("Client-ID", CLIENT_ID_SCHEMA, "A UUID that identifies the client (its own messages, echo)."),
    ]


SECURITY_SCHEMES: dict[str, Schema] = {
    "keystone": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Auth-Token",
        "description": "A project-scoped Keystone token (CHARON_AUTH=keystone).",
    },
    "signedUrl": {
        "type": "apiKey",
        "in": "header",
        "name": "URL-Signature",
        "description": "A pre-signed URL's signature, sent with URL-Expires, URL-Methods, URL-Paths and "
        "X-Project-ID as POST /v2/queues/{queue_name}/share answered them.",
    },
}


def _path_schema(name: str) -> Schema | None:
    if name in ("queue_name", "topic_name", "pool_name", "flavor_name"):
        return {**NAME_SCHEMA, "description": f"A name: {NAME_RULE}."}
    if name in ("message_id", "claim_id", "task_id", "subscription_id"):
        return {
            "type": "string",
            "description": "An id: 32 lowercase hex digits. Any other text names nothing, as a well-formed "
            "id that names nothing: 404, or 204 on DELETE.",
        }
    return None


def _query_schema(path: str, method: str, name: str, limits: Limits) -> Schema | None:
    page = {"type": "integer", "minimum": 1, "maximum": limits.max_messages_per_page}
    claim = {"type": "integer", "minimum": 1, "maximum": limits.max_messages_per_claim}
    most_ids = max_delete_ids(limits) if method == "delete" else limits.max_messages_per_page
    schemas: dict[str, Schema] = {
        "limit": claim if path.endswith("/claims") else page,
        "pop": claim,
        "ids": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": most_ids,
            "description": "Message ids, by commas or repeated. A listed text that is not an id (32 "
            "lowercase hex digits) names no message.",
        },
        "claim_ids": {"type": "array", "items": ID_SCHEMA, "minItems": 1, "maxItems": most_ids},
        "wait": {"type": "integer", "minimum": 0, "maximum": limits.max_claim_wait},
        "claim_id": ID_SCHEMA,
        "delay": {"type": "integer", "minimum": 0, "maximum": limits.max_claim_ttl},
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
    }
    if name == "marker":
        if path.endswith("/messages"):
            return {
                "anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_MARKER}, dict(ID_SCHEMA)],
                "description": "Where the previous page ended: its next link's marker, or the id of its last "
                "message (openstacksdk sends that): the listing goes on after that message, and ends (an "
                "empty page) when no live message of the queue has that id.",
            }
        if path.endswith("/subscriptions"):
            return dict(ID_SCHEMA)
        return dict(NAME_SCHEMA)
    if name in (
        "echo",
        "include_claimed",
        "include_delayed",
        "detailed",
        "with_count",
        "provenance",
        "acknowledge",
    ):
        return {"type": "boolean"}
    return schemas.get(name)


def _parameters(path: str, method: str, operation: Schema, limits: Limits, auth: str) -> None:
    parameters: list[Schema] = operation.setdefault("parameters", [])
    for p in parameters:
        description = p.get("description") or p.get("schema", {}).get("description")
        exact = _path_schema(p["name"]) if p["in"] == "path" else None
        if p["in"] == "query":
            exact = _query_schema(path, method, p["name"], limits)
        if exact is not None:
            p["schema"] = {**exact, **({"description": description} if description else {})}
        if p["name"] in (
            "ids",
            "claim_ids",
        ):  # the OpenAPI form of Zaqar's comma-separated ids (repeated ones work too)
            p.update(style="form", explode=False)
    if path in ("/v2/queues", "/v2/topics"):
        parameters.append(_metadata_filters())
    if path.startswith(("/v2/queues", "/v2/topics")):
        name = "queue_name" if path.startswith("/v2/queues") else "topic_name"
        if f"{{{name}}}" in path and not any(p["name"] == name for p in parameters):
            at = sum(1 for p in parameters if p["in"] == "path")
            schema = _path_schema(name)
            assert schema is not None
            entry = {"name": name, "in": "path", "required": True, "schema": schema}
            parameters.insert(at, {**entry, "description": schema["description"]})
        parameters.extend(_headers(auth))


def _metadata_filters() -> Schema:
    """Every query parameter of the queue listing besides its own is a metadata filter (Zaqar): OpenAPI says
    that with an object parameter in form style, exploded (each property its own key=value)."""
    reserved = list(ListQuery.model_fields)  # the listing's own parameters
    return {
        "name": "filters",
        "in": "query",
        "required": False,
        "style": "form",
        "explode": True,
        "schema": {
            "type": "object",
            # a value is text on the wire, whatever it spells (a number, true): only its length is bounded
            "additionalProperties": {
                "type": ["string", "number", "boolean", "null"],
                "maxLength": MAX_FILTER_VALUE,
            },
            "propertyNames": {"minLength": 1, "maxLength": MAX_FILTER_VALUE, "not": {"enum": reserved}},
            "maxProperties": MAX_FILTERS,
        },
        "description": "Metadata filters: `key=value` lists the queues whose metadata has `key` equal to "
        "`value` (a value that spells a JSON number, true, false or null matches that too).",
    }


def _responses(path: str, method: str, operation: Schema, auth: str) -> None:
    responses: dict[str, Schema] = operation.setdefault("responses", {})
    for status in [k for k in responses if not isinstance(k, str)]:
        responses[str(status)] = responses.pop(status)
    fastapi_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if fastapi_422.get("$ref", "").endswith("/HTTPValidationError"):
        del responses["422"]  # FastAPI's: Charon answers 400 for what it validates
    if path == "/v2":
        home = {"type": "object", "description": "JSON Home (RFC draft-nottingham-json-home)."}
        responses["200"] = {
            "description": "The home document",
            "content": {"application/json-home": {"schema": home}},
        }
    if path in ("/", "/v2"):
        return
    wanted = _errors(path, method, operation, auth)
    for key, response in responses.items():
        content = response.get("content", {})
        if key.startswith("2") and content.get("application/json", {}).get("schema") == {}:
            del response["content"]  # FastAPI's guess for a route that answers with no body
    for code in sorted(wanted):
        responses.setdefault(str(code), {})
    for key, response in responses.items():
        if key.isdigit() and int(key) >= 400:
            response["content"] = copy.deepcopy(ERROR)
            response["description"] = STATUS_TEXT.get(int(key), response.get("description", ""))
    if "429" in responses:
        responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}


def _errors(path: str, method: str, operation: Schema, auth: str) -> set[int]:
    """The error statuses an operation may answer."""
    wanted = {400, 503}
    if "x-policy-rule" in operation:
        wanted.add(403)  # the policy rule (an operator's policy file may refuse anything)
        if operation["x-policy-rule"] not in UNCOUNTED:
            wanted.add(429)  # the project's request rate (api/auth.py)
        if auth != "noauth":
            wanted.add(401)
    if method in WRITES and path != "/v2/ping":
        wanted.add(507)
    if "requestBody" in operation:
        wanted |= {413, 415}  # every body is read with a size limit, in UTF-8 (api/deps.py read_json)
    if (
        "_id}" in path
        or ("_name}" in path and not path.startswith(("/v2/queues", "/v2/topics")))
        or "/redrive" in path
    ):
        wanted.add(404)  # an unknown id, pool or flavor; a queue no pool holds (redrive, with pooling)
    return wanted


def _metadata_schema(limits: Limits, *, topic: bool = False) -> Schema:
    """The queue metadata body: free-form, with each reserved key's type, bounds and meaning from its row
    (core.metadata.RESERVED_KEYS), and no other key starting with "_" (core.metadata.parse_policy; rules
    across keys, such as a DLQ cycle, answer 400). A topic's: without the keys that act on claims."""
    keys = [k for k in RESERVED_KEYS if not (topic and k.name in CLAIM_KEYS)]
    properties = {
        # null is "unset" for every reserved key
        k.name: {"anyOf": [k.schema(limits), {"type": "null"}], "description": _reserved_key_text(k, limits)}
        for k in keys
    }
    return {
        "type": "object",
        "properties": properties,
        "propertyNames": {"anyOf": [{"pattern": "^(?:[^_]|$)"}, {"enum": [k.name for k in keys]}]},
        "description": "Free-form metadata (at most CHARON_LIMITS__MAX_QUEUE_METADATA bytes, nested at most "
        "CHARON_LIMITS__MAX_JSON_DEPTH deep); keys starting with `_` are the reserved ones above.",
    }


def _reserved_key_text(k: ReservedKey, limits: Limits) -> str:
    """A reserved key's meaning and default (what GET shows while it is unset, under `limits`)."""
    default = k.default if k.shown is None else str(bound(k.shown, limits))
    return f"{'(EXT) ' if k.ext else ''}{k.description} Default: {default}."


def _components(schemas: dict[str, Schema], limits: Limits) -> None:
    def bounded(model: str, field: str, lo: int, hi: int) -> None:
        prop = schemas[model]["properties"][field]
        prop["anyOf"] = [{"type": "integer", "minimum": lo, "maximum": hi}, {"type": "null"}]

    bounded("MessageIn", "ttl", limits.min_message_ttl, limits.max_message_ttl)
    bounded("MessageIn", "delay", 0, limits.max_message_delay)
    bounded("ClaimIn", "ttl", limits.min_claim_ttl, limits.max_claim_ttl)
    bounded("ClaimIn", "grace", 0, limits.max_claim_grace)
    bounded("ClaimCreateIn", "ttl", limits.min_claim_ttl, limits.max_claim_ttl)
    bounded("ClaimCreateIn", "grace", 0, limits.max_claim_grace)
    bounded("ClaimCreateIn", "limit", 1, limits.max_messages_per_claim)
    for model in ("SubscriptionIn", "SubscriptionPatch"):
        bounded(model, "ttl", limits.min_subscription_ttl, limits.max_subscription_ttl)
        subscriber = schemas[model]["properties"]["subscriber"]
        text = {"type": "string", "minLength": 1, "maxLength": limits.max_subscriber_length}
        subscriber.update({"anyOf": [text, {"type": "null"}]} if "anyOf" in subscriber else text)
    schemas["QueueMetadata"] = _metadata_schema(limits)
    schemas["TopicMetadata"] = _metadata_schema(limits, topic=True)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)


MESSAGE = "/v2/queues/{queue_name}/messages/{message_id}"
TASK = "/v2/queues/{queue_name}/redrive/{task_id}"
# OpenAPI links: where an answer names a resource another operation takes (clients and stateful fuzzing
# follow them; Location headers say the rest). (from path, method, status) -> [(name, path, method, id)]
LINKS: dict[tuple[str, str, str], list[tuple[str, str, str, str]]] = {
    ("/v2/queues/{queue_name}/claims", "post", "201"): [
        ("GetClaimedMessage", MESSAGE, "get", "$response.body#/messages/0/id"),
        ("DeleteClaimedMessage", MESSAGE, "delete", "$response.body#/messages/0/id"),
        ("ReleaseClaimedMessage", f"{MESSAGE}/release", "post", "$response.body#/messages/0/id"),
        ("RejectClaimedMessage", f"{MESSAGE}/dead_letter", "post", "$response.body#/messages/0/id"),
    ],
    ("/v2/queues/{queue_name}/messages", "get", "200"): [
        ("GetListedMessage", MESSAGE, "get", "$response.body#/messages/0/id"),
        ("DeleteListedMessage", MESSAGE, "delete", "$response.body#/messages/0/id"),
    ],
    ("/v2/queues/{queue_name}/redrive", "post", "202"): [
        ("GetRedriveTask", TASK, "get", "$response.body#/id"),
        ("CancelRedriveTask", TASK, "delete", "$response.body#/id"),
    ],
}


def _links(paths: dict[str, Schema]) -> None:
    for (path, method, status), links in LINKS.items():
        response = paths[path][method]["responses"][status]
        for name, target, target_method, value in links:
            key = "task_id" if "{task_id}" in target else "message_id"
            response.setdefault("links", {})[name] = {
                "operationId": paths[target][target_method]["operationId"],
                "parameters": {"queue_name": "$request.path.queue_name", key: value},
            }


# The order of an operation's keys in openapi.yaml, whatever put them there (FastAPI, a route's openapi_extra)
OPERATION_KEYS = ("tags", "summary", "description", "operationId", "parameters", "requestBody", "responses")


IGNORED = "Charon-Ignored-Parameters"
IGNORED_PARAMETERS_HEADER: Schema = {
    "required": False,
    "schema": {"type": "string"},
    "description": "The query parameters the operation does not take, which it ignored (as Zaqar), each "
    "percent-encoded and cut to 40 characters, at most 10 and then `and N more`. With "
    "CHARON_STRICT_PARAMETERS=true such a parameter is a 400 instead.",
}


def _request_id(operation: Schema) -> None:
    """Every operation takes X-OpenStack-Request-Id, and every answer carries it (api/access.py), and names
    the query parameters it ignored when there were any."""
    operation.setdefault("parameters", []).append({"$ref": "#/components/parameters/RequestId"})
    for response in operation["responses"].values():
        headers = response.setdefault("headers", {})
        headers[REQUEST_ID] = {"$ref": "#/components/headers/RequestId"}
        headers[IGNORED] = {"$ref": "#/components/headers/IgnoredParameters"}


def refine(schema: Schema, limits: Limits, auth: str = "noauth") -> None:
    """Make FastAPI's `schema` the exact contract of a service with these `limits` and authentication mode
    (CHARON_AUTH; in place)."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _parameters(path, method, operation, limits, auth)
            _responses(path, method, operation, auth)
            _request_id(operation)
            if auth != "noauth" and "x-policy-rule" in operation:
                schemes = ["keystone", "signedUrl"] if auth == "keystone" else ["signedUrl"]
                operation["security"] = [{name: []} for name in schemes]
            first = [k for k in OPERATION_KEYS if k in operation]
            operations[method] = {k: operation[k] for k in first + [k for k in operation if k not in first]}
    _links(schema.get("paths", {}))
    _components(schema.setdefault("components", {}).setdefault("schemas", {}), limits)
    kept = SECURITY_SCHEMES if auth == "keystone" else {"signedUrl": SECURITY_SCHEMES["signedUrl"]}
    schema["components"]["securitySchemes"] = kept
    schema["components"]["parameters"] = {"RequestId": REQUEST_ID_PARAMETER}
    schema["components"]["headers"] = {
        "RequestId": REQUEST_ID_HEADER,
        "IgnoredParameters": IGNORED_PARAMETERS_HEADER,
    }
