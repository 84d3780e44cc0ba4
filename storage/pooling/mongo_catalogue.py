"""The pool catalogue in MongoDB: collections `<ns>.pools`, `<ns>.flavors` and `<ns>.placements`, every
change a conditional single-document write (no transactions, so no replica set is needed for it).

placements: _id (the queue as '["project","name"]'), pool, refs {escaped referrer name: token}.
A pool deletion first marks the pool `deleting`, then counts its placements; a new placement checks the mark
after writing. Whichever comes second sees the other, so no queue is ever placed in a pool that is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from core.models import QueueRef
from storage.base import DEFAULT_TIMEOUT_S
from storage.mongodb.errors import unavailable_as_domain_error
from storage.mongodb.store import MongoStore
from storage.pooling.catalogue import SHOWN_QUEUES, Flavor, Pool, pool_in_use

Doc = dict[str, Any]
LIVE = {"deleting": {"$ne": True}}


def _member(q: QueueRef) -> str:
    return orjson.dumps([q.project, q.name]).decode()


def _field(referrer: str) -> str:
    # Queue names may hold '.', which a field path would read as nesting; '%' never occurs in them.
    return "refs." + referrer.replace("%", "%25").replace(".", "%2E")


def _name(escaped: str) -> str:
    return escaped.replace("%2E", ".").replace("%25", "%")


class MongoCatalogue:
    def __init__(self, client: Any, *, database: str = "charon", namespace: str = "charon") -> None:
        self._client = client
        db = client[database]
        self._pools: AsyncCollection[Doc] = db[f"{namespace}.pools"]
        self._flavors: AsyncCollection[Doc] = db[f"{namespace}.flavors"]
        self._placements: AsyncCollection[Doc] = db[f"{namespace}.placements"]
        self._indexed = False

    @classmethod
    def from_url(
        cls, url: str, *, namespace: str = "charon", timeout: float = DEFAULT_TIMEOUT_S
    ) -> MongoCatalogue:
        client, database = MongoStore.client_from_url(url, timeout)
        return cls(client, database=database, namespace=namespace)

    async def _ready(self) -> None:
        if not self._indexed:
            await self._placements.create_indexes([IndexModel([("pool", ASCENDING)], name="pool")])
            self._indexed = True

    # -- pools and flavors ---------------------------------------------------------------------------------

    async def put_pool(self, pool: Pool) -> bool:
        async with unavailable_as_domain_error():
            result = await self._pools.replace_one({"_id": pool.name}, pool.as_doc(), upsert=True)
        return result.upserted_id is not None

    async def get_pool(self, name: str) -> Pool | None:
        async with unavailable_as_domain_error():
            doc = await self._pools.find_one({"_id": name, **LIVE})
        return Pool.of(name, doc) if doc else None

    async def list_pools(self) -> list[Pool]:
        async with unavailable_as_domain_error():
            docs = await self._pools.find(LIVE).sort("_id", ASCENDING).to_list(None)
        return [Pool.of(d["_id"], d) for d in docs]

    async def delete_pool(self, name: str) -> None:
        async with unavailable_as_domain_error():
            await self._ready()
            if await self._pools.find_one_and_update({"_id": name}, {"$set": {"deleting": True}}) is None:
                return
            count = await self._placements.count_documents({"pool": name})
            if count == 0:
                await self._pools.delete_one({"_id": name})
                return
            await self._pools.update_one({"_id": name}, {"$unset": {"deleting": ""}})
            docs = await self._placements.find({"pool": name}).sort("_id").limit(SHOWN_QUEUES).to_list(None)
        raise pool_in_use(name, count, [QueueRef(*orjson.loads(d["_id"])) for d in docs])

    async def put_flavor(self, flavor: Flavor) -> bool:
        async with unavailable_as_domain_error():
            result = await self._flavors.replace_one(
                {"_id": flavor.name}, {"capabilities": flavor.capabilities}, upsert=True
            )
        return result.upserted_id is not None

    async def get_flavor(self, name: str) -> Flavor | None:
        async with unavailable_as_domain_error():
            doc = await self._flavors.find_one({"_id": name})
        return Flavor(name, doc["capabilities"]) if doc else None

    async def list_flavors(self) -> list[Flavor]:
        async with unavailable_as_domain_error():
            docs = await self._flavors.find().sort("_id", ASCENDING).to_list(None)
        return [Flavor(d["_id"], d["capabilities"]) for d in docs]

    async def delete_flavor(self, name: str) -> None:
        async with unavailable_as_domain_error():
            await self._flavors.delete_one({"_id": name})

    # -- placements ----------------------------------------------------------------------------------------

    async def lookup(self, q: QueueRef) -> str | None:
        async with unavailable_as_domain_error():
            doc = await self._placements.find_one({"_id": _member(q)}, {"pool": 1})
        return str(doc["pool"]) if doc else None

    async def place(self, q: QueueRef, pool: str, *, referrer: str | None = None) -> str | None:
        member = _member(q)
        update: Doc = (
            {"$set": {_field(referrer): uuid.uuid4().hex}} if referrer else {"$setOnInsert": {"refs": {}}}
        )
        async with unavailable_as_domain_error():
            await self._ready()
            for _ in range(3):  # a placement deleted between the failed upsert and the read: again
                if await self._pools.find_one({"_id": pool, **LIVE}, {"_id": 1}) is None:
                    return None
                try:
                    result = await self._placements.update_one(
                        {"_id": member, "pool": pool}, update, upsert=True
                    )
                except DuplicateKeyError:  # placed in another pool
                    doc = await self._placements.find_one({"_id": member}, {"pool": 1})
                    if doc is None:
                        continue
                    return str(doc["pool"])
                if result.upserted_id is not None and not await self._pools.find_one(
                    {"_id": pool, **LIVE}, {"_id": 1}
                ):  # the pool's deletion counted placements before this one landed: take it back
                    await self._placements.delete_one({"_id": member, "pool": pool})
                    return None
                return pool
        return None

    async def referrers(self, q: QueueRef) -> dict[str, str]:
        async with unavailable_as_domain_error():
            doc = await self._placements.find_one({"_id": _member(q)}, {"refs": 1})
        return {_name(k): str(v) for k, v in ((doc or {}).get("refs") or {}).items()}

    async def unplace(self, q: QueueRef, *, stale: Mapping[str, str]) -> bool:
        member = _member(q)
        async with unavailable_as_domain_error():
            for name, token in stale.items():
                field = _field(name)
                await self._placements.update_one({"_id": member, field: token}, {"$unset": {field: ""}})
            await self._placements.delete_one({"_id": member, "refs": {}})
            return await self._placements.find_one({"_id": member}, {"_id": 1}) is None

    async def ping(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.admin.command("ping")

    async def aclose(self) -> None:
        await self._client.close()
