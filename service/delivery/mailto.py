"""mailto: notifications, as Zaqar's mailto task writes them: To the URI's address, the subject from the
URI's `?subject=` else the `subject` option, From the `from` option, the body the document as JSON. A
confirmation request or unsubscribe notice gets Zaqar's default subject for it. Sent with aiosmtplib
through the operator's SMTP server (CHARON_NOTIFICATIONS__SMTP_*)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

import aiosmtplib

from core.errors import InvalidInput
from service.delivery.confirm import SUBSCRIPTION_CONFIRMATION, UNSUBSCRIBE_CONFIRMATION
from service.delivery.outcome import Outcome, delivered, failed, retry
from service.delivery.settings import NotificationSettings
from service.ssrf import parse_mailto

CONFIRMATION_SUBJECTS = {  # Zaqar's default email templates' topics
    SUBSCRIPTION_CONFIRMATION: "Zaqar Notification - Subscription Confirmation",
    UNSUBSCRIBE_CONFIRMATION: "Zaqar Notification - Unsubscribe Confirmation",
}


_ADDRESS = re.compile(r"[^\s@,;<>()\"\\\[\]:]{1,64}@[A-Za-z0-9.-]{1,253}")


def check_mail_options(options: Mapping[str, Any]) -> None:
    """`options.subject`: absent, or a string of printable characters (at most 998); `options.from`: absent,
    or one mail address."""
    subject = options.get("subject")
    if subject is not None and (
        not isinstance(subject, str) or len(subject) > 998 or not subject.isprintable()
    ):
        raise InvalidInput(
            f"options.subject must be a string of at most 998 printable characters; got {subject!r:.80}."
        )
    sender = options.get("from")
    if sender is not None and (not isinstance(sender, str) or _ADDRESS.fullmatch(sender) is None):
        raise InvalidInput(
            f"options.from must be one mail address, like team@example.com; got {sender!r:.80}."
        )


def mail_message(
    subscriber: str, options: Mapping[str, Any], document: Mapping[str, Any], sender: str
) -> EmailMessage:
    """The mail for `document`; InvalidInput when the subscriber or the options cannot make one."""
    mailto = parse_mailto(subscriber)
    check_mail_options(options)
    subject = CONFIRMATION_SUBJECTS.get(str(document.get("Message_Type")))
    if subject is None:
        subject = mailto.subject if mailto.subject is not None else options.get("subject", "")
    message = EmailMessage()
    message["To"] = mailto.address
    message["From"] = options.get("from") or sender
    message["Subject"] = subject
    message.set_content(json.dumps(document))
    return message


async def send_mail(
    settings: NotificationSettings, subscriber: str, options: Mapping[str, Any], document: Mapping[str, Any]
) -> Outcome:
    """Send one notification mail. The envelope sender is always settings.smtp_sender (bounces go to the
    operator); every SMTP or connection failure is temporary."""
    if not settings.smtp_host:
        return failed("mail is off: no SMTP server (CHARON_NOTIFICATIONS__SMTP_HOST)")
    try:
        message = mail_message(subscriber, options, document, settings.smtp_sender)
    except InvalidInput as exc:
        return failed(exc.description)
    password = settings.smtp_password.get_secret_value()
    try:
        await aiosmtplib.send(
            message,
            sender=settings.smtp_sender,
            recipients=[message["To"]],
            hostname=settings.smtp_host,
            port=settings.smtp_port,
            username=settings.smtp_username or None,
            password=password if settings.smtp_username else None,
            use_tls=settings.smtp_tls,
            start_tls=settings.smtp_starttls,
            timeout=settings.smtp_timeout,
        )
    except (aiosmtplib.SMTPException, OSError) as exc:  # TimeoutError is an OSError
        return retry(f"SMTP: {type(exc).__name__}: {str(exc)[:200]}")
    return delivered(f"mailed to {message['To']}")
