"""The pure domain rules: limits and reserved metadata."""

from __future__ import annotations

import dataclasses

import pytest

from core.errors import InvalidInput, InvalidQueueName
from core.limits import (
    Limits,
    check_client_id,
    check_marker,
    check_queue_name,
    check_range,
    is_name,
    is_valid_id,
    json_depth_exceeds,
)
from core.metadata import (
    POLICY_FIELDS,
    RESERVED,
    RESERVED_KEYS,
    STORED,
    Backoff,
    Kind,
    QueuePolicy,
    check_dead_letter_chain,
    parse_policy,
    policy_fields,
    policy_from_fields,
    with_reserved_defaults,
)

LIMITS = Limits()


@pytest.mark.parametrize("name", ["a", "q-1_x.y", "Z" * 64])
def test_valid_queue_names(name: str) -> None:
    assert check_queue_name(name) == name


@pytest.mark.parametrize("name", ["", "a b", "é", "q/1", "q" * 65])
def test_invalid_queue_names(name: str) -> None:
    with pytest.raises(InvalidQueueName):
        check_queue_name(name)


def test_range_message_names_field_bounds_and_value() -> None:
    with pytest.raises(InvalidInput, match="ttl must be between 60 and 100; got 59"):
        check_range(59, 60, 100, "ttl")


def test_client_id_accepts_dashed_and_plain_uuids() -> None:
    check_client_id("3381af92-2b9e-11e3-b191-71861300734c")
    check_client_id("3381af922b9e11e3b19171861300734c")
    with pytest.raises(InvalidInput):
        check_client_id("3381af92")


def test_ids_are_32_lowercase_hex() -> None:
    assert is_valid_id("0123456789abcdef" * 2)
    assert not is_valid_id("0123456789ABCDEF" * 2)
    assert not is_valid_id("abc")
    assert not is_valid_id("0123456789abcdef" * 2 + "\n")


def test_policy_from_reserved_keys() -> None:
    meta = {
        "_max_claim_count": 3,
        "_dead_letter_queue": "dlq",
        "_dead_letter_queue_messages_ttl": 600,
        "_default_message_ttl": 120,
        "_default_message_delay": 5,
        "_max_messages_post_size": 1000,
        "x": 1,
    }
    assert parse_policy(meta, LIMITS, queue="q") == QueuePolicy(
        default_message_ttl=120,
        default_message_delay=5,
        max_messages_post_size=1000,
        max_claim_count=3,
        dead_letter_queue="dlq",
        dead_letter_ttl=600,
    )


def test_every_reserved_key_is_one_row_of_the_table() -> None:
    """The table (core.metadata.RESERVED_KEYS) is the one list: each name once, starting with "_"; a bound
    named by text is a limit; a key a driver stores has both its QueuePolicy value and its field, each once;
    and every QueuePolicy value is set by some key."""
    assert len(set(RESERVED)) == len(RESERVED) == len(RESERVED_KEYS)
    assert all(name.startswith("_") for name in RESERVED)
    for k in RESERVED_KEYS:
        for b in (k.lo, k.hi, k.shown):
            assert not isinstance(b, str) or b in Limits.model_fields, (k.name, b)
        assert (k.policy is None) == (k.field is None), k.name
        assert k.description.endswith("."), k.name
    assert len(set(POLICY_FIELDS)) == len(POLICY_FIELDS)
    assert len({path for _, path in STORED}) == len(STORED)
    heads = {path.partition(".")[0] for _, path in STORED}
    assert heads == {f.name for f in dataclasses.fields(QueuePolicy)}
    parts = {path.partition(".")[2] for _, path in STORED if path.startswith("backoff.")}
    assert parts == {f.name for f in dataclasses.fields(Backoff)}


@pytest.mark.parametrize(
    "policy",
    [
        QueuePolicy(),
        QueuePolicy(max_claim_count=3, dead_letter_queue="dlq", dead_letter_ttl=600, expired_ttl=600),
        QueuePolicy(
            default_message_ttl=60, default_message_delay=0, max_messages_post_size=1, max_message_ttl=90
        ),
        QueuePolicy(backoff=Backoff(delay_ms=1500, multiplier=2.0, max_ms=10_000, jitter=0.25)),
        QueuePolicy(backoff=Backoff(levels_ms=(1000, 500))),
    ],
)
def test_the_stored_policy_reads_back_as_it_was(policy: QueuePolicy) -> None:
    stored = policy_fields(policy)
    assert list(stored) == list(POLICY_FIELDS)
    assert policy_from_fields(stored) == policy
    as_lists = {k: list(v) if isinstance(v, tuple) else v for k, v in stored.items() if v is not None}
    assert policy_from_fields(as_lists) == policy  # a store that keeps lists, and leaves unset out


def test_each_kind_publishes_what_it_checks() -> None:
    """Every kind of key is in the table, and each row's schema has the bounds its check applies."""
    assert {k.kind for k in RESERVED_KEYS} == set(Kind)
    for k in RESERVED_KEYS:
        schema = k.schema(LIMITS)
        if k.kind in (Kind.INTEGER, Kind.SECONDS, Kind.NUMBER):
            lo, hi = k.bounds(LIMITS)
            assert (schema["minimum"], schema["maximum"]) == (lo, hi)
            k.check(lo, LIMITS)
            k.check(hi, LIMITS)
            with pytest.raises(InvalidInput, match=k.name):
                k.check(hi + 1, LIMITS)
            with pytest.raises(InvalidInput, match=k.name):
                k.check(lo - 1, LIMITS)


def test_null_reserved_keys_mean_unset() -> None:
    meta = {"_max_claim_count": None, "_dead_letter_queue": None}
    assert parse_policy(meta, LIMITS, queue="q") == QueuePolicy()


@pytest.mark.parametrize(
    ("meta", "fragment"),
    [
        ({"_max_claim_count": 0}, "between 1"),
        ({"_max_claim_count": True}, "must be an integer"),
        ({"_max_claim_count": 2.5}, "must be an integer"),
        ({"_dead_letter_queue": "q"}, "itself"),
        ({"_dead_letter_queue": 7}, "_dead_letter_queue must be 1 to 64"),
        ({"_dead_letter_queue_messages_ttl": 59}, "between 60 and 1209600"),
        ({"_dead_letter_queue_messages_ttl": 1_209_601}, "between 60 and 1209600"),
        ({"_dead_letter_queue_messages_ttl": "3600"}, "must be an integer"),
        ({"_default_message_delay": 901}, "between 0 and 900"),
        ({"_max_messages_post_size": 262_145}, "between 1 and 262144"),
        ({"_max_claims_count": 3}, "Did you mean _max_claim_count"),
        ({"_private": 1}, "reserved"),
        ({"_enable_encrypt_messages": True}, "needs an encryption key"),
        ({"_enable_encrypt_messages": "false"}, "must be true or false"),
        ({"_flavor": "a\n"}, "_flavor must be 1 to 64"),
    ],
)
def test_bad_reserved_keys(meta: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        parse_policy(meta, LIMITS, queue="q")


def test_get_shows_defaults_under_stored_values() -> None:
    shown = with_reserved_defaults({"_max_claim_count": 2, "a": 1}, LIMITS)
    assert shown["_max_claim_count"] == 2
    assert shown["_default_message_ttl"] == 3600
    assert shown["a"] == 1
    assert "_dead_letter_queue" not in shown


def chain_of(links: dict[str, str]) -> object:
    async def dead_letter_queue_of(name: str) -> str | None:
        return links.get(name)

    return dead_letter_queue_of


@pytest.mark.parametrize(
    ("links", "dlq", "cycle"),
    [
        ({"b": "a"}, "b", "a -> b -> a"),
        ({"b": "c", "c": "a"}, "b", "a -> b -> c -> a"),
    ],
)
async def test_dead_letter_cycle_is_refused_and_named(links: dict[str, str], dlq: str, cycle: str) -> None:
    with pytest.raises(InvalidInput, match=f"cycle of dead-letter queues: {cycle}\\."):
        await check_dead_letter_chain("a", dlq, chain_of(links))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "links",
    [
        {},  # the DLQ has no DLQ of its own
        {"b": "c", "c": "d"},  # a chain that ends
        {"b": "c", "c": "b"},  # a cycle that does not pass through "a" is not this write's doing
    ],
)
async def test_dead_letter_chains_without_a_cycle_through_the_queue_pass(links: dict[str, str]) -> None:
    await check_dead_letter_chain("a", "b", chain_of(links))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ("x", 0), ({}, 1), ([], 1), ({"a": [1]}, 2), ([[[{}]]], 4), ({"a": 1, "b": {"c": [2]}}, 3)],
)
def test_json_depth(value: object, depth: int) -> None:
    assert not json_depth_exceeds(value, depth)
    assert json_depth_exceeds(value, depth - 1) == (depth > 0)


def test_a_depth_walk_of_hostile_input_stops_early() -> None:
    value: object = 1
    for _ in range(900):  # deeper than Python's recursion limit would allow a recursive walk
        value = [value, {"x": 1}]
    assert json_depth_exceeds(value, 64)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("a.b-c_D9", True),
        ("...", True),
        (".a", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        (".", False),
        ("..", False),
        ("a\n", False),
        ("a b", False),
        ("é", False),
        (7, False),
    ],
)
def test_names_are_fully_matched(name: object, ok: bool) -> None:
    assert is_name(name) is ok


@pytest.mark.parametrize("marker", ["0", "17", str(2**53)])
def test_good_markers(marker: str) -> None:
    assert check_marker(marker) == int(marker)


@pytest.mark.parametrize(
    "marker", ["", "\u00b2", "\uff11", "-1", "+1", "1_0", " 1", "1\n", str(2**53 + 1), "9" * 17]
)
def test_bad_markers(marker: str) -> None:
    with pytest.raises(InvalidInput, match="marker"):
        check_marker(marker)


def test_a_claims_answer_names_its_claim_in_every_href_even_once_it_expired() -> None:
    """A claim's answer built after the claim ended (a saturated store took longer than its ttl) still
    gives each message's href its claim id: the consumer needs it to delete what it claimed, and is then
    told the claim expired, instead of deleting without one."""
    from core.models import ClaimId, Message, MessageId
    from core.wire import messages

    claimed = Message(
        id=MessageId("a" * 32),
        queue="jobs",
        body={"n": 1},
        ttl=300,
        created_ms=0,
        expires_ms=300_000,
        claim_id=ClaimId("c" * 32),
        claim_expires_ms=60_000,
        claim_count=1,
    )
    late = 61_000
    [shown] = messages([claimed], late, claim=claimed.claim_id)
    assert shown["href"] == f"/v2/queues/jobs/messages/{'a' * 32}?claim_id={'c' * 32}"
    [listed] = messages([claimed], late)  # a listing shows the claim only while it holds the message
    assert listed["href"] == f"/v2/queues/jobs/messages/{'a' * 32}"
