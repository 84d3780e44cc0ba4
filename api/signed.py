"""Zaqar's pre-signed URLs for the API (python-zaqarclient's `signed-url` auth backend, Heat's
OS::Zaqar::SignedQueueURL): the computation is pure and lives in core/signing.py, which the notifier's
confirmation requests share."""

from __future__ import annotations

from core.signing import EXPIRES_FORMAT, SignedGrant, format_expires

__all__ = ["EXPIRES_FORMAT", "SignedGrant", "format_expires"]
