"""How the notifier process tells that `charon serve`'s API processes are busy (app/notify.py ServiceLoad):
the CPU of its parent's other processes, real processes here."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from app.notify import ServiceLoad
from tests.servers import spawn

pytestmark = pytest.mark.slow  # live processes

PARENT = """
import subprocess, sys, time

if sys.argv[1] == "burn":  # four spinning children: above BUSY_CORES even on a loaded two-core machine
    for _ in range(4):
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
print("ready", flush=True)
time.sleep(60)
"""


def looks(load: ServiceLoad, seconds: float = 0.6) -> bool:
    load()
    time.sleep(seconds)
    return load()


@pytest.mark.parametrize("child", ["idle", "burn"])
def test_a_child_that_uses_a_core_makes_the_service_busy(child: str) -> None:
    parent = spawn([sys.executable, "-c", PARENT, child], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"ready\n"
        assert looks(ServiceLoad(parent.pid)) == (child == "burn")
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()
