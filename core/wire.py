"""Domain values as Zaqar's JSON shows them (messages, their provenance, times): pure, so the API's
answers and the notifier's documents (service/notifier.py) are one shape."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from core import signatures
from core.limits import MAX_TIME_MS, MIN_TIME_MS
from core.models import PROVENANCE, DeadLetter, Message, MessageStamp, ProvenanceField

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """ISO 8601 in UTC to the second, four-digit year. Times from clients are kept within years 1 to 9999
    (core.limits.check_time_ms); a stored time outside is shown at that end rather than failing the read."""
    t = EPOCH + timedelta(milliseconds=min(max(ms, MIN_TIME_MS), MAX_TIME_MS))
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}Z"


def message_href(
    queue: str, message_id: str, claim_id: str | None = None, kind: Literal["queues", "topics"] = "queues"
) -> str:
    href = f"/v2/{kind}/{queue}/messages/{message_id}"
    return f"{href}?claim_id={claim_id}" if claim_id else href


def _provenance_renderer() -> Callable[[DeadLetter], dict[str, Any]]:
    """DeadLetter -> its `dead_letter` object, compiled from core.models.PROVENANCE (as dataclasses compiles
    an __init__): a dict display of the fields always shown, then one test per field left out while unset,
    the `rejection` object last. It is what a hand-written renderer would be, on every dead letter a read
    shows; a loop over the rows took 1.1x its time."""
    namespace: dict[str, Any] = {"iso": iso}
    exec(_provenance_source(), namespace)  # noqa: S102 -- the source is built from core's rows only
    render: Callable[[DeadLetter], dict[str, Any]] = namespace["dead_letter"]
    return render


def _provenance_source() -> str:
    """The renderer's Python source, in the rows' order: the leading run of fields always shown in the dict
    display, each later one assigned (under `if ... is not None` when optional)."""

    def value(p: ProvenanceField, of: str) -> str:
        return f"iso({of}.{p.attr})" if p.kind == "time" else f"{of}.{p.attr}"

    own = [p for p in PROVENANCE if not p.rejection]
    said = [p for p in PROVENANCE if p.rejection]
    lead = 0
    while lead < len(own) and not own[lead].optional:
        lead += 1
    lines = ["def dead_letter(d):", "    out = {"]
    lines += [f"        {p.wire!r}: {value(p, 'd')}," for p in own[:lead]]
    lines.append("    }")
    for p in own[lead:]:
        if p.optional:
            lines += [f"    if d.{p.attr} is not None:", f"        out[{p.wire!r}] = {value(p, 'd')}"]
        else:
            lines.append(f"    out[{p.wire!r}] = {value(p, 'd')}")
    if said:
        pairs = " ".join(f"({p.wire!r}, {value(p, 'r')})," for p in said)
        lines += [
            "    r = d.rejection",
            "    if r is not None:",
            f"        out['rejection'] = {{k: v for k, v in ({pairs}) if v}}",
        ]
    lines.append("    return out")
    return "\n".join(lines) + "\n"


# A dead letter's provenance as Zaqar's JSON shows it (the `dead_letter` object of a message).
dead_letter = _provenance_renderer()


@dataclass(frozen=True, slots=True)
class Shown:
    """What a read shows beside each message's own fields: the `dead_letter` provenance and
    `dead_letter_eligible` (EXT, `?provenance=`), and Zaqar's `checksum` (CHARON_ENABLE_CHECKSUM); `kind`:
    whether its href is a queue's or a topic's (core.models.QueueRef.kind)."""

    provenance: bool = True
    checksum: bool = False
    kind: Literal["queues", "topics"] = "queues"
    # with the provenance, the dead letter's failure signature (core/signatures.py of_message: what
    # `charon insights` names its cause, and a redrive's filter.signature selects): the API's reads, not
    # the notifier's documents
    signature: bool = False


EVERYTHING = Shown(provenance=True)  # the notifier's documents: provenance always, no checksum


def checksum(body: Any) -> str | None:
    """Zaqar's `checksum` of a body: `MD5:` and the MD5 of the body as Python's json.dumps writes it (Zaqar's
    storage/utils.py get_checksum, through oslo's jsonutils.dump_as_bytes); none for a null body, as Zaqar."""
    if body is None:
        return None
    return "MD5:" + hashlib.md5(json.dumps(body).encode(), usedforsecurity=False).hexdigest()


def message(m: Message, now_ms: int, shown: Shown = EVERYTHING, claim: str | None = None) -> dict[str, Any]:
    """The message as Zaqar shows it. Its href names the claim that holds it now; in a claim's own answer,
    `claim` (that claim's id), whatever the time: an answer built after the claim ended still says which
    claim the consumer got it from."""
    held = claim if claim is not None else m.claim_id if m.is_claimed(now_ms) else None
    out: dict[str, Any] = {
        "id": m.id,
        "href": message_href(m.queue, m.id, held, shown.kind),
        "ttl": m.ttl,
        "age": m.age(now_ms),
        "body": m.body,
        "claim_count": m.claim_count,
    }
    if shown.checksum and (sum_ := checksum(m.body)) is not None:
        out["checksum"] = sum_
    if shown.provenance:  # EXT fields only with provenance (zaqarclient)
        if m.dead_letter is not None:
            out["dead_letter"] = dead_letter(m.dead_letter)
            if shown.signature:
                out["dead_letter"]["signature"] = signatures.of_message(m)
        if not m.dead_letter_eligible:
            out["dead_letter_eligible"] = False
    return out


def messages(
    items: Iterable[Message], now_ms: int, shown: Shown = EVERYTHING, claim: str | None = None
) -> list[dict[str, Any]]:
    return [message(m, now_ms, shown, claim) for m in items]


def stamp(
    queue: str, s: MessageStamp | None, now_ms: int, kind: Literal["queues", "topics"] = "queues"
) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "href": message_href(queue, s.id, kind=kind),
        "age": max(0, (now_ms - s.created_ms) // 1000),
        "created": iso(s.created_ms),
    }
