"""What Charon needs in Keystone, made through its v3 API as the bootstrap admin (entrypoint.sh runs this
against a Keystone it serves on loopback only). Idempotent: each thing is looked up by name and made only when
missing; the service user's password and the messaging endpoints' URLs are set to what the environment says.

- project `service` (CHARON_SERVICE_PROJECT) and the service user `charon` (CHARON_SERVICE_USER,
  CHARON_SERVICE_PASSWORD) with the roles `service` and `admin` on it: the user Charon validates tokens as
  (CHARON_KEYSTONE__*);
- the service of type `messaging` (name MESSAGING_SERVICE_NAME) with a public endpoint at MESSAGING_PUBLIC_URL
  and, when set, an internal one at MESSAGING_INTERNAL_URL, in KEYSTONE_REGION: what `openstack messaging ...`
  (python-zaqarclient) finds in the catalogue;
- with KEYSTONE_DEMO_PASSWORD set: project `demo` and user `demo` with the `member` role on it, to try the
  service with (KEYSTONE_DEMO_USER, KEYSTONE_DEMO_PROJECT).

Only the standard library: it runs with the image's python, which has nothing but Keystone installed.
"""

# ruff: noqa: T201  (a script: it reports what it made on stdout, the container's log)
from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

URL = os.environ.get("KEYSTONE_SETUP_URL", "http://127.0.0.1:5001/v3").rstrip("/")
DOMAIN_ID = "default"  # made by keystone-manage bootstrap (name "Default")
REGION = os.environ.get("KEYSTONE_REGION", "RegionOne")


class Failed(Exception):
    pass


def call(
    method: str, path: str, *, token: str | None = None, body: Any = None, expect: tuple[int, ...] = (200,)
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["X-Auth-Token"] = token
    # URL is entrypoint.sh's http://127.0.0.1:<setup port>/v3
    request = urllib.request.Request(URL + path, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            status, raw, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, got = exc.code, exc.read(), dict(exc.headers)
    if status not in expect:
        raise Failed(f"{method} {path} answered {status}: {raw.decode(errors='replace')[:500]}")
    return status, (json.loads(raw) if raw else None), got


def wait_until_up(seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            call("GET", "")
            return
        except (urllib.error.URLError, ConnectionError, Failed):
            if time.monotonic() > deadline:
                raise Failed(f"Keystone at {URL} did not answer GET /v3 in {seconds:.0f} s") from None
            time.sleep(0.5)


def issue(user: str, password: str, scope: dict[str, Any]) -> str | None:
    """A token of `user`, or None when Keystone refuses the password (401)."""
    body = {
        "auth": {
            "identity": {
                "methods": ["password"],
                "password": {"user": {"name": user, "domain": {"id": DOMAIN_ID}, "password": password}},
            },
            "scope": scope,
        }
    }
    status, _, headers = call("POST", "/auth/tokens", body=body, expect=(201, 401))
    return headers.get("X-Subject-Token") if status == 201 else None


class Admin:
    def __init__(self, token: str) -> None:
        self.token = token

    def get(self, path: str, **query: str) -> Any:
        return call("GET", f"{path}?{urllib.parse.urlencode(query)}", token=self.token)[1]

    def ensure(self, kind: str, body: dict[str, Any], **query: str) -> str:
        """The id of the one `kind` (projects, users, roles, services) matching `query`, made from `body` if
        there is none."""
        found = self.get(f"/{kind}", **query)[kind]
        if found:
            return str(found[0]["id"])
        key = kind[:-1]
        made = call("POST", f"/{kind}", token=self.token, body={key: body}, expect=(201,))[1][key]
        print(f"register: made {key} {body.get('name', body.get('type'))} ({made['id']})", flush=True)
        return str(made["id"])

    def grant(self, role: str, project_id: str, user_id: str) -> None:
        role_id = self.ensure("roles", {"name": role}, name=role)
        path = f"/projects/{project_id}/users/{user_id}/roles/{role_id}"
        call("PUT", path, token=self.token, expect=(204,))

    def user(self, name: str, password: str, project: str, roles: list[str]) -> None:
        """User `name` with `password` and `roles` on `project` (both in the default domain)."""
        project_id = self.ensure(
            "projects", {"name": project, "domain_id": DOMAIN_ID}, name=project, domain_id=DOMAIN_ID
        )
        user_id = self.ensure(
            "users",
            {"name": name, "password": password, "domain_id": DOMAIN_ID, "default_project_id": project_id},
            name=name,
            domain_id=DOMAIN_ID,
        )
        for role in roles:
            self.grant(role, project_id, user_id)
        scope = {"project": {"id": project_id}}
        if issue(name, password, scope) is None:  # an existing user whose password was changed here
            call("PATCH", f"/users/{user_id}", token=self.token, body={"user": {"password": password}})
            print(f"register: set the password of user {name}", flush=True)
            if issue(name, password, scope) is None:
                raise Failed(
                    f"user {name} cannot get a token on project {project} after its password was set"
                )
        print(f"register: user {name} has {', '.join(roles)} on project {project}", flush=True)

    def endpoint(self, service_id: str, interface: str, url: str) -> None:
        found = self.get("/endpoints", service_id=service_id, interface=interface)["endpoints"]
        found = [e for e in found if e.get("region_id") == REGION]
        if not found:
            body = {"service_id": service_id, "interface": interface, "url": url, "region_id": REGION}
            call("POST", "/endpoints", token=self.token, body={"endpoint": body}, expect=(201,))
        elif found[0]["url"] != url or not found[0].get("enabled", True):
            change = {"url": url, "enabled": True}
            call("PATCH", f"/endpoints/{found[0]['id']}", token=self.token, body={"endpoint": change})
        print(f"register: messaging {interface} endpoint {url} ({REGION})", flush=True)


def main() -> int:
    env = os.environ
    wait_until_up()
    token = issue("admin", env["KEYSTONE_ADMIN_PASSWORD"], {"system": {"all": True}})
    if token is None:
        raise Failed("the bootstrap admin cannot get a system-scoped token with KEYSTONE_ADMIN_PASSWORD")
    admin = Admin(token)

    admin.user(
        env.get("CHARON_SERVICE_USER", "charon"),
        env["CHARON_SERVICE_PASSWORD"],
        env.get("CHARON_SERVICE_PROJECT", "service"),
        ["service", "admin"],
    )

    name = env.get("MESSAGING_SERVICE_NAME", "charon")
    services = [s for s in admin.get("/services", type="messaging")["services"] if s.get("name") == name]
    if services:
        service_id = str(services[0]["id"])
    else:
        body = {"type": "messaging", "name": name, "description": "Charon (Zaqar v2 API)", "enabled": True}
        made = call("POST", "/services", token=admin.token, body={"service": body}, expect=(201,))[1]
        service_id = str(made["service"]["id"])
        print(f"register: made service messaging ({name}, {service_id})", flush=True)
    admin.endpoint(service_id, "public", env.get("MESSAGING_PUBLIC_URL", "http://localhost:8888"))
    if env.get("MESSAGING_INTERNAL_URL"):
        admin.endpoint(service_id, "internal", env["MESSAGING_INTERNAL_URL"])

    if env.get("KEYSTONE_DEMO_PASSWORD"):
        admin.user(
            env.get("KEYSTONE_DEMO_USER", "demo"),
            env["KEYSTONE_DEMO_PASSWORD"],
            env.get("KEYSTONE_DEMO_PROJECT", "demo"),
            ["member"],
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failed as exc:
        print(f"register: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
