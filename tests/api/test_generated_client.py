"""A client generated from openapi.yaml by openapi-python-client, at test time, drives a live `charon serve`
through the consumer's round trip: post, claim, acknowledge (delete with the claim's id), reject, and read
the dead letter from the DLQ. What it proves: the document generates a client without warnings (schemas
named, operation ids readable and unique), and that client's requests and parsing agree with the service.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import CLIENT_ID
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow  # a live process: 4 to 10 s, generating the client included

SPEC = Path(__file__).resolve().parents[2] / "openapi.yaml"
PACKAGE = "charon_generated_client"
# No formatting of the generated code (post_hooks); the two vendor media types are JSON and are read as such
# (JSON home, Zaqar's JSON patch): without these the generator leaves out GET /v2's answer and PATCH queue.
CONFIG = """\
post_hooks: []
content_type_overrides:
  application/json-home: application/json
  application/openstack-messaging-v2.0-json-patch: application/json
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The generated package's name, importable while the module's tests run."""
    root = tmp_path_factory.mktemp("client")
    (root / "config.yaml").write_text(CONFIG, encoding="utf-8")
    args = ["generate", "--path", str(SPEC), "--meta", "none", "--output-path", str(root / PACKAGE)]
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", *args, "--config", str(root / "config.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(root))
    try:
        yield PACKAGE
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def service(redis_url: str) -> Iterator[CharonProcess]:
    charon = CharonProcess(redis_url, namespace=f"gc{uuid.uuid4().hex[:10]}").start()
    try:
        yield charon
    finally:
        charon.stop()


def _module(package: str, name: str) -> ModuleType:
    return importlib.import_module(f"{package}.{name}")


def test_a_generated_client_posts_claims_acknowledges_and_reads_the_dlq(
    generated: str, service: CharonProcess
) -> None:
    client_mod, models = _module(generated, "client"), _module(generated, "models")

    def operation(tag: str, operation_id: str) -> ModuleType:
        return _module(generated, f"api.{tag}.{operation_id}")

    who = {"x_project_id": f"p{uuid.uuid4().hex[:8]}", "client_id": CLIENT_ID}
    with client_mod.Client(base_url=service.url, raise_on_unexpected_status=True) as client:
        metadata = models.QueueMetadata(field_dead_letter_queue="orders.dlq", field_max_claim_count=5)
        r = operation("queues", "queues_create").sync_detailed("orders", client=client, body=metadata, **who)
        assert r.status_code == 201

        messages = [models.MessageIn(body={"sku": n}, ttl=300) for n in (1, 2)]
        posted = operation("messages", "messages_create").sync(
            "orders", client=client, body=models.PostMessagesIn(messages=messages), **who
        )
        assert isinstance(posted, models.PostedOut)
        assert len(posted.resources) == 2

        r = operation("claims", "claims_create").sync_detailed(
            "orders", client=client, body=models.ClaimIn(ttl=60, grace=60), limit=2, **who
        )
        assert r.status_code == 201
        claimed = r.parsed
        assert isinstance(claimed, models.MessagesOut)
        by_sku = {m.body["sku"]: m for m in claimed.messages}
        assert set(by_sku) == {1, 2}
        (claim_id,) = parse_qs(urlsplit(by_sku[1].href).query)["claim_id"]

        ack = operation("messages", "messages_delete").sync_detailed(
            "orders", by_sku[1].id, client=client, claim_id=claim_id, **who
        )
        assert ack.status_code == 204
        rejection = models.RejectIn(reason="bad schema", description="field sku is 2")
        rejected = operation("messages", "messages_dead_letter").sync(
            "orders", by_sku[2].id, client=client, body=rejection, claim_id=claim_id, **who
        )
        assert isinstance(rejected, models.RejectOut)
        assert rejected.outcome == "moved"

        page = operation("messages", "messages_list").sync(
            "orders.dlq", client=client, echo=True, provenance=True, **who
        )
        assert isinstance(page, models.MessagesPage)
        (dead,) = page.messages
        assert (dead.id, dead.body) == (by_sku[2].id, {"sku": 2})
        assert isinstance(dead.dead_letter, models.DeadLetterOut)
        assert (dead.dead_letter.source_queue, dead.dead_letter.reason) == ("orders", "rejected")
        assert dead.dead_letter.rejection.reason == "bad schema"

        stats = operation("queues", "queues_stats").sync("orders", client=client, **who)
        assert isinstance(stats, models.StatsOut)
        assert stats.messages.total == 0
