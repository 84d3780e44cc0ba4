"""openapi.yaml is the contract, and a live service holds to it (issue 18): schemathesis generates requests
from it (valid ones and ones that break it, one operation at a time and in stateful sequences that follow
Location links) against `charon serve` on Redis and on MongoDB, and against the admin API with pools. Every
check: no 5xx, every answer's status, headers, content type and body as documented (errors JSON), valid
requests accepted and invalid ones refused. The rules JSON Schema cannot state are listed, per operation, in
tests/fuzz/schemathesis.toml (which runs every check but use_after_free, and says why); tests/fuzz/hooks.py
teaches it Zaqar's media types.

CHARON_FUZZ_EXAMPLES (default 25) and CHARON_FUZZ_SEED (default 1) widen or vary a run; a failure prints the
curl line that reproduces it.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # schemathesis has its own bound, too

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "fuzz" / "schemathesis.toml"
EXAMPLES = os.environ.get("CHARON_FUZZ_EXAMPLES", "25")
SEED = os.environ.get("CHARON_FUZZ_SEED", "1")
ADMIN_PATHS = "^/v2/(pools|flavors)"


def fuzz(service: CharonProcess, *extra: str) -> None:
    argv = [
        sys.executable, "-m", "schemathesis.cli", "--no-color", "--config-file", str(CONFIG), "run",
        f"{service.url}/openapi.json",
        "-H", "X-Project-ID: fuzz", "-H", f"Client-ID: {CLIENT_ID}",
        "--max-examples", EXAMPLES, "--seed", SEED, "--workers", "1",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks", "PYTHONPATH": str(ROOT)}
    done = run(argv, cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    assert " passed" in done.stdout, done.stdout[-5_000:]  # it tested something


def test_queue_api_holds_to_its_contract(storage_uri: str) -> None:
    # a long poll waits its whole `wait` on an empty queue: 1 s at most here (the served openapi.json says so)
    env = {"CHARON_LIMITS__MAX_CLAIM_WAIT": "1"}
    service = CharonProcess(storage_uri, namespace=f"fz{uuid.uuid4().hex[:8]}", env=env).start()
    try:
        fuzz(service, "--exclude-path-regex", ADMIN_PATHS)
    finally:
        service.stop()


def test_admin_api_holds_to_its_contract(redis_url: str) -> None:
    namespace = f"fz{uuid.uuid4().hex[:8]}"
    env = {"CHARON_POOLING": "true", "CHARON_MANAGEMENT_URI": redis_url, "CHARON_ADMIN_MODE": "true"}
    service = CharonProcess(redis_url, namespace=namespace, env=env).start()
    try:
        admin = {"X-Roles": "admin"}
        r = httpx.put(f"{service.url}/v2/pools/main", json={"uri": redis_url, "weight": 10}, headers=admin)
        assert r.status_code == 201, r.text
        fuzz(service, "--include-path-regex", f"{ADMIN_PATHS}|^/metrics$", "-H", "X-Roles: admin")
    finally:
        service.stop()
