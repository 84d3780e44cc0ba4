"""Zaqar's own API tests against Charon: zaqar-tempest-plugin's v2 tests (queues, messages, claims and
subscriptions, with their negative tests), run by tempest as a user of Zaqar would run them. tempest and the
plugin are pinned in the Makefile (TEMPEST) and live in a virtualenv of their own (.venv-tempest, made by
`make install`): their oslo and keystoneauth pins must not move ours.

`run()` starts, each on free loopback ports and tethered to this process (tests/servers.py spawn):
  - the tests' Keystone (tests/keystone.py), whose catalog gets a `messaging` service and a public endpoint
    in RegionOne naming Charon, where tempest looks it up;
  - a redis-server, and `charon serve` on it in Keystone mode, with mail through a real SMTP receiver (Zaqar's
    tests subscribe `mailto:` subscribers, which Charon takes only with an SMTP server to send through);
then writes a tempest workspace (its HOME its own, so nothing lands in ~/.tempest) whose tempest.conf names
Keystone's admin for tempest's dynamic credentials, and runs `tempest run`. Every test must pass but the
EXPECTED_FAILURES, each with why (docs/testing.md says the same).

Run: make tempest (or .venv/bin/python -m tests.tempest)
"""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.keystone import DOMAIN_NAME, PASSWORD, KeystoneServer
from tests.receivers import SmtpReceiver, notification_env
from tests.servers import CharonProcess, RedisServer
from tests.servers import run as run_tethered

ROOT = Path(__file__).resolve().parents[1]
TEMPEST = ROOT / ".venv-tempest" / "bin" / "tempest"
SELECTION = r"^zaqar_tempest_plugin\.tests\.v2\."
RUN_TIMEOUT_S = 900  # the whole run: about 3 minutes, of which 140 s are one test's sleeps (the DLQ test)
# Zaqar's tests that Charon fails, and why; and what their output must show, so that one failing for
# another reason is not taken for the expected failure. Zaqar 23.0.1 failed the same one here.
EXPECTED_FAILURES = {
    "zaqar_tempest_plugin.tests.v2.test_subscriptions.TestSubscriptions.test_trust_subscription": (
        "the notification reaches the queue through the trust, and the test compares it whole with Zaqar's "
        "(body, ttl, queue_name, Message_Type), where Charon's also carries the message's id, href, age and "
        "claim_count (a subscriber deduplicates at-least-once deliveries by the id)"
    ),
}
# its notification, posted back to Charon with the trust's token, in the test's mismatch: the trust worked
FAILURE_SIGNS = {
    "zaqar_tempest_plugin.tests.v2.test_subscriptions.TestSubscriptions.test_trust_subscription": re.compile(
        r"actual\s+= \{'Message_Type': 'Notification',\s+'age': \d+,\s+'body': \{'MessagingKey"
    ),
}
# A test's line; or a class's setUpClass or tearDownClass that failed ("setUpClass (zaqar_...Class)"): then
# none of the class's tests ran, and that is a failure of its own (one CI run lost 44 tests so).
RESULT = re.compile(
    r"^\{\d+\} (?P<test>\S+(?: \([\w.]+\))?) \[[0-9.]+s\] \.\.\. (?P<outcome>ok|FAILED|SKIPPED)"
)
CONFIG = """\
[DEFAULT]
log_file = tempest.log

[auth]
use_dynamic_credentials = True
admin_username = admin
admin_password = {password}
admin_project_name = admin
admin_domain_name = {domain}
tempest_roles = member

[identity]
uri_v3 = {keystone}
auth_version = v3
region = RegionOne

[identity-feature-enabled]
api_v2 = False

[service_available]
zaqar = True
nova = False
neutron = False
glance = False
cinder = False
swift = False
"""


@dataclass
class Outcome:
    """Each test's outcome, by its tempest id, and tempest's own output."""

    passed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    output: str = ""

    @property
    def unexpected(self) -> set[str]:
        """Failed and not expected to, or expected to fail and did not run, passed, or failed without its
        FAILURE_SIGNS in the output."""
        unsigned = {test for test, sign in FAILURE_SIGNS.items() if not sign.search(self.output)}
        return (self.failed ^ set(EXPECTED_FAILURES)) | (self.failed & unsigned)


def available() -> bool:
    return TEMPEST.exists()


def run(workdir: Path, *, concurrency: int = 2) -> Outcome:
    """Zaqar's v2 API tests against a live Charon in Keystone mode (see the module's docstring)."""
    with contextlib.ExitStack() as started:  # each server stopped, whichever started
        smtp = SmtpReceiver().start()
        started.callback(smtp.stop)
        keystone = KeystoneServer().start()
        started.callback(keystone.stop)
        started.callback(keystone.keep_logs, workdir)  # before stop: its logs beside charon.log
        redis = RedisServer().start()
        started.callback(redis.stop)
        service = keystone.service_credentials()
        creds = {f"CHARON_KEYSTONE__{key.upper()}": value for key, value in service.items()}
        env = {**creds, "CHARON_AUTH": "keystone", **notification_env(smtp)}
        log = started.enter_context((workdir / "charon.log").open("wb"))
        charon = CharonProcess(redis.url, namespace="tempest", env=env, stdout=log, stderr=log)
        started.callback(charon.stop)
        charon.start()
        keystone.register_messaging(charon.url)
        return _tempest(workdir, keystone, concurrency)


def _tempest(workdir: Path, keystone: KeystoneServer, concurrency: int) -> Outcome:
    workspace = workdir / "workspace"
    home = {"HOME": str(workdir), "PATH": f"{TEMPEST.parent}:/usr/bin:/bin"}
    init = run_tethered([str(TEMPEST), "init", str(workspace)], timeout=120, env=home)
    if init.returncode != 0:
        raise RuntimeError(f"tempest init failed: {init.stderr[-2000:]}")
    conf = CONFIG.format(password=PASSWORD, domain=DOMAIN_NAME, keystone=keystone.url)
    (workspace / "etc" / "tempest.conf").write_text(conf)
    argv = [str(TEMPEST), "run", "--regex", SELECTION, "--concurrency", str(concurrency)]
    done = run_tethered(argv, timeout=RUN_TIMEOUT_S, env=home, cwd=workspace)
    outcome = Outcome(output=done.stdout + done.stderr)
    for line in done.stdout.splitlines():
        if m := RESULT.match(line):
            kind = {"ok": outcome.passed, "FAILED": outcome.failed, "SKIPPED": outcome.skipped}
            kind[m["outcome"]].add(m["test"])
    if not outcome.passed and not outcome.failed:
        raise RuntimeError(f"tempest ran nothing: {outcome.output[-3000:]}")
    return outcome


def main() -> int:
    import tempfile

    if not available():
        print("tempest is not installed: run `make install` (it makes .venv-tempest)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="charon-tempest-") as tmp:
        outcome = run(Path(tmp))
    counts = f"{len(outcome.passed)} passed, {len(outcome.failed)} failed, {len(outcome.skipped)} skipped"
    print(f"zaqar-tempest-plugin v2 against Charon: {counts}")
    for test in sorted(outcome.failed):
        why = EXPECTED_FAILURES.get(test)
        print(f"  failed: {test}" + (f" (expected: {why})" if why else ""))
    for test in sorted(set(EXPECTED_FAILURES) - outcome.failed):
        print(f"  expected to fail, and did not: {test}: remove it from EXPECTED_FAILURES")
    if outcome.unexpected:
        print(outcome.output[-20000:])
    return 1 if outcome.unexpected else 0


if __name__ == "__main__":
    raise SystemExit(main())
