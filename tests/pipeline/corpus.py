"""A generated corpus of dead letters with known causes, in records.SCHEMA's layout: each cause is one code
path of a consumer (one error text with its ids, values and times spelled in many ways), with optional body
fields, nested error objects, bodies that are not JSON objects and rejections with and without a reason code.
A signature equals a cause when every message of the cause is in one signature and no signature holds two.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson

PROJECT = "corpus"
START_MS = 1_795_000_000_000
WORKERS = ("3381af92-2b9e-11e3-b191-71861300734c", "4481af92-2b9e-11e3-b191-71861300734d")
NAMES = ("Alice Smith", "Bob", "Dana O'Neil", "Émile Zola", "Chen Wei", "X Æ A-12", "", "Li")


class Ids:
    """An id of one entity, spelled as different systems spell theirs."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def alnum(self, n: int) -> str:
        """Letters and digits, at least one digit."""
        chars = [self.rng.choice(string.ascii_letters + string.digits) for _ in range(n - 1)]
        chars.insert(self.rng.randrange(n), self.rng.choice(string.digits))
        return "".join(chars)

    def hex12(self) -> str:
        # now and then all digits: a 12-hex id must not turn into another signature then
        pool = string.digits if self.rng.random() < 0.2 else "0123456789abcdef"
        return "".join(self.rng.choice(pool) for _ in range(12))

    def any(self) -> str:
        spell = self.rng.randrange(8)
        if spell == 0:
            return "cus_" + self.alnum(14)
        if spell == 1:  # a prefixed id of letters only, capitals in it
            return "cus_" + "".join(self.rng.choice(string.ascii_letters) for _ in range(9)) + "Q"
        if spell == 2:
            return str(self.rng.randint(1, 10**9))
        if spell == 3:
            return self.hex12()
        if spell == 4:
            return str(uuid.UUID(int=self.rng.getrandbits(128)))
        if spell == 5:
            return (
                self.rng.choice(["dana.smith", "bob", "c.wei"]) + f"@{self.rng.choice(['ex.com', 'a.co.uk'])}"
            )
        if spell == 6:
            return str(uuid.UUID(int=self.rng.getrandbits(128))).upper()
        return f"{self.alnum(6)}-{self.rng.randint(1, 99)}"

    def time(self) -> str:
        at = datetime(2026, 11, 24, tzinfo=UTC) + timedelta(seconds=self.rng.randint(0, 86400 * 30))
        spell = self.rng.randrange(5)
        if spell == 0:
            return at.isoformat().replace("+00:00", "Z")
        if spell == 1:
            return at.astimezone(timezone(timedelta(hours=self.rng.choice([-5, 1, 9])))).isoformat()
        if spell == 2:
            return at.strftime("%Y-%m-%d %H:%M:%S")
        if spell == 3:
            return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.rng.randint(0, 999):03d}Z"
        return str(int(at.timestamp() * 1000))


# A cause: (name, how a message of it dies), giving (body, reason, rejection reason, rejection description).
Death = tuple[Any, str, str | None, str | None]


def _causes(ids: Ids) -> dict[str, Callable[[], Death]]:
    r = ids.rng

    def order(**extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"order_id": ids.any(), "amount": r.randint(1, 900), "currency": "EUR"}
        if r.random() < 0.3:
            body["coupon"] = "WINTER10"  # an optional field
        return body | extra

    def missing(field: str) -> Death:
        body = order(error=f"missing field '{field}'")
        del body[field]
        return body, "max_claims", None, None

    return {
        "customer": lambda: (order(error=f"customer {ids.any()} not found"), "max_claims", None, None),
        "timeout": lambda: (
            order(
                error=f"timeout after {r.choice([5, 10, 30])}s calling "
                f"https://inventory.example.com/v2/items/{ids.any()}?attempt={r.randint(1, 5)}"
            ),
            "max_claims",
            None,
            None,
        ),
        "email": lambda: (
            {"to": ids.any(), "error": f"invalid e-mail address '{ids.any()}'"},
            "max_claims",
            None,
            None,
        ),
        "declined": lambda: (
            order(error=f"payment {ids.any()} declined: insufficient funds at {ids.time()}"),
            "max_claims",
            None,
            None,
        ),
        "stock": lambda: (
            order(
                error={
                    "code": "E42",
                    "message": f"stock for sku SKU-{r.randint(1000, 9999)}-{ids.alnum(3)}"
                    f" is {r.randint(0, 3)}",
                    **({"retry": True} if r.random() < 0.5 else {}),
                }
            ),
            "max_claims",
            None,
            None,
        ),
        "missing-amount": lambda: missing("amount"),
        "missing-currency": lambda: missing("currency"),  # not the same cause as a missing amount
        "locked": lambda: (
            {"user": ids.any(), "error": f'user "{r.choice(NAMES)}" is locked since {ids.time()}'},
            "max_claims",
            None,
            None,
        ),
        "quantity": lambda: (
            order(error=f"quantity '{r.randint(-5, 0)}' is not positive for line {r.randint(1, 40)}"),
            "max_claims",
            None,
            None,
        ),
        "session": lambda: (
            {
                "exception": f"java.lang.IllegalStateException: Session {ids.alnum(24)} expired "
                f"(tenant t-{r.randint(1, 300)})"
            },
            "expired",
            None,
            None,
        ),
        "mailbox": lambda: (
            {
                "to": ids.any(),
                "reason": f"mailbox full ({r.choice([552, 452])} 5.2.{r.randint(0, 3)}) for {ids.any()}",
            },
            "max_claims",
            None,
            None,
        ),
        "unparseable": lambda: (
            r.choice(
                [f"<order id='{ids.any()}'/>", f"ORDER {ids.any()} QTY {r.randint(1, 9)}", [ids.any(), 3]]
            ),
            "rejected",
            "unparseable",
            f"cannot parse the body at byte {r.randint(0, 4000)}",
        ),
        "bad-sku": lambda: (order(sku=f"SKU-{ids.alnum(5)}"), "rejected", "bad_sku", None),
        # no error text at all: what is known of the cause is how the message died
        "silent-crash": lambda: (order(), "max_claims", None, None),
        "never-consumed": lambda: ({"session": ids.any(), "user": r.randint(1, 999)}, "expired", None, None),
    }


def generate(per_cause: int = 60, seed: int = 23) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The records, and each message's cause by id."""
    ids = Ids(random.Random(seed))
    causes = _causes(ids)
    records, cause_of = [], {}
    n = 0
    for _ in range(per_cause):
        for cause, die in causes.items():
            body, reason, rejection_reason, rejection_description = die()
            n += 1
            at = START_MS + n * 1_000
            text = orjson.dumps(body).decode()
            message_id = f"m{n:06d}"
            cause_of[message_id] = cause
            records.append(
                {
                    "project": PROJECT,
                    "queue": "orders.dlq",
                    "id": message_id,
                    "marker": n,
                    "body": text,
                    "body_bytes": len(text.encode()),
                    "created_ms": at,
                    "claim_count": 0,
                    "source_queue": "orders",
                    "reason": reason,
                    "dl_claim_count": 0 if reason == "rejected" else 5,
                    "dead_lettered_at_ms": at,
                    "first_enqueued_at_ms": at - ids.rng.randint(100, 60_000),
                    "redrive_count": 0,
                    "rejection_reason": rejection_reason,
                    "rejection_description": rejection_description,
                    "consumer": None if reason == "expired" else WORKERS[n % len(WORKERS)],
                }
            )
    return records, cause_of


if __name__ == "__main__":  # the corpus's error texts, one line each: python -m tests.pipeline.corpus
    for record in generate(per_cause=3)[0]:
        print(json.dumps(record["body"])[:150], record["rejection_reason"], record["rejection_description"])
