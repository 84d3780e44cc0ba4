"""The notifier's measure of a busy store (service/notifier.py StorePace): after a full batch a notifier
goes on at once only while a ping is about as quick as the quickest lately; a load that lasts becomes the
measure."""

from __future__ import annotations

import pytest

from service import notifier
from service.notifier import PACE_WINDOW_S, StorePace


def test_a_ping_well_above_the_quickest_means_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(notifier.time, "monotonic", lambda: now[0])
    pace = StorePace()
    assert not pace.busy(0.0002)
    assert not pace.busy(0.0011)  # under the margin: noise
    assert pace.busy(0.0013)  # 0.2 ms + 1 ms margin passed
    assert not pace.busy(0.0001)  # quicker still: the new measure
    assert pace.busy(0.0012)
    # a load that lasts: after one to two windows its round trips are the measure, and notifying goes on
    for _ in range(3):
        now[0] += PACE_WINDOW_S + 1
        pace.busy(0.004)
    assert not pace.busy(0.004)
    assert pace.busy(0.02)
