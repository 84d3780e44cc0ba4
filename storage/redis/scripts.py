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

_ERRORS: dict[str, type[errors.CharonError]] = {
    "CHARON_TOO_LARGE": errors.PayloadTooLarge,
    "CHARON_NO_CLAIM": errors.ClaimNotFound,
    "CHARON_CLAIMED": errors.ClaimMismatch,
    "CHARON_CLAIM_MISMATCH": errors.ClaimMismatch,
    "CHARON_STALE": errors.MetadataChanged,
    "CHARON_NO_MESSAGE": errors.MessageNotFound,
    "CHARON_NO_DLQ": errors.Conflict,
    "CHARON_NO_TASK": errors.NotFound,
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
    """The domain error a script raised with redis.error_reply('CHARON_<CODE> description'), if any."""
    text = str(exc)
    code, _, description = text.partition(" ")
    cls = _ERRORS.get(code)
    return cls(description) if cls else None


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

    async def __call__(self, name: str, keys: Sequence[str | bytes], args: list[Any]) -> Any:
        script = self._scripts[name]
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else self._new()
        try:
            try:
                result = await self._evalsha(conn, script, keys, args)
            except (RedisConnectionError, RedisTimeoutError):
                if not reused:
                    raise
                await conn.disconnect(nowait=True)
                conn = self._new()
                result = await self._evalsha(conn, script, keys, args)
        except ResponseError as exc:
            await self._keep(conn)  # the server answered: the connection is in a clean state
            raise_as_domain_error(exc)
        except BaseException:  # a broken connection, or a cancelled call with its reply still to come
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
    async def _evalsha(conn: Any, script: AsyncScript, keys: Sequence[str | bytes], args: list[Any]) -> Any:
        await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            return await conn.read_response()
        except NoScriptError:  # the server restarted or was flushed: load it and go on
            await conn.send_command("SCRIPT", "LOAD", script.script)
            await conn.read_response()
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return await conn.read_response()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()


@asynccontextmanager
async def unavailable_as_domain_error() -> AsyncIterator[None]:
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise errors.StorageUnavailable(f"Redis is not reachable ({exc}).") from None
