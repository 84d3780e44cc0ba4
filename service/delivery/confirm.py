"""The documents Zaqar's `send_confirm_notification` sends a subscriber (zaqar/notification/notifier.py): a
request to confirm a new subscription, and the notice after an unsubscribe, each with a pre-signed URL (the
signature, methods, paths, project and expiry of core/signing.py) that allows exactly the PUT of the
subscription's confirm resource, and the bodies to PUT there."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urljoin

from core.models import Subscription, kind_of, owner_of
from core.signing import SignedGrant, format_expires

# Message_Type values (Zaqar's notifier.MessageType names)
SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"
NOTIFICATION = "Notification"


def confirm_path(queue: str, subscription_id: str, api_version: str = "v2", kind: str = "queues") -> str:
    return f"/{api_version}/{kind}/{queue}/subscriptions/{subscription_id}/confirm"


def confirmation_document(
    subscription: Subscription,
    *,
    project: str,
    key: bytes,
    expires: datetime,
    unsubscribed: bool = False,
    api_version: str = "v2",
    public_endpoint: str | None = None,
) -> dict[str, Any]:
    """Zaqar's confirmation request (or, `unsubscribed`, its unsubscribe notice) for `subscription` of
    `project`, signed with `key` until `expires` (Zaqar: now + the subscription's ttl for a request, now + the
    default subscription ttl for a notice). `public_endpoint` (the service's public URL, Zaqar's catalog
    endpoint) adds WSGISubscribeURL, the URL to PUT to. `queue_name` is there too, as Zaqar's webhook task
    adds it to every document it posts."""
    path = confirm_path(subscription.queue, subscription.id, api_version, kind_of(project))
    owner = owner_of(project)  # a topic's subscriber confirms as the project, at the topic's path
    grant = SignedGrant(paths=(path,), methods=("PUT",), project=owner, expires=format_expires(expires))
    what = "topic" if kind_of(project) == "topics" else "queue"  # Zaqar's texts, for a topic too
    if unsubscribed:
        message_type = UNSUBSCRIBE_CONFIRMATION
        message = (
            f"You have unsubscribed successfully to the {what}: {subscription.queue}, you can resubscribe it "
            "by using confirmed=True."
        )
    else:
        message_type = SUBSCRIPTION_CONFIRMATION
        message = f"You have chosen to subscribe to the {what}: {subscription.queue}"
    document: dict[str, Any] = {}
    if public_endpoint:
        document["WSGISubscribeURL"] = urljoin(public_endpoint, path)
    document.update(
        {
            "Message_Type": message_type,
            "Message": message,
            "URL-Signature": grant.signature(key),
            "URL-Methods": "PUT",
            "URL-Paths": path,
            "X-Project-ID": owner,
            "URL-Expires": grant.expires,
            "SubscribeBody": {"confirmed": True},
            "UnsubscribeBody": {"confirmed": False},
            "queue_name": subscription.queue,
        }
    )
    return document
