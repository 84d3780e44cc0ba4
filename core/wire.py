"""Domain values as Zaqar's JSON shows them (messages, their provenance, times): pure, so the API's
answers and the notifier's documents (service/notifier.py) are one shape."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from core.limits import MAX_TIME_MS, MIN_TIME_MS
from core.models import Message, MessageStamp

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """ISO 8601 in UTC to the second, four-digit year. Times from clients are kept within years 1 to 9999
    (core.limits.check_time_ms); a stored time outside is shown at that end rather than failing the read."""
    t = EPOCH + timedelta(milliseconds=min(max(ms, MIN_TIME_MS), MAX_TIME_MS))
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}Z"


def message_href(queue: str, message_id: str, claim_id: str | None = None) -> str:
    href = f"/v2/queues/{queue}/messages/{message_id}"
    return f"{href}?claim_id={claim_id}" if claim_id else href


def message(m: Message, now_ms: int, *, provenance: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": m.id,
        "href": message_href(m.queue, m.id, m.claim_id if m.is_claimed(now_ms) else None),
        "ttl": m.ttl,
        "age": m.age(now_ms),
        "body": m.body,
        "claim_count": m.claim_count,
    }
    if m.dead_letter is not None and provenance:
        d = m.dead_letter
        out["dead_letter"] = {
            "source_queue": d.source_queue,
            "reason": d.reason,
            "claim_count": d.claim_count,
            "dead_lettered_at": iso(d.dead_lettered_at_ms),
            "first_enqueued_at": iso(d.first_enqueued_at_ms),
            "redrive_count": d.redrive_count,
        }
        if d.consumer is not None:
            out["dead_letter"]["consumer"] = d.consumer
        if d.rejection is not None:
            out["dead_letter"]["rejection"] = {
                k: v
                for k, v in (("reason", d.rejection.reason), ("description", d.rejection.description))
                if v
            }
    if not m.dead_letter_eligible and provenance:  # EXT fields only with provenance (zaqarclient)
        out["dead_letter_eligible"] = False
    return out


def messages(items: Iterable[Message], now_ms: int, *, provenance: bool = True) -> list[dict[str, Any]]:
    return [message(m, now_ms, provenance=provenance) for m in items]


def stamp(queue: str, s: MessageStamp | None, now_ms: int) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "href": message_href(queue, s.id),
        "age": max(0, (now_ms - s.created_ms) // 1000),
        "created": iso(s.created_ms),
    }
