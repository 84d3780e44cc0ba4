"""Fixtures of the console's tests: a live `charon serve` (noauth) on the tests' Redis, a real headless
Chromium, and a screenshot of the page when a test fails (.artifacts/console/<test>.png)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.console.browser import FAILURES, REPORT, Browser
from tests.servers import CharonProcess


@pytest.fixture(scope="module")
def service(redis_url: str) -> Iterator[CharonProcess]:
    env = {"CHARON_INSIGHTS_REPORT_URL": REPORT}  # where an operator published `charon insights`' report
    charon = CharonProcess(redis_url, namespace=f"console{uuid.uuid4().hex[:8]}", env=env).start()
    yield charon
    charon.stop()


@pytest.fixture(scope="module")
def _chromium(service: CharonProcess) -> Iterator[WebDriver]:
    """After the service and before it stops: the browser's open connections do not hold up its shutdown."""
    browser = Browser()
    try:
        yield browser.start()
    finally:
        browser.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def browser(_chromium: WebDriver, request: pytest.FixtureRequest) -> Iterator[WebDriver]:
    """The module's Chromium, with a fresh tab state: its session storage (the console's project and token)
    is cleared before each test."""
    _chromium.get("about:blank")
    yield _chromium
    if request.node.stash.get(_FAILED, False):
        FAILURES.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.nodeid.split("::", 1)[-1])
        _chromium.save_screenshot(str(FAILURES / f"{name}.png"))
