"""A real headless Chromium for the console's tests: Debian's `chromium` driven through its `chromedriver`
(selenium's WebDriver protocol), no browser downloaded. chromedriver is started here, tethered to the test run
(tests/servers.py spawn: it and the Chromium it starts die with the run, even an interrupted one), and
selenium only connects to it, so that selenium's own driver manager never looks for anything on the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.remote.webdriver import WebDriver

from tests.servers import free_port, spawn

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WINDOW = (1280, 800)  # the "readable at 1280x800"
# Where a failing test's screenshot goes (tests/console/conftest.py), and where `make console-screenshots`
# writes the docs' pictures (CONSOLE_SCREENSHOTS=docs/images)
FAILURES = Path(__file__).resolve().parents[2] / ".artifacts" / "console"
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS")
REPORT = "/reports/insights/report.html"  # the tests' service's CHARON_INSIGHTS_REPORT_URL (conftest.py)


class Browser:
    """chromedriver on a free port and one Chromium session through it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="charon-chromium-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.driver: WebDriver | None = None

    def start(self) -> WebDriver:
        self.proc = spawn(
            [CHROMEDRIVER, f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/status", timeout=1).json()["value"]["ready"]:
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless=new",
            "--no-sandbox",  # root in CI
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--user-data-dir={self.profile}",
            "--no-first-run",
            "--disable-background-networking",  # no request of the browser's own, to any host
            "--disable-component-update",
            "--disable-sync",
        ):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Remote(command_executor=f"http://127.0.0.1:{self.port}", options=options)
        self.driver.set_window_size(*WINDOW)
        return self.driver

    def stop(self) -> None:
        if self.driver is not None:
            # the session may be gone with a crashed browser: its process is killed below
            with suppress(Exception):
                self.driver.quit()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def shot(driver: WebDriver, name: str) -> None:
    """With CONSOLE_SCREENSHOTS set (`make console-screenshots`), the page as it is now, as
    $CONSOLE_SCREENSHOTS/console-<name>.png: the docs' pictures, drawn by the tests that check what they
    show."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"console-{name}.png"))
