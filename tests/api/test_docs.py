"""The documentation pages (api/routes/docs.py): Swagger UI at /docs and ReDoc at /redoc load everything from
the service itself (no CDN, no font or validator service), and the rule `docs:get` lets anyone read them
unless an operator's policy file says otherwise. On one app: no request reaches the storage."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI

from app.main import create_app
from app.settings import Settings

TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png"}


def browser(app: FastAPI, root_path: str = "") -> httpx.AsyncClient:
    """A client on `app` that says nothing about who it is, as a browser."""
    transport = httpx.ASGITransport(app=app, root_path=root_path)
    return httpx.AsyncClient(transport=transport, base_url="http://charon")


def _referenced(html: str) -> list[str]:
    """The URLs a page loads: its src and href attributes, and the document Swagger UI is told to read."""
    return re.findall(r'(?:src|href|spec-url)="([^"]*)"', html) + re.findall(r"url: '([^']*)'", html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_a_page_loads_only_what_the_service_serves(page: str) -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused"))) as client:
        r = await client.get(page)
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert re.findall(r"\w+://", r.text) == []  # no absolute URL: nothing from another host
        # and the browser fetches nothing from another host either (ReDoc's bundle draws a logo from its CDN)
        policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
        assert policy["default-src"] == "'self'"
        assert all("://" not in sources and "*" not in sources for sources in policy.values()), policy
        urls = _referenced(r.text)
        assert "/openapi.json" in urls
        assert len(urls) == (4 if page == "/docs" else 3)  # script, favicon, document (and Swagger's CSS)
        for url in urls:
            assert url.startswith("/"), url
            asset = await client.get(url)
            assert asset.status_code == 200, url
            expected = "application/json" if url == "/openapi.json" else TYPES[Path(url).suffix]
            assert asset.headers["content-type"] == expected, url
            assert len(asset.content) > (1000 if url.endswith(".png") else 10_000), url
    if page == "/docs":
        assert (
            "validatorUrl" in r.text
        )  # turned off: Swagger UI would send the document to a public validator


async def test_an_asset_is_read_again_only_when_it_changed_and_unknown_names_are_404() -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused"))) as client:
        first = await client.get("/docs/assets/swagger-ui-bundle.js")
        again = await client.get(
            "/docs/assets/swagger-ui-bundle.js", headers={"If-None-Match": first.headers["etag"]}
        )
        assert (again.status_code, again.content) == (304, b"")
        head = await client.head("/docs/assets/swagger-ui.css")
        assert (head.status_code, head.headers["content-type"]) == (200, TYPES[".css"])
        for name in ("nope.js", "..%2f__init__.py", "core.py"):
            r = await client.get(f"/docs/assets/{name}")
            assert r.status_code == 404, name
            assert r.json()["title"] == "Not found"


async def test_the_pages_follow_the_root_path_of_a_proxy_serving_the_api_under_a_prefix() -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused")), "/queueing") as client:
        r = await client.get("/queueing/docs")
    assert r.status_code == 200
    assert all(url.startswith("/queueing/") for url in _referenced(r.text)), _referenced(r.text)


async def test_anyone_reads_the_docs_without_credentials_even_where_every_operation_needs_them() -> None:
    """trusted-proxy: nothing is let in without the gateway's confirmation, except what `docs:get` (`@`)
    lets anyone read."""
    app = create_app(Settings(storage_uri="redis://unused", auth="trusted-proxy"))
    async with browser(app) as client:
        assert (await client.get("/v2/queues")).status_code == 401
        for url in ("/docs", "/redoc", "/docs/assets/redoc.standalone.js", "/openapi.json"):
            assert (await client.get(url)).status_code == 200, url


async def test_a_policy_file_can_keep_the_docs_for_admins(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"docs:get": "role:admin"}))
    async with browser(create_app(Settings(storage_uri="redis://unused", policy_file=policy))) as client:
        for url in ("/docs", "/redoc", "/docs/assets/favicon.png"):
            r = await client.get(url)
            assert (r.status_code, r.json()["rule"]) == (403, "docs:get"), url
            assert (await client.get(url, headers={"X-Roles": "admin"})).status_code == 200, url
