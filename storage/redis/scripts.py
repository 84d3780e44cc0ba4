"""Loads lua/*.lua (each prefixed with lib.lua) and maps the scripts' CHARON_* errors to domain errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
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


async def run(script: AsyncScript, keys: Sequence[str | bytes], args: list[Any]) -> Any:
    try:
        return await script(keys=keys, args=args)
    except ResponseError as exc:
        mapped = domain_error(exc)
        if mapped is None:
            raise
        raise mapped from None


@asynccontextmanager
async def unavailable_as_domain_error() -> AsyncIterator[None]:
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise errors.StorageUnavailable(f"Redis is not reachable ({exc}).") from None
