"""One log format on stderr (CHARON_LOG_FORMAT, app/logs.py): a `charon serve` run through its start,
requests, a store outage and its shutdown writes lines that all parse as JSON (uvicorn's, the access lines,
the sweeper's and the notifier process's), or with `text`, that all read `time level logger: message`."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID, PROJECT
from tests.servers import CharonProcess, RedisServer

pytestmark = pytest.mark.slow

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}
TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .*"
)


def serve_through_an_outage(tmp_path: Path, log_format: str) -> list[str]:
    """Start, requests, the store gone for a while (503s, the sweeper and notifier failing), SIGTERM: the
    service's stderr lines."""
    redis = RedisServer().start()
    env = {"CHARON_LOG_FORMAT": log_format, "CHARON_SWEEP_INTERVAL": "0.1", "CHARON_STORAGE_TIMEOUT": "1"}
    try:
        with (tmp_path / "stderr").open("wb") as stderr:
            service = CharonProcess(
                redis.url, namespace=f"lg{uuid.uuid4().hex[:8]}", env=env, log_level="info", stderr=stderr
            ).start()
            try:
                q = f"{service.url}/v2/queues/logged"
                assert httpx.post(
                    f"{q}/messages", json={"messages": [{"body": 1}]}, headers=HEADERS
                ).is_success
                assert httpx.get(f"{q}/nothing", headers=HEADERS).status_code == 404
                assert httpx.post(f"{q}/claims?limit=0", headers=HEADERS).status_code == 400
                redis.stop()
                assert (
                    httpx.post(f"{q}/messages", json={"messages": [{"body": 2}]}, headers=HEADERS).status_code
                    == 503
                )
                time.sleep(1.5)  # the sweeper tries, and says it fails
            finally:
                service.stop()
    finally:
        redis.stop()
    return (tmp_path / "stderr").read_text().splitlines()


def test_every_line_is_json_through_start_requests_an_outage_and_shutdown(tmp_path: Path) -> None:
    lines = serve_through_an_outage(tmp_path, "json")
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not JSON: {line!r}") from None
    assert all(isinstance(r, dict) and "time" in r for r in records)
    messages = [r for r in records if "message" in r]
    assert any("Application startup complete" in r["message"] for r in messages)  # uvicorn's own
    assert any(r["logger"] == "charon.sweeper" and r["level"] == "WARNING" for r in messages), messages
    assert any("Shutting down" in r["message"] or "shutdown" in r["message"].lower() for r in messages)
    statuses = {r["status"] for r in records if "request_id" in r}  # the access lines
    assert {201, 404, 400, 503} <= statuses


def test_with_text_every_line_reads_time_level_logger_message(tmp_path: Path) -> None:
    lines = serve_through_an_outage(tmp_path, "text")
    assert lines
    assert [line for line in lines if not TEXT_LINE.fullmatch(line)] == []
    assert any(" WARNING charon.sweeper: " in line for line in lines)
    assert any(" INFO charon.access: " in line and " 503 " in line for line in lines)
