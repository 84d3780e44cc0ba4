"""MongoDB driver internals: the hot queries use their index (explain), and a server that cannot run
transactions is refused with a clear error."""

from __future__ import annotations

from typing import Any

import pytest

from core.clock import ManualClock
from core.errors import StorageUnavailable
from core.models import ClaimId
from storage.mongodb.queries import claim_candidates, held_by, lapsed, listing
from storage.mongodb.schema import CLAIM_INDEX, CLAIMABLE_INDEX, LAPSED_INDEX, MARKER_INDEX
from storage.mongodb.store import MongoStore
from tests.contract.helpers import CLIENT, Q, post
from tests.servers import MongoServer


def plan_stages(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(stage, index name) of every stage of an explain() winning plan, classic or slot-based engine."""
    out = [(plan.get("stage", ""), plan.get("indexName"))]
    for key in ("inputStage", "queryPlan"):
        if isinstance(plan.get(key), dict):
            out += plan_stages(plan[key])
    for child in plan.get("inputStages", []):
        out += plan_stages(child)
    return out


async def stages(cursor: Any) -> list[tuple[str, str | None]]:
    explained = await cursor.explain()
    return plan_stages(explained["queryPlanner"]["winningPlan"])


@pytest.fixture
async def busy(mongo_store: MongoStore, clock: ManualClock) -> MongoStore:
    """A queue with claimed, free and delayed messages, and a claim that has lapsed."""
    await post(mongo_store, Q, *range(30))
    await post(mongo_store, Q, "later", delay=60)
    await mongo_store.claim(Q, ttl=30, grace=0, limit=5)
    clock.advance(31)
    await mongo_store.claim(Q, ttl=60, grace=0, limit=5)
    return mongo_store


@pytest.mark.parametrize(
    ("query", "index"),
    [
        pytest.param(lambda c, now: claim_candidates(c, Q, now, 10), CLAIMABLE_INDEX, id="claim"),
        pytest.param(
            lambda c, now: listing(
                c,
                Q,
                now=now,
                marker=3,
                limit=10,
                echo=False,
                client_id=CLIENT,
                include_claimed=False,
                include_delayed=False,
            ),
            MARKER_INDEX,
            id="list",
        ),
        pytest.param(lambda c, now: held_by(c, Q, ClaimId("0" * 32), now), CLAIM_INDEX, id="claim-held"),
        pytest.param(lambda c, now: lapsed(c, now, limit=100), LAPSED_INDEX, id="sweep-lapsed"),
    ],
)
async def test_hot_queries_use_their_index(
    busy: MongoStore, clock: ManualClock, query: Any, index: str
) -> None:
    plan = await stages(query(busy.collections, clock.now_ms()))
    assert ("IXSCAN", index) in plan, plan
    assert all(stage != "COLLSCAN" for stage, _ in plan), plan


async def test_a_standalone_server_is_refused_with_what_to_do() -> None:
    server = MongoServer(standalone=True).start()
    store = MongoStore.from_url(server.url, namespace="standalone")
    try:
        with pytest.raises(StorageUnavailable, match="needs a replica set"):
            await store.ping()
    finally:
        await store.aclose()
        server.stop()
