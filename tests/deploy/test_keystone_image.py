"""deploy/keystone/: the Keystone image of docker-compose.yml's `keystone` profile installs the Keystone the
tests run against, and its entrypoint runs for real against .venv-keystone (docker-compose.yml itself:
tests/deploy/test_compose.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.keystone import KEYSTONE_VENV, etc_keystone_state
from tests.keystone import available as keystone_available
from tests.servers import free_port, spawn

KEYSTONE = Path(__file__).resolve().parents[2] / "deploy" / "keystone"
ENTRYPOINT = KEYSTONE / "entrypoint.sh"


def test_the_keystone_image_installs_the_tested_keystone_and_copies_its_files() -> None:
    dockerfile = (KEYSTONE / "Dockerfile").read_text()
    assert "keystone==30.0.0" in dockerfile  # what tests/keystone.py runs against
    copied = re.search(r"^COPY (.+) /opt/keystone/$", dockerfile, re.M)
    assert copied is not None
    assert all((KEYSTONE / name).is_file() for name in copied.group(1).split())
    assert re.search(r'^ENTRYPOINT \["bash", "/opt/keystone/entrypoint.sh"\]$', dockerfile, re.M)


def test_the_keystone_entrypoint_and_register_script_parse() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    subprocess.run([bash, "-n", str(ENTRYPOINT)], check=True)
    compile((KEYSTONE / "register.py").read_text(), "register.py", "exec")


def _wait_for(url: str, proc: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"entrypoint.sh exited with {proc.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {seconds} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()  # the entrypoint execs gunicorn, whose arbiter stops its workers on SIGTERM
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _password_token(url: str, user: str, password: str, project: str) -> httpx.Response:
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {"user": {"name": user, "domain": {"id": "default"}, "password": password}},
            },
            "scope": {"project": {"name": project, "domain": {"id": "default"}}},
        }
    }
    return httpx.post(f"{url}/auth/tokens", json=body, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_keystone_entrypoint_bootstraps_registers_and_restarts(tmp_path: Path) -> None:
    """entrypoint.sh for real, outside a container (keystone from .venv-keystone), started twice on the same
    data: the service user validates a demo user's token, the catalogue has the messaging endpoints, and the
    second start keeps the keys and takes the new endpoint URL and service password."""
    if not keystone_available():
        pytest.skip("Keystone is not installed in .venv-keystone (make install)")
    before = etc_keystone_state()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v3"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "PYTHON", "KEYSTONE_", "CHARON_"))}
    env |= {
        "PATH": f"{KEYSTONE_VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        "KEYSTONE_DATA_DIR": str(tmp_path / "data"),
        "KEYSTONE_CONF": str(tmp_path / "etc" / "keystone.conf"),
        "KEYSTONE_PORT": str(port),
        "KEYSTONE_SETUP_PORT": str(free_port()),
        "KEYSTONE_PUBLIC_URL": url,
        "KEYSTONE_INTERNAL_URL": "http://keystone:5000/v3",
        "KEYSTONE_WORKERS": "1",
        "KEYSTONE_ADMIN_PASSWORD": "admin-pw",
        "CHARON_SERVICE_PASSWORD": "service-pw",
        "KEYSTONE_DEMO_PASSWORD": "demo-pw",
        "MESSAGING_PUBLIC_URL": "http://localhost:8888",
        "MESSAGING_INTERNAL_URL": "http://charon:8888",
    }

    def start(log: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / log, "wb") as out:
            return spawn(
                ["bash", str(ENTRYPOINT)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    proc = start("first.log")
    try:
        _wait_for(url, proc, 300)
        service = _password_token(url, "charon", "service-pw", "service")
        assert service.status_code == 201, service.text
        assert {r["name"] for r in service.json()["token"]["roles"]} >= {"service", "admin"}
        demo = _password_token(url, "demo", "demo-pw", "demo")
        assert demo.status_code == 201, demo.text
        headers = {
            "X-Auth-Token": service.headers["X-Subject-Token"],
            "X-Subject-Token": demo.headers["X-Subject-Token"],
        }
        validated = httpx.get(f"{url}/auth/tokens", headers=headers, timeout=30)
        assert validated.status_code == 200, validated.text  # what Charon does with every request's token
        assert validated.json()["token"]["project"]["name"] == "demo"
        catalog = {s["type"]: s for s in demo.json()["token"]["catalog"]}
        endpoints = {e["interface"]: e["url"] for e in catalog["messaging"]["endpoints"]}
        assert endpoints == {"public": "http://localhost:8888", "internal": "http://charon:8888"}
    finally:
        _stop(proc)
    keys = sorted(p.read_bytes() for p in (tmp_path / "data" / "fernet-keys").iterdir())

    env |= {"MESSAGING_PUBLIC_URL": "http://charon.example:8888", "CHARON_SERVICE_PASSWORD": "service-pw-2"}
    proc = start("second.log")
    try:
        _wait_for(url, proc, 300)
        assert sorted(p.read_bytes() for p in (tmp_path / "data" / "fernet-keys").iterdir()) == keys
        assert _password_token(url, "charon", "service-pw", "service").status_code == 401
        demo = _password_token(url, "demo", "demo-pw", "demo")
        assert demo.status_code == 201, demo.text
        catalog = {s["type"]: s for s in demo.json()["token"]["catalog"]}
        messaging = [e for e in catalog["messaging"]["endpoints"] if e["interface"] == "public"]
        assert [e["url"] for e in messaging] == ["http://charon.example:8888"]
        assert _password_token(url, "charon", "service-pw-2", "service").status_code == 201
    finally:
        _stop(proc)
    assert etc_keystone_state() == before
