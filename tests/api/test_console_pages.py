"""The console's files (api/routes/console.py): served from the package with a Content-Security-Policy that
lets the page load and call nothing but the service, read again only when changed, under the rule
`console:get` (anyone by default, an operator's policy file may restrict it), and every path the page uses
relative, so that it works under a proxy's prefix. The console itself, in a browser: tests/console/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from api.routes.console import ASSETS
from app.main import create_app
from app.settings import Settings
from tests.api.test_docs import browser


async def test_the_page_loads_its_two_files_and_lets_the_browser_call_only_the_service() -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused"))) as client:
        page = await client.get("/console")
        assert (page.status_code, page.headers["content-type"]) == (200, "text/html; charset=utf-8")
        policy = dict(d.strip().split(" ", 1) for d in page.headers["content-security-policy"].split(";"))
        assert policy["default-src"] == "'none'"
        assert policy["connect-src"] == policy["script-src"] == policy["style-src"] == "'self'"
        assert re.findall(r"\w+://", page.text) == []  # nothing from another host
        urls = [u for u in re.findall(r'(?:src|href)="([^"#]+)"', page.text) if not u.startswith("data:")]
        assert sorted(urls) == [f"console/{name}" for name in sorted(ASSETS)]  # relative: a prefix kept
        total = len(page.content)
        for name, media_type in ASSETS.items():
            r = await client.get(f"/console/{name}")
            assert (r.status_code, r.headers["content-type"]) == (200, media_type)
            assert re.findall(r"https?://|//[a-z]", r.text.replace("http://www.w3.org/2000/svg", "")) == []
            assert r.headers["x-content-type-options"] == "nosniff"
            total += len(r.content)
        assert total <= 300_000  # the budget


async def test_a_file_is_read_again_only_when_it_changed_and_unknown_names_are_404() -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused"))) as client:
        first = await client.get("/console/console.js")
        again = await client.get("/console/console.js", headers={"If-None-Match": first.headers["etag"]})
        assert (again.status_code, again.content) == (304, b"")
        for name in ("nope.js", "index.html", "console.py"):
            r = await client.get(f"/console/{name}")
            assert r.status_code == 404, name
            assert "it has console.js, console.css" in r.json()["description"]  # the files there are
        assert (await client.get("/console/..%2f__init__.py")).status_code == 404
        slash = await client.get("/console/")  # a browser's habit: to the page, its files relative to it
        assert (slash.status_code, slash.headers["location"]) == (308, "/console")


@pytest.mark.parametrize("auth", ["noauth", "trusted-proxy"])
async def test_anyone_loads_the_page_the_api_behind_it_asks_credentials(auth: str) -> None:
    async with browser(create_app(Settings(storage_uri="redis://unused", auth=auth))) as client:
        for url in ("/console", "/console/console.js", "/console/console.css"):
            assert (await client.get(url)).status_code == 200, url
        if auth == "trusted-proxy":
            assert (await client.get("/v2/queues")).status_code == 401


async def test_a_policy_file_can_keep_the_console_for_admins(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"console:get": "role:admin"}))
    async with browser(create_app(Settings(storage_uri="redis://unused", policy_file=policy))) as client:
        for url in ("/console", "/console/console.js"):
            r = await client.get(url)
            assert (r.status_code, r.json()["rule"]) == (403, "console:get"), url
            assert (await client.get(url, headers={"X-Roles": "admin"})).status_code == 200, url


async def test_the_insights_report_link_is_the_settings_escaped_and_only_http_or_a_path() -> None:
    link = "https://reports.example.com/insights/report.html?dlq=a&b=1"
    async with browser(
        create_app(Settings(storage_uri="redis://unused", insights_report_url=link))
    ) as client:
        page = (await client.get("/console")).text
    assert (
        '<meta name="charon-insights-report" content="https://reports.example.com/insights/report.html?dlq=a&amp;b=1">'
        in page
    )
    async with browser(create_app(Settings(storage_uri="redis://unused"))) as client:
        assert '<meta name="charon-insights-report" content="">' in (await client.get("/console")).text
    for bad in ("javascript:alert(1)", "//evil.example.com/x", "/a b", '/x"><script>', "ftp://h/r.html"):
        with pytest.raises(ValidationError, match="insights_report_url must be an http"):
            Settings(storage_uri="redis://unused", insights_report_url=bad)
