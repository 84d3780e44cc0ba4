"""`Deliverer`: one notification to one subscriber, webhook or mail, within bounds: each delivery takes
at most webhook_timeout (smtp_timeout for a mail) once it has a slot; at most max_concurrent are in flight in
the process and max_per_subscriber to one subscription, so a subscriber that hangs holds only its own
slots; and the SSRF guard (service/ssrf.py) vets every address a webhook connects to.

A `trust+http(s)` subscriber (Zaqar's trust notifier) is a webhook to the URL after `trust+`, sent with
X-Auth-Token: a token scoped to the Keystone trust its creator made (options.trust_id), got through the
`trust_tokens` the process was given (api/keystone.py Trustee; none without Keystone).

A `websocket://127.0.0.1:<port>/<key>?machine=<id>` subscriber is a websocket connection that subscribed
itself (api/ws_notices.py): only the service makes one, and it is POSTed to over loopback (http://), alone
of all subscribers allowed there whatever CHARON_NOTIFICATIONS__ALLOWED_NETWORKS says; only by a notifier
on the machine it names (another one's loopback is not the listener's: it gives the delivery up), and with
the notification alone (no post_data, no post_headers: nothing a tenant chose reaches a local port)."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from core.errors import InvalidInput
from core.models import Subscription
from core.retry import parse_retry_policy
from service.delivery.http1 import ProtocolFailure, WebhookClient
from service.delivery.mailto import check_mail_options, send_mail
from service.delivery.outcome import Outcome, failed, retry
from service.delivery.settings import NotificationSettings
from service.delivery.webhook import outcome_of_status, webhook_request
from service.ssrf import TRUST_PREFIX, Refused, is_trusted

MAX_ANSWER_BYTES = (
    64 * 1024
)  # of a webhook's answer read (so that its connection can be kept); the rest is not
KEEPALIVE_CONNECTIONS = 64

log = logging.getLogger("charon.notifier")

NOTICE_SCHEME = "websocket"  # a websocket connection's own subscription (api/ws_notices.py)
NOTICE_HOST = "127.0.0.1"


def machine_id() -> str:
    """This machine, as a websocket subscriber names it: a hash of /etc/machine-id (else of its host name)."""
    try:
        with open("/etc/machine-id", "rb") as f:
            seed = f.read().strip()
    except OSError:
        seed = b""
    return hashlib.sha256(seed or socket.gethostname().encode()).hexdigest()[:16]


MACHINE = machine_id()
LOOPBACK = (ipaddress.IPv4Network("127.0.0.0/8"),)
TrustTokens = Callable[[str], Awaitable[str]]  # a trust's id -> a token scoped to it (raises when none)


def check_options(options: Mapping[str, Any]) -> None:
    """The options a delivery uses, checked when a subscription is created or changed (Zaqar takes any
    object): post_data a string, post_headers an object of strings, subject and from single-line strings,
    _retry_policy (core/retry.py). Other keys are the client's own. Raises InvalidInput naming the option."""
    webhook_request(options, {})
    check_mail_options(options)
    if "_retry_policy" in options:
        parse_retry_policy(options["_retry_policy"], field="options._retry_policy")


@dataclass(slots=True)
class _Slots:
    """One subscription's slots; kept while a delivery to it holds or waits for one."""

    semaphore: asyncio.Semaphore
    users: int = 0
    active: int = 0


class Deliverer:
    """Sends notifications; one per process (it holds the HTTP connection pool). Close it with aclose()."""

    def __init__(self, settings: NotificationSettings, *, trust_tokens: TrustTokens | None = None) -> None:
        self.settings = settings
        self._trust_tokens = trust_tokens
        self._slots = asyncio.Semaphore(settings.max_concurrent)
        self._subscriptions: dict[str, _Slots] = {}
        self._active = 0
        self._client = WebhookClient(
            settings.allowed_networks,
            denied=settings.denied_networks,
            max_idle=min(settings.max_concurrent, KEEPALIVE_CONNECTIONS),
            max_answer_bytes=MAX_ANSWER_BYTES,
        )
        self._loopback = WebhookClient(LOOPBACK, max_idle=4, max_answer_bytes=MAX_ANSWER_BYTES)

    async def __aenter__(self) -> Deliverer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._loopback.aclose()

    def in_flight(self, subscription_id: str | None = None) -> int:
        """Deliveries being sent now, in the process or to one subscription."""
        if subscription_id is None:
            return self._active
        slots = self._subscriptions.get(subscription_id)
        return 0 if slots is None else slots.active

    async def deliver(self, subscription: Subscription, document: dict[str, Any]) -> Outcome:
        """Send `document` to `subscription`'s subscriber once: POST it to an http(s) URI, mail it to a
        mailto: one. Waits at most webhook_timeout for a slot (then a `retry` outcome, not attempted)."""
        try:
            scheme = urlsplit(subscription.subscriber).scheme.lower()
        except ValueError:
            return failed("the subscriber is not a valid URI")
        send: Callable[[Subscription, dict[str, Any]], Awaitable[Outcome]]
        if scheme in ("http", "https", "trust+http", "trust+https", NOTICE_SCHEME):
            send = self._post
        elif scheme == "mailto":
            send = self._mail
        else:
            return failed(f"unsupported subscriber scheme {scheme[:20]!r}")
        slots = self._subscriptions.get(subscription.id)
        if slots is None:
            slots = self._subscriptions[subscription.id] = _Slots(
                asyncio.Semaphore(self.settings.max_per_subscriber)
            )
        slots.users += 1
        deadline = asyncio.get_running_loop().time() + self.settings.webhook_timeout
        try:
            # the subscription's slot first: deliveries waiting on a hanging subscriber hold no process slot
            if not await _acquire(slots.semaphore, deadline):
                return retry(
                    f"busy: {self.settings.max_per_subscriber} deliveries to this subscription in flight",
                    attempted=False,
                )
            try:
                if not await _acquire(self._slots, deadline):
                    return retry(
                        f"busy: {self.settings.max_concurrent} deliveries in flight in this process",
                        attempted=False,
                    )
                slots.active += 1
                self._active += 1
                try:
                    return await send(subscription, document)
                except Exception as exc:  # what no retry can fix (a header the client cannot encode, ...)
                    log.warning("delivery to subscription %s cannot be made: %r", subscription.id, exc)
                    return failed(f"{type(exc).__name__}: {str(exc)[:200]}")
                finally:
                    slots.active -= 1
                    self._active -= 1
                    self._slots.release()
            finally:
                slots.semaphore.release()
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._subscriptions[subscription.id]

    async def _post(self, subscription: Subscription, document: dict[str, Any]) -> Outcome:
        url, auth, client, options = subscription.subscriber, {}, self._client, subscription.options
        if url.startswith(f"{NOTICE_SCHEME}://"):
            url, client, options = "http" + url[len(NOTICE_SCHEME) :], self._loopback, {}
            parts = urlsplit(url)
            if parts.hostname != NOTICE_HOST:
                return failed(f"a websocket subscriber is on {NOTICE_HOST} alone")
            if parts.query != f"machine={MACHINE}":
                return failed("a websocket connection of another machine: this notifier cannot reach it")
        elif is_trusted(url):
            url = url[len(TRUST_PREFIX) :]
            trust = subscription.options.get("trust_id")
            if self._trust_tokens is None or not isinstance(trust, str):
                return failed("a trust+ subscriber needs its Keystone trust, and this process has none")
            try:
                async with asyncio.timeout(self.settings.webhook_timeout):
                    auth = {"X-Auth-Token": await self._trust_tokens(trust)}
            except Exception as exc:  # expired, deleted, or Keystone away: the retry policy decides
                return retry(f"no token for the subscription's Keystone trust: {type(exc).__name__}")
        try:
            body, headers = webhook_request(options, document, auth)
        except InvalidInput as exc:
            return failed(exc.description)
        timeout = self.settings.webhook_timeout
        try:
            async with asyncio.timeout(timeout):
                answer = await client.post(url, body, headers)
        except Refused as exc:
            return failed(f"refused: {exc}")
        except TimeoutError:
            return retry(f"no answer within {timeout:g} s")
        except ValueError as exc:  # not an http(s) URL with a host (checked when subscribed, so unlikely)
            return failed(f"{type(exc).__name__}: {str(exc)[:200]}")
        except (OSError, asyncio.IncompleteReadError, ProtocolFailure) as exc:  # no connection, or it broke
            return retry(f"{type(exc).__name__}: {str(exc)[:200]}")
        return outcome_of_status(answer.status, answer.location)

    async def _mail(self, subscription: Subscription, document: dict[str, Any]) -> Outcome:
        try:
            async with asyncio.timeout(self.settings.smtp_timeout):
                return await send_mail(self.settings, subscription.subscriber, subscription.options, document)
        except TimeoutError:
            return retry(f"SMTP: not sent within {self.settings.smtp_timeout:g} s")


async def _acquire(semaphore: asyncio.Semaphore, deadline: float) -> bool:
    try:
        async with asyncio.timeout_at(deadline):
            await semaphore.acquire()
    except TimeoutError:
        return False
    return True
