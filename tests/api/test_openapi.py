from __future__ import annotations

import re
import uuid
from pathlib import Path

import yaml
from fastapi.routing import APIRoute
from fastapi.utils import generate_unique_id

from api.routing import documented
from app.main import create_app
from app.settings import Settings

SPEC = Path(__file__).resolve().parents[2] / "openapi.yaml"


def test_openapi_yaml_equals_the_served_schema() -> None:
    served = create_app(Settings(storage_uri="redis://unused")).openapi()
    published = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    assert published == served, "openapi.yaml is stale: run `make openapi`"


def test_schema_documents_every_route_and_the_dead_letter_field() -> None:
    served = create_app(Settings(storage_uri="redis://unused")).openapi()
    assert {"/v2/queues/{queue_name}/claims/{claim_id}", "/v2/queues/{queue_name}/purge"} <= set(
        served["paths"]
    )
    schemas = served["components"]["schemas"]
    assert "dead_letter" in schemas["MessageOut"]["properties"]
    assert {"PostMessagesIn", "ClaimIn", "PatchOp"} <= set(schemas)


def test_every_operation_in_openapi_yaml_is_guarded_by_a_registered_policy_rule() -> None:
    """Each operation names its oslo.policy rule (x-policy-rule), the rule is one the service registers, and
    every registered operation rule guards something; only the public ones (version document, ping) have
    none. (docs:get and console:get guard pages, which are not operations: test_docs.py.)"""
    from api.policy import PUBLIC, rule_defaults

    registered = {rule.name for rule in rule_defaults("admin")}
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    named, unguarded = set(), []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            rule = operation.get("x-policy-rule")
            if rule is None:
                unguarded.append((method.upper(), path))
            else:
                assert rule in registered, (method, path, rule)
                named.add(rule)
    assert set(unguarded) <= PUBLIC
    assert {("GET", "/"), ("GET", "/v2/ping")} <= set(unguarded)
    secondary = {"health:get_detailed", "quotas:get_any"}  # checked inside a route, after its own rule
    pages = {"docs:get", "console:get"}  # they guard pages for people, not operations (test_docs.py)
    operation_rules = registered - {"context_is_admin", "admin_or_owner", *pages, *secondary}
    assert operation_rules - named == set()


def test_every_operation_id_is_unique_snake_case_and_named_by_its_policy_rule() -> None:
    """What a generated client names its functions (api/routing.py operation_id): `queues_list` for
    queues:get_all, a public route's endpoint name (`ping`); never FastAPI's own form
    (`list_queues_v2_queues_get`), which changes with the endpoint's name and path."""
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    app = create_app(Settings(storage_uri="redis://unused"))
    fastapi_ids = {generate_unique_id(r) for r in documented(app.router.routes) if isinstance(r, APIRoute)}
    ids = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            op_id, rule = operation["operationId"], operation.get("x-policy-rule")
            ids.append(op_id)
            assert re.fullmatch(r"[a-z]+(_[a-z]+)*", op_id), (method, path, op_id)
            assert op_id not in fastapi_ids, (method, path, op_id)  # nor, by the pattern, any path in it
            if rule is not None:
                named = rule.replace(":get_all", ":list").replace(":", "_")
                if path.startswith("/v2/topics/") and not rule.startswith("topics:"):
                    named = f"topic_{named}"  # a topic's messages and subscriptions, under the queues' rules
                assert op_id == named, (method, path, op_id)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert {"queues_list", "queues_create", "messages_create", "messages_list", "claims_create"} <= set(ids)
    assert {"claims_get", "claims_delete", "ping", "versions"} <= set(ids)


def test_every_reference_in_openapi_yaml_resolves() -> None:
    """A body model missing from api/schemas.py REQUEST_MODELS leaves its $ref pointing at nothing."""
    text = SPEC.read_text(encoding="utf-8")
    components = yaml.safe_load(text)["components"]
    refs = set(re.findall(r"\$ref: '#/components/(\w+)/([^']+)'", text))
    assert {kind for kind, _ in refs} == {"schemas", "parameters", "headers"}
    assert {(kind, name) for kind, name in refs if name not in components[kind]} == set()


def test_every_operation_takes_and_every_answer_carries_the_request_id() -> None:
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    parameter = {"$ref": "#/components/parameters/RequestId"}
    header = {"$ref": "#/components/headers/RequestId"}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert parameter in operation["parameters"], (method, path)
            for status, response in operation["responses"].items():
                assert response["headers"]["X-OpenStack-Request-Id"] == header, (method, path, status)
    assert spec["components"]["parameters"]["RequestId"]["required"] is False
    assert re.fullmatch(
        spec["components"]["headers"]["RequestId"]["schema"]["pattern"], f"req-{uuid.uuid4()}"
    )
