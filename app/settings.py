"""All configuration, from the environment (prefix CHARON_). Built in create_app()/the CLI, not at import."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.limits import Limits


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHARON_", env_nested_delimiter="__", extra="ignore")

    storage_uri: str | None = Field(
        None,
        description="redis://host:port/db, rediss://... or unix:///path.sock for Redis; "
        "mongodb://host:port/db?replicaSet=rs0 or mongodb+srv://... for MongoDB (a replica set or sharded "
        "cluster; the database defaults to `charon`). Unset: an embedded redis-server is started under "
        "data_dir and stopped with the service.",
    )
    data_dir: Path = Field(Path("./data"), description="Where the embedded redis-server keeps its AOF files.")
    redis_server: str = Field("redis-server", description="The redis-server binary the embedded store runs.")
    namespace: str = Field(
        "charon",
        description="Prefix of every Redis key and MongoDB collection name (several services, one store).",
    )
    host: str = Field("127.0.0.1", description="Address `charon serve` binds.")
    port: int = Field(8888, description="Port `charon serve` binds.")
    workers: int = Field(1, description="Worker processes of `charon serve` (about one per core).")
    sweep_interval: float = Field(
        1.0,
        ge=0,
        le=60,
        description="Seconds between background sweeps, which end expired claims and move exhausted "
        "messages to their DLQ at once (0 turns the sweeper off; the queue's next use still does it).",
    )
    provenance: bool = Field(
        True,
        description="Show the `dead_letter` object on dead-lettered messages unless a request says "
        "`provenance=false`. Set false for python-zaqarclient consumers of DLQs, which reject unknown "
        "message fields; a request can still ask with `provenance=true`.",
    )
    limits: Limits = Field(
        default_factory=Limits, description="Zaqar's limits, e.g. CHARON_LIMITS__MAX_MESSAGE_TTL."
    )
