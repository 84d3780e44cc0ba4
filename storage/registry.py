"""Opens a Store, a pool catalogue or a dead-letter export from a storage URI, by scheme, importing only the
driver that is used."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from core.clock import Clock
from core.errors import InvalidInput
from core.metadata import DeadLetterDefaults
from core.quotas import Counted
from storage.base import DEFAULT_TIMEOUT_S, Store

if TYPE_CHECKING:
    from storage.export import DeadLetterExport
    from storage.pooling.catalogue import Catalogue

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel")
MONGODB_SCHEMES = ("mongodb", "mongodb+srv")


def open_store(
    uri: str,
    *,
    namespace: str = "charon",
    clock: Clock | None = None,
    defaults: DeadLetterDefaults | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    quotas: Counted | None = None,
) -> Store:
    """The driver for `uri`; `timeout`: seconds a storage operation may take before it fails (503);
    `quotas`: the counted quotas' defaults (core/quotas.py)."""
    scheme = urlsplit(uri).scheme
    if scheme in REDIS_SCHEMES:
        from storage.redis.store import RedisStore

        return RedisStore.from_url(
            uri, namespace=namespace, clock=clock, defaults=defaults, timeout=timeout, quotas=quotas
        )
    if scheme in MONGODB_SCHEMES:
        from storage.mongodb.store import MongoStore

        return MongoStore.from_url(
            uri, namespace=namespace, clock=clock, defaults=defaults, timeout=timeout, quotas=quotas
        )
    raise InvalidInput(unsupported_scheme(scheme))


def unsupported_scheme(scheme: str) -> str:
    return (
        f"Unsupported storage URI scheme {scheme!r}; use one of {', '.join(REDIS_SCHEMES + MONGODB_SCHEMES)}."
    )


def open_catalogue(uri: str, *, namespace: str = "charon", timeout: float = DEFAULT_TIMEOUT_S) -> Catalogue:
    """The pool catalogue in the management store at `uri` (Redis, Redis Cluster or MongoDB)."""
    scheme = urlsplit(uri).scheme
    if scheme in REDIS_SCHEMES:
        from storage.pooling.redis_catalogue import RedisCatalogue

        return RedisCatalogue.from_url(uri, namespace=namespace, timeout=timeout)
    if scheme in MONGODB_SCHEMES:
        from storage.pooling.mongo_catalogue import MongoCatalogue

        return MongoCatalogue.from_url(uri, namespace=namespace, timeout=timeout)
    raise InvalidInput(unsupported_scheme(scheme))


def open_export(uri: str, *, namespace: str = "charon", pooled: bool = False) -> DeadLetterExport:
    """The dead-letter export (storage/export.py) of the store at `uri`; with `pooled`, of every pool of the
    catalogue at `uri` (a pooled deployment's management store). Opening connects to nothing yet."""
    scheme = urlsplit(uri).scheme
    if scheme not in REDIS_SCHEMES + MONGODB_SCHEMES:
        raise InvalidInput(unsupported_scheme(scheme))
    if pooled:
        from storage.pooling.export import PooledExport

        return PooledExport(uri, namespace=namespace)
    if scheme in REDIS_SCHEMES:
        from storage.redis.export import RedisExport

        return RedisExport(uri, namespace=namespace)
    from storage.mongodb.export import MongoExport

    return MongoExport(uri, namespace=namespace)
