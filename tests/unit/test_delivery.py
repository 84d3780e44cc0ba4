"""Delivering notifications to real receivers (tests/receivers.py): webhooks, mail, the SSRF guard and the
concurrency bounds (service/delivery, service/ssrf.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import InvalidInput
from core.limits import Limits
from core.models import Subscription, SubscriptionId
from core.signing import SignedGrant
from service.delivery import Deliverer, NotificationSettings, check_options, confirmation_document
from service.ssrf import Refused, check_addresses, check_subscriber, refusal, resolve_checked
from tests.receivers import LOOPBACK_NETWORKS, HttpReceiver, SmtpReceiver

LOOPBACK = NotificationSettings(allowed_networks=LOOPBACK_NETWORKS, webhook_timeout=1)
DOCUMENT = {"body": {"event": "BackupStarted"}, "ttl": 300, "Message_Type": "Notification", "queue_name": "q"}


def subscription(subscriber: str, options: dict[str, Any] | None = None, sid: str = "s1") -> Subscription:
    return Subscription(
        id=SubscriptionId(sid),
        queue="q",
        subscriber=subscriber,
        ttl=3600,
        options=options or {},
        created_ms=0,
        expires_ms=3_600_000,
        confirmed=True,
    )


async def deliver(
    settings: NotificationSettings, sub: Subscription, document: dict[str, Any] = DOCUMENT
) -> Any:
    async with Deliverer(settings) as deliverer:
        return await deliverer.deliver(sub, document)


# --- webhooks ---


async def test_a_webhook_gets_the_document_as_json(webhook_receiver: HttpReceiver) -> None:
    outcome = await deliver(LOOPBACK, subscription(webhook_receiver.url_for("/hook?x=1")))
    assert (outcome.result, outcome.reason) == ("delivered", "HTTP 200")
    (request,) = webhook_receiver.requests
    assert (request.method, request.target) == ("POST", "/hook?x=1")
    assert request.headers["content-type"] == "application/json"
    assert request.headers["host"] == f"127.0.0.1:{webhook_receiver.port}"
    assert request.body == json.dumps(DOCUMENT).encode()  # Zaqar's json.dumps format


async def test_post_data_and_post_headers_are_applied_as_zaqar_does(webhook_receiver: HttpReceiver) -> None:
    options = {
        "post_data": '{"ticket": {"detail": "$zaqar_message$"}, "note": "in $zaqar_message$ text"}',
        "post_headers": {"content-type": "application/vnd.ticket+json", "X-Auth-Token": "t0k"},
    }
    outcome = await deliver(LOOPBACK, subscription(webhook_receiver.url_for(), options))
    assert outcome.delivered
    (request,) = webhook_receiver.requests
    # only the quoted placeholder is replaced; the bare one inside another string stays
    assert request.json() == {"ticket": {"detail": DOCUMENT}, "note": "in $zaqar_message$ text"}
    assert request.headers["content-type"] == "application/vnd.ticket+json"
    assert request.headers["x-auth-token"] == "t0k"


async def test_a_websocket_subscriber_gets_the_notification_alone_from_its_own_machine(
    webhook_receiver: HttpReceiver,
) -> None:
    """A websocket connection's subscriber (made by the service alone) is POSTed to over loopback without
    the tenant's post_data and post_headers, and only by a notifier on the machine it names: elsewhere,
    127.0.0.1 is another machine's loopback, whatever listens there."""
    from service.delivery.deliverer import MACHINE

    options = {"post_data": '{"x": "$zaqar_message$"}', "post_headers": {"X-Evil": "1"}}
    here = f"websocket://127.0.0.1:{webhook_receiver.port}/k1?machine={MACHINE}"
    outcome = await deliver(NotificationSettings(webhook_timeout=1), subscription(here, options))
    assert outcome.delivered, outcome.reason
    (request,) = webhook_receiver.requests
    assert (request.target, request.json()) == (f"/k1?machine={MACHINE}", DOCUMENT)
    assert "x-evil" not in request.headers
    there = f"websocket://127.0.0.1:{webhook_receiver.port}/k1?machine=0123456789abcdef"
    elsewhere = await deliver(NotificationSettings(webhook_timeout=1), subscription(there))
    assert (elsewhere.result, "another machine" in elsewhere.reason) == ("failed", True)
    assert len(webhook_receiver.requests) == 1


async def test_a_trust_subscriber_without_a_token_is_retried_or_given_up(
    webhook_receiver: HttpReceiver,
) -> None:
    """A trust+ subscriber is posted to only with its trust's token: none to be had is a retry (Keystone may
    come back), a process with no Keystone at all gives it up; neither sends the notification bare."""

    async def keystone_away(trust: str) -> str:
        raise ConnectionRefusedError(f"no Keystone to ask for {trust}")

    sub = subscription("trust+" + webhook_receiver.url_for("/hook"), {"trust_id": "t1"})
    async with Deliverer(LOOPBACK, trust_tokens=keystone_away) as deliverer:
        away = await deliverer.deliver(sub, DOCUMENT)
    assert (away.result, away.reason) == (
        "retry",
        "no token for the subscription's Keystone trust: ConnectionRefusedError",
    )
    none = await deliver(LOOPBACK, sub)
    assert none.result == "failed"
    assert "Keystone trust" in none.reason
    assert webhook_receiver.requests == []


@pytest.mark.parametrize(
    ("status", "result"), [(500, "retry"), (503, "retry"), (408, "retry"), (429, "retry")]
)
async def test_temporary_answers_ask_for_a_retry(
    webhook_receiver: HttpReceiver, status: int, result: str
) -> None:
    webhook_receiver.answer(status)
    outcome = await deliver(LOOPBACK, subscription(webhook_receiver.url_for()))
    assert (outcome.result, outcome.reason) == (result, f"HTTP {status}")


@pytest.mark.parametrize("status", [400, 403, 404, 410])
async def test_other_client_errors_fail_for_good(webhook_receiver: HttpReceiver, status: int) -> None:
    webhook_receiver.answer(status)
    assert (await deliver(LOOPBACK, subscription(webhook_receiver.url_for()))).result == "failed"


async def test_the_failing_receiver_succeeds_on_the_third_try(failing_receiver: HttpReceiver) -> None:
    sub = subscription(failing_receiver.url_for())
    async with Deliverer(LOOPBACK) as deliverer:
        results = [(await deliverer.deliver(sub, DOCUMENT)).result for _ in range(3)]
    assert results == ["retry", "retry", "delivered"]
    assert len(failing_receiver.requests) == 3


async def test_a_hanging_receiver_is_a_retry_within_the_timeout(hanging_receiver: HttpReceiver) -> None:
    started = time.monotonic()
    outcome = await deliver(LOOPBACK, subscription(hanging_receiver.url_for()))
    assert (outcome.result, outcome.reason) == ("retry", "no answer within 1 s")
    assert time.monotonic() - started < 2
    assert len(hanging_receiver.requests) == 1


async def test_a_timed_out_delivery_hangs_up(hanging_receiver: HttpReceiver) -> None:
    sub = subscription(hanging_receiver.url_for())
    async with Deliverer(LOOPBACK) as deliverer:
        for _ in range(2):
            assert (await deliverer.deliver(sub, DOCUMENT)).result == "retry"
    assert len(hanging_receiver.requests) == 2
    assert hanging_receiver.max_in_flight == 1  # the first connection was closed, not left to hang


async def test_redirects_are_not_followed(webhook_receiver: HttpReceiver) -> None:
    webhook_receiver.answer(302, headers={"Location": webhook_receiver.url_for("/elsewhere")})
    outcome = await deliver(LOOPBACK, subscription(webhook_receiver.url_for("/hook")))
    assert outcome.result == "failed"
    assert "redirects are not followed" in outcome.reason
    assert [r.path for r in webhook_receiver.requests] == ["/hook"]


async def test_a_large_answer_is_not_read_to_its_end(webhook_receiver: HttpReceiver) -> None:
    webhook_receiver.answer(200, body=b"x" * 5_000_000)
    assert (await deliver(LOOPBACK, subscription(webhook_receiver.url_for()))).delivered


async def test_deliveries_to_one_receiver_share_a_kept_alive_connection(
    webhook_receiver: HttpReceiver,
) -> None:
    async with Deliverer(LOOPBACK) as deliverer:
        for n in range(5):
            outcome = await deliverer.deliver(subscription(webhook_receiver.url_for()), {"n": n})
            assert outcome.delivered, outcome
    assert [r.json() for r in webhook_receiver.requests] == [{"n": n} for n in range(5)]
    assert webhook_receiver.connections == 1


async def test_a_receiver_that_hangs_up_after_each_answer_gets_each_delivery_once(
    webhook_receiver: HttpReceiver,
) -> None:
    webhook_receiver.close_after_answer = True
    async with Deliverer(LOOPBACK) as deliverer:
        for n in range(5):
            outcome = await deliverer.deliver(subscription(webhook_receiver.url_for()), {"n": n})
            assert outcome.delivered, outcome
            await asyncio.sleep(0.01 * (n % 2))  # the hang-up seen before the next POST, or not yet
    assert [r.json() for r in webhook_receiver.requests] == [{"n": n} for n in range(5)]
    assert webhook_receiver.connections == 5


async def test_a_path_beyond_ascii_is_sent_percent_encoded(webhook_receiver: HttpReceiver) -> None:
    async with Deliverer(LOOPBACK) as deliverer:
        outcome = await deliverer.deliver(subscription(webhook_receiver.url_for("/café?q=ü&x=%41")), {})
    assert outcome.delivered, outcome
    assert webhook_receiver.requests[0].target == "/caf%C3%A9?q=%C3%BC&x=%41"


async def test_nobody_listening_is_a_retry() -> None:
    from tests.servers import free_port

    outcome = await deliver(LOOPBACK, subscription(f"http://127.0.0.1:{free_port()}/"))
    assert outcome.result == "retry"
    assert "ConnectionRefused" in outcome.reason


async def test_unusable_options_fail_without_a_request(webhook_receiver: HttpReceiver) -> None:
    outcome = await deliver(LOOPBACK, subscription(webhook_receiver.url_for(), {"post_headers": {"X": 1}}))
    assert outcome.result == "failed"
    assert "options.post_headers.X must be a string" in outcome.reason
    assert webhook_receiver.requests == []


# --- the SSRF guard ---


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_loopback_is_refused_unless_allowed(webhook_receiver: HttpReceiver, host: str) -> None:
    uri = f"http://{host}:{webhook_receiver.port}/hook"
    outcome = await deliver(NotificationSettings(webhook_timeout=1), subscription(uri))
    assert outcome.result == "failed"
    assert "loopback" in outcome.reason
    assert webhook_receiver.requests == []
    # allowed by the operator: the same URI is delivered, to the address that was checked
    assert (await deliver(LOOPBACK, subscription(uri))).delivered
    (request,) = webhook_receiver.requests
    assert request.headers["host"] == f"{host}:{webhook_receiver.port}"


def test_a_name_is_refused_when_any_of_its_addresses_is() -> None:
    with pytest.raises(Refused, match=r"evil\.example resolves to 169\.254\.169\.254, which is a link-local"):
        check_addresses("evil.example", ["93.184.216.34", "169.254.169.254"])
    assert check_addresses("ok.example", ["10.0.0.1", "10.0.0.1", "fd00::1"]) == ["10.0.0.1", "fd00::1"]
    allowed = [ipaddress.ip_network("127.0.0.0/8")]
    with pytest.raises(Refused, match=r"::1, which is a loopback"):  # 127.0.0.0/8 does not allow ::1
        check_addresses("localhost", ["127.0.0.1", "::1"], allowed)


async def test_a_resolved_name_is_checked() -> None:
    with pytest.raises(Refused, match=r"localhost resolves to 127\.0\.0\.1, which is a loopback address"):
        await resolve_checked("localhost", 80)
    assert await resolve_checked("localhost", 80, [ipaddress.ip_network(n) for n in LOOPBACK_NETWORKS])


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::", "link-local"),  # 6to4 of 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, its client 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:5601:5601", "link-local"),  # Teredo, its client 169.254.169.254
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:5db8:d822::", None),  # 6to4 of a public address
        ("64:ff9b::5db8:d822", None),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.1.2.3", "this-network (0.0.0.0/8)"),
        ("10.0.0.5", None),  # RFC 1918: tenants' receivers live there
        ("172.16.1.1", None),
        ("192.168.1.1", None),
        ("fd00::1", None),
        ("93.184.216.34", None),
    ],
)
def test_refused_networks(address: str, why: str | None) -> None:
    assert refusal(ipaddress.ip_address(address)) == why


def test_allowed_networks_override_a_refusal() -> None:
    allowed = [ipaddress.ip_network("169.254.0.0/16")]
    assert refusal(ipaddress.ip_address("169.254.169.254"), allowed) is None
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) == "loopback"


LIMITS = Limits()


@pytest.mark.parametrize(
    "uri",
    [
        "http://receiver.example.com/hook",
        "https://10.1.2.3:8443/x?y=z",
        "http://[fd00::1]/",
        "mailto:ops@example.com",
        "mailto:ops@example.com?subject=Queue%20events",
        "mailto:root@localhost?Subject=x",
    ],
)
def test_good_subscribers(uri: str) -> None:
    assert check_subscriber(uri, LIMITS) == uri


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("ftp://example.com/", r"supported ones: http, https, mailto"),
        ("file:///etc/passwd", r"supported ones"),
        ("example.com/hook", r"supported ones"),
        ("", r"subscriber must be a non-empty string"),
        ("http://" + "a" * 2100 + ".com/", r"subscriber must be at most 2048 characters long"),
        ("http:///hook", r"needs a host"),
        ("http://user:pw@example.com/", r"subscriber must not carry a user name or password"),
        ("http://example.com:0/", r"port of subscriber must be a number from 1 to 65535"),
        ("http://example.com:65536/", r"subscriber is not a valid URI"),
        ("http://example.com:http/", r"subscriber is not a valid URI"),
        ("http://[zzz]/", r"subscriber is not a valid URI"),
        ("http://[::1/", r"subscriber is not a valid URI"),
        ("http://exa mple.com/", r"subscriber must not contain spaces"),
        ("http://127.0.0.1:8080/", r"subscriber may not reach 127\.0\.0\.1, a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", r"link-local"),
        ("http://[::1]/", r"loopback"),
        ("http://[::ffff:127.0.0.1]/", r"loopback"),
        ("http://2130706433/", r"loopback"),  # 127.0.0.1 as a resolver reads it
        ("http://127.1/", r"loopback"),
        ("http://0.0.0.0/", r"unspecified"),
        ("mailto:", r"subscriber must name exactly one e-mail address"),
        ("mailto:a@example.com,b@example.com", r"exactly one e-mail address"),
        ("mailto:not-an-address", r"exactly one e-mail address"),
        ("mailto://ops@example.com", r"exactly one e-mail address"),
        ("mailto:ops@example.com?cc=boss@example.com", r"may only have a subject header; got 'cc'"),
        ("mailto:ops@example.com?subject=a&subject=b", r"one subject header"),
        ("mailto:ops@example.com?subject=a%0d%0aBcc:x@example.com", r"must not contain control characters"),
    ],
)
def test_bad_subscribers_name_the_field(uri: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        check_subscriber(uri, LIMITS)


def test_an_operator_allowed_network_may_be_subscribed() -> None:
    allowed = [ipaddress.ip_network("127.0.0.0/8")]
    assert check_subscriber("http://127.0.0.1:8080/", LIMITS, allowed_networks=allowed)


def test_an_operator_denies_networks_private_ones_included_allowing_exceptions() -> None:
    """CHARON_NOTIFICATIONS__DENIED_NETWORKS: a Charon beside internal services refuses webhooks to them, at
    subscribing (an IP in the URL) and at delivery (every address a name resolves to); ALLOWED_NETWORKS
    makes exceptions."""
    denied = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]
    allowed = [ipaddress.ip_network("10.9.9.9/32")]
    assert refusal(ipaddress.ip_address("10.1.2.3")) is None  # private: allowed by default
    assert (
        refusal(ipaddress.ip_address("10.1.2.3"), (), denied)
        == "denied (CHARON_NOTIFICATIONS__DENIED_NETWORKS)"
    )
    assert refusal(ipaddress.ip_address("fd00::5"), (), denied) is not None
    assert refusal(ipaddress.ip_address("10.9.9.9"), allowed, denied) is None
    assert refusal(ipaddress.ip_address("192.168.1.1"), allowed, denied) is None
    with pytest.raises(InvalidInput, match=r"subscriber may not reach 10\.1\.2\.3, a denied"):
        check_subscriber("http://10.1.2.3:8080/hook", LIMITS, denied_networks=denied)
    assert check_subscriber("http://10.9.9.9/", LIMITS, allowed_networks=allowed, denied_networks=denied)
    with pytest.raises(Refused, match=r"jobs\.internal resolves to 10\.0\.0\.7, which is a denied"):
        check_addresses("jobs.internal", ["192.0.2.10", "10.0.0.7"], (), denied)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"post_data": {"a": 1}}, r"options\.post_data must be a string"),
        ({"post_headers": ["X: 1"]}, r"options\.post_headers must be an object"),
        ({"post_headers": {"Bad Name": "1"}}, r"invalid header name 'Bad Name'"),
        (
            {"post_headers": {"X": "a\r\nEvil: 1"}},
            r"options\.post_headers\.X must be a string of at most 4,096 visible ASCII",
        ),
        ({"post_headers": {"X": "\u00fc\u2603"}}, r"options\.post_headers\.X must be a string of at most"),
        ({"post_headers": {"X": "a\x01"}}, r"options\.post_headers\.X must be a string of at most"),
        # the request's framing and routing: a subscriber could split one POST in two on a kept connection
        (
            {"post_headers": {"Transfer-Encoding": "chunked"}},
            r"post_headers\.Transfer-Encoding is the service's",
        ),
        ({"post_headers": {"content-length": "4"}}, r"post_headers\.content-length is the service's"),
        ({"post_headers": {"Host": "internal.example"}}, r"post_headers\.Host is the service's"),
        ({"post_headers": {"Connection": "close"}}, r"post_headers\.Connection is the service's"),
        ({"post_headers": {"Proxy-Foo": "1"}}, r"post_headers\.Proxy-Foo is the service's"),
        ({"post_headers": {f"X-{i}": "1" for i in range(33)}}, r"at most 32 headers"),
        ({"subject": 5}, r"options\.subject must be a string"),
        ({"subject": "a\nBcc: c@d"}, r"options\.subject must be a string of at most 998 printable"),
        ({"from": "a@b\nBcc: c@d"}, r"options\.from must be one mail address"),
        ({"from": "ceo@bank.example, other@evil.example"}, r"options\.from must be one mail address"),
        (
            {"_retry_policy": {"minimum_delay": 0}},
            r"options\._retry_policy\.minimum_delay must be an integer",
        ),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        check_options(options)


def test_good_options_pass() -> None:
    check_options(
        {"post_data": "{}", "post_headers": {"X-A": "1"}, "subject": "s", "mine": [1], "_retry_policy": {}}
    )


# --- mail ---


def mail_settings(smtp: SmtpReceiver, **more: Any) -> NotificationSettings:
    return NotificationSettings(
        smtp_host=smtp.host, smtp_port=smtp.port, smtp_sender="charon@example.org", **more
    )


async def test_a_mailto_subscriber_gets_the_document_as_the_body(smtp_receiver: SmtpReceiver) -> None:
    sub = subscription(
        "mailto:ops@example.com?subject=Backup%20events", {"subject": "ignored", "from": "q@ex.org"}
    )
    outcome = await deliver(mail_settings(smtp_receiver), sub)
    assert outcome.delivered
    (mail,) = await smtp_receiver.arrived(1)
    assert mail.rcpt_tos == ["ops@example.com"]
    assert mail.mail_from == "charon@example.org"  # the envelope: bounces go to the operator
    assert mail.message["From"] == "q@ex.org"
    assert mail.message["To"] == "ops@example.com"
    assert mail.subject == "Backup events"  # the URI's subject wins over the option, as in Zaqar
    assert json.loads(mail.body()) == DOCUMENT


async def test_mail_subject_and_sender_from_options_and_settings(smtp_receiver: SmtpReceiver) -> None:
    await deliver(
        mail_settings(smtp_receiver), subscription("mailto:ops@example.com", {"subject": "From options"})
    )
    (mail,) = await smtp_receiver.arrived(1)
    assert (mail.subject, mail.message["From"]) == ("From options", "charon@example.org")


async def test_a_refused_mail_is_a_retry(smtp_receiver: SmtpReceiver) -> None:
    smtp_receiver.fail(1)
    sub = subscription("mailto:ops@example.com")
    async with Deliverer(mail_settings(smtp_receiver)) as deliverer:
        first = await deliverer.deliver(sub, DOCUMENT)
        second = await deliverer.deliver(sub, DOCUMENT)
    assert (first.result, second.result) == ("retry", "delivered")
    assert "451" in first.reason
    assert len(await smtp_receiver.arrived(1)) == 1


async def test_no_smtp_server_is_a_retry() -> None:
    from tests.servers import free_port

    settings = NotificationSettings(smtp_host="127.0.0.1", smtp_port=free_port(), smtp_timeout=2)
    assert (await deliver(settings, subscription("mailto:ops@example.com"))).result == "retry"


async def test_mail_off_fails() -> None:
    outcome = await deliver(NotificationSettings(), subscription("mailto:ops@example.com"))
    assert outcome.result == "failed"
    assert "SMTP_HOST" in outcome.reason


# --- confirmation documents ---

KEY = b"secret"


def test_the_confirmation_request_is_zaqars_with_a_signed_put() -> None:
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    doc = confirmation_document(
        subscription("http://r.example/", sid="abc"),
        project="p1",
        key=KEY,
        expires=expires,
        public_endpoint="https://charon.example:8888/",
    )
    path = "/v2/queues/q/subscriptions/abc/confirm"
    grant = SignedGrant(paths=(path,), methods=("PUT",), project="p1", expires="2030-01-02T03:04:05")
    assert doc == {
        "WSGISubscribeURL": "https://charon.example:8888" + path,
        "Message_Type": "SubscriptionConfirmation",
        "Message": "You have chosen to subscribe to the queue: q",
        "URL-Signature": grant.signature(KEY),
        "URL-Methods": "PUT",
        "URL-Paths": path,
        "X-Project-ID": "p1",
        "URL-Expires": "2030-01-02T03:04:05",
        "SubscribeBody": {"confirmed": True},
        "UnsubscribeBody": {"confirmed": False},
        "queue_name": "q",
    }
    assert grant.verifies(KEY, doc["URL-Signature"])


def test_the_unsubscribe_notice() -> None:
    doc = confirmation_document(
        subscription("http://r.example/"),
        project="p1",
        key=KEY,
        expires=datetime.now(UTC) + timedelta(hours=1),
        unsubscribed=True,
    )
    assert doc["Message_Type"] == "UnsubscribeConfirmation"
    assert doc["Message"] == (
        "You have unsubscribed successfully to the queue: q, you can resubscribe it by using confirmed=True."
    )
    assert "WSGISubscribeURL" not in doc


async def test_a_mailed_confirmation_gets_zaqars_subject(smtp_receiver: SmtpReceiver) -> None:
    sub = subscription("mailto:ops@example.com?subject=mine")
    doc = confirmation_document(sub, project="p1", key=KEY, expires=datetime.now(UTC) + timedelta(hours=1))
    assert (await deliver(mail_settings(smtp_receiver), sub, doc)).delivered
    (mail,) = await smtp_receiver.arrived(1)
    assert mail.subject == "Zaqar Notification - Subscription Confirmation"
    assert json.loads(mail.body())["URL-Paths"] == "/v2/queues/q/subscriptions/s1/confirm"


# --- concurrency ---


async def test_a_hanging_subscriber_holds_only_its_own_slots(
    hanging_receiver: HttpReceiver, webhook_receiver: HttpReceiver
) -> None:
    settings = NotificationSettings(
        allowed_networks=LOOPBACK_NETWORKS, webhook_timeout=1.5, max_concurrent=4, max_per_subscriber=2
    )
    stuck = subscription(hanging_receiver.url_for(), sid="stuck")
    healthy = subscription(webhook_receiver.url_for(), sid="healthy")
    async with Deliverer(settings) as deliverer:
        pending = [asyncio.create_task(deliverer.deliver(stuck, DOCUMENT)) for _ in range(10)]
        await hanging_receiver.arrived(2)
        assert deliverer.in_flight("stuck") == 2
        started = time.monotonic()
        outcome = await deliverer.deliver(healthy, DOCUMENT)
        assert outcome.delivered
        assert time.monotonic() - started < 1  # not queued behind the hanging subscriber
        outcomes = await asyncio.gather(*pending)
        assert deliverer.in_flight() == 0
    assert hanging_receiver.max_in_flight == 2
    assert {o.result for o in outcomes} == {"retry"}
    # two waited for a slot in vain (nothing sent), the others were sent in two waves and timed out
    busy = [o for o in outcomes if not o.attempted]
    assert len(busy) == 10 - len(hanging_receiver.requests)
    assert all(o.reason.startswith("busy: 2 deliveries to this subscription") for o in busy)


async def test_the_process_bound_holds_across_subscribers(hanging_receiver: HttpReceiver) -> None:
    settings = NotificationSettings(
        allowed_networks=LOOPBACK_NETWORKS, webhook_timeout=1, max_concurrent=3, max_per_subscriber=2
    )
    subs = [subscription(hanging_receiver.url_for(f"/{n}"), sid=f"s{n}") for n in range(4)]
    async with Deliverer(settings) as deliverer:
        outcomes = await asyncio.gather(*(deliverer.deliver(s, DOCUMENT) for s in subs for _ in range(2)))
    assert hanging_receiver.max_in_flight == 3
    # 3 sent at once; of the 5 waiting, those whose wait ends before a slot frees are not sent (at least 2:
    # 3 slots free up when the first 3 time out, just as the waits end)
    busy = [o for o in outcomes if not o.attempted]
    assert 2 <= len(busy) <= 5
    assert len(hanging_receiver.requests) == 8 - len(busy)
    assert all(o.reason == "busy: 3 deliveries in flight in this process" for o in busy)
