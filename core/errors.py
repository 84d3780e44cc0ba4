"""The one error hierarchy. Each class knows its HTTP status and Zaqar title; api/errors.py maps them.

CharonError
 ├── InvalidInput           400 "Invalid API request"
 │    ├── InvalidBody       400 "Invalid request body"
 │    └── InvalidQueueName  400 "Invalid queue identification"
 ├── Unauthenticated        401 "Authentication required" (no valid credentials; says where to get them)
 ├── NotAuthorized          403 "Not authorized"
 │    ├── PolicyDenied      403 (the policy rule that refused the call is named)
 │    └── ClaimMismatch     403 (a claimed message deleted without, or with another, claim id)
 │         └── NotAllDeleted 403 (a bulk delete with claim_ids left some: `not_deleted` says which, why)
 ├── NotFound               404 "Not found"
 │    ├── MessageNotFound
 │    └── ClaimNotFound
 ├── RequestTimeout         408 "Request timeout" (the body did not arrive whole: nothing was done)
 ├── Conflict               409 "Resource conflict"
 ├── PayloadTooLarge        413 "Request body too large"
 ├── UnsupportedMediaType   415 "Unsupported media type"
 ├── IdempotencyKeyReused   422 "Idempotency key reused"
 ├── RateLimited            429 "Too many requests" (a project's request rate; Retry-After says when)
 ├── StorageUnavailable     503 "Service temporarily unavailable"   (nothing was changed)
 │    └── OutcomeUnknown    503 (the store stopped answering after a write was sent: it may have happened)
 ├── ServiceBusy            503 (a bound of this process is reached, e.g. waiting claims; nothing was changed)
 ├── IdentityUnavailable    503 (Keystone could not say who the caller is; nothing was done)
 ├── StorageFull            507 "Insufficient storage"   (the store refuses writes; nothing was changed)
 ├── MessageUnreadable      503 "Message unreadable" (a body encrypted with a key the service lacks)
 └── EncryptionUnavailable  503 "Encryption unavailable" (a post to an encrypting queue, and no key)

The message of every instance is the description shown to the user: it says what to change.
"""

from __future__ import annotations

from typing import Any, ClassVar


class CharonError(Exception):
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal server error"

    @property
    def description(self) -> str:
        return str(self)

    @property
    def details(self) -> dict[str, Any] | None:
        """Fields the error body carries beside title and description."""
        return None

    @property
    def headers(self) -> dict[str, str] | None:
        """Response headers the answer carries (e.g. a 401's WWW-Authenticate)."""
        return None


class InvalidInput(CharonError):
    status = 400
    title = "Invalid API request"


class InvalidBody(InvalidInput):
    title = "Invalid request body"


class InvalidQueueName(InvalidInput):
    title = "Invalid queue identification"


class Unauthenticated(CharonError):
    """No credentials, or credentials that are not (or no longer) valid: a missing, malformed, expired or
    revoked token. `authenticate_uri`: where to get a token (WWW-Authenticate: Keystone uri=...)."""

    status = 401
    title = "Authentication required"

    def __init__(self, message: str, authenticate_uri: str = "") -> None:
        super().__init__(message)
        self.authenticate_uri = authenticate_uri

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": f'Keystone uri="{self.authenticate_uri}"'}


class NotAuthorized(CharonError):
    status = 403
    title = "Not authorized"


class PolicyDenied(NotAuthorized):
    """The policy rule of the operation refused the caller; `rule` names it (an operator's policy file can
    change it)."""

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule

    @property
    def details(self) -> dict[str, Any]:
        return {"rule": self.rule}


class QuotaExceeded(NotAuthorized):
    """A change would take the project or a queue past a counted quota (core/quotas.py); nothing was done.
    `quota` names it."""

    title = "Quota exceeded"

    def __init__(self, message: str, quota: str = "") -> None:
        super().__init__(message)
        self.quota = quota

    @property
    def details(self) -> dict[str, Any]:
        return {"quota": self.quota}


class ClaimMismatch(NotAuthorized):
    pass


class NotAllDeleted(ClaimMismatch):
    """A claim-safe bulk delete left some listed messages in place (the others were deleted)."""

    def __init__(self, message: str, not_deleted: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.not_deleted = not_deleted or []

    @property
    def details(self) -> dict[str, Any]:
        return {"not_deleted": self.not_deleted}


class NotFound(CharonError):
    status = 404
    title = "Not found"


class MessageNotFound(NotFound):
    pass


class ClaimNotFound(NotFound):
    pass


class SubscriptionNotFound(NotFound):
    pass


class Conflict(CharonError):
    status = 409
    title = "Resource conflict"


class SubscriptionExists(Conflict):
    """Subscriptions are unique by project, queue and subscriber URI (Zaqar's rule)."""


class MetadataChanged(Conflict):
    """Queue metadata of the project changed since it was read; the writer re-reads and tries again."""


class RequestTimeout(CharonError):
    """The request's body did not arrive whole: its client went away, or was cut for taking too long."""

    status = 408
    title = "Request timeout"


class PayloadTooLarge(CharonError):
    status = 413
    title = "Request body too large"

    @property
    def headers(self) -> dict[str, str]:
        """The rest of the body is not read: the connection ends with the answer."""
        return {"Connection": "close"}


class UnsupportedMediaType(CharonError):
    status = 415
    title = "Unsupported media type"


class IdempotencyKeyReused(CharonError):
    """An Idempotency-Key already used, within its window, for a different request (IETF httpapi draft)."""

    status = 422
    title = "Idempotency key reused"


class RateLimited(CharonError):
    """The project used up its request rate (a quota, core/quotas.py); nothing was done."""

    status = 429
    title = "Too many requests"

    def __init__(self, description: str, retry_after_s: int = 1) -> None:
        super().__init__(description)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class StorageUnavailable(CharonError):
    """The store could not be reached, or did not answer, before anything was changed."""

    status = 503
    title = "Service temporarily unavailable"

    @property
    def description(self) -> str:
        return f"{self} Nothing was changed; please try again in a few seconds."


class OutcomeUnknown(StorageUnavailable):
    """The store stopped answering after a write was sent to it: the write may or may not have happened."""

    @property
    def description(self) -> str:
        return (
            f"{self} The request was sent to the store, which then stopped answering: it may or may not have "
            "been carried out. Read the resource before repeating a change; a message post repeated with the "
            "same Idempotency-Key header is stored once."
        )


class ServiceBusy(CharonError):
    """A bound of this process is reached (e.g. how many claims may wait at once); nothing was changed."""

    status = 503
    title = "Service temporarily unavailable"


class IdentityUnavailable(CharonError):
    """Keystone could not be asked who the caller is (unreachable, too slow, or refusing the service's own
    credentials): the request is refused, never let through; nothing was done."""

    status = 503
    title = "Service temporarily unavailable"

    @property
    def description(self) -> str:
        return f"{self} Nothing was done; please try again in a few seconds."

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class StorageFull(CharonError):
    """The store refuses writes (Redis at maxmemory with noeviction, a disk out of space); reads, claims and
    deletes, which free space, still work."""

    status = 507
    title = "Insufficient storage"

    @property
    def description(self) -> str:
        return (
            f"{self} The store is full and refuses writes; nothing was changed. Consuming and deleting "
            "messages frees space (an operator can also give the store more room)."
        )


class MessageUnreadable(CharonError):
    """A stored message body is encrypted with a key this process lacks (the operator removed or changed a
    key of CHARON_ENCRYPTION__KEYS): a fault of the service's configuration, never of the request, and one
    the operator can mend (the key put back), so 503, not a bug's 500. A read changed nothing; a claim or a
    pop that met it says what it did (`after`)."""

    status = 503
    title = "Message unreadable"

    def after(self, done: str) -> MessageUnreadable:
        """The same error, saying what the request did before it met the body (a claim, a pop)."""
        return MessageUnreadable(f"{self} {done}")


class EncryptionUnavailable(CharonError):
    """A post to a queue that encrypts its messages, on a process that has no key to encrypt with (the
    operator removed CHARON_ENCRYPTION__KEYS after the queue asked for it): the service's fault; nothing was
    stored."""

    status = 503
    title = "Encryption unavailable"


class EncryptionRequired(CharonError):
    """A driver's signal to itself: the queue's policy asks for sealed bodies and the post brought clear ones
    (the Redis script cannot encrypt; the driver seals and posts again). Never reaches a caller."""

    status = 409
    title = "Encryption required"
