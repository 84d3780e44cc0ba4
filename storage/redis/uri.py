"""Redis storage URIs, read once, and the clients they open: asyncio ones for the store and the pool
catalogue, synchronous ones for the dead-letter export (Spark's Python workers). Every Redis URI becomes a
client here, and nowhere else.

Three kinds of deployment:

- one server: `redis://`, `rediss://`, `unix://`, as redis-py reads them (`/db`, `?socket_timeout=`, ...);
- a Redis Cluster: `redis+cluster://[user:password@]host:port,host:port,...` (`rediss+cluster://` for TLS),
  any of its nodes;
- the primary that Redis Sentinel names: `redis+sentinel://[user:password@]host[:port],host[:port],.../
  service[/db][?options]`, or Zaqar's form of the same, `redis://[user:password@]host[:port],...?master=
  service[&dbid=N]` (a sentinel's port is 26379 unless given). The password in the userinfo is the Redis
  servers' (primary and replicas); the sentinels' own are the options `sentinel_password` (and
  `sentinel_username`). `socket_timeout` and `socket_connect_timeout` (seconds) replace the storage timeout,
  as they do on a `redis://` URI. redis-py's Sentinel client asks the sentinels for the primary whenever it
  connects, so after a failover the next connection finds the new primary.

On one server or behind Sentinel, `?wait_replicas=N` has every write script followed by WAIT N (runner.py):
a write is acknowledged only once N replicas have it, so a failover cannot undo it; a write they do not
confirm within half the storage timeout is answered "the outcome is unknown" (503). Redis replicates
asynchronously otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from core.errors import InvalidInput
from storage.export import shown

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel",)
SENTINEL_PORT = 26379
SENTINEL_FORM = "redis+sentinel://[user:password@]host[:port],host[:port],.../<service name>[/<db>][?options]"
ZAQAR_FORM = "redis://[user:password@]host[:port],host[:port],...?master=<service name>[&dbid=<db>]"
# A Sentinel URI's options (its query), in either form; Zaqar's form also takes `master` and `dbid`.
WAIT_OPTION = "wait_replicas"
SENTINEL_OPTIONS = (
    "sentinel_password",
    "sentinel_username",
    "socket_timeout",
    "socket_connect_timeout",
    WAIT_OPTION,
)
ZAQAR_OPTIONS = ("master", "dbid")

Client = aioredis.Redis | aioredis.RedisCluster
SyncClient = redis.Redis | redis.RedisCluster


class Cluster(aioredis.RedisCluster):
    """A RedisCluster that finishes initializing before its first command starts. redis-py 8 resolves a
    command's policy before it initializes, and concurrent first commands then met connections the
    initialization closed ("Connection closed by server"): with no retries (a script sent again could run
    twice), 358 of 480 such commands failed in a check here, none with this."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


class SentinelPrimary(aioredis.Redis):
    """The client of the primary Sentinel names (redis-py's `master_for`), which closes its connections to
    the sentinels with its own."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            for sentinel in cast(Any, self.connection_pool).sentinel_manager.sentinels:
                await sentinel.aclose()


class SyncSentinelPrimary(redis.Redis):
    """SentinelPrimary for the synchronous client."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            for sentinel in cast(Any, self.connection_pool).sentinel_manager.sentinels:
                sentinel.close()


@dataclass(frozen=True)
class SentinelURI:
    """A Sentinel URI's parts: where the sentinels are, the primary's service name, and how to log in."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None  # the Redis servers' (primary and replicas)
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    socket_timeout: float | None = None  # replaces the storage timeout when given
    socket_connect_timeout: float | None = None

    def connection_kwargs(self, *, socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
        """The primary's connection arguments (the servers' login, the database, the timeouts)."""
        return {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            **self._timeouts(socket_timeout, connect_timeout),
        }

    def sentinel_kwargs(self, *, socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
        """The sentinels' connection arguments (their own login; the same timeouts)."""
        return {
            "username": self.sentinel_username,
            "password": self.sentinel_password,
            **self._timeouts(socket_timeout, connect_timeout),
        }

    def _timeouts(self, socket_timeout: float, connect_timeout: float) -> dict[str, float]:
        return {
            "socket_timeout": self.socket_timeout if self.socket_timeout is not None else socket_timeout,
            "socket_connect_timeout": (
                self.socket_connect_timeout if self.socket_connect_timeout is not None else connect_timeout
            ),
        }


def _bad(url: str, what: str, form: str) -> InvalidInput:
    return InvalidInput(f"{what} in the Redis Sentinel URI {shown(url)!r}; the form is {form}.")


def _address(text: str, url: str, form: str) -> tuple[str, int]:
    """host[:port] or [v6 address][:port] of one sentinel; port SENTINEL_PORT unless given."""
    text = text.strip()
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise _bad(url, f"Sentinel address {text!r} is not [IPv6 address]:port", form)
        port = rest[1:] if rest else ""
    else:
        host, _, port = text.partition(":")
        if ":" in port:
            raise _bad(url, f"Sentinel address {text!r} has several ':' (write IPv6 as [address])", form)
    if not host:
        raise _bad(url, f"A sentinel has no host name (got {text!r})", form)
    if not port:
        return host, SENTINEL_PORT
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad(url, f"Sentinel {host!r} has port {port!r}, not a number from 1 to 65535", form)
    return host, int(port)


def _db(text: str, url: str, form: str) -> int:
    if not text.isdigit():
        raise _bad(url, f"The database number must be a whole number from 0 (got {text!r})", form)
    return int(text)


def _seconds(name: str, text: str, url: str, form: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise _bad(url, f"Option {name} must be a positive number of seconds (got {text!r})", form)
    return value


def sentinel_uri(url: str) -> SentinelURI | None:
    """The parts of a Sentinel URI (either form), or None when `url` is not one; InvalidInput naming what to
    fix when it is one but malformed."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    credentials, _, hosts = parts.netloc.rpartition("@")
    known: tuple[str, ...]
    if parts.scheme in SENTINEL_SCHEMES:
        form, known = SENTINEL_FORM, SENTINEL_OPTIONS
        service, _, db = parts.path.lstrip("/").partition("/")
        service = unquote(service)
        if not service:
            raise _bad(url, "No service name (the sentinels' name of the primary) after the hosts", form)
        db = db.rstrip("/")
    elif parts.scheme == "redis" and "master" in options:  # Zaqar's form
        form, known = ZAQAR_FORM, SENTINEL_OPTIONS + ZAQAR_OPTIONS
        service = options["master"]
        if not service:
            raise _bad(url, "Option master (the sentinels' name of the primary) is empty", form)
        path_db = parts.path.strip("/")
        if path_db and "dbid" in options and path_db != options["dbid"]:
            raise _bad(url, f"The database is both /{path_db} and dbid={options['dbid']}", form)
        db = options.get("dbid", path_db)
    else:
        if parts.scheme == "rediss" and "master" in options:
            raise InvalidInput(
                f"Redis Sentinel over TLS is not supported (in {shown(url)!r}); use {SENTINEL_FORM} on a "
                "trusted network, or a TLS tunnel to the sentinels and servers."
            )
        if parts.scheme in ("redis", "rediss") and "," in hosts:
            raise InvalidInput(
                f"The Redis URI {shown(url)!r} lists several hosts but no ?master=<service name>: for Redis "
                f"Sentinel write {SENTINEL_FORM} (or {ZAQAR_FORM}); for a Redis Cluster, "
                "redis+cluster://host:port,host:port,..."
            )
        return None
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise _bad(url, f"Unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})", form)
    if not hosts.strip(","):
        raise _bad(url, "No sentinel host", form)
    sentinels = tuple(_address(a, url, form) for a in hosts.split(","))
    user, _, password = credentials.partition(":")
    timeouts = {
        name: _seconds(name, options[name], url, form)
        for name in ("socket_timeout", "socket_connect_timeout")
        if name in options
    }
    return SentinelURI(
        sentinels=sentinels,
        service=service,
        db=_db(db, url, form) if db else 0,
        username=unquote(user) or None,
        password=unquote(password) or None,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        **timeouts,
    )


def wait_replicas(url: str) -> int:
    """The replicas each write script waits for (`?wait_replicas=N`, 0 when not given); InvalidInput when it
    is not a whole number, or given for a Redis Cluster (WAIT there would have to run on the connection of
    each routed script: not supported)."""
    parts = urlsplit(url)
    value = dict(parse_qsl(parts.query, keep_blank_values=True)).get(WAIT_OPTION)
    if value is None:
        return 0
    if not value.isdigit():
        raise InvalidInput(
            f"{WAIT_OPTION} must be a whole number of replicas; got {value!r} in {shown(url)!r}."
        )
    if parts.scheme in CLUSTER_SCHEMES and int(value):
        raise InvalidInput(f"{WAIT_OPTION} is for one server or Redis Sentinel, not a Redis Cluster.")
    return int(value)


def _without_wait(url: str) -> str:
    """`url` without its wait_replicas option (Charon's, which redis-py would refuse)."""
    parts = urlsplit(url)
    if WAIT_OPTION not in parts.query:
        return url
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != WAIT_OPTION]
    return urlunsplit(parts._replace(query=urlencode(kept)))


def cluster_options(url: str, *, node: type[Any] = ClusterNode) -> dict[str, Any]:
    """RedisCluster's arguments from `redis+cluster://[user:password@]host:port,host:port/`; `node` is the
    client's ClusterNode class (the asyncio one by default; the synchronous client needs its own)."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for address in hosts.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInput(
                f"A Redis Cluster URI lists host:port pairs; got {address!r} in {shown(url)!r}."
            )
        nodes.append(node(host.strip("[]"), int(port)))
    options: dict[str, Any] = {"startup_nodes": nodes, "ssl": parts.scheme == "rediss+cluster"}
    if credentials:
        user, _, password = credentials.partition(":")
        options.update(username=unquote(user) or None, password=unquote(password) or None)
    return options


def open_client(url: str, timeout: float) -> Client:
    """The asyncio client of `url`. `timeout`: seconds a call may wait for the server (connecting, or for an
    answer). redis-py retries a command whose connection failed; here only once, and never after a timeout:
    a script sent again after it timed out could run twice (queue scripts take the ScriptRunner's own path,
    which retries only when nothing was sent; a cluster's scripts are not retried at all)."""
    bounded: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        return Cluster(**cluster_options(url), decode_responses=True, retry=Retry(NoBackoff(), 0), **bounded)
    once = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    common: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30, "retry": once}
    sentinel = sentinel_uri(url)
    if sentinel is not None:
        asked = sentinel.sentinel_kwargs(socket_timeout=timeout, connect_timeout=timeout)
        manager = redis.asyncio.sentinel.Sentinel(sentinel.sentinels, sentinel_kwargs=asked)  # type: ignore[no-untyped-call]
        connection = sentinel.connection_kwargs(socket_timeout=timeout, connect_timeout=timeout)
        return cast(
            SentinelPrimary,
            manager.master_for(sentinel.service, redis_class=SentinelPrimary, **connection, **common),
        )
    return aioredis.Redis.from_url(_without_wait(url), **common, **bounded)


def open_sync_client(url: str, *, connect_timeout: float, read_timeout: float) -> SyncClient:
    """The synchronous client of `url` (redis-py's defaults otherwise: its retries are the export's, which
    only reads)."""
    timeouts: dict[str, Any] = {"socket_connect_timeout": connect_timeout, "socket_timeout": read_timeout}
    if urlsplit(url).scheme in CLUSTER_SCHEMES:
        return redis.RedisCluster(**cluster_options(url, node=redis.cluster.ClusterNode), **timeouts)
    sentinel = sentinel_uri(url)
    if sentinel is not None:
        asked = sentinel.sentinel_kwargs(socket_timeout=connect_timeout, connect_timeout=connect_timeout)
        manager = redis.sentinel.Sentinel(sentinel.sentinels, sentinel_kwargs=asked)  # type: ignore[no-untyped-call]
        connection = sentinel.connection_kwargs(socket_timeout=read_timeout, connect_timeout=connect_timeout)
        primary = manager.master_for(  # type: ignore[no-untyped-call]
            sentinel.service, redis_class=SyncSentinelPrimary, **connection
        )
        return cast(SyncSentinelPrimary, primary)
    return redis.Redis.from_url(_without_wait(url), **timeouts)
