"""deploy/: the pooled compose file describes what the README promises (it is not run here: no Docker)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_the_pooled_compose_file_has_two_api_replicas_two_redis_pools_and_a_mongodb_pool() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.pools.yml").read_text())
    services = compose["services"]
    apis = [
        name for name, s in services.items() if s.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
    ]
    assert len(apis) == 2
    for name in apis:
        env = services[name]["environment"]
        assert env["CHARON_POOLING"] == "true"
        assert env["CHARON_MANAGEMENT_URI"].startswith("redis://catalogue:")
    script = (DEPLOY / "register-pools.sh").read_text()
    uris = re.findall(r'"uri": "([a-z+]+)://([a-z0-9-]+):', script)
    assert sorted(uris) == [("mongodb", "mongo"), ("redis", "redis-a"), ("redis", "redis-b")]
    assert {host for _, host in uris} <= set(services)
    assert "--replSet" in services["mongo"]["command"]
    upstream = (DEPLOY / "nginx.conf").read_text()
    assert all(f"server {name}:8888" in upstream for name in apis)
