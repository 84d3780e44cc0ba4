"""From why to action: the redrive requests insights writes for its top signatures, sent as the report says
to the real API over the same store, dry run first, move exactly that signature's dead letters back."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import shlex
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from app.main import create_app
from app.settings import Settings
from core import signatures
from core.clock import ManualClock
from core.models import QueueRef
from pipeline import DEFAULT_MAX_BODY_BYTES, aggregate, analysis, load, output, report
from pipeline.load import DeadLetterStore
from storage.base import Store
from storage.mongodb.store import MongoStore
from storage.registry import open_store
from tests.contract.helpers import all_messages
from tests.pipeline.conftest import fill, listed

pytestmark = pytest.mark.timeout(300)


@contextlib.asynccontextmanager
async def scenario_store(
    request: pytest.FixtureRequest, driver: str
) -> AsyncIterator[tuple[Store, Settings, ManualClock]]:
    """A store of its own namespace on the session's redis-server or MongoDB, its settings and clock."""
    uri: str = request.getfixturevalue("redis_url" if driver == "redis" else "mongodb_uri")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    clock = ManualClock()
    store = open_store(uri, namespace=namespace, clock=clock)
    try:
        yield store, Settings(storage_uri=uri, namespace=namespace), clock
    finally:
        if isinstance(store, MongoStore):
            await store.drop_collections()
        await store.aclose()


@pytest.mark.parametrize("driver", ["redis", "mongo"])
async def test_a_signatures_redrive_request_moves_exactly_its_messages(
    spark: SparkSession, request: pytest.FixtureRequest, driver: str, tmp_path: Path
) -> None:
    async with scenario_store(request, driver) as (store, settings, clock):
        uri, namespace = settings.storage_uri, settings.namespace
        assert uri is not None
        _, records = await fill(store, settings, clock)
        frame = load.from_store(spark, DeadLetterStore(uri, namespace), max_body_bytes=4096)
        insights = aggregate.analyse(spark, frame, top=3)
        output.write(insights, tmp_path, top=3, max_body_bytes=4096)
        top = insights.rows("signatures")[0]
        [*requests] = (
            r
            for r in insights.rows("signature_ids")
            if (r["project"], r["signature"]) == (top["project"], top["signature"])
        )
        assert sum(r["messages"] for r in requests) == top["messages"]
        page = (tmp_path / "report.html").read_text()
        rq = requests[0]
        request = report.redrive_request(rq)
        assert request is not None
        dry, real, _ = request
        assert f"-d @{dry}" in page
        # read at 4,096 bytes a body, not as the server signs (65,536): no redrive by signature offered
        assert "signature&quot;:" not in page
        ids = {r["id"] for r in records if r["project"] == rq["project"] and r["queue"] == rq["dlq"]}
        wanted = set(json.loads((tmp_path / real).read_text())["filter"]["message_ids"])
        assert wanted == set(rq["ids"])
        assert wanted <= ids

        app = create_app(settings, store=store, clock=clock)
        headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": rq["project"]}
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://charon", headers=headers
            ) as http,
        ):
            url = f"/v2/queues/{rq['dlq']}/redrive"
            preview = await http.post(url, content=(tmp_path / dry).read_bytes())
            assert preview.status_code == 200, preview.text
            assert preview.json()["matched"] == len(wanted)
            moved = await http.post(url, content=(tmp_path / real).read_bytes())
            assert moved.status_code in (200, 202), moved.text
            task = moved.json()
            for _ in range(200):
                if task["status"] != "running":
                    break
                await asyncio.sleep(0.05)
                task = (await http.get(task["href"])).json()
            assert (task["status"], task["progress"]["moved"]) == ("succeeded", len(wanted))
            left = {
                m.id
                for m in await all_messages(
                    store,
                    QueueRef(rq["project"], rq["dlq"]),
                    limit=100,
                    echo=True,
                    client_id="",
                    include_claimed=True,
                    include_delayed=True,
                )
            }
            assert left == ids - wanted  # exactly the signature's messages went back


@pytest.mark.parametrize("driver", ["redis", "mongo"])
async def test_a_signature_the_report_names_redrives_every_message_of_it(
    spark: SparkSession, request: pytest.FixtureRequest, driver: str
) -> None:
    """The server signs each dead letter as the Spark job does (every message of the scenario), and the
    report's redrive by signature, dry run first, moves exactly that signature's messages of the DLQ."""
    async with scenario_store(request, driver) as (store, settings, clock):
        uri, namespace = settings.storage_uri, settings.namespace
        assert uri is not None
        shops, _ = await fill(store, settings, clock)
        frame = load.from_store(spark, DeadLetterStore(uri, namespace), max_body_bytes=DEFAULT_MAX_BODY_BYTES)
        spark_signature = {
            r.id: r.signature for r in analysis.enrich(frame).select("id", "signature").collect()
        }
        messages = {}
        for project, shop in shops.items():
            for dlq in shop.dlqs:
                for m in await listed(store, QueueRef(project, dlq)):
                    messages[m.id] = (project, dlq)
                    if m.dead_letter is not None:  # one posted to the DLQ has no signature to redrive by
                        assert signatures.of_message(m) == spark_signature[m.id], m.body
        assert len(messages) == len(spark_signature) > 100
        insights = aggregate.analyse(spark, frame, top=3)
        top = insights.rows("signatures")[:3]
        rows = [
            r
            for r in insights.rows("signature_ids")
            if (r["project"], r["signature"]) in {(t["project"], t["signature"]) for t in top}
        ]
        assert rows
        offered = html.escape(
            report.signature_curl(rows[0]["project"], rows[0]["dlq"], rows[0]["signature"], dry_run=True)
        )
        assert offered in report.html(insights, top=3)
        app = create_app(settings, store=store, clock=clock)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://charon") as http,
        ):
            for r in rows:
                headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": r["project"]}
                url = f"/v2/queues/{r['dlq']}/redrive"
                before = {i for i, where in messages.items() if where == (r["project"], r["dlq"])}
                for dry_run in (True, False):
                    line = shlex.split(
                        report.signature_curl(r["project"], r["dlq"], r["signature"], dry_run=dry_run)
                    )
                    body = line[line.index("-d") + 1]
                    answer = await http.post(url, content=body, headers=headers)
                    assert answer.status_code in (200, 202), answer.text
                    if dry_run:
                        assert answer.json()["matched"] == r["messages"]
                    else:
                        task = answer.json()
                for _ in range(200):
                    if task["status"] != "running":
                        break
                    await asyncio.sleep(0.05)
                    task = (await http.get(task["href"], headers=headers)).json()
                assert (task["status"], task["progress"]["moved"]) == ("succeeded", r["messages"])
                left = {m.id for m in await listed(store, QueueRef(r["project"], r["dlq"]))}
                assert left == before - set(r["ids"])  # every one of them (no more than a request lists)
                for i in r["ids"]:
                    messages.pop(i)


def test_requests_and_commands_are_safe_whatever_the_input_says() -> None:
    """Dead letters read from a file (`--input`) can name any queue and id: no path outside the output
    directory, no request the API would refuse, no shell text that runs."""
    good = "0" * 32
    row = {
        "project": "shop",
        "signature": "ab" * 8,
        "dlq": "orders",
        "messages": 3,
        "ids": [good, "x", "$(id)"],
    }
    request = report.redrive_request(row)
    assert request is not None
    dry, real, ids = request
    assert ids == [good]
    assert report.redrive_request({**row, "dlq": "../../../tmp/evil"}) is None
    assert report.redrive_request({**row, "ids": ["$(touch /tmp/pwned)"]}) is None
    # two DLQs whose names differ by a suffix get different files
    other = report.redrive_request({**row, "dlq": "orders.dry-run"})
    assert other is not None
    assert len({dry, real, *other[:2]}) == 4
    hostile = "shop'; touch /tmp/pwned; echo '"
    weird = report.redrive_request({**row, "project": hostile})
    assert weird is not None
    assert weird[0].startswith("redrive/~")
    assert ".." not in weird[0]
    line = report.redrive_curl(hostile, "orders", weird[0])
    assert f"X-Project-ID: {hostile}" in shlex.split(line)
    fetch = shlex.split(report.curl(hostile, "q$(id)", "$(id)"))
    assert f"X-Project-ID: {hostile}" in fetch
    assert "$BASE/v2/queues/q$(id)/messages/$(id)?provenance=true" in fetch  # quoted: no substitution
