"""Zaqar's `_retry_policy` for notifications (a queue's metadata key and a subscription's option): how often,
and how long apart, a failed delivery is tried again before it is given up.

Zaqar's schedule (zaqar/notification/tasks/webhook.py), after the first try fails:

1. `retries_with_no_delay` tries at once;
2. `minimum_delay_retries` tries, each `minimum_delay` seconds after the last;
3. one try after each wait of the backoff function's list, computed as Zaqar does (`backoff_delays`) from
   minimum_delay to maximum_delay in steps of LINEAR_INTERVAL;
4. `maximum_delay_retries` tries, each `maximum_delay` seconds after the last;

then the delivery is given up. Zaqar sleeps in a worker thread between tries; Charon keeps the delivery in
the outbox and `RetryPolicy.delay_after` says when it is due again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, cast

from core.errors import InvalidInput

BackoffFunction = Literal["linear", "arithmetic", "exponential", "geometric"]
BACKOFF_FUNCTIONS: tuple[BackoffFunction, ...] = ("linear", "arithmetic", "exponential", "geometric")
LINEAR_INTERVAL = 5  # Zaqar's consts.LINEAR_INTERVAL: the backoff functions' step, seconds

# Charon's bounds (Zaqar has none but that maximum_delay - minimum_delay >= 2 * LINEAR_INTERVAL, without
# which its backoff functions divide by zero).
MAX_RETRIES = 100
MIN_DELAY = 1  # the geometric and exponential functions take the logarithm of maximum / minimum
MAX_MINIMUM_DELAY = 3600
MAX_MAXIMUM_DELAY = 86_400
MIN_DELAY_SPAN = 2 * LINEAR_INTERVAL


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Zaqar's fields and defaults (zaqar/common/consts.py)."""

    retries_with_no_delay: int = 3
    minimum_delay_retries: int = 3
    minimum_delay: int = 5
    maximum_delay: int = 30
    maximum_delay_retries: int = 3
    retry_backoff_function: BackoffFunction = "linear"
    ignore_subscription_override: bool = False

    def delay_after(self, failures: int) -> float | None:
        """Seconds to wait before the next try after `failures` failed tries (1: the first try failed), or
        None when the schedule is used up and the delivery is given up."""
        n = failures - 1  # retries made so far
        if n < 0:
            return 0.0
        if n < self.retries_with_no_delay:
            return 0.0
        n -= self.retries_with_no_delay
        if n < self.minimum_delay_retries:
            return float(self.minimum_delay)
        n -= self.minimum_delay_retries
        backoff = backoff_delays(self.retry_backoff_function, self.minimum_delay, self.maximum_delay)
        if n < len(backoff):
            return float(backoff[n])
        n -= len(backoff)
        if n < self.maximum_delay_retries:
            return float(self.maximum_delay)
        return None

    @property
    def tries(self) -> int:
        """How many tries the schedule makes in all, the first included."""
        backoff = backoff_delays(self.retry_backoff_function, self.minimum_delay, self.maximum_delay)
        return (
            1
            + self.retries_with_no_delay
            + self.minimum_delay_retries
            + len(backoff)
            + self.maximum_delay_retries
        )


@functools.lru_cache(maxsize=256)
def backoff_delays(function: BackoffFunction, minimum: int, maximum: int) -> tuple[int, ...]:
    """Zaqar's backoff lists (webhook.py `_Linear_function`...), the same floats truncated the same way: with
    the defaults (5, 30), linear [5, 10, 15, 20, 25], arithmetic [5, 7, 12, 20, 30], exponential and
    geometric [5, 7, 12, 19, 30]. Needs maximum - minimum >= 2 * LINEAR_INTERVAL and minimum >= 1."""
    if function == "linear":
        return tuple(range(minimum, maximum, LINEAR_INTERVAL))
    x_max = int((maximum - minimum) / LINEAR_INTERVAL)
    xs = range(1, x_max + 1)
    if function == "arithmetic":
        d = 2.0 * (maximum - minimum) / (x_max * (x_max - 1))
        return tuple(int(minimum + (a - 1) * a * d / 2) for a in xs)
    k = math.pow(10, math.log10(maximum / minimum) / (x_max - 1))
    if function == "geometric":
        return tuple(int(minimum * math.pow(k, a - 1)) for a in xs)
    p = minimum / k  # exponential: the same curve as geometric, its floats rounded another way
    return tuple(int(p * math.pow(k, a)) for a in xs)


_COUNTS = ("retries_with_no_delay", "minimum_delay_retries", "maximum_delay_retries")


def retry_policy_schema() -> dict[str, Any]:
    """The JSON schema of what parse_retry_policy takes (all but the rule between the two delays)."""
    count = {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **dict.fromkeys(_COUNTS, count),
            "minimum_delay": {"type": "integer", "minimum": MIN_DELAY, "maximum": MAX_MINIMUM_DELAY},
            "maximum_delay": {"type": "integer", "minimum": MIN_DELAY_SPAN, "maximum": MAX_MAXIMUM_DELAY},
            "retry_backoff_function": {"enum": list(BACKOFF_FUNCTIONS)},
            "ignore_subscription_override": {"type": "boolean"},
        },
        "description": f"Zaqar's retry policy of notifications; maximum_delay must be at least minimum_delay "
        f"+ {MIN_DELAY_SPAN} (defaults: 3 tries at once, 3 after 5 s, the backoff to 30 s, 3 after 30 s).",
    }


_KEYS = tuple(f.name for f in fields(RetryPolicy))
RULES = (
    f"retries_with_no_delay, minimum_delay_retries and maximum_delay_retries: integers 0 to {MAX_RETRIES}; "
    f"minimum_delay: an integer {MIN_DELAY} to {MAX_MINIMUM_DELAY} (seconds); maximum_delay: an integer "
    f"up to {MAX_MAXIMUM_DELAY}, at least minimum_delay + {MIN_DELAY_SPAN}; retry_backoff_function: one of "
    f"{', '.join(BACKOFF_FUNCTIONS)}; ignore_subscription_override: true or false"
)


def parse_retry_policy(value: object, field: str = "_retry_policy") -> RetryPolicy:
    """Validate a `_retry_policy` object as a client sent it (missing keys take Zaqar's defaults).

    Raises InvalidInput naming `field` (or `field.key`), the bounds and the value given."""
    if not isinstance(value, Mapping):
        raise InvalidInput(
            f"{field} must be an object with some of these keys: {RULES}; got {_shown(value)}."
        )
    unknown = sorted(str(k) for k in value if k not in _KEYS)
    if unknown:
        raise InvalidInput(
            f"{field} has an unknown key {_shown(unknown[0])}; its keys are {', '.join(_KEYS)} ({RULES})."
        )
    given: dict[str, Any] = {}
    for key in _COUNTS:
        if key in value:
            given[key] = _int(value[key], f"{field}.{key}", 0, MAX_RETRIES)
    if "minimum_delay" in value:
        given["minimum_delay"] = _int(
            value["minimum_delay"], f"{field}.minimum_delay", MIN_DELAY, MAX_MINIMUM_DELAY
        )
    if "maximum_delay" in value:
        given["maximum_delay"] = _int(value["maximum_delay"], f"{field}.maximum_delay", 0, MAX_MAXIMUM_DELAY)
    if "retry_backoff_function" in value:
        function = value["retry_backoff_function"]
        if function not in BACKOFF_FUNCTIONS:
            raise InvalidInput(
                f"{field}.retry_backoff_function must be one of {', '.join(BACKOFF_FUNCTIONS)}; "
                f"got {_shown(function)}."
            )
        given["retry_backoff_function"] = cast(BackoffFunction, function)
    if "ignore_subscription_override" in value:
        flag = value["ignore_subscription_override"]
        if not isinstance(flag, bool):
            raise InvalidInput(
                f"{field}.ignore_subscription_override must be true or false; got {_shown(flag)}."
            )
        given["ignore_subscription_override"] = flag
    policy = RetryPolicy(**given)
    if policy.maximum_delay - policy.minimum_delay < MIN_DELAY_SPAN:
        raise InvalidInput(
            f"{field}.maximum_delay must be at least {field}.minimum_delay + {MIN_DELAY_SPAN} seconds "
            f"(Zaqar's rule, so that the backoff function has steps of {LINEAR_INTERVAL} s to take); got "
            f"minimum_delay {policy.minimum_delay} and maximum_delay {policy.maximum_delay}."
        )
    return policy


def effective_policy(queue: RetryPolicy | None, subscription: RetryPolicy | None) -> RetryPolicy:
    """The policy a subscription's deliveries follow, Zaqar's rule: the subscription's own, else its queue's,
    else the defaults; but the queue's (else the defaults) when either sets ignore_subscription_override."""
    if (queue is not None and queue.ignore_subscription_override) or (
        subscription is not None and subscription.ignore_subscription_override
    ):
        return queue or RetryPolicy()
    return subscription or queue or RetryPolicy()


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, float) and value.is_integer():  # JSON Schema's integer: 5.0 is 5
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidInput(f"{what} must be an integer between {lo} and {hi}; got {_shown(value)}.")
    return value


def _shown(value: object) -> str:
    return repr(value[:80]) if isinstance(value, str) else repr(value)[:80]
