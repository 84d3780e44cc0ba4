"""Fixtures: a real redis-server per session, a fresh key namespace and a manual clock per test.

`store` is parametrised over every driver, so every contract and API test runs on each of them.
Set CHARON_TEST_REDIS_URL to use a Redis you run instead of starting one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from core.clock import ManualClock
from storage.base import Store
from storage.redis.store import RedisStore
from tests.servers import RedisServer

PROJECT = "project-a"
CLIENT_ID = "3381af92-2b9e-11e3-b191-71861300734c"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("CHARON_TEST_REDIS_URL")
    if external:
        yield external
        return
    server = RedisServer().start()
    yield server.url
    server.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def redis_store(redis_url: str, clock: ManualClock) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}", clock=clock)
    yield store
    await store.aclose()


@pytest.fixture(params=[pytest.param("redis_store", id="redis")])
def store(request: pytest.FixtureRequest) -> Store:
    driver: Store = request.getfixturevalue(request.param)
    return driver


@pytest.fixture
def settings() -> Settings:
    return Settings(storage_uri="redis://unused")


@pytest.fixture
async def client(store: Store, clock: ManualClock, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, store=store, clock=clock)
    transport = httpx.ASGITransport(app=app)
    headers = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}
    async with httpx.AsyncClient(transport=transport, base_url="http://charon", headers=headers) as c:
        yield c
