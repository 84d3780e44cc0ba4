"""The dead-letter console (/console) in a real headless Chromium against a live `charon serve` (noauth,
Redis): the queue list, a DLQ's dead letters filtered and opened, a dry-run and a redrive watched to its end,
deletes, the API's errors shown in the page, and the budget (files, hosts, first paint)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from api.routes.console import ASSETS
from core.models import NewMessage, QueueRef
from storage.registry import open_store
from tests.console.browser import REPORT, shot
from tests.servers import CharonProcess

pytestmark = pytest.mark.slow  # a live service and a browser

CLIENT = "3381af92-2b9e-11e3-b191-71861300734c"
SOURCE, DLQ = "orders", "orders.dlq"
MAX_CLAIMS, REJECTED = 30, 7  # dead letters of each reason the project's DLQ gets


def headers(project: str) -> dict[str, str]:
    return {"Client-ID": CLIENT, "X-Project-ID": project}


def seed(base: str, project: str) -> None:
    """A source queue whose messages die after one claim into its DLQ: MAX_CLAIMS by claims, REJECTED by a
    consumer's rejection; and a plain queue beside them."""
    with httpx.Client(base_url=base, headers=headers(project), timeout=30) as c:
        meta = {"_max_claim_count": 1, "_dead_letter_queue": DLQ}
        assert c.put(f"/v2/queues/{SOURCE}", json=meta).status_code == 201
        assert c.put(f"/v2/queues/{DLQ}", json={}).status_code == 201
        assert c.put("/v2/queues/invoices", json={}).status_code == 201
        c.post("/v2/queues/invoices/messages", json={"messages": [{"ttl": 3600, "body": {"n": 1}}]})
        total = MAX_CLAIMS + REJECTED
        for first in range(0, total, 10):
            batch = [{"ttl": 3600, "body": {"order": i, "sku": None if i < MAX_CLAIMS else "A-1"}}
                     for i in range(first, min(first + 10, total))]  # fmt: skip
            assert c.post(f"/v2/queues/{SOURCE}/messages", json={"messages": batch}).status_code == 201
        rejected = 0
        while True:  # claim everything once; reject REJECTED, release the rest (their next claim moves them)
            r = c.post(f"/v2/queues/{SOURCE}/claims?limit=20", json={"ttl": 60, "grace": 60})
            claim = r.json() if r.status_code == 201 else {}
            if not claim.get("messages"):  # all moved on the way (said in the answer), or none left
                break
            for m in claim["messages"]:
                if m["body"]["sku"] is not None and rejected < REJECTED:
                    mid, cid = m["href"].split("/")[-1].split("?")[0], m["href"].split("claim_id=")[1]
                    moved = c.post(
                        f"/v2/queues/{SOURCE}/messages/{mid}/dead_letter?claim_id={cid}",
                        json={"reason": "bad schema", "description": "field sku is unknown"},
                    )
                    assert moved.status_code == 200, moved.text
                    rejected += 1
            claim_id = r.headers["location"].rsplit("/", 1)[1]
            assert c.delete(f"/v2/queues/{SOURCE}/claims/{claim_id}").status_code == 204
        stats = c.get(f"/v2/queues/{DLQ}/stats").json()["messages"]
        assert stats["total"] == total, stats


def wait(browser: WebDriver, timeout: float = 10) -> WebDriverWait[WebDriver]:
    """Until a condition holds; an element the page drew again meanwhile is looked for again."""
    return WebDriverWait(browser, timeout, ignored_exceptions=[StaleElementReferenceException])


def find(browser: WebDriver, css: str, timeout: float = 10) -> WebElement:
    return wait(browser, timeout).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))


def open_console(browser: WebDriver, service: CharonProcess, project: str, hash_: str = "") -> None:
    """The console in a fresh tab state (no project or token kept), signed in as `project`."""
    browser.get(f"{service.url}/console")
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{service.url}/console{hash_}")
    field = find(browser, "#project")
    field.clear()
    field.send_keys(project, Keys.ENTER)


def rows(browser: WebDriver, table: str) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def queues(browser: WebDriver) -> list[str | None]:
    """The queue list's names, in the page's order."""
    return [r.get_attribute("data-queue") for r in rows(browser, "queue-table")]


def mark(browser: WebDriver, name: str) -> float:
    """When the console set performance mark `name`, in ms from the start of the page's load."""
    script = "const m = performance.getEntriesByName(arguments[0]); return m.length ? m[0].startTime : null"
    at = browser.execute_script(script, name)
    assert at is not None, f"the page set no mark {name}"
    return float(at)


def api(service: CharonProcess, project: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, service.url + path, headers=headers(project), timeout=30, **kwargs)


@pytest.fixture
def project(service: CharonProcess) -> str:
    name = f"p{uuid.uuid4().hex[:10]}"
    seed(service.url, name)
    return name


def test_the_queue_list_shows_depths_and_which_queue_is_whose_dlq(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    open_console(browser, service, project)
    wait(browser).until(lambda b: len(rows(b, "queue-table")) == 3)
    # the depths fill in from each queue's stats
    wait(browser).until(lambda b: "…" not in b.find_element(By.ID, "queue-table").text)
    shot(browser, "queues")
    cells = [td.text for td in find(browser, f'tr[data-queue="{DLQ}"]').find_elements(By.TAG_NAME, "td")]
    assert cells[0] == f"{DLQ} DLQ of {SOURCE}"
    assert cells[1] == str(MAX_CLAIMS + REJECTED)  # ready
    assert cells[5] == str(MAX_CLAIMS + REJECTED)  # dead letters received
    source_row = find(browser, f'tr[data-queue="{SOURCE}"]')
    assert f"→ {DLQ}, max claims 1" in source_row.text
    # sorted by a column with the keyboard: its header is a button
    header = browser.find_element(By.XPATH, "//th/button[starts-with(., 'Ready')]")
    header.send_keys(Keys.ENTER)
    browser.find_element(By.XPATH, "//th/button[starts-with(., 'Ready')]").send_keys(Keys.ENTER)  # descending
    wait(browser).until(lambda b: rows(b, "queue-table")[0].get_attribute("data-queue") == DLQ)
    # filtered by name, through the API's `name`
    filter_ = browser.find_element(By.ID, "queue-filter")
    filter_.send_keys("invoice", Keys.ENTER)
    wait(browser).until(lambda b: queues(b) == ["invoices"])


def test_the_budget_files_hosts_and_first_paint(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    """The console's files are at most 300 KB, it asks nothing of any other host, its page says so to the
    browser, and the queue list is drawn in under a second of the page's start, on this machine."""
    sizes = {}
    for name in ["", *(f"/{a}" for a in ASSETS)]:
        r = httpx.get(f"{service.url}/console{name}")
        assert r.status_code == 200, (name, r.text)
        assert "connect-src 'self'" in r.headers["content-security-policy"]
        sizes[name or "/"] = len(r.content)
    assert sum(sizes.values()) <= 300_000, sizes
    open_console(browser, service, project)
    browser.execute("getLog", {"type": "browser"})  # what the browser logged so far: drained
    browser.refresh()  # a fresh load, the project kept by the tab
    wait(browser).until(lambda b: len(rows(b, "queue-table")) == 3)
    listed = mark(browser, "charon:queues-listed")
    assert listed < 1000
    print(f"the console's files: {sum(sizes.values())} bytes; the queue list drawn at {listed:.0f} ms")
    hosts = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).host)"
    )
    assert set(hosts) <= {f"127.0.0.1:{service.port}"}, hosts
    errors = [e for e in browser.execute("getLog", {"type": "browser"})["value"] if e["level"] == "SEVERE"]
    assert errors == [], errors


def test_a_dlq_filtered_a_message_opened_and_deleted(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)  # a page: the API's 20
    wait(browser).until(lambda b: "max_claims" in b.find_element(By.ID, "by-reason").text)
    by_reason = browser.find_element(By.ID, "by-reason").text
    assert by_reason == f"max_claims {MAX_CLAIMS}\nrejected {REJECTED}"
    assert f"{SOURCE} {MAX_CLAIMS + REJECTED}" in browser.find_element(By.ID, "by-source").text
    assert browser.find_element(By.CSS_SELECTOR, "#chart svg rect")  # the rate of dead-lettering, drawn
    link = browser.find_element(By.ID, "insights-report")  # CHARON_INSIGHTS_REPORT_URL, linked
    assert link.get_attribute("href") == service.url + REPORT
    shot(browser, "dead-letters")

    Select(browser.find_element(By.ID, "filter-reason")).select_by_value("rejected")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    wait(browser).until(lambda b: len(rows(b, "message-table")) == REJECTED)
    reasons = {r.find_elements(By.TAG_NAME, "td")[3].text for r in rows(browser, "message-table")}
    assert reasons == {"rejected bad schema"}
    assert (
        f"{REJECTED} matching of {MAX_CLAIMS + REJECTED} read"
        in browser.find_element(By.ID, "messages-count").text
    )

    total = MAX_CLAIMS + REJECTED
    first = rows(browser, "message-table")[0]
    mid = first.get_attribute("data-id")
    first.find_element(By.CSS_SELECTOR, "button.link").click()
    body = json.loads(find(browser, "#message-json").text)
    assert body["sku"] == "A-1"
    detail = browser.find_element(By.ID, "message-body").text
    assert f"source queue {SOURCE}\nreason rejected\nsignature (cause) " in detail
    assert "\nrejection reason bad schema\n" in detail
    assert "rejection description field sku is unknown" in detail
    shot(browser, "message")
    browser.find_element(By.ID, "message-delete").click()
    confirm = find(browser, "#confirm")
    assert mid in confirm.text
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser).until(lambda b: len(rows(b, "message-table")) == REJECTED - 1)
    assert api(service, project, "GET", f"/v2/queues/{DLQ}/messages/{mid}").status_code == 404

    # two selected, deleted at once; a cancelled confirmation deletes nothing
    for r in rows(browser, "message-table")[:2]:
        r.find_element(By.CSS_SELECTOR, "input[type=checkbox]").send_keys(Keys.SPACE)
    browser.find_element(By.ID, "delete-selected").click()
    find(browser, "#confirm")
    browser.find_element(By.CSS_SELECTOR, "#confirm button[value=cancel]").click()
    time.sleep(1)  # what a cancelled confirmation would have sent, had it sent anything
    assert api(service, project, "GET", f"/v2/queues/{DLQ}/stats").json()["messages"]["total"] == total - 1
    assert len(rows(browser, "message-table")) == REJECTED - 1
    browser.find_element(By.ID, "delete-selected").click()
    find(browser, "#confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser).until(lambda b: len(rows(b, "message-table")) == REJECTED - 3)
    stats = api(service, project, "GET", f"/v2/queues/{DLQ}/stats").json()["messages"]
    assert stats["total"] == MAX_CLAIMS + REJECTED - 3


def test_a_redrive_dry_run_then_run_and_watched_to_its_end(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)
    Select(browser.find_element(By.ID, "filter-reason")).select_by_value("max_claims")
    browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
    wait(browser).until(lambda b: "matching" in b.find_element(By.ID, "messages-count").text)
    run = browser.find_element(By.ID, "redrive-run")
    assert not run.is_enabled()  # a dry run first
    browser.find_element(By.ID, "redrive-rate").send_keys("20")
    browser.find_element(By.ID, "redrive-dry-run").click()
    dry = find(browser, "#dry-run")
    said = f"{MAX_CLAIMS} would move to each message's source queue (reason max_claims)"
    assert dry.text.startswith(said), dry.text
    assert api(service, project, "GET", f"/v2/queues/{SOURCE}/stats").json()["messages"]["total"] == 0
    wait(browser).until(lambda b: b.find_element(By.ID, "redrive-run").is_enabled())
    # a filter changed after the dry run: its plan no longer holds, and the redrive waits for another
    Select(browser.find_element(By.ID, "filter-reason")).select_by_value("rejected")
    assert not browser.find_element(By.ID, "redrive-run").is_enabled()
    assert browser.find_elements(By.ID, "dry-run") == []
    Select(browser.find_element(By.ID, "filter-reason")).select_by_value("max_claims")
    browser.find_element(By.ID, "redrive-dry-run").click()
    wait(browser).until(lambda b: b.find_element(By.ID, "redrive-run").is_enabled())
    browser.find_element(By.ID, "redrive-run").click()
    confirm = find(browser, "#confirm").text
    assert f"Move up to {MAX_CLAIMS} dead letter(s) (reason max_claims) from {DLQ}" in confirm, confirm
    assert "20 a second" in confirm
    browser.find_element(By.ID, "confirm-ok").click()
    task = find(browser, "#redrive-task")
    assert "running" in task.text or "succeeded" in task.text
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", task)
    shot(browser, "redrive")
    try:
        wait(browser, 30).until(lambda b: "succeeded" in b.find_element(By.ID, "redrive-task").text)
    except TimeoutException:
        pytest.fail(f"the task did not finish: {browser.find_element(By.ID, 'redrive-task').text}")
    assert f"{MAX_CLAIMS} moved" in browser.find_element(By.ID, "redrive-task").text
    assert api(service, project, "GET", f"/v2/queues/{SOURCE}/stats").json()["messages"]["free"] == MAX_CLAIMS
    wait(browser).until(lambda b: len(rows(b, "task-table")) == 1)
    # only the rejected are left in the DLQ, and the page says so
    wait(browser).until(lambda b: "rejected" in b.find_element(By.ID, "by-reason").text)
    assert "max_claims" not in browser.find_element(By.ID, "by-reason").text


def test_a_running_redrive_cancelled_keeps_what_it_moved(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)
    browser.find_element(By.ID, "redrive-rate").send_keys("2")  # slow enough to cancel mid-way
    browser.find_element(By.ID, "redrive-dry-run").click()
    wait(browser).until(lambda b: b.find_element(By.ID, "redrive-run").is_enabled())
    browser.find_element(By.ID, "redrive-run").click()
    find(browser, "#confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    find(browser, "#redrive-cancel").click()
    wait(browser).until(lambda b: "cancelled" in b.find_element(By.ID, "redrive-task").text)
    time.sleep(1.5)  # a task that went on after its cancel would have moved more by now
    source = api(service, project, "GET", f"/v2/queues/{SOURCE}/stats").json()["messages"]["total"]
    dlq = api(service, project, "GET", f"/v2/queues/{DLQ}/stats").json()["messages"]["total"]
    assert source < MAX_CLAIMS + REJECTED  # stopped before the end
    assert source + dlq == MAX_CLAIMS + REJECTED  # and nothing lost
    assert f"{source} moved" in browser.find_element(By.ID, "redrive-task").text


def test_text_from_messages_is_shown_as_text_never_run(browser: WebDriver, service: CharonProcess) -> None:
    """A producer or consumer writes bodies, rejection texts and queue metadata: the console shows them as
    text, and no script of theirs runs."""
    project = f"x{uuid.uuid4().hex[:8]}"
    hostile = "<img src=x onerror=window.pwned=1><script>window.pwned=2</script>"
    meta = {"_max_claim_count": 1, "_dead_letter_queue": DLQ, "note": hostile}
    assert api(service, project, "PUT", f"/v2/queues/{SOURCE}", json=meta).status_code == 201
    posted = {"messages": [{"ttl": 3600, "body": {"html": f"</pre>{hostile}"}}]}
    assert api(service, project, "POST", f"/v2/queues/{SOURCE}/messages", json=posted).status_code == 201
    claim = api(service, project, "POST", f"/v2/queues/{SOURCE}/claims?limit=1", json={"ttl": 60}).json()
    href = claim["messages"][0]["href"]
    rejected = {"reason": hostile, "description": hostile}
    assert api(service, project, "POST", href.replace("?", "/dead_letter?"), json=rejected).status_code == 200
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 1)
    rows(browser, "message-table")[0].find_element(By.CSS_SELECTOR, "button.link").click()
    assert hostile in find(browser, "#message-body").text
    assert f"</pre>{hostile}" in browser.find_element(By.ID, "message-json").text
    browser.get(f"{service.url}/console#/")
    wait(browser).until(lambda b: len(rows(b, "queue-table")) == 2)
    assert browser.execute_script("return window.pwned === undefined && document.images.length === 0")


def test_the_apis_errors_are_shown_in_the_page(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)
    browser.find_element(By.ID, "redrive-rate").send_keys("100000")  # over the API's 10,000
    browser.find_element(By.ID, "redrive-dry-run").click()
    alert = find(browser, "#notice")
    assert "max_per_second" in alert.text, alert.text
    assert "10000" in alert.text.replace(",", ""), alert.text  # the limit named
    assert browser.find_element(By.ID, "view").text  # the page is still there
    # a project the API refuses: its 400 shown, not a blank page
    field = browser.find_element(By.ID, "project")
    field.clear()
    field.send_keys("a,b", Keys.ENTER)
    wait(browser).until(lambda b: "X-Project-ID" in b.find_element(By.ID, "notice").text)
    assert browser.find_element(By.TAG_NAME, "h1").text


BIG = 100_000  # the DLQ of 100,000 dead letters


async def fill_dlq(redis_url: str, namespace: str, project: str) -> None:
    """BIG dead letters in DLQ, moved there by claims from SOURCE (its _max_claim_count 1), through the
    service's own store (the API's posts of 10 would take minutes): a thousand a call."""
    store = open_store(redis_url, namespace=namespace)
    source = QueueRef(project, SOURCE)
    try:
        body = {"order": 0, "sku": None, "note": "x" * 100}
        size = len(json.dumps(body))
        for _ in range(BIG // 1000):
            batch = [NewMessage(body=body, ttl=3600)] * 1000
            await store.post_messages(
                source, batch, client_id=CLIENT, default_ttl=3600, default_delay=0, body_size=size * 1000
            )
        while (r := await store.claim(source, ttl=60, grace=60, limit=1000)).claim is not None:
            await store.release_claim(source, r.claim.id)  # claimed once: the next claim moves them
        while (await store.claim(source, ttl=60, grace=60, limit=1000)).dead_lettered:
            pass
    finally:
        await store.aclose()


def test_a_dlq_of_100000_shows_its_first_page_in_under_a_second(
    browser: WebDriver, service: CharonProcess, redis_url: str
) -> None:
    project = f"big{uuid.uuid4().hex[:8]}"
    meta = {"_max_claim_count": 1, "_dead_letter_queue": DLQ}
    assert api(service, project, "PUT", f"/v2/queues/{SOURCE}", json=meta).status_code == 201
    started = time.monotonic()
    asyncio.run(fill_dlq(redis_url, service.env["CHARON_NAMESPACE"], project))
    filled = time.monotonic() - started
    stats = api(service, project, "GET", f"/v2/queues/{DLQ}/stats").json()["messages"]
    assert stats["total"] == BIG, (stats, filled)
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)
    browser.refresh()  # measured on a fresh load of the page
    wait(browser).until(lambda b: len(rows(b, "message-table")) == 20)
    listed = mark(browser, "charon:dead-letters-listed")
    assert listed < 1000
    print(f"{BIG} dead letters made in {filled:.1f} s; the first page drawn at {listed:.0f} ms")
    wait(browser, 30).until(lambda b: str(BIG) in b.find_element(By.ID, "summary").text)
    # counted from what was read, not by a dry run of 100,000 on every view; counted whole when asked
    wait(browser).until(
        lambda b: f"Of the 20 read here, of {BIG}." in b.find_element(By.ID, "by-source").text
    )
    assert "max_claims 20" in browser.find_element(By.ID, "by-reason").text
    first_page = [r.get_attribute("data-id") for r in rows(browser, "message-table")]
    browser.find_element(By.ID, "messages-next").click()  # the next page, by marker
    wait(browser).until(lambda b: "Page 2" in b.find_element(By.ID, "messages-pager").text)
    second_page = [r.get_attribute("data-id") for r in rows(browser, "message-table")]
    assert len(second_page) == 20
    assert not set(first_page) & set(second_page)
    browser.find_element(By.XPATH, "//div[@id='messages-pager']/button[.='Previous']").click()
    wait(browser).until(
        lambda b: [r.get_attribute("data-id") for r in rows(b, "message-table")] == first_page
    )


def test_a_cause_is_one_click_from_its_redrive(
    browser: WebDriver, service: CharonProcess, project: str
) -> None:
    """The dead letters by failure signature (what `charon insights` names a cause): a cause's "Redrive this
    cause" filters the DLQ to it and dry-runs its redrive; the redrive then moves exactly its messages."""
    open_console(browser, service, project, f"#/q/{DLQ}")
    wait(browser).until(lambda b: len(rows(b, "cause-table")) == 2)  # the rejected, and those out of claims
    # counted over the whole DLQ (its dry run), an example of each from the page's dead letters
    caption = browser.find_element(By.CSS_SELECTOR, "#cause-table caption").text
    assert caption.startswith("In the whole DLQ"), caption
    causes = {r.find_elements(By.TAG_NAME, "td")[2].text: r for r in rows(browser, "cause-table")}
    assert set(causes) == {"(none of them read here yet)", 'orders max_claims: {"order":0,"sku":null}'}, (
        causes
    )
    counts = {r.find_elements(By.TAG_NAME, "td")[1].text for r in rows(browser, "cause-table")}
    assert counts == {str(MAX_CLAIMS), str(REJECTED)}
    browser.find_element(By.ID, "messages-next").click()  # the second page: the rejected among them
    wait(browser).until(lambda b: "field sku is unknown" in b.find_element(By.ID, "cause-table").text)
    causes = {r.find_elements(By.TAG_NAME, "td")[2].text: r for r in rows(browser, "cause-table")}
    rejected = causes["field sku is unknown"]
    signature = rejected.get_attribute("data-signature")
    assert rejected.find_elements(By.TAG_NAME, "td")[1].text == str(REJECTED)
    rejected.find_element(By.TAG_NAME, "button").click()
    dry = find(browser, "#dry-run")
    assert dry.text.startswith(f"{REJECTED} would move"), dry.text
    assert browser.find_element(By.ID, "filter-signature").get_attribute("value") == signature
    wait(browser).until(lambda b: len(rows(b, "message-table")) == REJECTED)
    browser.find_element(By.ID, "redrive-run").click()
    find(browser, "#confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    wait(browser, 30).until(lambda b: "succeeded" in b.find_element(By.ID, "redrive-task").text)
    back = api(service, project, "GET", f"/v2/queues/{SOURCE}/messages?echo=true&limit=20").json()["messages"]
    assert sorted(m["body"]["order"] for m in back) == list(range(MAX_CLAIMS, MAX_CLAIMS + REJECTED))
