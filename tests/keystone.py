"""A real OpenStack Keystone for the tests: keystone 30.0.0 from its own virtualenv (.venv-keystone, made by
`make install`), on SQLite and Fernet tokens in a temporary directory it owns, served by gunicorn on a free
loopback port, with a fixed set of projects, users and role assignments (see KeystoneServer).

Everything Keystone writes stays in that directory: keystone.conf names every key repository, because
`keystone-manage fernet_setup` also sets up [fernet_receipts] key_repository, whose default is
/etc/keystone/fernet-keys/ (that is how an earlier experiment wrote there). start() checks that nothing under
/etc/keystone changed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.servers import free_port, spawn

KEYSTONE_VENV = Path(__file__).resolve().parents[1] / ".venv-keystone"
KEYSTONE_MANAGE = KEYSTONE_VENV / "bin" / "keystone-manage"
GUNICORN = KEYSTONE_VENV / "bin" / "gunicorn"
ETC_KEYSTONE = Path("/etc/keystone")

# Every user's password (the bootstrap admin's too).
PASSWORD = "charon-test-password"
DOMAIN_ID = "default"
DOMAIN_NAME = "Default"
SERVICE_USER = "charon"
SERVICE_PROJECT = "service"
# user -> [(role, project)]. admin is the bootstrap admin (also admin on the system and on project `admin`);
# carol holds a role that is neither member nor admin. Keystone's implied roles expand in tokens:
# admin -> manager -> member -> reader, so alice's token lists member and reader.
ASSIGNMENTS: dict[str, list[tuple[str, str]]] = {
    "admin": [("admin", "alpha")],
    "alice": [("member", "alpha")],
    "bob": [("member", "beta")],
    "carol": [("reader", "alpha")],
    SERVICE_USER: [("admin", SERVICE_PROJECT), ("service", SERVICE_PROJECT)],
}
PROJECTS = ["alpha", "beta", SERVICE_PROJECT]
ROLES = ["admin", "member", "reader", "service"]
# The admin token is renewed well before Keystone's default 1 h expiry.
ADMIN_TOKEN_TTL_S = 1800.0

WSGI_MODULE = """\
import sys

sys.argv = sys.argv[:1]  # else oslo.config parses gunicorn's arguments and the worker exits with code 2
from keystone.wsgi.api import application  # noqa: E402,F401
"""


def available() -> bool:
    return KEYSTONE_MANAGE.exists() and GUNICORN.exists()


def etc_keystone_state() -> list[tuple[str, int]] | None:
    """Every path under /etc/keystone with its mtime (None when there is no /etc/keystone)."""
    if not ETC_KEYSTONE.exists():
        return None
    paths = [ETC_KEYSTONE, *ETC_KEYSTONE.rglob("*")]
    return sorted((str(p), p.lstat().st_mtime_ns) for p in paths)


class KeystoneServer:
    """Keystone on http://127.0.0.1:<free port>/v3 with projects alpha, beta and service; users admin (admin
    on alpha, and the bootstrap admin), alice (member on alpha), bob (member on beta), carol (reader on alpha)
    and charon (admin and service on service: the service user that validates other users' tokens), all with
    password PASSWORD."""

    name = "keystone (gunicorn)"

    def __init__(self) -> None:
        self.port = free_port()
        self.password = PASSWORD
        self.project_ids: dict[str, str] = {}
        self.user_ids: dict[str, str] = {}
        self.role_ids: dict[str, str] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="charon-keystone-")
        self.dir = Path(self._tmp.name)
        self.conf = self.dir / "keystone.conf"
        self.proc: subprocess.Popen[bytes] | None = None
        self._http = httpx.Client(timeout=30)
        self._admin_token: tuple[str, float] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "PYTHON"))}
        self.env["OS_KEYSTONE_CONFIG_FILES"] = str(self.conf)

    @property
    def url(self) -> str:
        """The auth URL."""
        return f"http://127.0.0.1:{self.port}/v3"

    # -- start and stop --------------------------------------------------------------------------------------

    def start(self) -> KeystoneServer:
        if not available():
            raise RuntimeError(f"Keystone is not installed in {KEYSTONE_VENV}: run `make install`")
        before = etc_keystone_state()
        try:
            self._configure()
            self._manage("db_sync")
            # write-ahead logging: readers (token validation) and the one writer do not block each other
            with contextlib.closing(sqlite3.connect(self.dir / "keystone.db")) as db:
                db.execute("PRAGMA journal_mode=WAL")
            self._manage("fernet_setup", "--keystone-user", "root", "--keystone-group", "root")
            self._manage("credential_setup", "--keystone-user", "root", "--keystone-group", "root")
            self._manage(
                "bootstrap",
                "--bootstrap-password", PASSWORD,
                "--bootstrap-username", "admin",
                "--bootstrap-project-name", "admin",
                "--bootstrap-role-name", "admin",
                "--bootstrap-admin-url", self.url,
                "--bootstrap-internal-url", self.url,
                "--bootstrap-public-url", self.url,
                "--bootstrap-region-id", "RegionOne",
            )  # fmt: skip
            self._serve()
            self._populate()
        except BaseException:
            self.stop()
            raise
        after = etc_keystone_state()
        if after != before:
            self.stop()
            raise RuntimeError(f"Keystone wrote under {ETC_KEYSTONE}: {before} -> {after}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # gunicorn's arbiter stops its workers on SIGTERM
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._http.close()
        self._tmp.cleanup()

    def keep_logs(self, into: Path) -> None:
        """Copy Keystone's logs into `into` (before stop(), which removes its directory)."""
        for name in ("gunicorn.log", "keystone.log"):
            if (self.dir / name).exists():
                shutil.copy(self.dir / name, into / f"keystone-{name}")

    def _configure(self) -> None:
        d = self.dir
        for sub in ("fernet-keys", "credential-keys"):
            (d / sub).mkdir(mode=0o700)
        (d / "charon_keystone_wsgi.py").write_text(WSGI_MODULE)
        self.conf.write_text(
            f"""\
[DEFAULT]
log_file = {d}/keystone.log
use_stderr = false
debug = false

[database]
# A writer waits up to 30 s for another's lock (pysqlite's default is 5 s: tempest's two workers making
# their users and projects while tokens are validated met "database is locked" under a loaded CI machine)
connection = sqlite:///{d}/keystone.db?timeout=30

[token]
provider = fernet

[fernet_tokens]
key_repository = {d}/fernet-keys

# fernet_setup sets this repository up too (default /etc/keystone/fernet-keys/): the tokens' one
[fernet_receipts]
key_repository = {d}/fernet-keys

[credential]
key_repository = {d}/credential-keys

[identity]
# bcrypt's fewest rounds: every token request checks a password (12 rounds: ~0.25 s each)
password_hash_rounds = 4

[cache]
enabled = false
"""
        )

    def _manage(self, *args: str) -> None:
        cmd = [str(KEYSTONE_MANAGE), "--config-file", str(self.conf), *args]
        done = subprocess.run(cmd, env=self.env, cwd=self.dir, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"keystone-manage {args[0]} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
                f"{self._log_tail()}"
            )

    def _serve(self) -> None:
        args = [str(GUNICORN), "--bind", f"127.0.0.1:{self.port}", "--workers", "2", "--threads", "4"]
        args += ["--pythonpath", str(self.dir), "--chdir", str(self.dir), "--graceful-timeout", "5"]
        # gunicorn 27 opens a control socket at ~/.gunicorn/gunicorn.ctl by default: outside the directory,
        # and one path for every gunicorn of the user
        args += ["--no-control-socket", "charon_keystone_wsgi:application"]
        with open(self.dir / "gunicorn.log", "ab") as log:  # the child has its own copy
            self.proc = spawn(
                args, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited at start (code {self.proc.returncode}){self._log_tail()}"
                )
            try:
                if self._http.get(self.url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer GET /v3 in 60 s{self._log_tail()}")

    def _log_tail(self, lines: int = 40) -> str:
        out = []
        for name in ("gunicorn.log", "keystone.log"):
            path = self.dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"\n--- {path} (last {lines} lines) ---\n" + "\n".join(tail))
        return "".join(out)

    # -- the test data ---------------------------------------------------------------------------------------

    def _populate(self) -> None:
        for role in ROLES:
            self.role_ids[role] = self._find("roles", role) or self._create("roles", {"name": role})
        for project in ["admin", *PROJECTS]:
            self.project_ids[project] = self._find("projects", project) or self._create(
                "projects", {"name": project, "domain_id": DOMAIN_ID}
            )
        for user, grants in ASSIGNMENTS.items():
            self.user_ids[user] = self._find("users", user) or self._create(
                "users", {"name": user, "password": PASSWORD, "domain_id": DOMAIN_ID}
            )
            for role, project in grants:
                project_id, user_id, role_id = (
                    self.project_ids[project],
                    self.user_ids[user],
                    self.role_ids[role],
                )
                self._admin("PUT", f"/projects/{project_id}/users/{user_id}/roles/{role_id}", expect=204)

    def _find(self, kind: str, name: str) -> str | None:
        found = self._admin("GET", f"/{kind}", params={"name": name}).json()[kind]
        return str(found[0]["id"]) if found else None

    def _create(self, kind: str, body: dict[str, str]) -> str:
        key = kind[:-1]
        return str(self._admin("POST", f"/{kind}", json={key: body}, expect=201).json()[key]["id"])

    def _admin(self, method: str, path: str, *, expect: int = 200, **kwargs: object) -> httpx.Response:
        response = self._http.request(
            method,
            self.url + path,
            headers={"X-Auth-Token": self.admin_token()},
            **kwargs,  # type: ignore[arg-type]
        )
        if response.status_code != expect:
            raise RuntimeError(f"keystone: {method} {path} answered {response.status_code}: {response.text}")
        return response

    # -- public API ------------------------------------------------------------------------------------------

    def admin_token(self) -> str:
        """A system-scoped token of the bootstrap admin (cached; Keystone's policies for creating projects,
        users and grants want the system scope)."""
        if self._admin_token is None or time.monotonic() > self._admin_token[1]:
            token = self._issue({"system": {"all": True}}, "admin")
            self._admin_token = (token, time.monotonic() + ADMIN_TOKEN_TTL_S)
        return self._admin_token[0]

    def token(self, user: str, project: str = "alpha") -> str:
        """A fresh password token of `user` scoped to `project` (a name in project_ids)."""
        return self._issue({"project": {"id": self.project_ids[project]}}, user)

    def revoke(self, token: str) -> None:
        """Revoke `token` (DELETE /v3/auth/tokens with the admin token)."""
        response = self._http.delete(
            f"{self.url}/auth/tokens",
            headers={"X-Auth-Token": self.admin_token(), "X-Subject-Token": token},
        )
        if response.status_code != 204:
            raise RuntimeError(f"keystone: revoking a token answered {response.status_code}: {response.text}")

    def register_messaging(self, url: str) -> None:
        """Make `url` the catalog's public messaging endpoint in RegionOne (replacing any an earlier caller
        put): where openstacksdk, the `openstack messaging` CLI and tempest find Charon."""
        services = self._admin("GET", "/services", params={"type": "messaging"}).json()["services"]
        if services:
            service_id = services[0]["id"]
        else:
            service_id = self._create("services", {"type": "messaging", "name": "zaqar"})
        endpoints = self._admin("GET", "/endpoints", params={"service_id": service_id}).json()["endpoints"]
        for endpoint in endpoints:
            self._admin("DELETE", f"/endpoints/{endpoint['id']}", expect=204)
        body = {"service_id": service_id, "interface": "public", "url": url, "region_id": "RegionOne"}
        self._create("endpoints", body)

    def service_credentials(self) -> dict[str, str]:
        """The password credentials of the service user `charon` (admin and service on project `service`)."""
        return {
            "auth_url": self.url,
            "username": SERVICE_USER,
            "password": PASSWORD,
            "project_name": SERVICE_PROJECT,
            "user_domain_name": DOMAIN_NAME,
            "project_domain_name": DOMAIN_NAME,
        }

    def _issue(self, scope: dict[str, object], user: str) -> str:
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {"user": {"name": user, "domain": {"id": DOMAIN_ID}, "password": PASSWORD}},
                },
                "scope": scope,
            }
        }
        response = self._http.post(f"{self.url}/auth/tokens", json=body)
        if response.status_code != 201:
            raise RuntimeError(
                f"keystone: a token for {user} answered {response.status_code}: {response.text}"
            )
        return response.headers["X-Subject-Token"]
