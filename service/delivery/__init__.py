"""The delivery side of Zaqar's subscriptions: what the notifier calls to send one notification.

- `Deliverer.deliver(subscription, document) -> Outcome` (deliverer.py): a webhook POST (webhook.py) or a
  mail (mailto.py), bounded in time and concurrency, every webhook address vetted by service/ssrf.py;
- `confirmation_document` (confirm.py): Zaqar's confirmation request and unsubscribe notice;
- `check_options`: the subscription options a delivery uses, checked at create/patch time;
- `NotificationSettings` (settings.py): CHARON_NOTIFICATIONS__<NAME>.

When to try again is core/retry.py's `RetryPolicy.delay_after`; the outbox and its leases are the store's.
"""

from service.delivery.confirm import (
    NOTIFICATION,
    SUBSCRIPTION_CONFIRMATION,
    UNSUBSCRIBE_CONFIRMATION,
    confirm_path,
    confirmation_document,
)
from service.delivery.deliverer import NOTICE_SCHEME, Deliverer, check_options
from service.delivery.outcome import Outcome, Result
from service.delivery.settings import NotificationSettings

__all__ = [
    "NOTICE_SCHEME",
    "NOTIFICATION",
    "SUBSCRIPTION_CONFIRMATION",
    "UNSUBSCRIBE_CONFIRMATION",
    "Deliverer",
    "NotificationSettings",
    "Outcome",
    "Result",
    "check_options",
    "confirm_path",
    "confirmation_document",
]
