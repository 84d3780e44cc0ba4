"""The pool catalogue in Redis. Every key shares the hash tag `{catalogue}`, so a Redis Cluster works too,
and each change that touches several keys is one script (lua/*.lua)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

import orjson
import redis.asyncio as aioredis

from core.models import QueueRef
from storage.base import DEFAULT_TIMEOUT_S
from storage.pooling.catalogue import SHOWN_QUEUES, Flavor, Pool, pool_in_use
from storage.redis.runner import Script, ScriptRunner, unavailable_as_domain_error
from storage.redis.uri import open_client, wait_replicas


def _member(q: QueueRef) -> str:
    return orjson.dumps([q.project, q.name]).decode()


def _queue(member: str) -> QueueRef:
    project, name = orjson.loads(member)
    return QueueRef(project, name)


def _script(name: str) -> Script:
    """A catalogue script; each changes the catalogue (a failure once sent: the outcome is unknown)."""
    source = (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, source, write=True)


PLACE, UNPLACE, DELETE_POOL = _script("place"), _script("unplace"), _script("delete_pool")


class RedisCatalogue:
    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        namespace: str = "charon",
        timeout: float = DEFAULT_TIMEOUT_S,
        wait_replicas: int = 0,
    ) -> None:
        self._client = client
        # the driver's one way of running a script
        self._scripts = ScriptRunner(client, timeout=timeout, wait_replicas=wait_replicas)
        self._prefix = f"{namespace}:{{catalogue}}:"

    @classmethod
    def from_url(
        cls, url: str, *, namespace: str = "charon", timeout: float = DEFAULT_TIMEOUT_S
    ) -> RedisCatalogue:
        waits = wait_replicas(url)
        return cls(open_client(url, timeout), namespace=namespace, timeout=timeout, wait_replicas=waits)

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    # -- pools and flavors ---------------------------------------------------------------------------------

    async def put_pool(self, pool: Pool) -> bool:
        async with unavailable_as_domain_error():
            return bool(await self._client.hset(self._key("pools"), pool.name, orjson.dumps(pool.as_doc())))

    async def get_pool(self, name: str) -> Pool | None:
        async with unavailable_as_domain_error():
            raw = await self._client.hget(self._key("pools"), name)
        return Pool.of(name, orjson.loads(raw)) if raw else None

    async def list_pools(self) -> list[Pool]:
        async with unavailable_as_domain_error():
            docs = await self._client.hgetall(self._key("pools"))
        return [Pool.of(str(name), orjson.loads(raw)) for name, raw in sorted(docs.items())]

    async def delete_pool(self, name: str) -> None:
        keys = [self._key("pools"), self._key(f"in:{name}")]
        count, *shown = await self._scripts(DELETE_POOL, keys, [name, SHOWN_QUEUES])
        if count:
            raise pool_in_use(name, int(count), [_queue(m) for m in sorted(shown)])

    async def put_flavor(self, flavor: Flavor) -> bool:
        doc = orjson.dumps({"capabilities": flavor.capabilities})
        async with unavailable_as_domain_error():
            return bool(await self._client.hset(self._key("flavors"), flavor.name, doc))

    async def get_flavor(self, name: str) -> Flavor | None:
        async with unavailable_as_domain_error():
            raw = await self._client.hget(self._key("flavors"), name)
        return Flavor(name, orjson.loads(raw)["capabilities"]) if raw else None

    async def list_flavors(self) -> list[Flavor]:
        async with unavailable_as_domain_error():
            docs = await self._client.hgetall(self._key("flavors"))
        return [Flavor(str(name), orjson.loads(raw)["capabilities"]) for name, raw in sorted(docs.items())]

    async def delete_flavor(self, name: str) -> None:
        async with unavailable_as_domain_error():
            await self._client.hdel(self._key("flavors"), name)

    # -- placements ----------------------------------------------------------------------------------------

    async def lookup(self, q: QueueRef) -> str | None:
        async with unavailable_as_domain_error():
            pool = await self._client.hget(self._key("placements"), _member(q))
        return str(pool) if pool is not None else None

    async def place(self, q: QueueRef, pool: str, *, referrer: str | None = None) -> str | None:
        member = _member(q)
        keys = [
            self._key("pools"),
            self._key("placements"),
            self._key(f"in:{pool}"),
            self._key(f"refs:{member}"),
            self._key("generation"),
        ]
        placed = await self._scripts(PLACE, keys, [member, pool, referrer or ""])
        return str(placed) if placed is not None else None

    async def referrers(self, q: QueueRef) -> dict[str, str]:
        async with unavailable_as_domain_error():
            refs = await self._client.hgetall(self._key(f"refs:{_member(q)}"))
        return {str(name): str(token) for name, token in refs.items()}

    async def unplace(self, q: QueueRef, *, stale: Mapping[str, str]) -> bool:
        member = _member(q)
        args: list[Any] = [member, self._key("in:")]
        for name, token in stale.items():
            args += [name, token]
        keys = [self._key("placements"), self._key(f"refs:{member}")]
        gone = await self._scripts(UNPLACE, keys, args)
        return bool(gone)

    async def ping(self) -> None:
        async with unavailable_as_domain_error():
            await self._client.ping()

    async def aclose(self) -> None:
        await self._scripts.aclose()
        await self._client.aclose()
