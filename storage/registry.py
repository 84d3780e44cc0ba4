"""Opens a Store from a storage URI, by scheme, importing only the driver that is used."""

from __future__ import annotations

from urllib.parse import urlsplit

from core.clock import Clock
from core.errors import InvalidInput
from storage.base import Store

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
MONGODB_SCHEMES = ("mongodb", "mongodb+srv")


def open_store(uri: str, *, namespace: str = "charon", clock: Clock | None = None) -> Store:
    scheme = urlsplit(uri).scheme
    if scheme in REDIS_SCHEMES:
        from storage.redis.store import RedisStore

        return RedisStore.from_url(uri, namespace=namespace, clock=clock)
    if scheme in MONGODB_SCHEMES:
        from storage.mongodb.store import MongoStore

        return MongoStore.from_url(uri, namespace=namespace, clock=clock)
    raise InvalidInput(
        f"Unsupported storage URI scheme {scheme!r}; use one of {', '.join(REDIS_SCHEMES + MONGODB_SCHEMES)}."
    )
