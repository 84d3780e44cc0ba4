"""docker-compose.yml: the real `docker-compose config` (Debian's Compose 1.29, which needs no Docker daemon
and no network) accepts the file alone and with each profile, with no variable set, and what it prints (the
file normalised: anchors merged, paths made absolute, variables put in) is what the file's header promises.
The files the services mount exist, Prometheus loads the project's rules (`promtool check config`), and
Grafana is given the project's dashboard. Skipped only when docker-compose is not installed (`make
system-deps` installs it)."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
PROFILES = ("mongodb", "pools", "keystone", "observability", "insights")
METRICS_TOKEN = "CHARON_METRICS__BEARER_TOKEN"
KEYSTONE_SECRETS = ("KEYSTONE_ADMIN_PASSWORD", "CHARON_SERVICE_PASSWORD", "CHARON_SIGNED_URL_KEY")

# What each profile adds to `charon` and `redis` (the file's header says what each is for).
ADDS = {
    "mongodb": {"mongodb", "charon-mongodb"},
    "pools": {
        "pool-api-1", "pool-api-2", "pool-lb", "pool-catalogue", "pool-redis-a", "pool-redis-b", "mongodb",
        "pool-register",
    },
    "keystone": {"keystone", "charon-keystone"},
    "observability": {"prometheus", "grafana"},
    "insights": {"spark-master", "spark-worker", "charon-insights"},
}  # fmt: skip


def docker_compose() -> str:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed (`make system-deps` installs Debian's)")
    return tool


@functools.cache
def _empty_env_file() -> str:
    # --env-file: a developer's .env beside the file must not change what the tests see
    fd, path = tempfile.mkstemp(prefix="charon-compose-", suffix=".env")
    os.close(fd)
    atexit.register(os.unlink, path)
    return path


def run_config(
    *profiles: str, file: Path = COMPOSE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f FILE [--profile P]... config` with no variable of the caller's environment but PATH
    and HOME (no CHARON_ or KEYSTONE_ setting of the test machine, no DOCKER_HOST), plus `env`."""
    args = [docker_compose(), "--env-file", _empty_env_file(), "-f", str(file)]
    for profile in profiles:
        args += ["--profile", profile]
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [*args, "config"], env=clean | (env or {}), capture_output=True, text=True, timeout=60, check=False
    )


Run = subprocess.CompletedProcess[str]


@functools.cache
def _cached_run(profiles: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> Run:
    return run_config(*profiles, env=dict(env))


def config_run(*profiles: str, **env: str) -> Run:
    """run_config of COMPOSE, once per profiles and variables for the whole module."""
    return _cached_run(profiles, tuple(sorted(env.items())))


def config(*profiles: str, **env: str) -> dict[str, Any]:
    """The normalised file (every service, whatever the profiles: Compose 1.29 prints them all)."""
    done = config_run(*profiles, **env)
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = yaml.safe_load(done.stdout)
    return loaded


def active(*profiles: str, **env: str) -> dict[str, dict[str, Any]]:
    """The services `docker compose [--profile P]... up` starts: of no profile, or of a profile given."""
    return {
        name: service
        for name, service in config(*profiles, **env)["services"].items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }


def published(service: dict[str, Any]) -> dict[int, int]:
    """Host port -> container port, each published on 127.0.0.1 only (noauth serves any project). Compose
    1.29 prints a port with a host address as `127.0.0.1:8888:8888/tcp`, Compose 2 in the long syntax."""
    ports: dict[int, int] = {}
    for p in service.get("ports", []):
        if isinstance(p, str):
            host_ip, host, target = p.split("/")[0].split(":")
        else:
            host_ip, host, target = p.get("host_ip", ""), p["published"], p["target"]
        assert host_ip == "127.0.0.1", f"port {p} is published on every interface"
        ports[int(host)] = int(target)
    return ports


def mounts(service: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(type, source, target) of each of the service's volumes: `bind` or `volume`."""
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            yield volume["type"], volume["source"], volume["target"]
        else:
            source, target, *_ = volume.split(":")
            yield ("bind" if source.startswith(("/", ".")) else "volume"), source, target


def bind_target(service: dict[str, Any], repo_path: str) -> str:
    """Where the service mounts a file of the repository."""
    found = [t for kind, s, t in mounts(service) if kind == "bind" and Path(s) == ROOT / repo_path]
    assert len(found) == 1, f"{repo_path} is not mounted once: {list(mounts(service))}"
    return found[0]


def charons(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The services that run `charon serve`: those built from deploy/Dockerfile's target `service`."""
    return {n: s for n, s in services.items() if s.get("build", {}).get("target") == "service"}


def script(service: dict[str, Any]) -> str:
    """The `sh -c` script of a service's entrypoint, as the container gets it ($$ is Compose's `$`)."""
    entrypoint = service["entrypoint"]
    assert entrypoint[:2] == ["/bin/sh", "-c"], entrypoint
    return str(entrypoint[2]).replace("$$", "$")


class NoDuplicateKeys(yaml.SafeLoader):
    """PyYAML (and Compose 1.29 with it) keeps the last of two equal keys: here, two are an error."""


def _no_duplicates(loader: NoDuplicateKeys, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [key.value for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge"]  # `<<` merges
    repeated = {key for key in keys if keys.count(key) > 1}
    if repeated:
        raise yaml.constructor.ConstructorError(None, None, f"repeated keys {repeated}", node.start_mark)
    return loader.construct_mapping(node, deep)


NoDuplicateKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


# -- the file as Compose reads it ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profiles", [(), *((p,) for p in PROFILES), PROFILES], ids=lambda p: "+".join(p) or "default"
)
def test_compose_accepts_the_file_with_each_profile_and_no_variable_set(profiles: tuple[str, ...]) -> None:
    """Compose interpolates the whole file whatever the profiles: no `${X:?...}` may stop a profile that does
    not need X, and no variable is left unset (1.29 warns "The X variable is not set")."""
    done = config_run(*profiles)
    assert done.returncode == 0, done.stderr
    assert "is not set" not in done.stderr, done.stderr
    services = active(*profiles)
    assert set(services) == {"charon", "redis"}.union(*(ADDS[p] for p in profiles))
    # whatever is combined, what a service waits for starts with it
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name


def test_a_file_with_a_mistake_is_refused(tmp_path: Path) -> None:
    """The check is real: an unknown key in a service, or a required variable unset in a profile not even
    asked for, makes `docker-compose config` fail."""
    text = COMPOSE.read_text()
    typo = tmp_path / "typo.yml"
    typo.write_text(text.replace("  charon:\n", "  charon:\n    restrat: always\n", 1))
    done = run_config(file=typo)
    assert done.returncode != 0
    assert "restrat" in done.stderr
    required = tmp_path / "required.yml"
    required.write_text(text.replace("${KEYSTONE_ADMIN_PASSWORD:-}", "${KEYSTONE_ADMIN_PASSWORD:?set it}"))
    done = run_config(file=required)  # no --profile keystone
    assert done.returncode != 0
    assert "KEYSTONE_ADMIN_PASSWORD" in done.stderr
    assert config_run().returncode == 0  # the file itself


def test_service_names_and_host_ports_do_not_collide() -> None:
    raw = yaml.load(COMPOSE.read_text(), Loader=NoDuplicateKeys)
    assert set(raw["services"]) == set(config()["services"])
    ports: dict[int, str] = {}
    for name, service in active(*PROFILES).items():
        for port in published(service):
            assert port not in ports, f"{name} and {ports[port]} both publish {port}"
            ports[port] = name
    # the header's URLs are the ports the services publish
    header = "".join(re.findall(r"^#.*\n", COMPOSE.read_text(), re.M))
    assert {int(p) for p in re.findall(r"http://localhost:(\d+)", header)} == set(ports)


def test_every_image_built_is_charons_or_keystones() -> None:
    for name, service in config()["services"].items():
        build = service.get("build")
        if build is None:
            continue
        if name == "keystone":
            assert Path(build["context"]) == DEPLOY / "keystone"
            assert (DEPLOY / "keystone" / build.get("dockerfile", "Dockerfile")).is_file()
            continue
        assert Path(build["context"]) == ROOT, name
        assert build["dockerfile"] == "deploy/Dockerfile", name
        assert build["target"] in {"service", "insights"}, name
        # one image a target, whichever service builds it
        assert (
            service["image"] == {"service": "charon:dev", "insights": "charon-insights:dev"}[build["target"]]
        )
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for target in ("service", "insights"):
        assert re.search(rf"^FROM \S+ AS {target}$", dockerfile, re.M | re.I), target


def test_every_mounted_file_is_in_the_repository_and_every_volume_is_declared() -> None:
    normalised = config()
    for name, service in normalised["services"].items():
        for kind, source, target in mounts(service):
            if kind == "bind":
                path = Path(source)
                assert path.is_relative_to(DEPLOY), f"{name} mounts {source}, outside deploy/"
                assert path.exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in normalised["volumes"], f"{name}: volume {source} is not declared"
            assert target.startswith("/"), target


def test_every_charon_setting_named_is_a_setting() -> None:
    """Settings ignores unknown CHARON_ variables, so a misspelt one would pass silently: each variable of
    every service that runs Charon (deploy/Dockerfile's images) names a setting."""
    for name, service in config(*PROFILES)["services"].items():
        if service.get("build", {}).get("dockerfile") != "deploy/Dockerfile":
            continue
        for variable in service.get("environment", {}):
            if not variable.startswith("CHARON_"):
                continue
            model: type[BaseModel] = Settings
            *parents, leaf = variable.removeprefix("CHARON_").lower().split("__")
            for part in parents:
                model = model.model_fields[part].annotation  # type: ignore[assignment]
            assert leaf in model.model_fields, f"{name}: {variable}"


# -- what `docker compose up` gives --------------------------------------------------------------------------


def test_the_default_is_charon_on_redis_with_its_aof_on() -> None:
    services = active()
    assert set(services) == {"charon", "redis"}
    charon, redis = services["charon"], services["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert ("volume", "redis", "/data") in set(mounts(redis))  # the AOF outlives the container
    env = charon["environment"]
    assert env["CHARON_STORAGE_URI"] == "redis://redis:6379/0"
    assert env["CHARON_HOST"] == "0.0.0.0"
    assert published(charon) == {8888: int(env["CHARON_PORT"])}
    assert charon["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "redis-cli" in redis["healthcheck"]["test"]
    assert "/readyz" in " ".join(charon["healthcheck"]["test"])


def test_the_metrics_token_reaches_every_charon_and_prometheus_only_when_set() -> None:
    """An empty token must not reach Charon (a scrape sending `Bearer ` with nothing would match it)."""
    unset = active(*PROFILES)
    for name, service in charons(unset).items():
        assert service["environment"].get(METRICS_TOKEN) is None, name
    assert unset["prometheus"]["environment"].get(METRICS_TOKEN) is None
    given = active(*PROFILES, **{METRICS_TOKEN: "t0ken"})
    for name in [*charons(given), "prometheus"]:
        assert given[name]["environment"][METRICS_TOKEN] == "t0ken", name


# -- profile mongodb -----------------------------------------------------------------------------------------


def test_the_mongodb_profile_runs_a_charon_on_an_initiated_replica_set() -> None:
    services = active("mongodb")
    mongodb, charon = services["mongodb"], services["charon-mongodb"]
    command = mongodb["command"]
    assert command[command.index("--replSet") + 1] == "rs0"
    check = " ".join(mongodb["healthcheck"]["test"])
    assert "rs.initiate({_id: 'rs0', members: [{_id: 0, host: 'mongodb:27017'}]})" in check
    assert "quit(db.hello().isWritablePrimary ? 0 : 1)" in check  # mongosh --eval alone always exits 0
    uri = urlsplit(charon["environment"]["CHARON_STORAGE_URI"])
    assert (uri.scheme, uri.netloc, uri.query) == ("mongodb", "mongodb:27017", "replicaSet=rs0")
    assert charon["depends_on"]["mongodb"]["condition"] == "service_healthy"
    assert published(charon) == {8889: 8888}


# -- profile pools -------------------------------------------------------------------------------------------


def test_the_pools_profile_has_two_api_replicas_behind_nginx_two_redis_pools_and_a_mongodb_pool() -> None:
    services = active("pools")
    apis = sorted(n for n in charons(services) if n != "charon")
    assert apis == ["pool-api-1", "pool-api-2"]
    for name in apis:
        env = services[name]["environment"]
        assert env["CHARON_POOLING"] == "true"
        assert env["CHARON_ADMIN_MODE"] == "true"
        assert urlsplit(env["CHARON_MANAGEMENT_URI"]).netloc == "pool-catalogue:6379"
        assert "ports" not in services[name]  # reached through nginx
    register = services["pool-register"]
    script_file = bind_target(register, "deploy/register-pools.sh")
    assert register["entrypoint"] == ["/bin/sh", script_file]
    text = (DEPLOY / "register-pools.sh").read_text()
    uris = re.findall(r'"uri": "([a-z+]+)://([a-z0-9-]+):', text)
    assert sorted(uris) == [("mongodb", "mongodb"), ("redis", "pool-redis-a"), ("redis", "pool-redis-b")]
    assert {host for _, host in uris} <= set(services)
    # the MongoDB pool is not the database the mongodb profile's Charon uses
    assert "mongodb://mongodb:27017/charon_pool?replicaSet=rs0" in text
    assert urlsplit(register["environment"]["API"]).netloc == f"{apis[0]}:8888"
    lb = services["pool-lb"]
    assert bind_target(lb, "deploy/nginx.conf") == "/etc/nginx/nginx.conf"
    upstream = (DEPLOY / "nginx.conf").read_text()
    assert sorted(re.findall(r"^\s*server ([\w-]+):8888;", upstream, re.M)) == apis
    assert 'proxy_set_header X-Roles "";' in upstream
    assert published(lb) == {8890: 8888}
    for name in ("pool-catalogue", "pool-redis-a", "pool-redis-b"):
        assert services[name]["command"] == services["redis"]["command"], name  # AOF on
        assert ("volume", name, "/data") in set(mounts(services[name]))


# -- profile keystone ----------------------------------------------------------------------------------------


def test_the_keystone_profile_wires_charon_to_its_keystone() -> None:
    services = active("keystone", **dict.fromkeys(KEYSTONE_SECRETS, "s"))
    charon, keystone = services["charon-keystone"], services["keystone"]
    env, ks_env = charon["environment"], keystone["environment"]
    assert env["CHARON_AUTH"] == "keystone"
    # Charon asks the compose service `keystone`, once it is healthy, as the user register.py makes there
    assert urlsplit(env["CHARON_KEYSTONE__AUTH_URL"]).netloc == "keystone:5000"
    assert charon["depends_on"]["keystone"]["condition"] == "service_healthy"
    assert "5000/v3" in " ".join(keystone["healthcheck"]["test"])
    assert env["CHARON_KEYSTONE__USERNAME"] == ks_env["CHARON_SERVICE_USER"]
    assert env["CHARON_KEYSTONE__PROJECT_NAME"] == ks_env["CHARON_SERVICE_PROJECT"]
    assert env["CHARON_KEYSTONE__PASSWORD"] == ks_env["CHARON_SERVICE_PASSWORD"] == "s"  # the same variable
    assert env["CHARON_SIGNED_URL_KEY"] == "s"
    assert (
        env["CHARON_KEYSTONE__USER_DOMAIN_NAME"] == env["CHARON_KEYSTONE__PROJECT_DOMAIN_NAME"] == "Default"
    )
    assert env["CHARON_KEYSTONE__WWW_AUTHENTICATE_URI"] == ks_env["KEYSTONE_PUBLIC_URL"]
    # its own store: not the default Charon's database
    assert env["CHARON_STORAGE_URI"] != services["charon"]["environment"]["CHARON_STORAGE_URI"]
    # the catalogue's messaging endpoints are this Charon: inside compose and as published on the host
    assert urlsplit(ks_env["MESSAGING_INTERNAL_URL"]).netloc == "charon-keystone:8888"
    assert published(charon) == {urlsplit(ks_env["MESSAGING_PUBLIC_URL"]).port: 8888}
    assert ("volume", "keystone", "/var/lib/keystone") in set(mounts(keystone))
    assert published(keystone) == {5000: 5000}


def test_without_its_secrets_the_keystone_profile_does_not_start(tmp_path: Path) -> None:
    """Not the file (that would stop every profile) but each container refuses an empty secret: keystone's
    entrypoint.sh, and charon-keystone's check before `charon serve`."""
    unset = active("keystone")
    for name in KEYSTONE_SECRETS[:2]:
        assert unset["keystone"]["environment"][name] == ""
        assert re.search(rf'^: "\$\{{{name}:\?', (DEPLOY / "keystone" / "entrypoint.sh").read_text(), re.M)
    guard = script(unset["charon-keystone"])
    assert guard.rstrip().endswith("exec charon serve")
    stub = tmp_path / "charon"
    stub.write_text('#!/bin/sh\necho "charon $*"\n')
    stub.chmod(0o755)
    path = f"{tmp_path}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def start(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-c", guard], env={"PATH": path, **env}, capture_output=True, text=True, check=False
        )

    refused = start(CHARON_KEYSTONE__PASSWORD="", CHARON_SIGNED_URL_KEY="k")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert "set CHARON_SERVICE_PASSWORD" in refused.stderr
    refused = start(CHARON_KEYSTONE__PASSWORD="p", CHARON_SIGNED_URL_KEY="")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert "set CHARON_SIGNED_URL_KEY" in refused.stderr
    started = start(CHARON_KEYSTONE__PASSWORD="p", CHARON_SIGNED_URL_KEY="k")
    assert (started.returncode, started.stdout) == (0, "charon serve\n")


# -- profile observability -----------------------------------------------------------------------------------


def prometheus_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    return loaded


def test_prometheus_loads_the_projects_rules_and_scrapes_every_charon_with_the_token() -> None:
    services = active(*PROFILES)
    prometheus = services["prometheus"]
    config_at = bind_target(prometheus, "deploy/prometheus/prometheus.yml")
    rules_at = bind_target(prometheus, "deploy/prometheus/alerts.yml")
    loaded = prometheus_config()
    # rule files are relative to the configuration file: the project's alerts.yml, in the container too
    assert [str(Path(config_at).parent / f) for f in loaded["rule_files"]] == [rules_at]
    assert [(DEPLOY / "prometheus" / f).resolve() for f in loaded["rule_files"]] == [
        (DEPLOY / "prometheus" / "alerts.yml").resolve()
    ]
    entry = script(prometheus)
    assert f"--config.file={config_at}" in entry
    [job] = loaded["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    token_file = job["authorization"]["credentials_file"]
    assert f'printf %s "${METRICS_TOKEN}" > {token_file}' in entry
    static = [t for c in job["static_configs"] for t in c["targets"]]
    found = [f"{n}:{c['port']}" for c in job["dns_sd_configs"] for n in c["names"]]
    assert sorted(static + found) == sorted(f"{n}:8888" for n in charons(services))
    assert static == ["charon:8888"]


def test_promtool_accepts_the_prometheus_configuration(tmp_path: Path) -> None:
    """`promtool check config` also loads the rule files and wants the token file: a copy beside a token file
    and alerts.yml, the token file's path its only change."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make system-deps` installs Debian's prometheus", pytrace=False)
    loaded = prometheus_config()
    token_file = loaded["scrape_configs"][0]["authorization"]["credentials_file"]
    (tmp_path / "token").write_text("t0ken")
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(text.replace(token_file, str(tmp_path / "token")))
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path)
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout


def test_prometheus_refuses_to_start_without_the_token_and_writes_it_for_the_scrape(tmp_path: Path) -> None:
    entry = script(active("observability")["prometheus"])
    entry = entry.replace("/bin/prometheus ", f"{tmp_path}/prometheus ")  # a stub that says how it was run
    entry = entry.replace("/prometheus/", f"{tmp_path}/")  # the data directory
    stub = tmp_path / "prometheus"
    stub.write_text('#!/bin/sh\necho "prometheus $*"\n')
    stub.chmod(0o755)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    refused = subprocess.run(
        ["/bin/sh", "-c", entry], env={"PATH": path, METRICS_TOKEN: ""}, capture_output=True, text=True
    )
    assert (refused.returncode, refused.stdout) == (1, "")
    assert f"set {METRICS_TOKEN}" in refused.stderr
    assert not (tmp_path / "charon-metrics-token").exists()
    started = subprocess.run(
        ["/bin/sh", "-c", entry], env={"PATH": path, METRICS_TOKEN: "t0ken"}, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("prometheus --config.file=")
    token = tmp_path / "charon-metrics-token"
    assert token.read_text() == "t0ken"
    assert token.stat().st_mode & 0o077 == 0


def test_grafana_is_provisioned_with_prometheus_and_the_projects_dashboard() -> None:
    services = active("observability")
    grafana = services["grafana"]
    provisioning = DEPLOY / "grafana" / "provisioning"
    datasources_at = bind_target(grafana, "deploy/grafana/provisioning/datasources")
    dashboards_at = bind_target(grafana, "deploy/grafana/provisioning/dashboards")
    assert datasources_at == "/etc/grafana/provisioning/datasources"
    assert dashboards_at == "/etc/grafana/provisioning/dashboards"
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus"  # the dashboard's `datasource` variable asks for this type
    assert source["isDefault"] is True
    url = urlsplit(source["url"])
    assert url.hostname == "prometheus"
    assert url.port == 9090  # Prometheus' own port (no --web.listen-address), in the network
    assert "--web.listen-address" not in script(services["prometheus"])
    assert published(services["prometheus"]) == {9090: 9090}
    [provider] = yaml.safe_load((provisioning / "dashboards" / "charon.yml").read_text())["providers"]
    assert provider["type"] == "file"
    dashboard_at = bind_target(grafana, "deploy/grafana/charon.json")
    assert str(Path(dashboard_at).parent) == provider["options"]["path"]
    assert dashboard_at.endswith(".json")
    board = yaml.safe_load((DEPLOY / "grafana" / "charon.json").read_text())  # JSON is YAML
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == source["type"]
    assert published(grafana) == {3000: 3000}


# -- profile insights ----------------------------------------------------------------------------------------


def test_the_insights_profile_runs_charon_insights_on_a_spark_cluster_over_the_default_store() -> None:
    services = active("insights")
    master, worker, run = services["spark-master"], services["spark-worker"], services["charon-insights"]
    for service in (master, worker, run):
        assert service["build"]["target"] == "insights"
        # the executors run the driver's Python: the same, in the same image
        assert service["environment"]["PYSPARK_PYTHON"] == "/opt/charon/bin/python"
    assert master["entrypoint"] == worker["entrypoint"] == ["spark-class"]
    command = master["command"]
    assert command[0] == "org.apache.spark.deploy.master.Master"
    url = f"spark://{command[command.index('--host') + 1]}:{command[command.index('--port') + 1]}"
    assert url == "spark://spark-master:7077"
    assert worker["command"][:2] == ["org.apache.spark.deploy.worker.Worker", url]
    args = run["command"]
    assert args[0] == "insights"  # the image's entrypoint is `charon`
    assert args[args.index("--master") + 1] == url
    # the dead letters of the Charon every `docker compose up` runs
    assert run["environment"]["CHARON_STORAGE_URI"] == services["charon"]["environment"]["CHARON_STORAGE_URI"]
    assert run["depends_on"]["redis"]["condition"] == "service_healthy"
    # --out is written by the driver and the executors: one volume, at the same path in both
    out = args[args.index("--out") + 1]
    [(volume, at)] = [(s, t) for kind, s, t in mounts(run) if kind == "volume" and out.startswith(t + "/")]
    assert ("volume", volume, at) in set(mounts(worker))
    assert published(master) == {8080: 8080}


def test_the_spark_scripts_are_where_a_pip_installed_pyspark_puts_them() -> None:
    """spark-class (the services' entrypoint) comes with PySpark's wheel into the virtualenv's bin/, and finds
    SPARK_HOME by running PYSPARK_PYTHON (or python3) on find_spark_home.py: the Python that has pyspark."""
    pyspark = pytest.importorskip("pyspark", reason="the [insights] extra is not installed")
    bin_dir = Path(sys.prefix) / "bin"
    spark_class = bin_dir / "spark-class"
    assert spark_class.is_file(), f"no spark-class in {bin_dir}"
    finder = (bin_dir / "find-spark-home").read_text()
    assert 'PYSPARK_DRIVER_PYTHON="${PYSPARK_PYTHON:-"python3"}"' in finder
    done = subprocess.run(
        [str(bin_dir / "python"), str(bin_dir / "find_spark_home.py")],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(done.stdout.strip()) == Path(pyspark.__file__).parent
    assert (Path(done.stdout.strip()) / "jars").is_dir()


# -- the files that pointed at the old compose files ---------------------------------------------------------


def test_nothing_under_deploy_names_the_removed_compose_files() -> None:
    for path in [COMPOSE, *DEPLOY.rglob("*")]:
        if path.is_file() and path.suffix in {".md", ".yml", ".yaml", ".sh", ".conf", ".py", ""}:
            text = path.read_text(errors="replace")
            assert "docker-compose.pools" not in text, path
            assert "docker-compose.keystone" not in text, path
    assert "--profile keystone up" in (DEPLOY / "KEYSTONE.md").read_text()
