"""service.outage.Outage: one log line when a background loop starts failing, one when it recovers, and a
wait that doubles while it fails (the sweeper must not log a traceback every 0.5 s while a store is down)."""

from __future__ import annotations

import logging

import pytest

from core.errors import StorageUnavailable
from service.outage import Outage


def test_one_line_when_failing_starts_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.outage")
    outage = Outage(log, "sweeper", interval=0.5, cap=10)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        assert outage.ok() == 0.5
        waits = [outage.failed(StorageUnavailable("Redis is not reachable.")) for _ in range(8)]
        assert outage.ok() == 0.5
        assert outage.ok() == 0.5
    assert waits == [1.0, 2.0, 4.0, 8.0, 10, 10, 10, 10]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("sweeper failing: Redis is not reachable.")
    assert lines[1].startswith("sweeper recovered after 8 failed attempts")
    assert all(r.exc_info is None for r in caplog.records)


def test_a_bug_is_logged_with_its_traceback_once(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage(logging.getLogger("test.outage"), "sweeper", interval=0.5)
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for _ in range(5):
            try:
                raise KeyError("a bug")
            except KeyError as exc:
                outage.failed(exc)
    assert [r.exc_info is not None for r in caplog.records] == [True]
