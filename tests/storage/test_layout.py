"""storage/redis/keys.py owns the Redis layout: the Lua side is held to it here, run on a real Redis.

lib.lua builds the keys a script finds in data (a DLQ's keys, a message's hash) with qkeys() and
message_key(); every other key comes from the caller in KEYS. Every hash field a .lua file names must be a
field of keys.py (the policy's fields are core.metadata's, written into lib.lua's POLICY_FIELDS when the
scripts load; the provenance's are core.models.PROVENANCE's, DEAD_LETTER_FIELDS). lib.lua's policy()
applies the operator's dead-letter defaults as core's DeadLetterDefaults.apply does, and its exhausted() is
core's QueuePolicy.exhausted.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest
import redis.asyncio as aioredis

from core import sealing
from core.limits import Limits
from core.metadata import DeadLetterDefaults, QueuePolicy, parse_policy
from core.sealing import Keyring
from storage.redis.keys import (
    DEAD_LETTER_FIELDS,
    POLICY_FIELDS,
    BucketField,
    ClaimField,
    DeliveryField,
    IdempotencyField,
    MessageField,
    ProjectKeys,
    QueueField,
    QueueKeys,
    SubscriptionField,
    TaskField,
)
from storage.redis.scripts import POLICY_FIELDS_SLOT, SCRIPT_NAMES, defaults_args, library, policy_args

LUA = resources.files("storage.redis") / "lua"
LIB = library()
LAYOUT = (
    QueueField,
    MessageField,
    ClaimField,
    TaskField,
    IdempotencyField,
    SubscriptionField,
    DeliveryField,
    BucketField,
)
FIELDS = {str(f) for enum in LAYOUT for f in enum} | set(POLICY_FIELDS) | set(DEAD_LETTER_FIELDS.values())
HASH_COMMANDS = re.compile(r"redis\.call\('(HSET|HMGET|HGET|HDEL|HINCRBY|HSETNX|HEXISTS)',")


def _sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in LUA.iterdir() if p.name.endswith(".lua")}


def _call_args(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose '(' precedes `start`."""
    depth, args, current = 0, [], ""
    for ch in text[start:]:
        if ch in "({":
            depth += 1
        elif ch in ")}":
            if depth == 0:
                args.append(current.strip())
                return args
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    raise AssertionError(f"unclosed call at {start}")


def _fields_named(source: str) -> set[str]:
    """Every quoted hash field name a script passes to a hash command."""
    named = set()
    for m in HASH_COMMANDS.finditer(source):
        command, args = m.group(1), _call_args(source, m.end())
        rest = args[1:]  # after the key
        if command in ("HSET",):
            rest = rest[0::2]
        elif command in ("HINCRBY", "HSETNX", "HGET", "HEXISTS"):
            rest = rest[:1]
        named.update(a.strip("'") for a in rest if re.fullmatch(r"'[^']*'", a))
    return named


def test_every_lua_file_is_a_script_of_the_driver() -> None:
    assert set(_sources()) - {"lib.lua"} == {f"{n}.lua" for n in SCRIPT_NAMES}


def test_every_hash_field_the_scripts_name_is_a_field_of_the_layout() -> None:
    named = {name: _fields_named(source) for name, source in _sources().items()}
    assert named["claim.lua"] >= {"e", "cc", "c", "ce"}  # the parser finds fields at all
    unknown = {name: fields - FIELDS for name, fields in named.items() if fields - FIELDS}
    assert unknown == {}


def test_only_the_layout_helpers_of_lib_lua_build_key_names() -> None:
    """A key name is built from the prefix in lib.lua's qkeys() and message_key() only; every other key a
    script uses comes in KEYS."""
    builders = re.compile(
        r"local function (qkeys|message_key|waiting_key|wake_channel|notify_key|subscriptions_key|"
        r"subscribers_key|subscription_key|delivery_key|outbox_key|outbox_seq_key|outbox_owed_key)\(.*?\nend\n"
        r"|local function quota_key\(prefix\) return prefix \.\. 'quota' end\n"
        r"|local function subscription_expiry_key\(prefix\) return prefix \.\. 'subs' end\n"
        r"|local function message_expiry_key\(prefix\) return prefix \.\. 'bytes' end\n"
        r"|local function message_sizes_key\(prefix\) return prefix \.\. 'sizes' end\n",
        re.S,
    )
    for name, source in _sources().items():
        rest = builders.sub("", source) if name == "lib.lua" else source
        assert not re.search(r"prefix \.\. '", rest), name
        assert not re.search(r"\.\. ':(waiting|wake|notify|subs|subscribers)'", rest), name


async def test_lib_lua_builds_the_keys_keys_py_builds(redis_url: str) -> None:
    prefix, name, message_id = "charon:{p%7B1}:", "orders.DLQ", "0123abcd"
    script = (
        LIB
        + "\nlocal K = qkeys(ARGV[1], ARGV[2])\n"
        + "return {K.queue, K.msgs, K.ready, K.delayed, K.claimed, K.expiry, K.queues, K.due, "
        + "message_key(ARGV[1], ARGV[3]), waiting_key(K.queue), wake_channel(K.queue), K.notify, K.subs, "
        + "K.subscribers, subscription_key(ARGV[1], ARGV[3]), delivery_key(ARGV[1], '7'), "
        + "outbox_key(ARGV[1]), outbox_seq_key(ARGV[1]), outbox_owed_key(ARGV[1]), quota_key(ARGV[1]), "
        + "subscription_expiry_key(ARGV[1]), K.bytes, K.sizes}"
    )
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        built = await client.eval(script, 0, prefix, name, message_id)  # type: ignore[misc]
    finally:
        await client.aclose()
    qk = QueueKeys(prefix, name)
    pk = ProjectKeys(prefix)
    assert built == [
        *qk.all(),
        pk.message(message_id),
        qk.waiting,
        qk.wake_channel,
        qk.notify,
        qk.subscriptions,
        qk.subscribers,
        pk.subscription(message_id),
        pk.delivery("7"),
        pk.outbox,
        pk.outbox_seq,
        pk.outbox_owed,
        pk.quota,
        pk.subscription_expiry,
        pk.message_expiry,
        pk.message_sizes,
    ]


NAMES = ["orders", "orders.DLQ", "dlq-orders", "x" * 64, ".DLQ", "DLQ", "a.DLQ.b"]


@pytest.mark.parametrize(
    "defaults",
    [
        DeadLetterDefaults(),
        DeadLetterDefaults(max_claim_count=5),
        DeadLetterDefaults(max_claim_count=3, template="{queue}.DLQ"),
        DeadLetterDefaults(template="dlq-{queue}"),
        DeadLetterDefaults(template="dlq-{queue}-x"),
    ],
)
async def test_lib_lua_applies_the_dead_letter_defaults_as_core_does(
    redis_url: str, defaults: DeadLetterDefaults
) -> None:
    script = (
        LIB
        + "\nset_defaults(ARGV, 1)\nlocal out = {}\n"
        + "for i = 4, #ARGV do\n"
        + "  local pol = policy(qkeys('charon:{layout-test}:', ARGV[i]))\n"
        + "  table.insert(out, {pol.maxcc or -1, pol.dlq or ''})\n"
        + "end\nreturn out"
    )
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        applied = await client.eval(script, 0, *defaults_args(defaults), *NAMES)  # type: ignore[misc]
    finally:
        await client.aclose()
    expected = []
    for name in NAMES:
        policy = defaults.apply(name, QueuePolicy())
        expected.append([policy.max_claim_count or -1, policy.dead_letter_queue or ""])
    assert applied == expected


async def test_lib_lua_exhausted_is_core_exhausted(redis_url: str) -> None:
    cases = [(None, 0), (None, 9), (1, 0), (1, 1), (3, 2), (3, 3), (3, 4)]
    script = (
        LIB
        + "\nlocal out = {}\nfor i = 1, #ARGV, 2 do\n"
        + "  table.insert(out, exhausted({maxcc = tonumber(ARGV[i])}, tonumber(ARGV[i + 1])) and 1 or 0)\n"
        + "end\nreturn out"
    )
    args = [str(v) for maxcc, cc in cases for v in ("" if maxcc is None else maxcc, cc)]
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        got = await client.eval(script, 0, *args)  # type: ignore[misc]
    finally:
        await client.aclose()
    assert got == [int(QueuePolicy(max_claim_count=maxcc).exhausted(cc)) for maxcc, cc in cases]


def test_lib_lua_lists_no_policy_field_by_hand() -> None:
    """write_metadata's POLICY_FIELDS is filled from keys.POLICY_FIELDS (core.metadata's rows) when the
    scripts load: lib.lua leaves the table empty, and the filled one names exactly those, in order."""
    source = (LUA / "lib.lua").read_text(encoding="utf-8")
    by_hand = re.search(r"local POLICY_FIELDS = (\{.*?\})\n", source)
    assert by_hand is not None
    assert by_hand.group(1) == POLICY_FIELDS_SLOT
    table = re.search(r"local POLICY_FIELDS = \{(.*?)\}", LIB, re.S)
    assert table is not None
    assert re.findall(r"'([^']*)'", table.group(1)) == [str(f) for f in POLICY_FIELDS]
    assert all(re.fullmatch(r"[a-z_]+", f) for f in POLICY_FIELDS)  # safe to write into Lua as they are


FULL_POLICY = {
    "_default_message_ttl": 120,
    "_default_message_delay": 5,
    "_max_messages_post_size": 1000,
    "_max_claim_count": 3,
    "_dead_letter_queue": "dlq",
    "_dead_letter_queue_messages_ttl": 600,
    "_redelivery_delay": 1.5,
    "_redelivery_delay_multiplier": 2,
    "_max_redelivery_delay": 10,
    "_redelivery_jitter": 0.25,
    "_redelivery_delay_levels": ["1s", "500ms"],
    "_dead_letter_on_expiry": True,
    "_max_message_ttl": 7200,
    "_enable_encrypt_messages": True,
}


@pytest.mark.parametrize("metadata", [FULL_POLICY, {"_max_claim_count": 2}, {}])
async def test_write_metadata_stores_policy_args_under_the_policy_fields(
    redis_url: str, metadata: dict[str, object]
) -> None:
    """Every value policy_args() sends lands in the queue hash under its field of POLICY_FIELDS; an unset one
    is no field; and every field of POLICY_FIELDS is set by a policy that sets every stored key."""
    sealing.use(Keyring({"k": bytes(32)}))  # _enable_encrypt_messages: true needs a key
    try:
        policy = parse_policy(metadata, Limits(), queue="q")
    finally:
        sealing.use(None)
    args = policy_args(metadata, policy, None)
    queue = "charon:{layout-test}:q:q"
    script = (
        LIB + "\nwrite_metadata(KEYS[2], {queue = KEYS[1]}, ARGV, 1)\nreturn redis.call('HGETALL', KEYS[1])"
    )
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.delete(queue)
        flat = await client.eval(script, 2, queue, "charon:{layout-test}:mver", *args)  # type: ignore[misc]
        await client.delete(queue, "charon:{layout-test}:mver")
    finally:
        await client.aclose()
    stored = dict(zip(flat[0::2], flat[1::2], strict=True))
    assert stored.pop(QueueField.META) == args[0]
    sent = {f: str(v) for f, v in zip(POLICY_FIELDS, args[1:-1], strict=True) if v != ""}
    assert stored == sent
    if metadata is FULL_POLICY:
        assert set(stored) == set(POLICY_FIELDS)
