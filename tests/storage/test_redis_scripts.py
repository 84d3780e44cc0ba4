"""Redis driver internals: scripts survive SCRIPT FLUSH and closed connections, the sweeper's index, the
bound on script connections and its wait (the layout: test_layout.py)."""

from __future__ import annotations

import asyncio
import re
import signal
import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from core import signatures
from core.clock import ManualClock
from core.errors import QuotaExceeded, StorageUnavailable
from core.models import QueueRef, RedriveSpec, TaskId
from storage.redis.keys import ProjectKeys, full_scan_key, touched_key
from storage.redis.runner import Script, ScriptRunner, pack_evalsha, unavailable_as_domain_error
from storage.redis.scripts import SCRIPT_NAMES, ReadAhead, _source, library, used, wrapped
from storage.redis.store import RedisStore
from tests.contract.helpers import DLQ, Q, post, set_policy
from tests.contract.test_redrive import LEASE_MS, OWNER, dead_letter, run_on
from tests.contract.test_subscriptions import HOOK, subscribe
from tests.servers import RedisServer


def test_a_script_carries_the_part_of_lib_lua_it_uses() -> None:
    """scripts.used(): the definitions a code names, those they name in turn, in lib.lua's order, and no
    other; every script's text defines each lib.lua name it uses (an undefined local would be a nil global
    when the script runs), and carries less than the whole of lib.lua."""
    lib = (
        "-- header\nlocal A = 1\nlocal function f(x)\n  return x + A\nend\n-- g's comment\n"
        "local function g(x)\n  return f(x)\nend\nlocal function h()\n  return 2\nend\n"
    )
    assert used(lib, "return g(1)") == (
        "-- header\nlocal A = 1\nlocal function f(x)\n  return x + A\nend\n-- g's comment\n"
        "local function g(x)\n  return f(x)\nend\n"
    )
    assert used(lib, "return h()") == "-- header\nlocal function h()\n  return 2\nend\n"
    with pytest.raises(ValueError, match="one name a top-level definition"):
        used("local a, b = 1, 2\n", "return a")
    with pytest.raises(ValueError, match="only definitions at the top level"):
        used("local a\na = 1\n", "return a")
    full = library()
    names = set(re.findall(r"^local (?:function )?(\w+)", full, re.MULTILINE))
    for name in SCRIPT_NAMES:
        text = wrapped(full, _source(name))
        defined = set(re.findall(r"^local (?:function )?(\w+)", text, re.MULTILINE))
        assert names & set(re.findall(r"\w+", re.sub(r"--[^\n]*", "", text))) <= defined, name
        assert len(text) < len(full) + len(_source(name)), name


async def test_scripts_reload_after_script_flush(redis_store: RedisStore, redis_url: str) -> None:
    await post(redis_store, Q, "before")
    admin = aioredis.Redis.from_url(redis_url)
    await admin.script_flush()
    await admin.aclose()
    await post(redis_store, Q, "after")  # NOSCRIPT -> redis-py loads the script again
    assert (await redis_store.stats(Q)).total == 2


async def test_calls_go_on_after_the_server_closes_the_kept_connections(
    redis_store: RedisStore, redis_url: str
) -> None:
    """The driver keeps its script connections (storage.redis.runner.ScriptRunner); when the server drops
    them (a restart, CLIENT KILL, a timeout), the next call replaces the connection and succeeds, once."""
    await asyncio.gather(*(post(redis_store, Q, n) for n in range(5)))  # several kept connections
    admin = aioredis.Redis.from_url(redis_url)
    killed = await admin.client_kill_filter(_type="normal", skipme=True)
    await admin.aclose()
    assert killed >= 1
    for n in range(5):
        await post(redis_store, Q, n)
    assert (await redis_store.stats(Q)).total == 10


async def test_a_command_whose_connection_another_task_closed_is_unavailable_and_did_not_run(
    redis_url: str,
) -> None:
    """On a Redis Cluster in failover, redis-py re-maps the slots and closes connections that a command has
    taken but not yet written on; the command then met AttributeError ('NoneType' object has no attribute
    'writelines'), answered 500 in a CI run. It is StorageUnavailable (a 503: nothing was done), as the
    command never ran. Here another task closes the connection at that moment, on one server."""
    client = aioredis.Redis.from_url(redis_url, socket_timeout=5, single_connection_client=True)
    key = f"t{uuid.uuid4().hex}:n"
    try:
        await client.ping()

        async def incr() -> int:
            async with unavailable_as_domain_error(write=True):
                return int(await client.incr(key))

        assert client.connection is not None
        outcome, _ = await asyncio.gather(
            incr(), client.connection.disconnect(nowait=True), return_exceptions=True
        )
        assert type(outcome) is StorageUnavailable, outcome
        assert await client.get(key) is None
    finally:
        await client.aclose()


async def test_full_scan_repairs_a_lost_touched_mark(
    redis_store: RedisStore, redis_url: str, clock: ManualClock
) -> None:
    """A sweeper that dies between taking the touched set and recording due times loses the marks; the
    periodic full scan (every FULL_SCAN_MS) finds the project again."""
    await redis_store.sweep()  # the first sweep is the full scan; the next full scan is 30 s away
    await set_policy(redis_store, Q, max_claim_count=1, dead_letter_queue=DLQ.name)
    [mid] = await post(redis_store, Q, "x")
    assert (await redis_store.claim(Q, ttl=60, grace=0, limit=1)).claim is not None
    admin = aioredis.Redis.from_url(redis_url)
    ns = redis_store._namespace
    await admin.delete(touched_key(ns))  # as if taken by a sweeper that then died
    clock.advance(61)
    await redis_store.sweep()
    assert await redis_store.get_messages(DLQ, [mid]) == []
    await admin.delete(full_scan_key(ns))  # 30 s later
    await admin.aclose()
    await redis_store.sweep()
    assert len(await redis_store.get_messages(DLQ, [mid])) == 1


async def test_a_burst_of_first_calls_succeeds_and_leaves_few_connections(
    redis_store: RedisStore, redis_url: str
) -> None:
    """200 concurrent first calls on a new project all succeed (they once each took a connection of
    redis-py's pool, 100 at most, to register the project), and the driver never opens more than
    ScriptRunner.MAX_CONNECTIONS (64) script connections."""
    await asyncio.gather(*(post(redis_store, Q, n) for n in range(200)))
    assert (await redis_store.stats(Q)).total == 200
    admin = aioredis.Redis.from_url(redis_url)
    clients = await admin.client_list()
    await admin.aclose()
    assert len(clients) <= 64 + 10  # + redis-py's own pool, this admin client


async def test_a_call_that_waits_past_the_timeout_for_a_connection_is_unavailable_and_did_not_run() -> None:
    """With all MAX_CONNECTIONS script connections busy (the server paused), a call past them waits for one
    at most the storage timeout, then fails as StorageUnavailable (a 503 saying nothing was done), and it
    never runs; the calls that held connections finish once the server answers."""
    server = RedisServer().start()  # its own: CLIENT PAUSE stops every client of the server
    client = aioredis.Redis.from_url(server.url, socket_timeout=30)
    runner = ScriptRunner(client, timeout=0.5)
    count = Script("count", "return redis.call('INCR', KEYS[1])", write=True)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await runner(count, ["n"], [])  # loaded and one connection kept
        await admin.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
        calls = 100
        outcomes = await asyncio.gather(
            *(runner(count, ["n"], []) for _ in range(calls)), return_exceptions=True
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(failed) == calls - ScriptRunner.MAX_CONNECTIONS
        assert all(type(e) is StorageUnavailable for e in failed), failed[:3]
        assert "All 64 Redis connections stayed busy for 0.5 s" in failed[0].description
        assert int(await admin.get("n")) == 1 + ScriptRunner.MAX_CONNECTIONS  # the refused ones never ran
    finally:
        await runner.aclose()
        await client.aclose()
        await admin.aclose()
        server.stop()


async def test_a_call_the_stopped_server_cannot_take_in_is_unavailable_and_never_runs() -> None:
    """A server that stops reading (SIGSTOP) while a call larger than the socket buffers is written: the
    write is bounded by the socket timeout (runner._send), the call fails as StorageUnavailable (a 503 saying
    nothing was done, not OutcomeUnknown), and what was not written is discarded with the connection: once
    the server reads again and has closed that connection, the call has not run (a graceful close would
    still have sent the rest). The next call succeeds on a new connection."""
    server = RedisServer().start()
    client = aioredis.Redis.from_url(server.url, socket_timeout=0.5)
    runner = ScriptRunner(client, timeout=0.5)
    store = Script("store", "return redis.call('SET', KEYS[1], ARGV[1])", write=True)
    admin = aioredis.Redis.from_url(server.url)
    try:
        await runner(store, ["small"], ["x"])  # loaded and one connection kept
        server.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(StorageUnavailable) as refused:
                await asyncio.wait_for(runner(store, ["big"], ["x" * 64_000_000]), 10)
            assert type(refused.value) is StorageUnavailable
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert await runner(store, ["after"], ["y"]) in (b"OK", "OK")
        for _ in range(100):  # until the server has read what reached it and closed the dropped connection
            if len(await admin.client_list()) <= 2:  # this one and the runner's new one
                break
            await asyncio.sleep(0.05)
        assert len(await admin.client_list()) <= 2
        assert await admin.get("big") is None
        assert await admin.get("after") == b"y"
    finally:
        await runner.aclose()
        await client.aclose()
        await admin.aclose()
        server.stop()


def test_a_packed_call_is_what_redis_py_sends() -> None:
    """ScriptRunner packs EVALSHA itself (pack_evalsha): byte for byte what redis-py would send, for every
    kind of argument a script takes; anything else is refused, as redis-py refuses it."""
    script = Script("s", "return 1", write=False)
    keys = [b"charon:{p}:q:orders", "charon:{p}:m:\u00e9t\u00e9"]
    args = [b"", "", "x" * 7000, 0, -17, 2**40, 1.5, 1e-7, "\U0001f600"]
    expected = b"".join(Connection().pack_command("EVALSHA", script.sha, len(keys), *keys, *args))
    assert pack_evalsha(script, keys, args) == expected
    for bad in (True, None, [1]):
        with pytest.raises(TypeError, match="bytes, str, int or float"):
            pack_evalsha(script, keys, [bad])


async def test_a_backlog_count_that_drifted_heals_when_the_outbox_runs_dry(
    redis_store: RedisStore, redis_url: str
) -> None:
    """Deliveries written before `outbox:owed` existed were never counted: finishing them must not leave the
    count below zero for good (the backlog gauge would then show hashes, not messages)."""
    await subscribe(redis_store, Q, HOOK)
    await post(redis_store, Q, "a", "b", "c")
    admin = aioredis.Redis.from_url(redis_url)
    owed = ProjectKeys.of(redis_store._namespace, Q.project).outbox_owed
    await admin.delete(owed)  # as if written by a version without the count
    got = await redis_store.lease_deliveries("n", lease_ms=30_000, limit=10)
    await redis_store.finish_deliveries(got)
    assert await admin.get(owed) is None
    await admin.aclose()
    await post(redis_store, Q, *range(40))
    assert (await redis_store.outbox_stats())[0] == 40


async def test_a_retry_made_while_a_lease_records_its_due_time_still_comes_due_on_time(
    redis_store: RedisStore, clock: ManualClock
) -> None:
    """A notifier's lease records the project's next due time after its script ran; a retry finished in
    between (another task of the same notifier) must not be hidden until the lease ends."""
    await subscribe(redis_store, Q, HOOK)
    await post(redis_store, Q, "a", "b")
    outbox = redis_store._outbox
    a, _ = sorted(
        await redis_store.lease_deliveries("n", lease_ms=30_000, limit=10),
        key=lambda d: str(d.message.body if d.message else None),
    )
    now = clock.now_ms()
    keys = ProjectKeys.of(redis_store._namespace, Q.project)
    (reply,) = await outbox._scripts.lease_deliveries([keys], now=now, lease_ms=30_000, limit=10)
    await redis_store.finish_delivery(a, retry_at_ms=now + 1000)
    await outbox.record({Q.project: reply.next_due_ms})  # the lease's record, after the retry
    clock.advance(2)
    assert [d.id for d in await redis_store.lease_deliveries("n", lease_ms=30_000, limit=10)] == [a.id]


async def test_a_post_hash_written_before_its_count_field_is_still_delivered(
    redis_store: RedisStore, redis_url: str
) -> None:
    await subscribe(redis_store, Q, HOOK)
    await post(redis_store, Q, "a", "b", "c")
    admin = aioredis.Redis.from_url(redis_url)
    keys = ProjectKeys.of(redis_store._namespace, Q.project)
    [hash_id] = await admin.zrange(keys.outbox, 0, -1)
    await admin.hdel(keys.delivery(hash_id.decode()), "_n")  # as the first packed hashes were written
    await admin.aclose()
    got = await redis_store.lease_deliveries("n", lease_ms=30_000, limit=2)
    assert sorted(d.message.body for d in got if d.message) == ["a", "b"]
    await redis_store.finish_deliveries(got)
    [last] = await redis_store.lease_deliveries("n", lease_ms=30_000, limit=10)
    await redis_store.finish_delivery(last, retry_at_ms=None)
    assert await redis_store.outbox_stats() == (0, None)


async def test_a_signature_step_moves_only_what_was_read_and_found(
    redis_store: RedisStore, clock: ManualClock
) -> None:
    """A signature task's step on Redis is a read (the driver computes signatures) then the script: a
    message removed in between must not let the script walk past what was read (a message of the signature
    unread, passed over), and a step read before another one moved the cursor must change nothing."""
    boom = {"error": "boom"}
    ids = await dead_letter(redis_store, Q, boom, {"error": "other"}, boom, boom, boom, boom)
    a, b, c, d, e, f = ids
    target = await redis_store._target(DLQ)

    async def task(spec: RedriveSpec) -> TaskId:
        task_id = TaskId(f"t-{len(spec.message_ids or ())}")
        await redis_store.create_redrive(DLQ, task_id, spec, owner=OWNER, lease_ms=LEASE_MS)
        return task_id

    async def step(task_id: TaskId, read: ReadAhead | None) -> dict[str, str]:
        reply = await redis_store._scripts.redrive_step(
            target, now=clock.now_ms(), task_id=task_id, owner=OWNER, lease_ms=LEASE_MS, batch=3, read=read
        )
        return reply.task

    signature = signatures.signature("boom")
    walk = await task(RedriveSpec(signature=signature, destination="fixed"))
    # an earlier version, which knows no signature and walks markers up to 'end', moves nothing of it
    end, sigend = await redis_store._client.hmget(redis_store._task_key(DLQ, walk), ["end", "sigend"])
    assert (end, (await redis_store.get_redrive(DLQ, walk)).end_marker) == ("0", int(sigend)) != ("0", 0)
    read = await redis_store._read_ahead(DLQ, walk, 3)
    assert read is not None
    assert (read.at, read.only) == (0, [a, c])
    await redis_store.delete_message(DLQ, b, claim_id=None)  # between the read and the step
    done = await step(walk, read)
    assert (done["status"], done["moved"], done["scanned"]) == ("running", "2", "2")  # d: not read, left
    # listed ids: a read from a cursor that has moved on since changes nothing
    listed = await task(RedriveSpec(signature=signature, message_ids=(d, e, f), destination="fixed"))
    stale = await redis_store._read_ahead(DLQ, listed, 1)
    assert stale is not None
    assert stale.only == [d]
    moved = await redis_store.redrive_step(DLQ, listed, owner=OWNER, lease_ms=LEASE_MS, batch=1)
    assert (moved.cursor, moved.moved) == (1, 1)
    assert (await step(listed, stale))["cursor"] == "1"  # not e and f passed over as "not of it"
    assert (await run_on(redis_store, listed, batch=1)).moved == 3
    finished = await run_on(redis_store, walk, batch=3)
    assert (finished.status, finished.moved) == ("succeeded", 2)
    assert {m.id for m in await redis_store.get_messages(QueueRef(Q.project, "fixed"), ids)} == {
        a,
        c,
        d,
        e,
        f,
    }


async def test_a_refusal_near_the_largest_byte_quota_names_its_numbers_whole(
    redis_store: RedisStore, redis_url: str
) -> None:
    """Lua writes 10^15 as "1e+15": the refusal of a project holding a petabyte (its sum set by hand) must
    still be a 403 naming whole numbers, not a reply core cannot read."""
    await redis_store.set_quota(Q.project, {"message_bytes": 10**15})
    sizes = ProjectKeys.of(redis_store._namespace, Q.project).message_sizes
    admin = aioredis.Redis.from_url(redis_url)
    await admin.hset(sizes, "", 10**15)  # type: ignore[misc]
    await admin.aclose()
    with pytest.raises(QuotaExceeded) as refused:
        await post(redis_store, Q, "one more")
    assert "holds 1000000000000000 bytes and this would add 10; its quota 'message_bytes' is " in str(
        refused.value
    )
    assert str(refused.value).count("1000000000000000") == 2
