"""`charon serve` says so at start when it serves a non-loopback address without authentication."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.servers import free_port, spawn

pytestmark = pytest.mark.slow  # live server processes


@pytest.mark.parametrize(
    ("host", "auth", "warned"), [("0.0.0.0", "noauth", True), ("127.0.0.1", "noauth", False)]
)
def test_noauth_on_a_network_address_is_warned_about(
    redis_url: str, host: str, auth: str, warned: bool
) -> None:
    port = free_port()
    env = dict(os.environ, CHARON_STORAGE_URI=redis_url, CHARON_AUTH=auth, CHARON_NAMESPACE="warned")
    proc = spawn(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/ping", timeout=1).status_code == 204:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("charon did not start")
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=15)
    warnings = [json.loads(line) for line in stderr.splitlines()]  # CHARON_LOG_FORMAT is json
    said = [
        w for w in warnings if w.get("message", "").startswith("serving on 0.0.0.0 with CHARON_AUTH=noauth")
    ]
    assert bool(said) is warned, stderr
    assert all(w["level"] == "WARNING" for w in said)
