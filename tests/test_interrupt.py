"""Interrupting the test run leaves no server behind (issue 40): a child pytest whose test uses the real
fixtures (a redis-server, SecantusDB), starts a `charon serve` and then runs a long command in the foreground
(as the contract fuzz runs schemathesis) is sent SIGTERM, SIGINT while it ignores SIGINT (what a run started
in the background by a script inherits), or SIGKILL, and a run in pytest-xdist workers (`make test`) is sent
SIGKILL (its workers die with it, their servers with them); once it has exited, none of the processes it
started lives and none of their ports answers. tests/servers.py spawn() says how."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.servers import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]

CHILD_TEST = """
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tests.servers import CharonProcess, run


def test_interrupted_while_servers_run(redis_url, mongodb_uri):
    service = CharonProcess(redis_url).start()
    try:
        ports = [urlsplit(redis_url).port, urlsplit(mongodb_uri).port, service.port]
        Path({ready!r} + '.part').write_text(json.dumps(ports))
        Path({ready!r} + '.part').replace({ready!r})  # whole when it appears
        run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=600)
    finally:
        service.stop()
"""

# Starts pytest with SIGINT ignored, as a shell without job control starts a background job (`make test &`).
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _started(pid: int) -> str | None:
    """`pid`'s start time (field 22 of /proc/<pid>/stat), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid`, with its start time (so that a reused pid is not taken for it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        started = _started(child)
        if started is not None:
            found[child] = started
        todo += children.get(child, [])
    return found


def _alive(processes: dict[int, str]) -> list[str]:
    alive = []
    for pid, started in processes.items():
        if _started(pid) == started:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            alive.append(f"{pid}: {cmdline.strip()}")
    return alive


def _answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("sig", "workers"),
    [(signal.SIGTERM, 0), (signal.SIGINT, 0), (signal.SIGKILL, 0), (signal.SIGKILL, 2)],
    ids=["SIGTERM", "SIGINT", "SIGKILL", "SIGKILL-2-workers"],
)
def test_an_interrupted_run_leaves_no_server_behind(
    tmp_path: Path, sig: signal.Signals, workers: int
) -> None:
    ready = tmp_path / "ports.json"
    module = tmp_path / "test_child.py"
    module.write_text(CHILD_TEST.format(ready=str(ready)))
    pytest_argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ROOT / "pyproject.toml"),
    ]
    pytest_argv += ["--rootdir", str(ROOT), "-p", "tests.conftest", "-q", str(module)]
    if workers:  # as `make test` runs them: pytest-xdist's workers, each with its servers
        pytest_argv += ["-n", str(workers), "--dist", "loadfile"]
    argv = [sys.executable, "-c", IGNORING_SIGINT, *pytest_argv] if sig == signal.SIGINT else pytest_argv
    env = {k: v for k, v in os.environ.items() if k not in ("CHARON_TEST_REDIS_URL", "MONGODB_URI")}
    log = (tmp_path / "child.log").open("wb")
    child = spawn(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert child.poll() is None, (tmp_path / "child.log").read_text()
            assert time.monotonic() < deadline, "the child's servers did not start in 120 s"
            time.sleep(0.1)
        ports = json.loads(ready.read_text())
        # redis-server, SecantusDB, charon serve (and its notifier), and the sleep the test starts after it
        # writes the ports (so a moment later: under load, one CI run looked before it)
        started = _descendants(child.pid)
        while len(started) < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
            started = _descendants(child.pid)
        assert len(started) >= 5, started
        child.send_signal(sig)
        child.wait(60)
        # SIGKILL is not instant; and an xdist worker, told by SIGTERM that the run died, first tears down
        # its fixtures (stopping its servers gracefully): one CI run saw it live past 5 s, its servers gone.
        deadline = time.monotonic() + (60 if workers else 5)
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive(started) == [], (tmp_path / "child.log").read_text()[-3000:]
        assert [p for p in ports if _answers(p)] == []
    finally:
        for pid, at in started.items():
            if _started(pid) == at:
                os.kill(pid, signal.SIGKILL)
        if child.poll() is None:
            child.kill()
            child.wait()
        log.close()
