"""The one way a Lua script is run (every script of the driver and of the pool catalogue), and Redis errors
as domain errors.

`ScriptRunner` sends EVALSHA and, on NOSCRIPT (the server restarted or was flushed; the script did not
run), loads the script and sends it again. On one server it keeps its own connections, made by the
client's pool (same address, credentials, TLS, decoding; behind Redis Sentinel, the primary the sentinels
name as it connects), at most MAX_CONNECTIONS at once: redis-py 8's
command path (pool lock, a liveness probe on every checkout, retry wrapper, metrics hooks) was the largest
part of a one-message DELETE's time in Charon (bench/README.md). On a Redis Cluster it goes through
redis-py, whose routing is the point. A failure once a script is sent is never retried (it may have run).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import redis.asyncio as aioredis
from redis.exceptions import ClusterError, NoScriptError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import errors
from core.quotas import exceeded_reply

Keys = Sequence[str | bytes]

_ERRORS: dict[str, type[errors.CharonError]] = {
    # Redis refusing writes: maxmemory with noeviction ("OOM"), a failing disk ("MISCONF"). A script is
    # refused only before its first write (Redis will not stop one half-way), so nothing was changed.
    "OOM": errors.StorageFull,
    "MISCONF": errors.StorageFull,
    # Redis not serving now: starting up, a script running too long, a replica (a demoted primary), a cluster
    # without quorum.
    "LOADING": errors.StorageUnavailable,
    "BUSY": errors.StorageUnavailable,
    "READONLY": errors.StorageUnavailable,
    # a primary with min-replicas-to-write refusing writes while too few replicas are in reach (a script, at
    # its first write: so, as for OOM, before it changed anything)
    "NOREPLICAS": errors.StorageUnavailable,
    "MASTERDOWN": errors.StorageUnavailable,
    "CLUSTERDOWN": errors.StorageUnavailable,
    "TRYAGAIN": errors.StorageUnavailable,
    "CHARON_TOO_LARGE": errors.PayloadTooLarge,
    "CHARON_QUOTA": errors.QuotaExceeded,
    "CHARON_SEAL": errors.EncryptionRequired,
    "CHARON_NO_CLAIM": errors.ClaimNotFound,
    "CHARON_CLAIMED": errors.ClaimMismatch,
    "CHARON_CLAIM_MISMATCH": errors.ClaimMismatch,
    "CHARON_STALE": errors.MetadataChanged,
    "CHARON_NO_MESSAGE": errors.MessageNotFound,
    "CHARON_NO_DLQ": errors.Conflict,
    "CHARON_NO_TASK": errors.NotFound,
    "CHARON_IDEMPOTENCY": errors.IdempotencyKeyReused,
    "CHARON_TOO_MANY": errors.Conflict,
    "CHARON_NO_SUBSCRIPTION": errors.SubscriptionNotFound,
    "CHARON_SUBSCRIPTION_EXISTS": errors.SubscriptionExists,
}


_NO_SUCH_DB = "DB index is out of range"


def domain_error(exc: ResponseError) -> errors.CharonError | None:
    """The domain error a script raised with redis.error_reply('CHARON_<CODE> description'), or the one a
    Redis error reply about the server's state stands for (OOM, LOADING, ...), if any."""
    text = str(exc)
    code, _, description = text.partition(" ")
    # redis-py takes the code off the replies it knows (OOM, READONLY, ...) and keeps it in status_code
    known = getattr(exc, "status_code", None)
    if isinstance(known, str) and known in _ERRORS:
        code, description = known, text
    if text.startswith(_NO_SUCH_DB):  # connecting: SELECT of a database past the server's `databases`
        return errors.StorageUnavailable(
            f"Redis refused the storage URI's database number ({text}): use one below its `databases`."
        )
    cls = _ERRORS.get(code)
    if cls is None:
        return None
    if code == "CHARON_QUOTA":
        return exceeded_reply(description)
    if code.startswith("CHARON_"):
        return cls(description)
    return cls(f"Redis answered {code} {description[:200]}.")


def raise_as_domain_error(exc: ResponseError) -> NoReturn:
    """Raise the domain error a script's error reply stands for, or the reply itself when it is none."""
    mapped = domain_error(exc)
    if mapped is None:
        raise exc
    raise mapped from None


def connection_error(exc: Exception, *, sent: bool) -> errors.StorageUnavailable:
    """A connection failure or timeout as a domain error: OutcomeUnknown once a write was `sent` (it may
    have run), StorageUnavailable before (nothing was changed)."""
    if sent:
        return errors.OutcomeUnknown(f"Redis stopped answering ({exc}).")
    return errors.StorageUnavailable(f"Redis is not reachable ({exc}).")


def closed_transport(exc: BaseException) -> bool:
    """Whether `exc` is a write on a connection already closed, raised as something else than a
    ConnectionError, before any byte of the command went out: uvloop's RuntimeError for a transport the server
    closed (asyncio's own loop raises a ConnectionError; MagicStack/uvloop#506), or redis-py's AttributeError
    for a connection another task disconnected between connecting it and writing on it (seen on a Redis
    Cluster in failover, as redis-py re-maps the slots; redis/redis-py#4287 is its kin)."""
    if isinstance(exc, RuntimeError):
        return "handler is closed" in str(exc)
    return isinstance(exc, AttributeError) and "'NoneType' object has no attribute 'writelines'" in str(exc)


def before_sending(exc: Exception) -> bool:
    """Whether a failure of redis-py's own command path happened before the command went out: connecting
    (refused, or timed out) is; reading, or writing part of a command, is not known to be."""
    return "connecting" in str(exc)


@asynccontextmanager
async def unavailable_as_domain_error(*, write: bool = False) -> AsyncIterator[None]:
    """Redis failures through redis-py's own command path as domain errors: a connection failure or timeout
    as StorageUnavailable (OutcomeUnknown for a `write` that got past connecting), a Redis Cluster's
    topology errors as StorageUnavailable, and the server's refusals (OOM, LOADING, ...) and a script's
    CHARON_* replies as their domain errors."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise connection_error(exc, sent=write and not before_sending(exc)) from None
    except ResponseError as exc:
        raise_as_domain_error(exc)
    except (ClusterError, RedisClusterException) as exc:
        # a Redis Cluster's topology in flux (a failover): slots not covered, nodes that disagree or cannot
        # be reached while the client maps them, redirections past redis-py's bound; raised before the
        # command runs anywhere
        raise errors.StorageUnavailable(f"The Redis Cluster cannot serve this now ({exc}).") from None
    except (RuntimeError, AttributeError) as exc:
        if not closed_transport(exc):
            raise
        raise connection_error(exc, sent=False) from None


class Script:
    """A script's source and its SHA1 (the name EVALSHA runs it by). `write`: whether it changes what a
    client asked for; a failure after one was sent is then "the outcome is unknown", not "unavailable"."""

    __slots__ = ("evalsha", "name", "sha", "source", "write")

    def __init__(self, name: str, source: str, *, write: bool) -> None:
        self.name, self.source, self.write = name, source, write
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self.evalsha = b"$7\r\nEVALSHA\r\n$40\r\n" + self.sha.encode() + b"\r\n"  # RESP: the call's head


def _bulk(value: bytes | str | int | float) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py encodes it (UTF-8 text, int, float repr)."""
    if isinstance(value, bytes):
        b = value
    elif isinstance(value, str):
        b = value.encode()
    elif isinstance(value, int) and not isinstance(value, bool):
        b = b"%d" % value
    elif isinstance(value, float):
        b = repr(value).encode()
    else:
        raise TypeError(f"a script argument must be bytes, str, int or float; got {type(value).__name__}")
    return b"$%d\r\n%s\r\n" % (len(b), b)


def pack_evalsha(script: Script, keys: Keys, args: Sequence[Any]) -> bytes:
    """EVALSHA of `script` as the bytes sent: what redis-py's pack_command makes of it, at a third of its cost
    (it was a tenth of a one-message DELETE's CPU in Charon; bench/README.md)."""
    return b"".join(
        [
            b"*%d\r\n" % (3 + len(keys) + len(args)),
            script.evalsha,
            _bulk(len(keys)),
            *map(_bulk, keys),
            *map(_bulk, args),
        ]
    )


class ScriptRunner:
    MAX_CONNECTIONS = 64  # script connections open at once on one server; a call past them waits its turn
    CLUSTER_CONCURRENCY = 32  # calls of each() in flight at once on a Redis Cluster

    def __init__(
        self, client: aioredis.Redis | aioredis.RedisCluster, *, timeout: float, wait_replicas: int = 0
    ) -> None:
        """`wait_replicas`: on one server, each write script is followed by WAIT for that many replicas (on
        the same connection, sent with it), and acknowledged only once they have it (uri.py)."""
        self._client = client
        self._timeout = timeout
        self._cluster = isinstance(client, aioredis.RedisCluster)
        if wait_replicas and self._cluster:
            raise errors.InvalidInput(
                "wait_replicas is for one server or Redis Sentinel, not a Redis Cluster."
            )
        self._wait_replicas = wait_replicas
        # half the read timeout: Redis ends a WAIT on its timer (hz 10: up to 100 ms late), and a shortfall
        # must come back as one, not as a read timing out
        self._wait_ms = max(1, int(timeout * 500))
        wait = [b"*3\r\n", _bulk("WAIT"), _bulk(wait_replicas), _bulk(self._wait_ms)] if wait_replicas else []
        self._wait = b"".join(wait)  # WAIT as sent, after each write script
        self._idle: list[Any] = []
        self._in_use = 0  # connections taken by calls now (at most MAX_CONNECTIONS)
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __call__(self, script: Script, keys: Keys, args: Sequence[Any]) -> Any:
        """One EVALSHA; a script's CHARON_* error and Redis' refusals raise their domain errors."""
        if self._cluster:
            return await self._via_redis_py(script, keys, args)
        await self._take_slot()
        try:
            conn, reused = await self._checkout()
            try:
                result = await self._evalsha(conn, reused, script, keys, args)
            except BaseException as exc:
                await self._checkin(conn, exc)
                raise
            self._idle.append(conn)
            return result
        finally:
            self._give_slot()

    async def each(self, script: Script, calls: Sequence[tuple[Keys, Sequence[Any]]]) -> list[Any]:
        """`script` once per (keys, args), pipelined on one connection (on a Redis Cluster, which refuses
        scripts in a pipeline, as concurrent calls routed each to its node). Replies in order."""
        if not calls:
            return []
        if self._cluster:
            out: list[Any] = []
            for i in range(0, len(calls), self.CLUSTER_CONCURRENCY):
                batch = calls[i : i + self.CLUSTER_CONCURRENCY]
                out += await asyncio.gather(*(self._via_redis_py(script, k, a) for k, a in batch))
            return out
        commands = b"".join(pack_evalsha(script, k, a) for k, a in calls)
        await self._take_slot()
        try:
            conn, _ = await self._checkout()
            try:
                replies = await self._pipelined(conn, script, commands, len(calls))
                if any(isinstance(r, NoScriptError) for r in replies):  # none of them ran
                    await self._load(conn, script)
                    replies = await self._pipelined(conn, script, commands, len(calls))
            except BaseException as exc:
                await self._checkin(conn, exc)
                raise
            self._idle.append(conn)
        finally:
            self._give_slot()
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise_as_domain_error(reply)
        return replies

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()

    # -- one server -----------------------------------------------------------------------------------

    async def _take_slot(self) -> None:
        """One of MAX_CONNECTIONS slots; a call past them waits its turn, at most the storage timeout."""
        if self._in_use >= self.MAX_CONNECTIONS:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(self._timeout):
                    await waiter  # the slot is handed over by _give_slot
            except TimeoutError:
                raise errors.StorageUnavailable(
                    f"All {self.MAX_CONNECTIONS} Redis connections stayed busy for {self._timeout:g} s."
                ) from None
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._give_slot()  # handed over just as this call gave up: pass it on
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
            return
        self._in_use += 1

    def _give_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to it (_in_use stays)
                return
        self._in_use -= 1

    async def _checkout(self) -> tuple[Any, bool]:
        """A kept connection (True), or a new one when none is kept or the server closed the kept one
        meanwhile (a restart), before anything is sent."""
        conn = self._idle.pop() if self._idle else None
        if conn is not None and _closed(conn):
            await conn.disconnect(nowait=True)
            conn = None
        if conn is None:
            return self._client.connection_pool.make_connection(), False  # type: ignore[union-attr]
        return conn, True

    async def _checkin(self, conn: Any, exc: BaseException) -> None:
        """After a call failed with `exc`: keep the connection if the server answered (an error reply is a
        clean state), else drop it (a failed or cancelled call may leave a reply to come)."""
        answered = isinstance(exc, ResponseError | errors.CharonError) and not isinstance(
            exc, errors.StorageUnavailable
        )
        if answered:
            self._idle.append(conn)
        else:
            await conn.disconnect(nowait=True)

    async def _evalsha(self, conn: Any, reused: bool, script: Script, keys: Keys, args: Sequence[Any]) -> Any:
        """EVALSHA on `conn`. A kept (`reused`) connection that fails while sending is connected again once
        (the script cannot have run); once the command is out, a failure is never retried."""
        sent = False
        waits = script.write and bool(self._wait)
        try:
            command = pack_evalsha(script, keys, args) + (self._wait if waits else b"")
            try:
                await _connected(conn)
                await _send(conn, command)
            except (RedisConnectionError, RedisTimeoutError):
                await conn.disconnect(nowait=True)
                if not reused:
                    raise
                await _connected(conn)
                await _send(conn, command)
            sent = script.write
            try:
                return await self._answer(conn, waits)
            except NoScriptError:
                await self._load(conn, script)
                await _send(conn, command)
                return await self._answer(conn, waits)
        except ResponseError as exc:
            raise_as_domain_error(exc)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise connection_error(exc, sent=sent) from None

    async def _pipelined(self, conn: Any, script: Script, commands: bytes, count: int) -> list[Any]:
        """`count` EVALSHAs of `script`, packed together in `commands`, sent at once; their replies."""
        sent = False
        waits = script.write and bool(self._wait)
        try:
            await _connected(conn)
            await _send(conn, commands + (self._wait if waits else b""))
            sent = script.write
            replies = []
            for _ in range(count):
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:
                    replies.append(exc)
            if waits:
                await self._replicated(conn)
            return replies
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise connection_error(exc, sent=sent) from None

    async def _answer(self, conn: Any, waits: bool) -> Any:
        """A script's reply (its error raised), and when it `waits`, WAIT's after it (read even after an
        error, so that the connection is left with nothing unread)."""
        try:
            reply = await conn.read_response()
        except ResponseError:
            if waits:
                with contextlib.suppress(ResponseError):  # a replica refuses WAIT too
                    await conn.read_response()
            raise
        if waits:
            await self._replicated(conn)
        return reply

    async def _replicated(self, conn: Any) -> None:
        """WAIT's answer, read from `conn`: fewer replicas than asked have the write, which a failover now
        could lose (OutcomeUnknown)."""
        try:
            replicas = await conn.read_response()
        except ResponseError as exc:
            raise errors.OutcomeUnknown(
                f"Redis wrote it on the primary, then refused WAIT ({exc})."
            ) from None
        if replicas < self._wait_replicas:
            raise errors.OutcomeUnknown(
                f"Redis wrote it on the primary, but {replicas} of the {self._wait_replicas} replicas asked "
                f"for (wait_replicas) confirmed it within {self._wait_ms} ms, so a failover could undo it."
            )

    @staticmethod
    async def _load(conn: Any, script: Script) -> None:
        await conn.send_command("SCRIPT", "LOAD", script.source)
        await conn.read_response()

    # -- a cluster ------------------------------------------------------------------------------------

    async def _via_redis_py(self, script: Script, keys: Keys, args: Sequence[Any]) -> Any:
        async with unavailable_as_domain_error(write=script.write):
            try:
                return await self._client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                await self._client.script_load(script.source)
                return await self._client.evalsha(script.sha, len(keys), *keys, *args)


async def _send(conn: Any, command: bytes) -> None:
    """`command` sent on `conn` (connected) as redis-py's send_packed_command sends it, but bounded by
    asyncio.timeout where redis-py uses asyncio.wait_for, which on Python 3.11 runs each write as a task of
    its own: an event-loop turn a call (bench/RESULTS.md, "A request's CPU by layer").

    A write that fails or runs out of time before the whole command left this process drops the connection
    with what was not written (`_drop`): the server gets at most part of a command, which it never runs, so
    the call did not happen (a ConnectionError or TimeoutError, StorageUnavailable to the caller, and safe to
    send again). Once the whole command is out, it may run: `_send` returns, and the reply's read says how
    it went (OutcomeUnknown for a write that fails then). A closed connection raises ConnectionError
    whichever event loop runs. The timer is armed only when the kernel did not take the whole command at
    once (a timer a call was three asyncio.get_running_loop calls, a getpid(2) each on Python 3.11)."""
    writer = None
    try:
        if conn.health_check_interval:
            await conn.check_health()
        writer = conn._writer  # None once disconnected: the AttributeError closed_transport knows
        writer.writelines((command,))
        if writer.transport.get_write_buffer_size():  # not all of it taken by the kernel yet: wait, bounded
            async with asyncio.timeout(conn.socket_timeout):
                await writer.drain()
        else:  # all of it went: drain() cannot wait (it only raises what the connection knows of)
            await writer.drain()
    except (RuntimeError, AttributeError) as exc:
        raise await _closed_connection(conn, exc) from None
    except (TimeoutError, OSError) as exc:
        if writer is not None and not writer.transport.get_write_buffer_size():
            return  # all of it handed to the kernel (the timer and the drain may end in one turn)
        await _drop(conn, writer)
        if isinstance(exc, TimeoutError):
            raise RedisTimeoutError("Timeout writing to socket") from None
        raise RedisConnectionError(f"Error while writing to socket: {exc}.") from exc
    except BaseException:
        await _drop(conn, writer)
        raise


async def _drop(conn: Any, writer: Any) -> None:
    """`conn` closed at once, what it had not yet written discarded: a graceful close would still send it, and
    a server that reads again later would run a command the caller was told did not happen."""
    if writer is not None:
        writer.transport.abort()
    await conn.disconnect(nowait=True)


async def _connected(conn: Any) -> None:
    """Connect `conn` if it is not: through its class's connect(), which for a Sentinel-managed connection
    asks the sentinels where the primary is now (sending on an unconnected one would reconnect to the address
    it had, or to redis-py's default, without asking). A server that closes it during the handshake (a
    primary going down) raises ConnectionError."""
    if not conn.is_connected:
        try:
            await conn.connect()
        except (RuntimeError, AttributeError) as exc:
            raise await _closed_connection(conn, exc) from None


async def _closed_connection(conn: Any, exc: RuntimeError | AttributeError) -> RedisConnectionError:
    """`exc`, from a write or connect on `conn`, as the ConnectionError it is when `conn` was closed,
    whichever event loop runs (closed_transport), `conn` dropped; any other such error is raised as it is."""
    if not closed_transport(exc):
        raise exc
    await conn.disconnect(nowait=True)
    return RedisConnectionError(f"Connection closed by server ({exc}).")


def _closed(conn: Any) -> bool:
    """Whether the server has closed this kept connection (its reader saw the end of the stream)."""
    reader = getattr(conn, "_reader", None)
    return reader is None or reader.at_eof()
