"""PyMongo's connection failures and timeouts as the domain's StorageUnavailable (503)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pymongo.errors import ConnectionFailure, PyMongoError

from core.errors import StorageUnavailable


@asynccontextmanager
async def unavailable_as_domain_error() -> AsyncIterator[None]:
    try:
        yield
    except ConnectionFailure as exc:
        raise StorageUnavailable(f"MongoDB is not reachable ({exc}).") from None
    except PyMongoError as exc:
        if not exc.timeout:
            raise
        raise StorageUnavailable(f"MongoDB did not answer in time ({exc}); try again.") from None
