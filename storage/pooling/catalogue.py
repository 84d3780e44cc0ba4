"""The pool catalogue: pools, flavors and where each queue lives, kept in a management store.

A pool is one storage backend (a Redis server or Cluster, a MongoDB replica set). A flavor names a group of
pools; a queue created with `_flavor` metadata is placed in one of its pools. A placement maps a queue
(project, name) to its pool for as long as the queue exists; it is made before the queue's first write and
never changes while it exists, so every API process routes a queue to the same backend.

A DLQ is placed in its source queue's pool, and remembers which queues name it (its referrers), so that a
DLQ deleted while some queue still points at it keeps its placement: a later move then lands where the
catalogue says it is. Two implementations keep the same rules atomically: RedisCatalogue (one Lua script per
change) and MongoCatalogue (conditional single-document writes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import Conflict
from core.models import QueueRef

MAX_WEIGHT = 2**32 - 1
SHOWN_QUEUES = 5  # queues named in the description of a refused pool deletion


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    uri: str
    weight: int
    flavor: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def as_doc(self) -> dict[str, Any]:
        return {"uri": self.uri, "weight": self.weight, "flavor": self.flavor, "options": self.options}

    @classmethod
    def of(cls, name: str, doc: Mapping[str, Any]) -> Pool:
        return cls(name, doc["uri"], int(doc["weight"]), doc.get("flavor"), dict(doc.get("options") or {}))


@dataclass(frozen=True, slots=True)
class Flavor:
    name: str
    capabilities: dict[str, Any] = field(default_factory=dict)


def pool_in_use(name: str, count: int, sample: list[QueueRef]) -> Conflict:
    shown = ", ".join(f"{q.project}/{q.name}" for q in sample)
    more = f" and {count - len(sample)} more" if count > len(sample) else ""
    return Conflict(
        f"Pool {name!r} still holds {count} queue(s) ({shown}{more}). Delete those queues first, or set the "
        f"pool's weight to 0 so that no new queue is placed there."
    )


class Catalogue(Protocol):
    # -- pools and flavors (admin) -------------------------------------------------------------------------

    async def put_pool(self, pool: Pool) -> bool:
        """Create or replace the pool; True when it is new."""

    async def get_pool(self, name: str) -> Pool | None: ...

    async def list_pools(self) -> list[Pool]:
        """Every pool, in name order."""

    async def delete_pool(self, name: str) -> None:
        """Remove the pool. Raises Conflict (naming some of them) while any queue is placed in it; the check
        and the removal are one step, so no queue can be placed in a pool as it disappears."""

    async def put_flavor(self, flavor: Flavor) -> bool: ...

    async def get_flavor(self, name: str) -> Flavor | None: ...

    async def list_flavors(self) -> list[Flavor]: ...

    async def delete_flavor(self, name: str) -> None: ...

    # -- placements (every API process) --------------------------------------------------------------------

    async def lookup(self, q: QueueRef) -> str | None:
        """The pool `q` is placed in, or None."""

    async def place(self, q: QueueRef, pool: str, *, referrer: str | None = None) -> str | None:
        """Place `q` in `pool` unless it is placed already; returns the pool it is placed in now, or None
        when `pool` does not exist (any more). With `referrer` (a queue of the same project whose DLQ is
        `q`), it is recorded on `q`'s placement when that is in `pool`."""

    async def referrers(self, q: QueueRef) -> dict[str, str]:
        """The queues recorded as naming `q` as their DLQ, each with a token that changes whenever its
        record is written again."""

    async def unplace(self, q: QueueRef, *, stale: Mapping[str, str]) -> bool:
        """Drop the `stale` referrers (those whose token is unchanged) and then, when none is left, `q`'s
        placement; True when the placement is gone."""

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...
