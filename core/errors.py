"""The one error hierarchy. Each class knows its HTTP status and Zaqar title; api/errors.py maps them.

CharonError
 ├── InvalidInput           400 "Invalid API request"
 │    ├── InvalidBody       400 "Invalid request body"
 │    └── InvalidQueueName  400 "Invalid queue identification"
 ├── NotAuthorized          403 "Not authorized"
 │    └── ClaimMismatch     403 (a claimed message deleted without, or with another, claim id)
 ├── NotFound               404 "Not found"
 │    ├── MessageNotFound
 │    └── ClaimNotFound
 ├── Conflict               409 "Resource conflict"
 ├── PayloadTooLarge        413 "Request body too large"
 ├── UnsupportedMediaType   415 "Unsupported media type"
 └── StorageUnavailable     503 "Service temporarily unavailable"

The message of every instance is the description shown to the user: it says what to change.
"""

from __future__ import annotations

from typing import ClassVar


class CharonError(Exception):
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal server error"

    @property
    def description(self) -> str:
        return str(self)


class InvalidInput(CharonError):
    status = 400
    title = "Invalid API request"


class InvalidBody(InvalidInput):
    title = "Invalid request body"


class InvalidQueueName(InvalidInput):
    title = "Invalid queue identification"


class NotAuthorized(CharonError):
    status = 403
    title = "Not authorized"


class ClaimMismatch(NotAuthorized):
    pass


class NotFound(CharonError):
    status = 404
    title = "Not found"


class MessageNotFound(NotFound):
    pass


class ClaimNotFound(NotFound):
    pass


class Conflict(CharonError):
    status = 409
    title = "Resource conflict"


class MetadataChanged(Conflict):
    """Queue metadata of the project changed since it was read; the writer re-reads and tries again."""


class PayloadTooLarge(CharonError):
    status = 413
    title = "Request body too large"


class UnsupportedMediaType(CharonError):
    status = 415
    title = "Unsupported media type"


class StorageUnavailable(CharonError):
    status = 503
    title = "Service temporarily unavailable"

    @property
    def description(self) -> str:
        return f"{self} Please try again in a few seconds."
