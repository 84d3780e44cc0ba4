"""Zaqar's websocket transport: its JSON action protocol (zaqar/api/v2, zaqar/transport/websocket), served at
`/` and `/v2/ws` on the API's own port (`ws://host:8888/`, as Zaqar's `ws://host:9000/`).

A client sends one JSON object a frame (text, or binary MessagePack as Zaqar takes it):
`{"action": "message_post", "headers": {"Client-ID": ..., "X-Project-ID": ...}, "body": {"queue_name": ...,
"messages": [...]}}`, and gets one back: `{"request": {...}, "body": ..., "headers": {"status": 201, ...}}`.

Each action is the HTTP call of the same meaning (ACTIONS), made through the app itself in process: the
same identity (a Keystone token from `authenticate`, kept for the connection; a pre-signed URL's headers),
policy rule, validation, limits, store call, access log line, request id and metrics as over HTTP, and so the
same status. Only the shapes differ where Zaqar's websocket answers differ from its HTTP ones (`message_ids`
for a post, `claim_id` on a claim's messages, a sentence for a queue created, `{"error": ...}` for an error).
Frames are answered one at a time, in order. A connection that subscribes itself (`subscription_create`
without a subscriber, as in Zaqar) is sent each notification as a frame of its own, in the format of the
frame that subscribed it (api/ws_notices.py); its own subscriptions are deleted when it closes. Pool and
flavor actions are not served over a websocket."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import msgpack
import orjson
from starlette.routing import WebSocketRoute
from starlette.types import Message, Scope
from starlette.websockets import WebSocket, WebSocketDisconnect

from api.access import IGNORED_HEADER
from api.auth import AuthMode
from api.deps import parse_json
from api.state import state_of
from api.ws_notices import SELF_MADE, SELF_SUBSCRIBER
from core.errors import CharonError
from core.limits import json_depth_exceeds
from core.models import QueueRef, SubscriptionId

log = logging.getLogger("charon.websocket")
Q = "/v2/queues/{queue_name}"
# Headers an action's `headers` may carry into its HTTP call; any other is left out (and named).
FORWARDED = (
    "Client-ID",
    "X-Project-ID",
    "X-Auth-Token",
    "X-Roles",
    "URL-Signature",
    "URL-Expires",
    "URL-Methods",
    "URL-Paths",
    "Idempotency-Key",
    "X-OpenStack-Request-ID",
)
SECRET = frozenset({"x-auth-token", "url-signature"})  # never echoed back in the answer's `request`
# Headers of the websocket's own handshake that are not the caller's: not forwarded to each call.
HANDSHAKE_ONLY = frozenset(
    {b"connection", b"upgrade", b"content-length", b"content-type", b"transfer-encoding", b"host"}
)
MAX_FRAME_SLACK = 64 * 1024
FRAME_NESTING = 4  # a frame's levels above a message's body: the frame, its body, messages, the message
MAX_HEADER = 8192  # characters of one header's value (uvicorn's own bound on a request's header line)
HEADER_TEXT = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # what HTTP lets a header's value be: no CR, LF, NUL
IGNORED = IGNORED_HEADER.decode()  # a frame may be this much larger than the largest post it carries
MAX_OWN_SUBSCRIPTIONS = 100  # subscriptions one connection may make for itself


@dataclass(frozen=True)
class Action:
    """One of Zaqar's websocket actions as an HTTP call: `path` filled from the body's fields, `query` the
    body's fields sent as query parameters, `json` those sent in the JSON body (`json_from`: one body field
    that is the JSON body, as queue_create's `metadata`), `said` Zaqar's sentence for a success without a
    body, `shape` Zaqar's body from the HTTP answer's."""

    method: str
    path: str
    query: tuple[str, ...] = ()
    json: tuple[str, ...] = ()
    json_from: str | None = None
    said: str | None = None
    shape: Callable[[Any, Mapping[str, str], Mapping[str, Any]], Any] | None = None
    required: tuple[str, ...] = field(default=())

    def fields(self) -> set[str]:
        named = {part[1:-1] for part in self.path.split("/") if part.startswith("{")}
        return named | set(self.query) | set(self.json) | ({self.json_from} if self.json_from else set())


def _claim_of(href: str) -> str | None:
    return href.split("claim_id=", 1)[1] if "claim_id=" in href else None


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as Zaqar's websocket shows it: with its `claim_id` (None when not claimed)."""
    return {**m, "claim_id": _claim_of(m.get("href", ""))}


def _messages(body: Any, _h: Mapping[str, str], _b: Mapping[str, Any]) -> Any:
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        return {**body, "messages": [_message(m) for m in body["messages"]]}
    return body


def _one_message(body: Any, _h: Mapping[str, str], _b: Mapping[str, Any]) -> Any:
    return {"messages": _message(body)}  # Zaqar's websocket: one message under `messages`


def _posted(body: Any, _h: Mapping[str, str], _b: Mapping[str, Any]) -> Any:
    return {"message_ids": [href.rsplit("/", 1)[1] for href in body["resources"]]}


def _claimed(body: Any, headers: Mapping[str, str], _b: Mapping[str, Any]) -> Any:
    if body is None:  # 204: nothing to claim
        return {"claim_id": None}
    location = headers.get("location", "")
    return {"claim_id": location.rsplit("/", 1)[1], "messages": [_message(m) for m in body["messages"]]}


def _subscribed(body: Any, _h: Mapping[str, str], sent: Mapping[str, Any]) -> Any:
    return {**body, "message": f"Subscription {sent.get('queue_name')} created."}


ACTIONS: dict[str, Action] = {
    "get_home_doc": Action("GET", "/v2"),
    "check_node_health": Action("GET", "/v2/health"),
    "ping_node": Action("GET", "/v2/ping"),
    "queue_list": Action("GET", "/v2/queues", query=("marker", "limit", "detailed")),
    "queue_create": Action("PUT", Q, json_from="metadata", said="Queue {queue_name} created."),
    "queue_delete": Action("DELETE", Q, said="Queue {queue_name} removed."),
    "queue_get": Action("GET", Q),
    "queue_get_stats": Action("GET", f"{Q}/stats"),
    "queue_purge": Action("POST", f"{Q}/purge", json=("resource_types",)),
    "message_list": Action(
        "GET",
        f"{Q}/messages",
        query=("marker", "limit", "echo", "include_claimed", "include_delayed"),
        shape=_messages,
    ),
    "message_get": Action("GET", f"{Q}/messages/{{message_id}}", shape=_one_message),
    "message_get_many": Action("GET", f"{Q}/messages", query=("message_ids",), shape=_messages),
    "message_post": Action(
        "POST", f"{Q}/messages", json=("messages",), shape=_posted, required=("messages",)
    ),
    "message_delete": Action("DELETE", f"{Q}/messages/{{message_id}}", query=("claim_id",)),
    "message_delete_many": Action(
        "DELETE", f"{Q}/messages", query=("message_ids", "claim_ids", "pop"), shape=_messages
    ),
    "claim_create": Action("POST", f"{Q}/claims", query=("limit",), json=("ttl", "grace"), shape=_claimed),
    "claim_get": Action("GET", f"{Q}/claims/{{claim_id}}", shape=_messages),
    "claim_update": Action(
        "PATCH", f"{Q}/claims/{{claim_id}}", json=("ttl", "grace"), said="Claim {claim_id} updated."
    ),
    "claim_delete": Action("DELETE", f"{Q}/claims/{{claim_id}}", said="Claim {claim_id} deleted."),
    "subscription_list": Action("GET", f"{Q}/subscriptions", query=("marker", "limit")),
    "subscription_create": Action(
        "POST", f"{Q}/subscriptions", json=("subscriber", "ttl", "options"), shape=_subscribed
    ),
    "subscription_delete": Action(
        "DELETE", f"{Q}/subscriptions/{{subscription_id}}", said="Subscription {subscription_id} removed."
    ),
    "subscription_get": Action("GET", f"{Q}/subscriptions/{{subscription_id}}"),
}
QUERY_NAMES = {"message_ids": "ids"}  # a body field sent under another name as a query parameter


class Refused(Exception):
    """A frame answered without an HTTP call: its status and Zaqar's error text."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


@dataclass
class Connection:
    """One websocket: its handshake's headers (a trusted gateway's identity among them) and the Keystone
    token `authenticate` gave. A frame is answered in its own format, JSON or MessagePack (`serve`). The
    subscriptions it made for itself (`own`: each one's queue and id, as the route made it) are sent
    notifications by `push`, in the format of the last frame that made one."""

    scope: Scope
    base: list[tuple[bytes, bytes]]
    websocket: WebSocket | None = None
    token: str | None = None
    key: str = field(default_factory=lambda: secrets.token_hex(16))
    own: dict[SubscriptionId, QueueRef] = field(default_factory=dict)
    notify_binary: bool = False
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)  # a frame is sent whole before another

    @classmethod
    def of(cls, websocket: WebSocket) -> Connection:
        base = [
            (k, v)
            for k, v in websocket.scope["headers"]
            if k not in HANDSHAKE_ONLY and not k.startswith(b"sec-websocket")
        ]
        return cls(websocket.scope, base, websocket)

    async def send(self, answer: Any, binary: bool) -> None:
        """One frame to the client, JSON text or MessagePack."""
        assert self.websocket is not None
        async with self.sending:
            if binary:
                await self.websocket.send_bytes(msgpack.packb(answer, use_bin_type=False))
            else:
                await self.websocket.send_text(orjson.dumps(answer).decode())

    async def push(self, notification: bytes) -> bool:
        """A notification of one of its own subscriptions, as a frame (Zaqar's: the webhook's body as is);
        False when the connection is gone."""
        try:
            document = orjson.loads(notification)
        except orjson.JSONDecodeError:  # a post_data that is not JSON: passed on as text
            document = notification.decode(errors="replace")
        try:
            await self.send(document, self.notify_binary)
        except (WebSocketDisconnect, RuntimeError, OSError):  # closed meanwhile
            return False
        return True

    async def close(self) -> None:
        """The connection ended: the service deletes its own subscriptions from the store, whatever became
        of the identity that made them (a token that expired meanwhile). One the store could not delete
        ends with its ttl, its notifications given up (404) meanwhile."""
        state = state_of_scope(self.scope)
        state.ws_notices.forget(self.key)
        for sid, q in self.own.items():
            try:
                await state.store.delete_subscription(q, sid)
            except Exception as exc:
                log.warning("websocket subscription %s of %s not deleted: %s", sid, q.name, exc)
        self.own.clear()

    async def answer(self, payload: Any, binary: bool = False) -> dict[str, Any]:
        """The answer to one decoded frame (sent `binary`: MessagePack)."""
        action = payload.get("action") if isinstance(payload, dict) else None
        sent_headers = payload.get("headers") if isinstance(payload, dict) else None
        body = payload.get("body", {}) if isinstance(payload, dict) else None
        echo = {"action": action, "body": body, "api": "v2", "headers": _shown(sent_headers)}
        try:
            if not isinstance(payload, dict):
                raise Refused(400, "Unexpected body type. Expected dict or dict like.")
            if not isinstance(action, str):
                raise Refused(400, "action: required, the name of one of Zaqar's websocket actions.")
            if sent_headers is None:
                sent_headers = {}
            if not isinstance(sent_headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in sent_headers.items()
            ):
                raise Refused(400, "headers: must be an object of strings (Client-ID, X-Project-ID, ...).")
            for k, v in sent_headers.items():
                if len(v) > MAX_HEADER or not HEADER_TEXT.fullmatch(v):
                    raise Refused(
                        400,
                        f"headers.{k[:40]}: at most {MAX_HEADER} characters of printable Latin-1 text, as an "
                        "HTTP header's value.",
                    )
            if body is None:
                body = {}
            if not isinstance(body, dict):
                raise Refused(400, "body: must be an object.")
            if action == "authenticate":
                return await self._authenticate(sent_headers, echo)
            status, headers, out = await self._call(action, sent_headers, body, binary)
        except Refused as refused:
            return _refused(echo, refused.status, refused.error)
        return {"request": echo, "body": out, "headers": {"status": status, **headers}}

    async def _authenticate(self, sent: dict[str, str], echo: dict[str, Any]) -> dict[str, Any]:
        """Zaqar's `authenticate`: the token is checked now (GET /v2 with it) and sent with every later
        action of the connection that sends none of its own."""
        token = sent.get("X-Auth-Token")
        if state_of_scope(self.scope).auth.mode == AuthMode.KEYSTONE:
            if not token:
                raise Refused(400, "authenticate: X-Auth-Token is required.")
            headers = _headers(self.base, {**self._forwarded(sent)[0], "X-Auth-Token": token})
            status, _, _ = await dispatch(self.scope, "GET", "/v2", b"", headers, b"")
            if status != 200:
                self.token = None
                return _refused(echo, status, "Authentication failed.")
            self.token = token
        return {"request": echo, "body": {"message": "Authentified."}, "headers": {"status": 200}}

    async def _call(
        self, name: str, sent: dict[str, str], body: dict[str, Any], binary: bool = False
    ) -> tuple[int, dict[str, str], Any]:
        action = ACTIONS.get(name)
        if action is None:
            raise Refused(
                400, f"Invalid action: {name[:40]!r} (one of {', '.join(sorted(ACTIONS))}, authenticate)."
            )
        itself = name == "subscription_create" and not body.get("subscriber")
        if itself and len(self.own) >= MAX_OWN_SUBSCRIPTIONS:
            raise Refused(
                400,
                f"A websocket connection may subscribe itself to at most {MAX_OWN_SUBSCRIPTIONS} queues; "
                "delete one of its subscriptions, or open another connection.",
            )
        missing = [f for f in (*_path_fields(action.path), *action.required) if f not in body]
        if missing:
            raise Refused(400, f"body.{missing[0]}: required for {name}.")
        path = action.path
        for f in _path_fields(action.path):
            value = body[f]
            if not isinstance(value, str) or not value or "/" in value or len(value) > 256:
                raise Refused(
                    400, f"body.{f}: must be a name or id (a string of 1 to 256 characters, no '/')."
                )
            path = path.replace(f"{{{f}}}", value)
        query = [(QUERY_NAMES.get(f, f), _query_value(f, body[f])) for f in action.query if f in body]
        if action.json_from is not None:
            document = body.get(action.json_from, {})
        else:
            document = {f: body[f] for f in action.json if f in body}
        extra: dict[str, Any] = {}
        made: list[tuple[QueueRef, SubscriptionId]] = []
        if itself:  # the subscriber is the connection's own: the route takes it from the scope alone
            notices = state_of_scope(self.scope).ws_notices
            document["subscriber"] = extra[SELF_SUBSCRIBER] = await notices.subscriber(self.key, self.push)
            extra[SELF_MADE] = made  # where the route says which subscription it is
        data = orjson.dumps(document) if action.json or action.json_from else b""
        forwarded, left_out = self._forwarded(sent)
        if self.token and "X-Auth-Token" not in forwarded:
            forwarded["X-Auth-Token"] = self.token
        ignored = sorted((set(body) - action.fields()) | set(left_out))
        if ignored and state_of_scope(self.scope).strict_parameters:
            raise Refused(
                400,
                f"{name} does not take {', '.join(i[:40] for i in ignored[:10])} (CHARON_STRICT_PARAMETERS).",
            )
        headers = _headers(self.base, forwarded, json=bool(data))
        status, answer_headers, raw = await dispatch(
            self.scope, action.method, path, urlencode(query).encode(), headers, data, extra
        )
        if itself and status == 201:
            self.notify_binary = binary  # Zaqar: the format of the last self-subscription made
        for q, sid in made:
            self.own[sid] = q
        out: dict[str, str] = {}
        for k in ("x-openstack-request-id", IGNORED, "retry-after"):
            if k in answer_headers:
                out[k] = answer_headers[k]
        if ignored:
            out[IGNORED] = ",".join(quote(i[:40], safe="") for i in ignored[:10])
        return status, out, _zaqar_body(name, action, status, answer_headers, raw, body)

    def _forwarded(self, sent: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """The action's headers its HTTP call carries, and the names of those it does not. Behind a trusted
        gateway (CHARON_AUTH=trusted-proxy) the identity is the handshake's, which the gateway vouched for: a
        frame's X-Project-ID (but with a pre-signed URL's signature, which binds it) and X-Roles are not."""
        names = {n.lower(): n for n in FORWARDED}
        kept = {names[k.lower()]: v for k, v in sent.items() if k.lower() in names}
        left_out = [k for k in sent if k.lower() not in names]
        if state_of_scope(self.scope).auth.mode == AuthMode.TRUSTED_PROXY:
            vouched = ["X-Roles", "X-Auth-Token"] + ([] if "URL-Signature" in kept else ["X-Project-ID"])
            left_out += [name for name in vouched if kept.pop(name, None) is not None]
        return kept, left_out


def _zaqar_body(
    name: str, action: Action, status: int, headers: Mapping[str, str], raw: bytes, sent: Mapping[str, Any]
) -> Any:
    """The body of an action's answer, as Zaqar's websocket gives it, from its HTTP call's answer."""
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:  # not the app's JSON (a bug's page): passed on as text
        parsed = raw.decode(errors="replace")[:2000]
    if status >= 400:
        error = parsed if isinstance(parsed, dict) else {}
        description = error.get("description", raw.decode(errors="replace")[:500])
        return {**error, "error": description, "exception": description}
    if parsed is None and action.shape is not _claimed:  # no body: Zaqar's sentence, or {}
        return action.said.format(**sent) if action.said else {}
    if action.shape is not None:
        try:
            return action.shape(parsed, headers, sent)
        except Exception:  # a bug: the call's own answer, so that its status still says what was done
            log.exception("websocket answer of %s not shaped", name)
    return parsed


def state_of_scope(scope: Scope) -> Any:
    return state_of(scope["app"])


def _path_fields(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _query_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():  # 60.0 is 60, as in the HTTP API's bodies
        value = int(value)
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise Refused(400, f"body.{name}: must be a string, a whole number, true or false, or a list of strings.")


def _headers(
    base: list[tuple[bytes, bytes]], forwarded: Mapping[str, str], *, json: bool = False
) -> list[tuple[bytes, bytes]]:
    """The HTTP call's headers: the handshake's (a gateway vouched for them, so they win), then the action's
    (`json`: with a JSON body)."""
    have = {k for k, _ in base}
    out = list(base)
    for name, value in forwarded.items():
        key = name.lower().encode("latin-1")
        if key not in have:
            out.append((key, value.encode("latin-1", errors="replace")))
    if json:
        out.append((b"content-type", b"application/json"))
    return out


def _shown(headers: Any) -> Any:
    if not isinstance(headers, dict):
        return headers
    return {k: v for k, v in headers.items() if not (isinstance(k, str) and k.lower() in SECRET)}


async def dispatch(
    ws_scope: Scope,
    method: str,
    path: str,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    extra: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP call through the app itself (its middleware, router and handlers), as uvicorn would make it
    for a request from the websocket's peer: status, headers (names lowercased) and body. `extra`: keys
    of its scope that no client can send (SELF_SUBSCRIBER)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": ws_scope.get("asgi", {"version": "3.0"}),
        "http_version": "1.1",
        "method": method,
        "scheme": "https" if ws_scope.get("scheme") == "wss" else "http",
        "path": path,
        "raw_path": quote(path).encode(),
        "root_path": ws_scope.get("root_path", ""),
        "query_string": query,
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ws_scope.get("client"),
        "server": ws_scope.get("server"),
        "state": dict(ws_scope.get("state", {})),
        **(extra or {}),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status = 500
    answer_headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            for k, v in message.get("headers", []):
                answer_headers[k.decode("latin-1").lower()] = v.decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await ws_scope["app"](scope, receive, send)
    return status, answer_headers, b"".join(chunks)


async def serve(websocket: WebSocket) -> None:
    """A websocket connection: each frame decoded, answered and sent back in the frame's format. A browser
    page's handshake (it carries `Origin`) is refused (403) unless the page is the service's own or CORS lets
    its origin in: browsers apply no CORS to websockets, so any page could otherwise drive the API."""
    state = state_of(websocket)
    origin = websocket.headers.get("origin")
    if origin is not None and not _origin_allowed(
        origin, websocket.headers.get("host", ""), state.cors_origins
    ):
        await websocket.close(code=1008)  # before the handshake's answer: uvicorn answers it 403
        return
    await websocket.accept()
    connection = Connection.of(websocket)
    limits = state.limits
    most = limits.max_messages_post_size + MAX_FRAME_SLACK
    try:
        while True:
            frame = await websocket.receive()
            if frame["type"] == "websocket.disconnect":
                return
            binary = frame.get("bytes") is not None
            raw = frame["bytes"] if binary else (frame.get("text") or "").encode()
            try:
                answer = await _answer(connection, raw, binary, most, limits.max_json_depth + FRAME_NESTING)
            except Exception:  # a bug: the frame is answered 500 (and logged), the connection goes on
                log.exception("websocket frame failed")
                answer = _refused(None, 500, "The service failed to answer this frame; it is logged.")
            await connection.send(answer, binary)
    except WebSocketDisconnect:
        return
    finally:
        await connection.close()


def _origin_allowed(origin: str, host: str, allowed: tuple[str, ...]) -> bool:
    """Whether a browser page of `origin` may open a websocket: one served by this service (the same host,
    and port when the Host header has one), or one CORS allows (CHARON_CORS__ALLOWED_ORIGIN)."""
    if "*" in allowed or origin in allowed:
        return True
    netloc = urlsplit(origin).netloc.lower()
    host = host.lower()
    return bool(netloc) and (netloc == host or (":" not in host and netloc.split(":")[0] == host))


def _refused(echo: dict[str, Any] | None, status: int, error: str) -> dict[str, Any]:
    """Zaqar's websocket error: its `exception` and `error`, both the description here."""
    echo = echo or {"action": None, "body": {}, "api": "v2", "headers": {}}
    return {"request": echo, "body": {"exception": error, "error": error}, "headers": {"status": status}}


async def _answer(connection: Connection, raw: bytes, binary: bool, most: int, depth: int) -> dict[str, Any]:
    if len(raw) > most:
        error = (
            f"A frame may be at most {most} bytes (the largest post, CHARON_LIMITS__MAX_MESSAGES_POST_SIZE, "
            f"and 64 KiB); got {len(raw)}."
        )
        return _refused(None, 413, error)
    kind = "binary (MessagePack)" if binary else "text (JSON)"
    try:
        if binary:  # MessagePack's values JSON cannot hold (bytes, NaN): refused as the HTTP API refuses them
            payload = msgpack.unpackb(raw, raw=False)
            json.dumps(payload, allow_nan=False)
        else:  # as strict as the HTTP API's bodies: no NaN, no integer beyond 64 bits, no lone surrogate
            payload = parse_json(raw, depth)
    except CharonError as exc:
        return _refused(None, 400, f"Can't decode {kind} request. {exc}")
    except Exception as exc:  # any undecodable frame is the client's: a 400 naming why
        return _refused(None, 400, f"Can't decode {kind} request. {type(exc).__name__}: {str(exc)[:200]}")
    if json_depth_exceeds(payload, depth):
        error = (
            f"The frame nests objects and arrays more than {depth} levels deep: message bodies and metadata "
            f"may nest {depth - FRAME_NESTING} (CHARON_LIMITS__MAX_JSON_DEPTH), a frame {FRAME_NESTING} more."
        )
        return _refused(None, 400, error)
    return await connection.answer(payload, binary)


ROUTES = [WebSocketRoute("/", serve), WebSocketRoute("/v2/ws", serve)]
