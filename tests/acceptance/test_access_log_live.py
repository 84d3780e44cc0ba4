"""`charon serve` writes one JSON access line a request to stderr (api/access.py), and uvicorn's own access
log stays off: with one process and with uvicorn's supervisor over two workers (app/workers.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID, PROJECT
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": PROJECT}


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_logs_json_lines_to_stderr_and_no_uvicorn_access_line(
    redis_url: str, tmp_path: Path, workers: str
) -> None:
    env = {"CHARON_WORKERS": workers}
    with (tmp_path / "stdout").open("wb") as stdout, (tmp_path / "stderr").open("wb") as stderr:
        service = CharonProcess(
            redis_url,
            namespace=f"al{uuid.uuid4().hex[:8]}",
            env=env,
            log_level="info",
            stdout=stdout,
            stderr=stderr,
        ).start()
        try:
            posted = httpx.post(
                f"{service.url}/v2/queues/logged/messages", json={"messages": [{"body": 1}]}, headers=HEADERS
            )
            missing = httpx.get(f"{service.url}/v2/queues/logged/nothing/here", headers=HEADERS)
        finally:
            service.stop()
    assert (posted.status_code, missing.status_code) == (201, 404)
    text = (tmp_path / "stderr").read_text()
    out = (tmp_path / "stdout").read_text()
    assert "Application startup complete" in text  # uvicorn's INFO lines are shown: its access lines would be
    # uvicorn's access line (on stdout): 127.0.0.1:port - "POST /v2/queues/logged/messages HTTP/1.1" 201
    assert 'HTTP/1.1"' not in out + text
    lines = [json.loads(line) for line in text.splitlines()]  # every line: CHARON_LOG_FORMAT is json
    lines = [line for line in lines if "request_id" in line]  # the access lines
    by_id = {line["request_id"]: line for line in lines}
    line = by_id[posted.headers["X-OpenStack-Request-Id"]]
    assert line["route"] == "/v2/queues/{queue_name}/messages"
    assert (line["method"], line["status"], line["project"]) == ("POST", 201, PROJECT)
    assert line["bytes"] == len(posted.content)
    line = by_id[missing.headers["X-OpenStack-Request-Id"]]
    assert (line["route"], line["status"]) == (None, 404)
    assert {line["route"] for line in lines} >= {"/v2/ping"}  # the start's pings
