"""`charon serve` delivers from a notifier process of its own (CHARON_NOTIFICATIONS__PROCESS, on by
default): at a lower CPU priority than the API workers, started again when it dies, gone when the service
is. With the setting off, the API process delivers itself; with CHARON_NOTIFICATIONS__EXTERNAL, neither does,
and a `charon notify` run apart delivers."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_ID
from tests.receivers import HttpReceiver, notification_env
from tests.servers import CharonProcess, spawn

pytestmark = pytest.mark.slow  # live server processes

HEADERS = {"Client-ID": CLIENT_ID, "X-Project-ID": "notifier-process"}


def descendants(pid: int) -> dict[int, str]:
    """The processes under `pid` (children and theirs): pid -> command line."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                frontier.append(child)
    return found


def notifiers(service: CharonProcess) -> list[int]:
    assert service.proc is not None
    return [pid for pid, argv in descendants(service.proc.pid).items() if " app.cli notify " in f"{argv} "]


def post_and_wait(c: httpx.Client, receiver: HttpReceiver, n: int, seen: int) -> None:
    r = c.post("/v2/queues/events/messages", json={"messages": [{"body": {"n": n}}]})
    assert r.status_code == 201, r.text
    got = receiver.wait_for(seen + 1, within=30)
    assert got[-1].json()["body"] == {"n": n}


def subscribe(c: httpx.Client, receiver: HttpReceiver) -> None:
    r = c.post("/v2/queues/events/subscriptions", json={"subscriber": receiver.url_for("/events")})
    assert r.status_code == 201, r.text


def test_the_notifier_is_a_process_of_its_own_at_a_lower_priority_restarted_when_it_dies(
    tmp_path: Path, webhook_receiver: HttpReceiver
) -> None:
    service = CharonProcess(None, data_dir=tmp_path / "data", env=notification_env(nice="7")).start()
    try:
        assert service.proc is not None
        [notifier] = notifiers(service)
        lower = os.getpriority(os.PRIO_PROCESS, service.proc.pid) + 7
        deadline = time.monotonic() + 15  # it lowers its own priority as it starts
        while os.getpriority(os.PRIO_PROCESS, notifier) != lower and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, notifier) == lower
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=30) as c:
            subscribe(c, webhook_receiver)
            post_and_wait(c, webhook_receiver, 1, 0)
            os.kill(notifier, 9)
            post_and_wait(c, webhook_receiver, 2, 1)  # delivered by the notifier started in its place
            [again] = notifiers(service)
            assert again != notifier
        service.kill()  # kill -9 of the service: its notifier does not outlive it
        deadline = time.monotonic() + 10
        while Path(f"/proc/{again}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (
            not Path(f"/proc/{again}").exists() or "Z" in Path(f"/proc/{again}/stat").read_text().split()[2]
        )
    finally:
        if service.proc is not None and service.proc.poll() is None:
            service.stop()


def test_with_the_setting_off_the_api_process_delivers(
    tmp_path: Path, webhook_receiver: HttpReceiver
) -> None:
    env = notification_env(process="false")
    service = CharonProcess(None, data_dir=tmp_path / "data", env=env).start()
    try:
        assert notifiers(service) == []
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=30) as c:
            subscribe(c, webhook_receiver)
            post_and_wait(c, webhook_receiver, 1, 0)
    finally:
        service.stop()


def test_with_an_external_notifier_serve_delivers_nothing_and_charon_notify_does(
    redis_url: str, webhook_receiver: HttpReceiver
) -> None:
    env = notification_env(external="true")
    service = CharonProcess(redis_url, namespace="external-notifier", env=env).start()
    notifier = None
    try:
        assert notifiers(service) == []
        with httpx.Client(base_url=service.url, headers=HEADERS, timeout=30) as c:
            subscribe(c, webhook_receiver)
            r = c.post("/v2/queues/events/messages", json={"messages": [{"body": {"n": 1}}]})
            assert r.status_code == 201, r.text
            time.sleep(2)  # a worker that delivered would have by now (the others deliver within 30 s)
            assert webhook_receiver.requests == []
            # the notifier of another container: the same settings and store, run on its own
            notifier = spawn([sys.executable, "-m", "app.cli", "notify"], env=service.env)
            assert webhook_receiver.wait_for(1, within=30)[-1].json()["body"] == {"n": 1}
    finally:
        if notifier is not None:
            notifier.terminate()
            notifier.wait(15)
        service.stop()


def test_charon_notify_alone_needs_the_store_the_api_uses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alone, without CHARON_STORAGE_URI, it would start an embedded store no API writes to: refused."""
    from app.cli import main

    monkeypatch.delenv("CHARON_STORAGE_URI", raising=False)
    assert main(["notify"]) == 2
    assert "set CHARON_STORAGE_URI" in capsys.readouterr().err
