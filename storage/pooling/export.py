"""The dead-letter export (storage/export.py) of a pooled deployment: every pool of the catalogue, each read
by its own driver's export.

A queue lives in exactly one pool, its DLQ with it, so the DLQs of a deployment are those of all its pools
taken together. extents() reads the catalogue once and asks each pool for its DLQs; every Extent, and so every
Slice, names its pool. read() looks the slice's pool up in the catalogue (one read per slice: the slice
carries a pool name, never a URI with its credentials) and reads it with that pool's export, so slices of
different pools run in parallel as those of one store do.

The catalogue is async (the service's); its few calls here run with asyncio.run, on a thread of their own when
the caller is inside an event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from core.errors import StorageUnavailable
from storage.export import DeadLetterExport, Extent, Page, Slice, shown
from storage.pooling.catalogue import Catalogue, Pool
from storage.pooling.store import pool_namespace
from storage.registry import open_catalogue, open_export

T = TypeVar("T")


class PooledExport:
    def __init__(self, catalogue_uri: str, *, namespace: str = "charon") -> None:
        self.uri, self.namespace = catalogue_uri, namespace

    def extents(self, project: str | None, names: Sequence[str] | None) -> list[Extent]:
        out = []
        for pool in self._catalogue(lambda c: c.list_pools()):
            try:
                found = self._pool_export(pool).extents(project, names)
            except StorageUnavailable as e:
                raise StorageUnavailable(f"Pool {pool.name!r}: {e}") from e
            out += [dataclasses.replace(e, pool=pool.name) for e in found]
        return sorted(out, key=lambda e: (e.project, e.queue, e.pool or ""))

    def read(self, part: Slice) -> Iterator[Page]:
        name = part.pool
        if name is None:
            raise ValueError("A slice of a pooled deployment names its pool.")
        pool = self._catalogue(lambda c: c.get_pool(name))
        if pool is None:
            raise StorageUnavailable(f"Pool {name!r} is not in the pool catalogue at {shown(self.uri)}.")
        yield from self._pool_export(pool).read(part)

    def _pool_export(self, pool: Pool) -> DeadLetterExport:
        return open_export(pool.uri, namespace=pool_namespace(pool, self.namespace))

    def _catalogue(self, call: Callable[[Catalogue], Awaitable[T]]) -> T:
        """`call` on the catalogue, opened for it and closed after."""

        async def run() -> T:
            catalogue = open_catalogue(self.uri, namespace=self.namespace)
            try:
                return await call(catalogue)
            except StorageUnavailable as e:
                raise StorageUnavailable(f"Cannot read the pool catalogue at {shown(self.uri)}: {e}") from e
            finally:
                await catalogue.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run())
        with ThreadPoolExecutor(1) as thread:
            return thread.submit(asyncio.run, run()).result()
