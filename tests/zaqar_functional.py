"""The functional tests the zaqar package ships (zaqar/tests/functional/wsgi: the versions document, and a
subscription that expires, by its ttl and after a PATCH of it) pass against a live Charon, run as Zaqar runs
them against a server of its own: ZAQAR_TEST_INTEGRATION=1 and a functional-tests.conf naming the URL.

They run from .venv-zaqar (zaqar 23.0.1, pinned in the Makefile, with what its tests import: `make install`)
in noauth mode, since they send no token; tests/acceptance/test_tempest.py runs them after tempest, on the
same worker, where their sleeps cost nothing. Their harness builds a Zaqar in the test process too (and
forks its web server on a port nobody calls), on a redis-server of its own here, never Charon's store: its
cleanup deletes keys. Each subscription test polls for 61 s, so each test runs in a process of its own, all
at once.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from tests.servers import CharonProcess, RedisServer, spawn

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-zaqar" / "bin" / "python"
TESTS = (
    "zaqar.tests.functional.wsgi.test_versions.TestVersions.test_get_versions_without_headers",
    "zaqar.tests.functional.wsgi.test_versions.TestVersions.test_get_versions_with_headers",
    "zaqar.tests.functional.wsgi.v2.test_subscriptions.TestSubscriptions.test_expired_subscription",
    "zaqar.tests.functional.wsgi.v2.test_subscriptions.TestSubscriptions.test_update_ttl",
)
FUNCTIONAL = """\
[DEFAULT]
run_tests = True

[zaqar]
url = {url}
config = {zaqar_conf}

[headers]
user_agent = FunctionalTests
project_id = 123456
"""
# The Zaqar the harness builds in the test process: on the scratch redis-server (its cleanup runs every second
# on redis, so the subscription tests are not "slow" ones), its web server on port 0.
ZAQAR = """\
[DEFAULT]
unreliable = True

[drivers]
transport = wsgi
message_store = redis
management_store = redis

[drivers:transport:wsgi]
bind = 127.0.0.1
port = 0

[drivers:message_store:redis]
uri = {redis}

[drivers:management_store:redis]
uri = {redis}
"""


RUN_TIMEOUT_S = 300  # each test's process; the subscription tests poll for 61 s


def available() -> bool:
    return PYTHON.exists()


def run(tmp_path: Path) -> dict[str, str]:
    """Run the four tests against a live Charon (the module's docstring): the output of each that failed."""
    with contextlib.ExitStack() as started:
        scratch = RedisServer().start()
        started.callback(scratch.stop)
        log = started.enter_context((tmp_path / "charon.log").open("wb"))
        charon = CharonProcess(
            None, data_dir=tmp_path / "data", env={"CHARON_AUTH": "noauth"}, stdout=log, stderr=log
        )
        started.callback(charon.stop)
        charon.start()

        etc = tmp_path / "etc"
        etc.mkdir()
        (etc / "functional-zaqar.conf").write_text(ZAQAR.format(redis=scratch.url))
        conf = FUNCTIONAL.format(url=charon.url, zaqar_conf=etc / "functional-zaqar.conf")
        (etc / "functional-tests.conf").write_text(conf)
        env = {"ZAQAR_TEST_INTEGRATION": "1", "ZAQAR_TESTS_CONFIGS_DIR": str(etc), "PATH": "/usr/bin:/bin"}
        running = []
        for test in TESTS:
            out = started.enter_context((tmp_path / f"{test.rsplit('.', 1)[1]}.log").open("w+"))
            argv = [str(PYTHON), "-m", "unittest", "-v", test]
            running.append(
                (test, out, spawn(argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT))
            )
        failed = {}
        for test, out, proc in running:
            proc.wait(timeout=RUN_TIMEOUT_S)
            out.seek(0)
            said = out.read()
            if proc.returncode != 0 or "\nOK" not in said:
                failed[test] = said[-4000:]
        return failed
