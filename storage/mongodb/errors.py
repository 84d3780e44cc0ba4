"""PyMongo's connection failures and timeouts as the domain's StorageUnavailable (503)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from core.errors import OutcomeUnknown, StorageFull, StorageUnavailable

# Server errors that mean "no room to write": out of disk (14031), Atlas' space quota (8000, "over your space
# quota"), a capped storage size (12501 "quota exceeded").
FULL_CODES = frozenset({14031, 8000, 12501})


@asynccontextmanager
async def unavailable_as_domain_error(*, write: bool = False) -> AsyncIterator[None]:
    """PyMongo's failures as domain errors. An operation that writes may have got part of the way (several
    commands, or one whose answer never came): OutcomeUnknown; one that only reads: StorageUnavailable."""
    failed: type[StorageUnavailable] = OutcomeUnknown if write else StorageUnavailable
    try:
        yield
    except ConnectionFailure as exc:
        raise failed(f"MongoDB is not reachable ({_short(exc)}).") from None
    except OperationFailure as exc:
        if exc.code in FULL_CODES:
            raise StorageFull(f"MongoDB refuses writes ({_short(exc)}).") from None
        if not exc.timeout:
            raise
        raise failed(f"MongoDB did not answer in time ({_short(exc)}).") from None
    except PyMongoError as exc:
        if not exc.timeout:
            raise
        raise failed(f"MongoDB did not answer in time ({_short(exc)}).") from None


log = logging.getLogger("charon.mongodb")


async def after_commit(step: Awaitable[object], what: str) -> None:
    """Bookkeeping after an operation's writes are done (a counter, a claim record no longer needed): its
    failure must not turn a done operation into an error. Each such step is repaired later by design (a
    counter is healed by the next writer, a stale claim record by its TTL index)."""
    try:
        await step
    except PyMongoError as exc:
        log.debug("%s skipped after the operation was done (%s)", what, _short(exc))


def _short(exc: Exception) -> str:
    return str(exc).split(", Timeout:")[0][:300]
