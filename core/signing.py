"""Pre-signed URLs as Zaqar makes them (zaqar/common/urls.py), so that python-zaqarclient's `signed-url` auth
backend and Heat's OS::Zaqar::SignedQueueURL work unchanged: an HMAC-SHA256 over the sorted paths, the sorted
methods, the project and the expiry, with the service's secret key.
Pure: the API checks pre-signed requests with it (api/signed.py) and the notifier signs the confirmation
URLs it sends to subscribers (service/delivery).

The signed text is Zaqar's byte for byte, including its quirk: the fields are joined by the two characters
backslash and n (Zaqar formats a raw string), not by newlines.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime

EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%S"  # Zaqar's: UTC, no zone, no fraction


@dataclass(frozen=True, slots=True)
class SignedGrant:
    """What a signature allows: `methods` on `paths` (and the resources under them) of `project` until
    `expires`."""

    paths: tuple[str, ...]
    methods: tuple[str, ...]
    project: str
    expires: str  # EXPIRES_FORMAT, UTC

    def signature(self, key: bytes) -> str:
        text = r"%s\n%s\n%s\n%s" % (  # noqa: UP031 - Zaqar's raw-string text, kept recognisably
            ",".join(sorted(self.paths)),
            ",".join(sorted(self.methods)),
            self.project,
            self.expires,
        )
        return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def document(self, key: bytes) -> dict[str, object]:
        """The answer of POST /v2/queues/{q}/share, Zaqar's shape."""
        return {
            "paths": sorted(self.paths),
            "methods": sorted(self.methods),
            "project": self.project,
            "expires": self.expires,
            "signature": self.signature(key),
        }

    def verifies(self, key: bytes, signature: str) -> bool:
        return hmac.compare_digest(self.signature(key).encode(), signature.encode("latin-1"))

    def allows(self, method: str, path: str) -> bool:
        """`method` is signed (a HEAD is a GET without the body), and `path` is a signed path or a resource
        under one (Zaqar lets a URL signed for .../messages read .../messages/{id})."""
        signed = method in self.methods or (method == "HEAD" and "GET" in self.methods)
        return signed and any(path == p or path.startswith(p + "/") for p in self.paths)

    def expires_at(self) -> datetime:
        return datetime.strptime(self.expires, EXPIRES_FORMAT).replace(tzinfo=UTC)


def format_expires(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(EXPIRES_FORMAT)
