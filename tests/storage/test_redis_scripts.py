"""Redis driver internals: every script file is loaded, and scripts survive a SCRIPT FLUSH."""

from __future__ import annotations

from importlib import resources

import redis.asyncio as aioredis

from storage.redis.scripts import SCRIPT_NAMES
from storage.redis.store import RedisStore
from tests.contract.helpers import Q, post


def test_every_lua_file_is_a_loaded_script() -> None:
    files = {
        p.name.removesuffix(".lua")
        for p in (resources.files("storage.redis") / "lua").iterdir()
        if p.name.endswith(".lua")
    }
    assert files == {*SCRIPT_NAMES, "lib"}


async def test_scripts_reload_after_script_flush(redis_store: RedisStore, redis_url: str) -> None:
    await post(redis_store, Q, "before")
    admin = aioredis.Redis.from_url(redis_url)
    await admin.script_flush()
    await admin.aclose()
    await post(redis_store, Q, "after")  # NOSCRIPT -> redis-py loads the script again
    assert (await redis_store.stats(Q)).total == 2
