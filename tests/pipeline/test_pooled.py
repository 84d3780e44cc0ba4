"""Insights and export over a pooled deployment: two Redis pools behind a catalogue, one project in each, read
through the catalogue as the service's settings name it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.cli import main
from pipeline import purepython
from pipeline.aggregate import TABLES
from storage.pooling.catalogue import Pool
from storage.pooling.redis_catalogue import RedisCatalogue
from storage.registry import open_export
from tests.pipeline.conftest import PROJECTS, DeadLetters
from tests.pipeline.test_insights import from_store, records, tables, written

pytestmark = pytest.mark.timeout(300)


def test_every_pool_is_read(spark: SparkSession, pooled_dead_letters: DeadLetters) -> None:
    data = pooled_dead_letters
    assert data.pools is not None
    assert len(set(data.pools.values())) == 2  # the projects live in different pools
    extents = data.store.open().extents(None, None)
    assert {(e.project, e.pool) for e in extents} == set(data.pools.items())
    ids = [r.id for r in records(spark, data).select("id").collect()]
    assert sorted(ids) == sorted(r["id"] for r in data.records)
    assert tables(from_store(spark, data)) == purepython.analyse(data.records)


def test_one_project_reads_one_pool(pooled_dead_letters: DeadLetters) -> None:
    data = pooled_dead_letters
    assert data.pools is not None
    export = open_export(data.store.uri, namespace=data.store.namespace, pooled=True)
    extents = export.extents("tenant-b", ["payments.dlq", "notify.dlq"])
    assert {e.pool for e in extents} == {data.pools["tenant-b"]}
    read = [page for e in extents for s in e.cut(3, now_ms=0) for page in export.read(s)]
    assert sum(len(p) for p in read) == len(data.of("tenant-b", {"payments.dlq", "notify.dlq"}))


def test_commands_read_the_pools_the_settings_name(
    spark: SparkSession,
    pooled_dead_letters: DeadLetters,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """CHARON_POOLING and CHARON_MANAGEMENT_URI, as the service is configured: no option names the store."""
    data = pooled_dead_letters
    monkeypatch.delenv("CHARON_STORAGE_URI", raising=False)
    monkeypatch.setenv("CHARON_POOLING", "true")
    monkeypatch.setenv("CHARON_MANAGEMENT_URI", data.store.uri)
    monkeypatch.setenv("CHARON_NAMESPACE", data.store.namespace)
    dlqs = sorted({d for shop in data.shops.values() for d in shop.dlqs})
    exported = tmp_path / "all.jsonl"
    assert main(["export", *(a for q in dlqs for a in ("--queue", q)), "--out", str(exported)]) == 0
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(r["id"] for r in data.records)
    assert {line["project"] for line in lines} == set(PROJECTS)
    assert f"{len(data.records):,} messages" in capsys.readouterr().err

    out = tmp_path / "insights"
    code = main(["insights", "--out", str(out), "--max-body-bytes", "4096", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert f"{len(data.records):,} messages analysed" in capsys.readouterr().out
    expected = purepython.analyse(data.records)
    for name in TABLES:
        assert written(out, name) == expected[name], name


def test_a_storage_uri_given_reads_that_one_store(
    pooled_dead_letters: DeadLetters, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the service's pooled settings in the environment, --storage-uri still names the store that is
    read: one pool, as a plain store (it was silently replaced by the catalogue)."""
    data = pooled_dead_letters
    monkeypatch.setenv("CHARON_POOLING", "true")
    monkeypatch.setenv("CHARON_MANAGEMENT_URI", data.store.uri)
    monkeypatch.setenv("CHARON_NAMESPACE", data.store.namespace)

    async def pools() -> list[Pool]:
        catalogue = RedisCatalogue.from_url(data.store.uri, namespace=data.store.namespace)
        try:
            return await catalogue.list_pools()
        finally:
            await catalogue.aclose()

    blue = next(p for p in asyncio.run(pools()) if p.name.startswith("blue"))
    assert data.pools is not None
    project = next(p for p, pool in data.pools.items() if pool == blue.name)
    dlqs = sorted({d for shop in data.shops.values() for d in shop.dlqs})
    args = ["export", "--storage-uri", blue.uri, *(a for q in dlqs for a in ("--queue", q))]
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(
        r["id"] for r in data.records if r["project"] == project
    )
