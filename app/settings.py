"""All configuration: the environment (prefix CHARON_, `__` into nested groups), over an optional TOML file
(CHARON_CONFIG_FILE, `charon --config`), over the defaults. Built in create_app()/the CLI, not at import.

Names are checked: an unknown CHARON_ variable (`unknown_variables`) or key of the file (`ConfigFile`) is
refused with the nearest real name, but not the variables Kubernetes injects for a Service named `charon`
(`service_link`), which are ignored. `sources` says where each setting's value came from (`charon config`)."""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from api.auth import AuthMode
from api.cors import ALLOW_HEADERS, ALLOW_METHODS, EXPOSE_HEADERS
from api.keystone import KeystoneSettings
from app.http import HttpSettings
from core.limits import Limits
from core.metadata import DeadLetterDefaults, check_template
from core.quotas import MAX_BYTES, MAX_COUNT, Counted
from core.sealing import Keyring
from service.delivery import NotificationSettings
from storage.base import DEFAULT_TIMEOUT_S
from storage.export import shown
from storage.registry import MONGODB_SCHEMES, REDIS_SCHEMES, unsupported_scheme


class MetricsSettings(BaseModel):
    """GET /metrics (api/routes/metrics.py, service/gauges.py): who may scrape it without the policy's
    admin role, and how much of the store a scrape reads."""

    max_queues: int = Field(
        1000,
        ge=0,
        le=100_000,
        description="Queues with series of their own in GET /metrics (labels project and queue), the first "
        'in (project, queue) order; the others are added up into one series, project="_other", '
        'queue="_other".',
    )
    max_queues_read: int = Field(
        20_000,
        ge=1,
        le=1_000_000,
        description="The most queues one GET /metrics reads from the store (on Redis about 1 s for 10,000: "
        "bench/RESULTS.md); past it, charon_metrics_queues_truncated is 1 and the rest are in no series.",
    )
    cache_seconds: float = Field(
        5.0,
        ge=0,
        le=300,
        description="Seconds a process reuses what GET /metrics read from the store; scrapes arriving "
        "meanwhile share it (and one read runs at a time).",
    )
    bearer_token: SecretStr | None = Field(
        None,
        description="A scrape that sends `Authorization: Bearer <this>` is let in without the policy rule "
        "`metrics:get` (Prometheus' `authorization: {credentials_file: ...}`); a wrong one is refused (403). "
        "Unset or empty: GET /metrics asks the rule (admin only by default), as every other route asks "
        "its own.",
    )
    allow_loopback: bool = Field(
        False,
        description="Let scrapes from a loopback address (127.0.0.0/8, ::1) in without credentials. Not "
        "behind a reverse proxy on the same host that does not set X-Forwarded-For: every request would "
        "come from loopback.",
    )

    @field_validator("bearer_token", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        """An empty token (a deployment's `${TOKEN:-}`) is no token: else an empty `Bearer` would match it."""
        return None if isinstance(value, str) and not value.strip() else value


class QuotaSettings(BaseModel):
    """Per-project quotas (core/quotas.py, docs/quotas.md): the service-wide defaults, under each project's
    overrides (PUT /v2/quotas/{project})."""

    reads_per_second: float | None = Field(
        None,
        ge=0.01,
        le=1_000_000,
        description="Requests a second each project may make that only read (GET, HEAD), over every API "
        "process; past it, 429 with Retry-After. Unset: no limit, but for projects an admin gave one.",
    )
    writes_per_second: float | None = Field(
        None,
        ge=0.01,
        le=1_000_000,
        description="Requests a second each project may make that change something (POST, PUT, PATCH, "
        "DELETE), over every API process; past it, 429 with Retry-After. Unset: no limit, but for projects "
        "an admin gave one.",
    )
    queues: int | None = Field(
        None,
        ge=0,
        le=MAX_COUNT,
        description="Queues each project may have; creating one more answers 403. Unset: no limit, but for "
        "projects an admin gave one.",
    )
    messages_per_queue: int | None = Field(
        None,
        ge=0,
        le=MAX_COUNT,
        description="Messages each queue may hold (expired ones not); a post that would pass it answers 403 "
        "and stores nothing, a dead-letter move into a full DLQ discards and counts. Unset: no limit, but "
        "for projects an admin gave one.",
    )
    message_bytes: int | None = Field(
        None,
        ge=0,
        le=MAX_BYTES,
        description="Bytes the bodies of each project's messages may take over all its queues (as stored; "
        "expired ones not); a post that would pass it answers 403 and stores nothing. Unset: no limit, but "
        "for projects an admin gave one.",
    )
    subscriptions: int | None = Field(
        None,
        ge=0,
        le=MAX_COUNT,
        description="Subscriptions each project may have over all its queues (expired ones not); one more "
        "answers 403. Unset: no limit, but for projects an admin gave one.",
    )
    burst_seconds: float = Field(
        2.0,
        ge=0.01,
        le=3600,
        description="How many seconds of its rate a project may spend at once after being idle (the token "
        "bucket's size; at least one request).",
    )
    cache_seconds: float = Field(
        10.0,
        ge=0,
        le=300,
        description="Seconds an API process keeps a project's quota overrides before reading them again: a "
        "change by PUT /v2/quotas/{project} takes effect everywhere within it (at once in the process that "
        "made it).",
    )

    def counted(self) -> Counted:
        """The counted quotas' defaults, as the drivers take them."""
        return Counted(
            queues=self.queues,
            messages_per_queue=self.messages_per_queue,
            message_bytes=self.message_bytes,
            subscriptions=self.subscriptions,
        )


class EncryptionSettings(BaseModel):
    """Encryption at rest (core/sealing.py, docs/encryption.md): the keys of `_enable_encrypt_messages`."""

    keys: SecretStr | None = Field(
        None,
        description="The AES-256 keys that encrypt the bodies of queues with `_enable_encrypt_messages`: "
        "`id:base64key` entries, comma-separated (each key 32 random bytes in base64, `openssl rand -base64 "
        "32`; an id of 1 to 32 letters, digits, `-` or `_`; at most 16). One encrypts (`current`, else the "
        "last one); each one decrypts what it encrypted: rotate in two steps (`current`), and remove a key "
        "only when no stored message uses it. Every process of the service (API, notifier, `charon insights` "
        "and its Spark executors) needs the same list. Unset: `_enable_encrypt_messages: true` is refused.",
    )
    current: str | None = Field(
        None,
        description="The id of the key that encrypts (one of `keys`). Unset: the last one listed. Rotating: "
        "first give every process the new key with the old one still encrypting here, then make the new one "
        "encrypt; so no process meets a body sealed with a key it does not have yet (docs/encryption.md).",
    )

    @field_validator("keys", mode="before")
    @classmethod
    def _parsed(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str):
            Keyring.parse(value)  # ValueError says which entry is wrong, never a key
        return value

    @model_validator(mode="after")
    def _current_is_listed(self) -> EncryptionSettings:
        if self.current is not None:
            if self.keys is None:
                raise ValueError(
                    "CHARON_ENCRYPTION__CURRENT names a key, and CHARON_ENCRYPTION__KEYS lists none"
                )
            self.keyring()  # ValueError unless it names a listed key
        return self

    def keyring(self) -> Keyring | None:
        return None if self.keys is None else Keyring.parse(self.keys.get_secret_value(), self.current or "")


def _listed(value: object) -> object:
    """A list setting as oslo.config writes one, `a,b` (or JSON, `["a", "b"]`), each item stripped."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


# `*`, or scheme://host[:port] as a browser sends it: lowercase, no path, no user, a port that exists
ORIGIN = r"^(\*|https?://(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?)$"


class CorsSettings(BaseModel):
    """Cross-origin requests from browsers (api/cors.py), as Zaqar's `[cors]` section of oslo.middleware."""

    allowed_origin: Annotated[list[Annotated[str, Field(pattern=ORIGIN, max_length=255)]], NoDecode] = Field(
        default_factory=list,
        max_length=100,
        description="Origins whose pages may call the API, `<scheme>://<host>[:<port>]` without a trailing "
        "slash, lowercase as browsers send it, comma-separated "
        "(`https://horizon.example.com,https://console.example.com`), or `*` for any page, which then may "
        "not send credentials (browsers refuse a credentialed answer to `*`, as oslo.middleware gives it). "
        "Empty (the default): CORS is off, no CORS header is sent, and a preflight is a 405 as any OPTIONS. "
        "These origins' pages may open Zaqar's websocket too; a browser page of any other origin but the "
        "service's own may not.",
    )
    allow_credentials: bool = Field(
        True,
        description="Let a page send credentials (cookies, `Authorization`) with its requests "
        "(`Access-Control-Allow-Credentials`); oslo.middleware's default.",
    )
    allow_methods: Annotated[list[Annotated[str, Field(pattern="^[A-Z]{1,10}$")]], NoDecode] = Field(
        default_factory=lambda: list(ALLOW_METHODS),
        max_length=20,
        description="Methods a page may use, comma-separated; Zaqar's list by default.",
    )
    allow_headers: Annotated[list[Annotated[str, Field(pattern="^[A-Za-z0-9-]{1,64}$")]], NoDecode] = Field(
        default_factory=lambda: list(ALLOW_HEADERS),
        max_length=100,
        description="Request headers a page may send, comma-separated: Zaqar's list (X-Auth-Token, "
        "Client-ID, X-Roles, ...) and the headers Charon reads (X-Project-ID, Idempotency-Key, "
        "Content-Type, URL-Signature, URL-Expires, URL-Methods, URL-Paths) by default.",
    )
    expose_headers: Annotated[list[Annotated[str, Field(pattern="^[A-Za-z0-9-]{1,64}$")]], NoDecode] = Field(
        default_factory=lambda: list(EXPOSE_HEADERS),
        max_length=100,
        description="Answer headers a page may read, comma-separated: Zaqar's list (X-Auth-Token, "
        "X-Subject-Token, X-Service-Token, X-OpenStack-Request-ID) and Location and "
        "Charon-Ignored-Parameters by default.",
    )
    max_age: int = Field(
        3600,
        ge=0,
        le=86_400,
        description="Seconds a browser may keep a preflight's answer (`Access-Control-Max-Age`).",
    )

    _split = field_validator(
        "allowed_origin", "allow_methods", "allow_headers", "expose_headers", mode="before"
    )(_listed)

    @property
    def on(self) -> bool:
        return bool(self.allowed_origin)


PREFIX = "CHARON_"
CONFIG_FILE_VARIABLE = "CHARON_CONFIG_FILE"
# names under CHARON_ that are not settings and never will be, left alone: the test suite's
# (tests/conftest.py), and those of the deployment files (deploy/keystone, docker-compose.yml, the image's
# build argument), which a shell that runs them may export
NOT_SETTINGS = (
    "CHARON_TEST_",
    "CHARON_FUZZ_",
    "CHARON_SERVICE_USER",
    "CHARON_SERVICE_PASSWORD",
    "CHARON_SERVICE_PROJECT",
    "CHARON_PUBLIC_URL",
    "CHARON_UID",
)
# what Kubernetes injects into a pod for each Service of its namespace (enableServiceLinks), for a Service
# named charon (or charon-...): CHARON_SERVICE_HOST, CHARON_SERVICE_PORT[_<port name>], CHARON_PORT=tcp://...,
# CHARON_PORT_8888_TCP[_PROTO|_PORT|_ADDR]
SERVICE_LINK = re.compile(
    r"CHARON(_[A-Z0-9_]+?)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)"
)
SERVICE_LINK_URL = re.compile(r"(tcp|udp|sctp)://[^/]*:[0-9]+")


def service_link(name: str, value: str | None) -> bool:
    """Whether the variable `name` is one Kubernetes made for a Service (not a setting of Charon's)."""
    name = name.upper()
    if SERVICE_LINK.fullmatch(name):
        return True
    return name.endswith("_PORT") and value is not None and SERVICE_LINK_URL.fullmatch(value) is not None


class Settings(BaseSettings):
    # hide_input_in_errors: a refused value is never repeated in an error's text (a traceback, a log line):
    # it may be a secret, e.g. an encryption key list (`charon` names the setting and what is wrong)
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """What the service reads, first wins: the arguments (tests), the environment (without Kubernetes'
        service links), the config file named by CHARON_CONFIG_FILE; no .env file, no secrets directory."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, Environment(settings_cls)]
        path = os.environ.get(CONFIG_FILE_VARIABLE)
        if path:
            sources.append(ConfigFile(settings_cls, Path(path)))
        return tuple(sources)

    log_format: Literal["json", "text"] = Field(
        "json",
        description="The format of every log line on stderr (the access lines, the service's, uvicorn's, the "
        "notifier's, the sweeper's): `json`, one object a line (time, level, logger, message, and "
        "`exception` with its traceback; the access lines have their own fields), or `text` for a terminal.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="The least severe log lines written (`charon serve --log-level` overrides it)."
    )

    storage_uri: str | None = Field(
        None,
        description="redis://host:port/db, rediss://... or unix:///path.sock for Redis; "
        "redis+cluster://host:port,host:port for a Redis Cluster; "
        "redis+sentinel://host:26379,host:26379/<service>/db for the primary Redis Sentinel names; "
        "mongodb://host:port/db?replicaSet=rs0 or mongodb+srv://... for MongoDB (a replica set or sharded "
        "cluster; the database defaults to `charon`). Unset: an embedded redis-server is started under "
        "data_dir and stopped with the service.",
    )
    storage_timeout: float = Field(
        DEFAULT_TIMEOUT_S,
        ge=0.1,
        le=120,
        description="Seconds a storage operation may take before the request answers 503 (a stalled or "
        "unreachable store); /v2/ping answers within it too. A write whose answer did not come in time may "
        "or may not have been made, and its 503 says so (a post retried with its Idempotency-Key is stored "
        "once). The sweeper and redrive steps get at least 60 s.",
    )
    idempotency_window: int = Field(
        300,
        ge=1,
        le=86_400,
        description="Seconds a message post's Idempotency-Key is remembered: a post repeated with the same "
        "key within it stores nothing and answers the first post's resources (SQS FIFO's 5 minutes by "
        "default). Each key's record (about 100 bytes and 33 a message) is kept that long.",
    )
    data_dir: Path = Field(Path("./data"), description="Where the embedded redis-server keeps its AOF files.")
    redis_server: str = Field("redis-server", description="The redis-server binary the embedded store runs.")
    namespace: str = Field(
        "charon",
        description="Prefix of every Redis key and MongoDB collection name (several services, one store).",
    )
    host: str = Field("127.0.0.1", description="Address `charon serve` binds.")
    port: int = Field(8888, ge=1, le=65535, description="Port `charon serve` binds.")
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Worker processes of `charon serve` (one per core; each listens on its own "
        "SO_REUSEPORT socket).",
    )
    shutdown_timeout: float = Field(
        20.0,
        ge=1,
        le=600,
        description="Seconds `charon serve` lets the requests in flight finish after SIGTERM (waiting claims "
        "answer at once) before it cancels them and stops. Give the container runtime more: `docker stop "
        "-t`, Kubernetes' terminationGracePeriodSeconds.",
    )
    sweep_interval: float = Field(
        0.5,
        ge=0,
        le=60,
        description="Seconds between background sweeps, which end expired claims and move exhausted (or, "
        "with `_dead_letter_on_expiry`, expired) messages to their DLQ at once (0 turns the sweeper off; "
        "the queue's next use still does it).",
    )
    provenance: bool = Field(
        False,
        description="Show the `dead_letter` object (and `dead_letter_eligible`) on messages by default. Off, "
        "so that Zaqar-shaped resources carry only Zaqar's fields and the unchanged python-zaqarclient reads "
        "DLQs (it refuses unknown fields); a request asks for them with `provenance=true` (curl, consoles). "
        "Turn on for deployments whose clients all want them.",
    )
    insights_report_url: str | None = Field(
        None,
        max_length=2048,
        description="Where your `charon insights` report is published (an `http(s)://` URL, or a path on "
        "this host such as `/reports/report.html`): the console (`/console`) links it from every DLQ. Charon "
        "does not serve the report itself. Unset: no link.",
    )
    enable_checksum: bool = Field(
        False,
        description="Show each message's `checksum` on every read (get, list, claim, a claim's messages, "
        "pop, the redrive sample), as Zaqar's `enable_checksum`: `MD5:` and the hex MD5 of the body as "
        "Python's `json.dumps` writes it, so a client can check the body it parsed. Computed at read from "
        "the stored body, so it covers messages posted before it was turned on (Zaqar's cover only those "
        "posted after). Off by default, as Zaqar.",
    )
    strict_parameters: bool = Field(
        False,
        description="Refuse (400) a query parameter the route does not take. Off, as Zaqar: such a parameter "
        "is ignored, and the answer names it in its `Charon-Ignored-Parameters` header, so that a typo "
        "(`?limt=5`) shows in `curl -i`.",
    )
    pooling: bool = Field(
        False,
        description="Spread queues over pools (storage backends registered with PUT /v2/pools/{name}). The "
        "pool catalogue lives in management_uri; storage_uri is then not used for queues.",
    )
    management_uri: str | None = Field(
        None,
        description="With pooling: the Redis or MongoDB that holds the pool catalogue (pools, flavors, where "
        "each queue lives). Unset: storage_uri, or the embedded redis-server.",
    )
    admin_mode: bool = Field(
        False,
        description="Serve the admin API (pools, flavors, detailed health) to callers with the admin role.",
    )
    admin_role: str = Field(
        "admin", description="The role the default policy's admin rules ask for (Zaqar's `role:admin`)."
    )
    roles_header: str = Field(
        "X-Roles",
        description="noauth and trusted-proxy modes: the request header that carries the caller's roles, "
        "comma-separated, as Keystone's auth middleware sets it. Ignored with CHARON_AUTH=keystone (the "
        "roles come from the token).",
    )
    auth: AuthMode = Field(
        AuthMode.NOAUTH,
        description="How callers are identified: `noauth` (development: the project is X-Project-ID and "
        "the roles X-Roles, as sent, so anyone can be anyone), `keystone` (a Keystone token in "
        "X-Auth-Token; CHARON_KEYSTONE__*), `trusted-proxy` (a gateway in front, e.g. keystonemiddleware, "
        "has authenticated the caller and sets X-Identity-Status: Confirmed, X-Project-ID, X-User-ID and "
        "the roles header; only behind one that strips what clients send).",
    )
    keystone: KeystoneSettings = Field(
        default_factory=KeystoneSettings,
        description="With auth=keystone: Keystone's URL and the service user, e.g. "
        "CHARON_KEYSTONE__AUTH_URL.",
    )
    policy_file: Path | None = Field(
        None,
        description="An oslo.policy YAML file whose rules replace the defaults of the same name (`charon "
        "policy` prints them); read when the service starts.",
    )
    signed_url_key: SecretStr | None = Field(
        None,
        description="The secret key of pre-signed URLs (POST /v2/queues/{q}/share, HMAC-SHA256 as Zaqar's "
        "signed_url.secret_key); every process of the service needs the same one. Unset: pre-signed URLs "
        "are off.",
    )

    @field_validator("storage_uri", "management_uri")
    @classmethod
    def _store_scheme(cls, value: str | None) -> str | None:
        """A URI of a store some driver opens (else the service would start, then fail opening it)."""
        if value is not None and urlsplit(value).scheme not in REDIS_SCHEMES + MONGODB_SCHEMES:
            raise ValueError(unsupported_scheme(urlsplit(value).scheme))
        return value

    @field_validator("insights_report_url", mode="before")
    @classmethod
    def _report_link(cls, value: object) -> object:
        """A link a page may hold: http(s) or a path of this host, no space or quote (else the console's link
        would be another scheme, `javascript:` among them)."""
        if isinstance(value, str) and not value.strip():
            return None
        if isinstance(value, str) and (
            not (
                value.startswith(("http://", "https://"))
                or (value.startswith("/") and not value.startswith("//"))
            )
            or any(c.isspace() or c in "\"'<>`" for c in value)
        ):
            raise ValueError(
                "insights_report_url must be an http:// or https:// URL or a path starting with a single /, "
                "without spaces or quotes"
            )
        return value

    @field_validator("policy_file")
    @classmethod
    def _policy_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"the policy file {value} does not exist")
        return value.resolve() if value is not None else None

    redrive_lease: float = Field(
        15.0,
        ge=1,
        le=600,
        description="Seconds a redrive task's runner may go without a step before another API process takes "
        "the task over (and resumes it where it stopped).",
    )
    default_max_claim_count: int | None = Field(
        None,
        ge=1,
        description="The `_max_claim_count` of every queue that sets none itself (off when unset).",
    )
    dead_letter_queue_template: str | None = Field(
        None,
        description='Name of the DLQ of every queue that sets no `_dead_letter_queue` itself, with "{queue}" '
        'for the queue\'s name, e.g. "{queue}.DLQ" (off when unset). The DLQ is made when the first message '
        "moves there; a queue whose name fits the template is such a DLQ and gets no defaults.",
    )

    @field_validator("dead_letter_queue_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return check_template(value)

    def dead_letter_defaults(self) -> DeadLetterDefaults:
        return DeadLetterDefaults(self.default_max_claim_count, self.dead_letter_queue_template)

    def store_uri(self) -> str | None:
        """The store the service opens: with pooling, the catalogue's (management_uri, else storage_uri);
        without, storage_uri. None: the embedded redis-server."""
        if self.pooling and self.management_uri:
            return self.management_uri
        return self.storage_uri

    limits: Limits = Field(
        default_factory=Limits, description="Zaqar's limits, e.g. CHARON_LIMITS__MAX_MESSAGE_TTL."
    )
    access_log: bool = Field(
        True,
        description="One JSON line a request on stderr (logger `charon.access`: time, request_id, project, "
        "method, route template, status, duration_ms, bytes, client; docs/operations.md: Logs). false "
        "turns it off; every answer still carries its X-OpenStack-Request-Id.",
    )
    tracing: bool = Field(
        False,
        description="OpenTelemetry traces, sent over OTLP/HTTP: a span for each request (its route template) "
        "with one child span for each storage call (`store.<method>`). Needs the `tracing` extra (pip "
        "install 'charon-queue[tracing]'); off, nothing is instrumented.",
    )
    tracing_endpoint: str | None = Field(
        None,
        description="With tracing: the OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces. Unset: "
        "the exporter's own default (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, "
        "else http://localhost:4318/v1/traces).",
    )

    http: HttpSettings = Field(
        default_factory=HttpSettings,
        description="What a client may take of the service, as a reverse proxy bounds its clients: e.g. "
        "CHARON_HTTP__HEADER_TIMEOUT.",
    )
    cors: CorsSettings = Field(
        default_factory=CorsSettings,
        description="Cross-origin requests from browsers, off by default: e.g. CHARON_CORS__ALLOWED_ORIGIN.",
    )
    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings,
        description="GET /metrics: access without the admin role, and its cost, e.g. "
        "CHARON_METRICS__MAX_QUEUES.",
    )

    quotas: QuotaSettings = Field(
        default_factory=QuotaSettings,
        description="Per-project request rates, service-wide: e.g. CHARON_QUOTAS__WRITES_PER_SECOND.",
    )
    encryption: EncryptionSettings = Field(
        default_factory=EncryptionSettings,
        description="Encryption of message bodies at rest: CHARON_ENCRYPTION__KEYS.",
    )

    notifications: NotificationSettings = Field(
        default_factory=NotificationSettings,
        description="How subscriptions are told (webhook, mailto): e.g. "
        "CHARON_NOTIFICATIONS__WEBHOOK_TIMEOUT.",
    )

    @model_validator(mode="after")
    def _confirmation_needs_a_key(self) -> Settings:
        if self.notifications.require_confirmation and self.signed_url_key is None:
            raise ValueError(
                "CHARON_NOTIFICATIONS__REQUIRE_CONFIRMATION needs CHARON_SIGNED_URL_KEY: a confirmation "
                "request carries a pre-signed URL"
            )
        return self


class Environment(EnvSettingsSource):
    """The CHARON_ environment, without the variables Kubernetes injects for a Service named charon
    (CHARON_PORT=tcp://10.0.0.1:8888 would otherwise be read as the port to bind)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k: v for k, v in super()._load_env_vars().items() if not service_link(k, v)}


class ConfigFile(InitSettingsSource):
    """The TOML config file: top-level keys are the settings' names (`storage_uri = "redis://..."`), tables
    their groups (`[metrics]` `max_queues = 100`). A missing, unreadable or unknown-keyed file is refused."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ValueError(f"the config file {path} cannot be read: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"the config file {path} is not TOML: {e}") from None
        unknown = unknown_keys(data)
        if unknown:
            raise ValueError(f"the config file {path}: {'; '.join(unknown)}")
        super().__init__(settings_cls, data)


@dataclass(frozen=True)
class Setting:
    """One setting as a user names it: `path` its keys (("metrics", "max_queues")), `variable` its
    environment variable (CHARON_METRICS__MAX_QUEUES), `field` its declaration."""

    path: tuple[str, ...]
    field: FieldInfo

    @property
    def variable(self) -> str:
        return PREFIX + "__".join(self.path).upper()

    @property
    def key(self) -> str:
        """Its name in the config file: `metrics.max_queues` (a key of table [metrics])."""
        return ".".join(self.path)


def group_of(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a field that is a group of settings (`metrics`, `limits`, ...), else None."""
    kind = field.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def settings(model: type[BaseModel] = Settings, path: tuple[str, ...] = ()) -> Iterator[Setting]:
    """Every setting of `model`, groups flattened into their members, in declaration order."""
    for name, field in model.model_fields.items():
        group = group_of(field)
        if group is not None:
            yield from settings(group, (*path, name))
        else:
            yield Setting((*path, name), field)


def _groups(model: type[BaseModel] = Settings, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        group = group_of(field)
        if group is not None:
            yield (*path, name)
            yield from _groups(group, (*path, name))


def _suggest(name: str, names: list[str], prefix: str = "") -> str:
    """`name` is unknown, and which of `names` is nearest, compared without their common `prefix`."""
    nearest = difflib.get_close_matches(name.removeprefix(prefix), [n.removeprefix(prefix) for n in names], 1)
    hint = f"did you mean {prefix}{nearest[0]}?" if nearest else "`charon config` lists every setting"
    return f"unknown setting {name} ({hint})"


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """What is wrong with the CHARON_ variables of `environ`: one message for each that names no setting
    (a typo would otherwise leave the setting at its default, silently), with the nearest real name."""
    known = {s.variable for s in settings()} | {PREFIX + "__".join(g).upper() for g in _groups()}
    known.add(CONFIG_FILE_VARIABLE)
    names = sorted(known)
    return [
        _suggest(name.upper(), names, PREFIX)
        for name, value in sorted(environ.items())
        if name.upper().startswith(PREFIX)
        and name.upper() not in known
        and not name.upper().startswith(NOT_SETTINGS)
        and not service_link(name, value)
    ]


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel] = Settings, path: str = "") -> list[str]:
    """What is wrong with the keys of a config file's `data`: one message for each that names no setting."""
    out = []
    names = list(model.model_fields)
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            out.append(_suggest(path + key, [path + n for n in names], path))
            continue
        group = group_of(field)
        if group is not None and isinstance(value, Mapping):
            out += unknown_keys(value, group, f"{path}{key}.")
    return out


def masked(setting: Setting, value: Any) -> str:
    """`value` as `charon config` shows it: secrets as ***, a URI's credentials (user:password@ and any
    ...password= option) as ***, nothing as (unset) or (empty)."""
    if value is None:
        return "(unset)"
    if isinstance(value, SecretStr):
        return "***" if value.get_secret_value() else "(empty)"
    text = str(value.value if hasattr(value, "value") else value)
    if text == "":
        return "(empty)"
    return shown(text) if "://" in text else text


def sources(values: Settings, environ: Mapping[str, str] | None = None) -> Iterator[tuple[Setting, str, str]]:
    """Each setting, the value `values` has (masked), and where it came from: `environment`, `file PATH`
    (CHARON_CONFIG_FILE), or `default`."""
    environ = os.environ if environ is None else environ
    present = {k.upper() for k, v in environ.items() if not service_link(k, v)}
    path = environ.get(CONFIG_FILE_VARIABLE)
    data: dict[str, Any] = {}
    if path:
        with Path(path).open("rb") as f:
            data = tomllib.load(f)
    for setting in settings():
        value: Any = values
        for key in setting.path:
            value = getattr(value, key)
        # a group may come whole, as JSON: CHARON_METRICS='{"max_queues": 5}'
        prefixes = {PREFIX + "__".join(setting.path[:i]).upper() for i in range(1, len(setting.path) + 1)}
        where = "default"
        if prefixes & present:
            where = "environment"
        else:
            node: Any = data
            for key in setting.path:
                node = node.get(key) if isinstance(node, Mapping) else None
            if node is not None:
                where = f"file {path}"
        yield setting, masked(setting, value), where


def named(path: tuple[str, ...], environ: Mapping[str, str] | None = None) -> str:
    """How a user set the setting at `path` (keys, e.g. ("limits", "max_claim_ttl")), for an error about its
    value: its variable (CHARON_LIMITS__MAX_CLAIM_TTL) when the environment sets it or no config file is
    read, else its key in the file (`limits.max_claim_ttl in /etc/charon.toml`)."""
    environ = os.environ if environ is None else environ
    variables = [PREFIX + "__".join(path[:i]).upper() for i in range(1, len(path) + 1)]
    file = environ.get(CONFIG_FILE_VARIABLE)
    if file and not any(v in {k.upper() for k in environ} for v in variables):
        return f"{'.'.join(path)} in {file}"
    return variables[-1]


def not_valid(exc: Exception) -> str:
    """What is wrong with the settings, in one line naming each setting as the user set it (`named`)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{named(tuple(str(p) for p in e['loc']))}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
    if isinstance(exc, SettingsError):  # a variable of a list or a group that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        group = PREFIX + (field[1].upper() if field else "")
        given = sorted(k.upper() for k in os.environ if k.upper().startswith(group))
        return (
            f"{', '.join(given) or group}: not JSON; a list or a group of settings is written as JSON, like "
            """CHARON_NOTIFICATIONS__ALLOWED_NETWORKS='["10.0.0.0/8"]'"""
        )
    return str(exc)
