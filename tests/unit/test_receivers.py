"""The receivers of tests/receivers.py serve other processes too (a live `charon serve`): real sockets,
waited on from a sync test."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.receivers import HttpReceiver, SmtpReceiver, notification_env

SENDER = """
import smtplib, sys, httpx
httpx.post(sys.argv[1], json={"n": 1}, headers={"X-From": "child"})
with smtplib.SMTP("127.0.0.1", int(sys.argv[2])) as smtp:
    smtp.sendmail("a@example.org", ["b@example.org"], "Subject: hi\\r\\n\\r\\nbody")
"""


def test_a_child_process_reaches_the_receivers(
    webhook_receiver: HttpReceiver, smtp_receiver: SmtpReceiver
) -> None:
    subprocess.run(
        [sys.executable, "-c", SENDER, webhook_receiver.url_for("/x"), str(smtp_receiver.port)],
        check=True,
        timeout=30,
    )
    (request,) = webhook_receiver.wait_for(1)
    assert (request.path, request.json(), request.headers["x-from"]) == ("/x", {"n": 1}, "child")
    (mail,) = smtp_receiver.wait_for(1)
    assert (mail.subject, mail.rcpt_tos) == ("hi", ["b@example.org"])


def test_notification_env_points_a_live_server_at_them(smtp_receiver: SmtpReceiver) -> None:
    env = notification_env(smtp_receiver, webhook_timeout="1")
    assert json.loads(env["CHARON_NOTIFICATIONS__ALLOWED_NETWORKS"]) == ["127.0.0.0/8", "::1/128"]
    assert env["CHARON_NOTIFICATIONS__SMTP_PORT"] == str(smtp_receiver.port)
    assert env["CHARON_NOTIFICATIONS__WEBHOOK_TIMEOUT"] == "1"
