"""The console behind Keystone (CHARON_AUTH=keystone, the tests' real Keystone): the operator pastes a token,
the project comes from it, and a token the service refuses sends the operator back to the token prompt."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.console.test_console import CLIENT, find, queues, wait
from tests.keystone import KeystoneServer
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow  # a live service, Keystone and a browser


@pytest.fixture(scope="module")
def service(keystone: KeystoneServer, redis_url: str) -> Iterator[CharonProcess]:
    """`charon serve` validating tokens with the real Keystone (the conftest's `service`, overridden)."""
    env = {f"CHARON_KEYSTONE__{key.upper()}": value for key, value in keystone.service_credentials().items()}
    env |= {"CHARON_AUTH": "keystone", "CHARON_KEYSTONE__TIMEOUT": "30"}
    charon = CharonProcess(redis_url, namespace=f"consoleks{uuid.uuid4().hex[:8]}", env=env).start()
    yield charon
    charon.stop()


def test_a_pasted_token_names_the_project_and_a_refused_one_asks_again(
    browser: WebDriver, service: CharonProcess, keystone: KeystoneServer
) -> None:
    token = keystone.token("alice", "alpha")
    r = httpx.put(
        f"{service.url}/v2/queues/alpha-orders",
        json={},
        headers={"X-Auth-Token": token, "Client-ID": CLIENT},
        timeout=30,
    )
    assert r.status_code in (201, 204), r.text
    browser.get(f"{service.url}/console")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    assert find(browser, "h1").text == "Sign in"  # nothing asked of the API without credentials
    find(browser, "#token").send_keys(token, Keys.ENTER)
    wait(browser, 30).until(lambda b: "alpha-orders" in queues(b))
    kept = browser.execute_script("return [sessionStorage.getItem('charon.token'), localStorage.length]")
    assert kept == [token, 0]  # in this tab's session storage, nowhere else
    # a token the service refuses (expired, revoked or mistyped: a 401 alike) sends back to the prompt
    field = browser.find_element(By.ID, "token")
    field.clear()
    field.send_keys("gAAAAAB-not-a-token-any-more", Keys.ENTER)
    notice = find(browser, "#notice")
    wait(browser, 30).until(lambda b: "Sign in again" in b.find_element(By.ID, "notice").text)
    assert "Paste a Keystone token" in notice.text
    assert browser.switch_to.active_element.get_attribute("id") == "token"
    assert browser.find_element(By.ID, "token").get_attribute("value") == ""
    assert browser.execute_script("return sessionStorage.getItem('charon.token')") is None
