"""Zaqar's `_retry_policy`: validation, which policy applies, and the schedule (core/retry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InvalidInput
from core.retry import RetryPolicy, backoff_delays, effective_policy, parse_retry_policy

# Zaqar's lists with its defaults (minimum_delay 5, maximum_delay 30), as its webhook.py computes them
ZAQAR_DEFAULT_BACKOFF = {
    "linear": [5, 10, 15, 20, 25],
    "arithmetic": [5, 7, 12, 20, 30],
    "exponential": [5, 7, 12, 19, 30],
    "geometric": [5, 7, 12, 19, 30],
}


@pytest.mark.parametrize(("function", "delays"), ZAQAR_DEFAULT_BACKOFF.items())
def test_backoff_lists_are_zaqars_with_the_defaults(function: Any, delays: list[int]) -> None:
    assert list(backoff_delays(function, 5, 30)) == delays


@pytest.mark.parametrize(
    ("function", "tail", "count"),
    [
        ("linear", [86386, 86391, 86396], 17280),
        ("arithmetic", [86379, 86389, 86400], 17279),
        ("exponential", [86286, 86343, 86400], 17279),
        ("geometric", [86286, 86343, 86400], 17279),
    ],
)
def test_backoff_lists_at_the_widest_bounds_are_zaqars(function: Any, tail: list[int], count: int) -> None:
    delays = backoff_delays(function, 1, 86400)
    assert len(delays) == count
    assert list(delays[-3:]) == tail


@pytest.mark.parametrize("function", ZAQAR_DEFAULT_BACKOFF)
def test_backoff_at_the_narrowest_span(function: Any) -> None:
    assert list(backoff_delays(function, 10, 20)) == ([10, 15] if function == "linear" else [10, 20])


@pytest.mark.parametrize(("function", "backoff"), ZAQAR_DEFAULT_BACKOFF.items())
def test_default_schedule_follows_zaqars_phases(function: Any, backoff: list[int]) -> None:
    policy = RetryPolicy(retry_backoff_function=function)
    schedule = []
    failures = 1
    while (delay := policy.delay_after(failures)) is not None:
        schedule.append(delay)
        failures += 1
    assert schedule == [0, 0, 0, 5, 5, 5, *backoff, 30, 30, 30]
    assert policy.tries == len(schedule) + 1  # the first try, then one after each wait


def test_a_schedule_without_retries_gives_up_after_the_backoff() -> None:
    policy = RetryPolicy(retries_with_no_delay=0, minimum_delay_retries=0, maximum_delay_retries=0)
    assert [policy.delay_after(n) for n in range(1, 7)] == [5, 10, 15, 20, 25, None]


def test_empty_policy_is_zaqars_defaults() -> None:
    assert parse_retry_policy({}) == RetryPolicy()


def test_full_policy_parses() -> None:
    given: dict[str, Any] = {
        "retries_with_no_delay": 0,
        "minimum_delay_retries": 1,
        "minimum_delay": 2,
        "maximum_delay": 120,
        "maximum_delay_retries": 100,
        "retry_backoff_function": "geometric",
        "ignore_subscription_override": True,
    }
    assert parse_retry_policy(given) == RetryPolicy(**given)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([], r"_retry_policy must be an object"),
        ("linear", r"_retry_policy must be an object"),
        ({"retries": 3}, r"unknown key 'retries'"),
        (
            {"retries_with_no_delay": True},
            r"_retry_policy\.retries_with_no_delay must be an integer between 0 and 100",
        ),
        ({"minimum_delay_retries": "3"}, r"_retry_policy\.minimum_delay_retries must be an integer"),
        ({"maximum_delay_retries": 101}, r"between 0 and 100; got 101"),
        ({"retries_with_no_delay": -1}, r"between 0 and 100; got -1"),
        ({"minimum_delay": 0}, r"_retry_policy\.minimum_delay must be an integer between 1 and 3600; got 0"),
        ({"minimum_delay": 2.5}, r"_retry_policy\.minimum_delay must be an integer"),
        ({"maximum_delay": 86401}, r"_retry_policy\.maximum_delay must be an integer between 0 and 86400"),
        ({"minimum_delay": 25}, r"maximum_delay must be at least _retry_policy\.minimum_delay \+ 10"),
        ({"minimum_delay": 10, "maximum_delay": 19}, r"got minimum_delay 10 and maximum_delay 19"),
        ({"retry_backoff_function": "cubic"}, r"retry_backoff_function must be one of linear, arithmetic"),
        ({"retry_backoff_function": None}, r"retry_backoff_function must be one of"),
        ({"ignore_subscription_override": 1}, r"ignore_subscription_override must be true or false"),
    ],
)
def test_invalid_policies_name_the_field_and_the_bounds(value: object, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse_retry_policy(value)


def test_the_field_name_is_the_callers() -> None:
    with pytest.raises(InvalidInput, match=r"options\._retry_policy\.minimum_delay "):
        parse_retry_policy({"minimum_delay": 0}, field="options._retry_policy")


def test_an_integral_float_is_an_integer() -> None:
    assert parse_retry_policy({"minimum_delay": 6.0}).minimum_delay == 6


QUEUE = RetryPolicy(minimum_delay=7)
SUB = RetryPolicy(minimum_delay=9)


@pytest.mark.parametrize(
    ("queue", "subscription", "expected"),
    [
        (None, None, RetryPolicy()),
        (QUEUE, None, QUEUE),
        (None, SUB, SUB),
        (QUEUE, SUB, SUB),  # the subscription overrides its queue
        (RetryPolicy(ignore_subscription_override=True), SUB, RetryPolicy(ignore_subscription_override=True)),
        # Zaqar: a subscription's own flag also makes its queue's policy (or the defaults) apply
        (QUEUE, RetryPolicy(minimum_delay=9, ignore_subscription_override=True), QUEUE),
        (None, RetryPolicy(minimum_delay=9, ignore_subscription_override=True), RetryPolicy()),
    ],
)
def test_effective_policy_is_zaqars_rule(
    queue: RetryPolicy | None, subscription: RetryPolicy | None, expected: RetryPolicy
) -> None:
    assert effective_policy(queue, subscription) == expected
