"""Loads lua/*.lua (each prefixed with lib.lua) and maps the scripts' CHARON_* errors to domain errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, NoReturn

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import errors
from core.metadata import DeadLetterDefaults

SCRIPT_NAMES = (
    "create_queue",
    "set_metadata",
    "drop_messages",
    "stats",
    "post_messages",
    "list_messages",
    "get_messages",
    "delete_message",
    "delete_messages",
    "pop_messages",
    "claim",
    "get_claim",
    "renew_claim",
    "release_claim",
    "release_message",
    "dead_letter_message",
    "sweep",
    "task_create",
    "task_lease",
    "task_cancel",
    "task_release",
    "redrive_step",
)

# Scripts that change nothing a client asked for (their housekeeping is the service's own): a failure after
# one was sent is just "unavailable", never "the outcome is unknown".
READ_SCRIPTS = frozenset({"list_messages", "get_messages", "stats", "get_claim"})

_ERRORS: dict[str, type[errors.CharonError]] = {
    # Redis refusing writes: maxmemory with noeviction ("OOM"), a failing disk ("MISCONF"). A script is
    # refused only before its first write (Redis will not stop one half-way), so nothing was changed.
    "OOM": errors.StorageFull,
    "MISCONF": errors.StorageFull,
    # Redis not serving now: starting up, a script running too long, a replica, a cluster without quorum.
    "LOADING": errors.StorageUnavailable,
    "BUSY": errors.StorageUnavailable,
    "READONLY": errors.StorageUnavailable,
    "MASTERDOWN": errors.StorageUnavailable,
    "CLUSTERDOWN": errors.StorageUnavailable,
    "TRYAGAIN": errors.StorageUnavailable,
    "CHARON_TOO_LARGE": errors.PayloadTooLarge,
    "CHARON_NO_CLAIM": errors.ClaimNotFound,
    "CHARON_CLAIMED": errors.ClaimMismatch,
    "CHARON_CLAIM_MISMATCH": errors.ClaimMismatch,
    "CHARON_STALE": errors.MetadataChanged,
    "CHARON_NO_MESSAGE": errors.MessageNotFound,
    "CHARON_NO_DLQ": errors.Conflict,
    "CHARON_NO_TASK": errors.NotFound,
    "CHARON_IDEMPOTENCY": errors.IdempotencyKeyReused,
}


def _source(name: str) -> str:
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def load_scripts(
    client: aioredis.Redis | aioredis.RedisCluster, defaults: DeadLetterDefaults | None = None
) -> dict[str, AsyncScript]:
    """register_script sends EVALSHA and falls back to EVAL (reloading) on NOSCRIPT by itself. The
    operator's dead-letter defaults are written into lib.lua, so scripts apply them with no extra argument."""
    lib = _source("lib").replace("--@DEFAULTS@", _defaults_lua(defaults or DeadLetterDefaults()))
    return {name: client.register_script(f"{lib}\n{_source(name)}") for name in SCRIPT_NAMES}


def _defaults_lua(defaults: DeadLetterDefaults) -> str:
    lines = []
    if defaults.max_claim_count is not None:
        lines.append(f"AUTO_MAXCC = {int(defaults.max_claim_count)}")
    if (ps := defaults.prefix_suffix) is not None:  # names hold only [A-Za-z0-9_.-] (check_template)
        lines.append(f"AUTO_PREFIX, AUTO_SUFFIX = '{ps[0]}', '{ps[1]}'")
    return "\n".join(lines)


def domain_error(exc: ResponseError) -> errors.CharonError | None:
    """The domain error a script raised with redis.error_reply('CHARON_<CODE> description'), or the one a
    Redis error reply about the server's state stands for (OOM, LOADING, ...), if any."""
    text = str(exc)
    code, _, description = text.partition(" ")
    # redis-py takes the code off the replies it knows (OOM, READONLY, ...) and keeps it in status_code
    known = getattr(exc, "status_code", None)
    if isinstance(known, str) and known in _ERRORS:
        code, description = known, text
    cls = _ERRORS.get(code)
    if cls is None:
        return None
    if code.startswith("CHARON_"):
        return cls(description)
    return cls(f"Redis answered {code} {description[:200]}.")


def raise_as_domain_error(exc: ResponseError) -> NoReturn:
    """Raise the domain error a script's error reply stands for, or the reply itself when it is none."""
    mapped = domain_error(exc)
    if mapped is None:
        raise exc
    raise mapped from None


async def run(script: AsyncScript, keys: Sequence[str | bytes], args: list[Any]) -> Any:
    try:
        return await script(keys=keys, args=args)
    except ResponseError as exc:
        raise_as_domain_error(exc)


def connection_error(exc: Exception, *, sent: bool) -> errors.StorageUnavailable:
    """A connection failure or timeout as a domain error: OutcomeUnknown once a write was `sent` (it may
    have run), StorageUnavailable before (nothing was changed)."""
    if sent:
        return errors.OutcomeUnknown(f"Redis stopped answering ({exc}).")
    return errors.StorageUnavailable(f"Redis is not reachable ({exc}).")


def before_sending(exc: Exception) -> bool:
    """Whether a failure of redis-py's own command path happened before the command went out: connecting
    (refused, or timed out) is; reading, or writing part of a command, is not known to be."""
    return "connecting" in str(exc)


class DirectScripts:
    """Runs the queue scripts (the API's hot path) with EVALSHA on connections this object keeps, made by
    the client's own pool (same address, credentials, TLS, decoding), instead of through
    Redis.execute_command. redis-py 8's command path (pool lock, a liveness probe on every checkout, retry
    wrapper, metrics hooks, AsyncScript) was the largest part of a one-message DELETE's time in Charon
    (bench/README.md). What stays the same: one EVALSHA per call, NOSCRIPT answered by loading the script,
    the scripts' CHARON_* errors mapped to domain errors, redis-py's periodic health check (a PING on a
    connection idle for 30 s). A kept connection that fails is replaced and the call made once more on a
    new one (as redis-py's default retry would); a new connection that fails raises. Redis Cluster clients
    keep redis-py's path (their routing is the point)."""

    MAX_IDLE = 64  # connections kept between calls (a worker's usual concurrency is far below)

    def __init__(self, client: aioredis.Redis, scripts: dict[str, AsyncScript]) -> None:
        self._pool = client.connection_pool
        self._scripts = scripts
        self._idle: list[Any] = []

    async def __call__(
        self, name: str, keys: Sequence[str | bytes], args: list[Any], *, write: bool = True
    ) -> Any:
        """One EVALSHA. A kept connection that the server closed meanwhile (a restart) is replaced before
        anything is sent, and a failure while sending on a kept one is tried once more on a new one: the
        script cannot have run. A failure once the command is out is never retried (the script may have
        run): OutcomeUnknown for a `write`, StorageUnavailable otherwise."""
        script = self._scripts[name]
        conn = self._idle.pop() if self._idle else None
        if conn is not None and _closed(conn):
            await conn.disconnect(nowait=True)
            conn = None
        reused = conn is not None
        conn = conn or self._new()
        sent = False
        try:
            try:
                await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            except (RedisConnectionError, RedisTimeoutError):
                await conn.disconnect(nowait=True)
                if not reused:
                    raise
                conn = self._new()
                await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            sent = write
            result = await self._reply(conn, script, keys, args)
        except ResponseError as exc:
            await self._keep(conn)  # the server answered: the connection is in a clean state
            raise_as_domain_error(exc)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            await conn.disconnect(nowait=True)
            raise connection_error(exc, sent=sent) from None
        except BaseException:  # a cancelled call with its reply still to come
            await conn.disconnect(nowait=True)
            raise
        await self._keep(conn)
        return result

    async def _keep(self, conn: Any) -> None:
        """Keep a connection for the next call, up to MAX_IDLE; past that (after a burst) close it."""
        if len(self._idle) < self.MAX_IDLE:
            self._idle.append(conn)
        else:
            await conn.disconnect()

    def _new(self) -> Any:
        return self._pool.make_connection()  # type: ignore[no-untyped-call]

    @staticmethod
    async def _reply(conn: Any, script: AsyncScript, keys: Sequence[str | bytes], args: list[Any]) -> Any:
        try:
            return await conn.read_response()
        except NoScriptError:  # the server restarted or was flushed (the script did not run): load it, go on
            await conn.send_command("SCRIPT", "LOAD", script.script)
            await conn.read_response()
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return await conn.read_response()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()


def _closed(conn: Any) -> bool:
    """Whether the server has closed this kept connection (its reader saw the end of the stream)."""
    reader = getattr(conn, "_reader", None)
    return reader is None or reader.at_eof()


@asynccontextmanager
async def unavailable_as_domain_error(*, write: bool = False) -> AsyncIterator[None]:
    """Redis failures through redis-py's own command path as domain errors: a connection failure or timeout
    as StorageUnavailable (OutcomeUnknown for a `write` that got past connecting), and the server's refusals
    (OOM, LOADING, ...) as their domain errors; a script's CHARON_* reply stays with run()."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise connection_error(exc, sent=write and not before_sending(exc)) from None
    except ResponseError as exc:
        mapped = domain_error(exc)
        if mapped is None:
            raise
        raise mapped from None
