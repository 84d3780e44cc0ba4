"""All configuration, from the environment (prefix CHARON_). Built in create_app()/the CLI, not at import."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.auth import AuthMode
from api.keystone import KeystoneSettings
from core.limits import Limits
from core.metadata import DeadLetterDefaults, check_template
from service.delivery import NotificationSettings
from storage.base import DEFAULT_TIMEOUT_S


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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHARON_", env_nested_delimiter="__", extra="ignore")

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
    port: int = Field(8888, description="Port `charon serve` binds.")
    workers: int = Field(
        1,
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
        "method, route template, status, duration_ms, bytes, client; README: Logs and request ids). false "
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

    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings,
        description="GET /metrics: access without the admin role, and its cost, e.g. "
        "CHARON_METRICS__MAX_QUEUES.",
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
