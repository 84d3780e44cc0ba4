"""Where a request's CPU goes, layer by layer: the per-request cost budget (issue 42). The hot routes (a post
of 10 messages, a claim of 10, a DELETE with its claim_id, a bulk DELETE of 10 with their claim_ids, a ping)
are driven through the app's ASGI callable in process, as bench/request_cost.py does, on a private
redis-server, in noauth mode and, with `--keystone`, against the tests' real Keystone with a cached token,
on uvloop as `charon serve` runs.

Each layer's functions (LAYERS) are wrapped by a timer of this thread's CPU (`time.thread_time_ns`), each
exclusive of the layers it calls, so nothing is counted twice; a request's whole CPU is `time.process_time`
around it. Two rows are not a layer's own code:
- `redis-server`: that server's CPU (INFO cpu) over the requests, a request: the store's other half;
- `framework`: what is left: Starlette's routing and responses, the ASGI calls, and the route's own lines,
  less this harness's own cost (a request to an ASGI app that only answers, `HARNESS`).
`wrapped calls` says how many timed calls a request made; `timer overhead` is that many times the cost of a
timed empty call (measured here, on a plain function: an async one costs a little more), taken off what is
left for `framework`. A timed call nested in another (`core.wire.message` in `messages`) leaves its timer's
cost in the layer around it, so rendering a claim's 10 messages reads a few us high.

Tracing is not a row: when off (the default) no tracing code is installed at all (app/tracing.py). The
check for subscribers on a post (the notification check) runs inside the post's Lua script: it is in the
redis-server row.

Run: .venv/bin/python -m bench.layers [--requests 2000] [--rounds 3] [--keystone] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import logging
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from api.access import ACCESS_LOGGER
from bench import request_cost
from bench.request_cost import POST

LAYERS: dict[str, list[str]] = {
    "request id": ["api.access:new_request_id", "api.access:sent_request_id"],
    "access log": ["api.access:AccessLog.add", "api.access:AccessLog.flush"],
    "metrics": ["api.metrics:HttpMetrics.count"],
    "identity and policy": ["api.auth:Authenticator.authorize"],
    "signed-URL check": ["api.auth:Authenticator._signed"],
    "request rate": ["service.ratelimit:RateLimiter.admit", "service.ratelimit:RateLimiter._admit"],
    "parameters and body": [
        "api.params:QueryModel.parse", "api.params:QueryModel.collect", "api.deps:read_json",
        "api.deps:validate_body", "api.deps:call_of", "api.ids:message_id", "api.ids:claim_id",
        "api.ids:message_ids", "api.ids:claim_ids", "api.routes.claims:_claim_body",
    ],
    "store call (Python)": ["storage.redis.store:RedisStore.*"],
    "rendering": ["api.render:json_response", "core.wire:messages", "core.wire:message"],
}  # fmt: skip
OPS = ("post of 10", "claim of 10", "delete with claim_id", "bulk delete of 10", "ping")
HARNESS = "harness"
FRAMEWORK = "framework"
REDIS = "redis-server"
PACKAGES = ("api", "app", "core", "service", "storage")


class Timers:
    """CPU ns a layer, exclusive of the timed calls made inside (nested ones, and any that ran while it
    awaited): `attributed` is all the time given to any layer so far."""

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls = 0
        self.attributed = 0

    def wrap(self, layer: str, f: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.thread_time_ns

        def settle(t0: int, before: int) -> None:
            own = clock() - t0 - (self.attributed - before)
            self.ns[layer] += own
            self.attributed += own
            self.calls += 1

        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                before, t0 = self.attributed, clock()
                try:
                    return await f(*args, **kwargs)
                finally:
                    settle(t0, before)

            return timed_async

        @functools.wraps(f)
        def timed(*args: Any, **kwargs: Any) -> Any:
            before, t0 = self.attributed, clock()
            try:
                return f(*args, **kwargs)
            finally:
                settle(t0, before)

        return timed

    def install(self) -> None:
        """Wraps every target of LAYERS where it is defined and wherever a module of ours imported it."""
        for layer, targets in LAYERS.items():
            for target in targets:
                for owner, name, f in _resolve(target):
                    wrapped = self.wrap(layer, f)
                    if isinstance(inspect.getattr_static(owner, name), classmethod):
                        setattr(owner, name, classmethod(wrapped))
                        continue
                    setattr(owner, name, wrapped)
                    if inspect.ismodule(owner):
                        _replace_imported(f, wrapped)


def _resolve(target: str) -> list[tuple[Any, str, Callable[..., Any]]]:
    module_name, _, path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, last = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    if last != "*":
        raw = inspect.getattr_static(owner, last)
        f = raw.__func__ if isinstance(raw, classmethod) else raw
        return [(owner, last, f)]
    return [
        (owner, name, f)
        for name, f in vars(owner).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(f)
    ]


def _replace_imported(f: Callable[..., Any], wrapped: Callable[..., Any]) -> None:
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        for attr, value in list(vars(module).items()):
            if value is f:
                setattr(module, attr, wrapped)


def overhead_us(calls: int = 20_000) -> float:
    """The timer's own CPU a wrapped call (a function doing nothing, timed and not)."""

    def nothing() -> None:
        return None

    timed = Timers().wrap("x", nothing)
    start = time.process_time()
    for _ in range(calls):
        timed()
    with_timer = time.process_time() - start
    start = time.process_time()
    for _ in range(calls):
        nothing()
    return max(0.0, (with_timer - (time.process_time() - start)) / calls * 1e6)


async def harness_us(requests: int) -> float:
    """This harness's CPU a request: bench.request_cost.call on an ASGI app that only answers 200."""

    async def answer(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    start = time.process_time()
    for _ in range(requests):
        await request_cost.call(answer, "GET", "/v2/ping")
    return (time.process_time() - start) / requests * 1e6


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Mode:
    """An app in one identity mode, its headers, and what each op cost it so far (us sums, request counts)."""

    def __init__(self, name: str, app: Any, headers: list[tuple[bytes, bytes]]) -> None:
        self.name = name
        self.app = app
        self.headers = headers
        self.sums: dict[str, defaultdict[str, float]] = {op: defaultdict(float) for op in OPS}
        self.counts: Counter[str] = Counter()

    async def send(
        self, method: str, path: str, body: bytes = b"", query: bytes = b"", status: int = 200
    ) -> bytes:
        got, answer = await request_cost.call(self.app, method, path, body, query, headers=self.headers)
        if got != status:
            raise RuntimeError(f"{self.name}: {method} {path}?{query!r} answered {got}: {answer[:300]!r}")
        return answer

    async def timed(
        self,
        timers: Timers,
        op: str,
        method: str,
        path: str,
        body: bytes = b"",
        query: bytes = b"",
        status: int = 200,
    ) -> bytes:
        """One request, its CPU and each layer's added to `op`'s sums."""
        before = timers.ns.copy()
        calls = timers.calls
        start = time.process_time()
        answer = await self.send(method, path, body, query, status)
        took = time.process_time() - start
        sums = self.sums[op]
        sums["total"] += took * 1e6
        for layer in LAYERS:
            sums[layer] += (timers.ns[layer] - before[layer]) / 1e3
        sums["wrapped calls"] += timers.calls - calls
        self.counts[op] += 1
        return answer


async def one_round(mode: Mode, timers: Timers, server: Any, requests: int) -> None:
    """Each op, `requests` times (claims: a tenth), the redis-server's CPU read around each op's requests."""
    q = f"/v2/queues/q-{mode.name}"
    redis: defaultdict[str, float] = defaultdict(float)

    def claimed(answer: bytes) -> list[tuple[str, str]]:
        hrefs = [m["href"].partition("?") for m in json.loads(answer)["messages"]]
        return [(path, query) for path, _, query in hrefs]

    r0 = redis_cpu(server)
    for _ in range(requests):
        await mode.timed(timers, OPS[0], "POST", f"{q}/messages", POST, status=201)
    r1 = redis_cpu(server)
    redis[OPS[0]] += r1 - r0
    held: list[tuple[str, str]] = []
    for _ in range(requests // 10):
        held += claimed(
            await mode.timed(timers, OPS[1], "POST", f"{q}/claims", b'{"ttl": 60}', b"limit=10", 201)
        )
    r2 = redis_cpu(server)
    redis[OPS[1]] += r2 - r1
    for path, query in held:
        await mode.timed(timers, OPS[2], "DELETE", path, query=query.encode(), status=204)
    r3 = redis_cpu(server)
    redis[OPS[2]] += r3 - r2
    for _ in range(requests // 10):
        await mode.send("POST", f"{q}/messages", POST, status=201)
    r4 = redis_cpu(server)
    for _ in range(requests // 10):
        got = claimed(await mode.send("POST", f"{q}/claims", b'{"ttl": 60}', b"limit=10", 201))
        ids = ",".join(path.rsplit("/", 1)[1] for path, _ in got)
        claim_id = got[0][1].split("claim_id=")[1]
        both = f"ids={ids}&claim_ids={claim_id}".encode()
        await mode.timed(timers, OPS[3], "DELETE", f"{q}/messages", query=both, status=204)
    r5 = redis_cpu(server)
    # the claims made for the bulk deletes at the claim's own redis-server cost
    redis[OPS[3]] += (r5 - r4) - (r2 - r1)
    for _ in range(requests):
        await mode.timed(timers, OPS[4], "GET", "/v2/ping", status=204)
    redis[OPS[4]] += redis_cpu(server) - r5
    for op, seconds in redis.items():
        mode.sums[op][REDIS] += seconds * 1e6


async def build(redis_url: str, keystone: Any | None) -> tuple[list[Mode], Any]:
    from app.main import create_app
    from app.settings import Settings
    from storage.registry import open_store

    store = open_store(redis_url, namespace=f"ly{os.getpid()}")
    common: dict[str, Any] = {"storage_uri": "redis://unused", "sweep_interval": 0}
    modes = [Mode("noauth", create_app(Settings(**common), store=store), list(request_cost.HEADERS))]
    if keystone is not None:
        from api.auth import AuthMode
        from api.keystone import KeystoneSettings

        credentials = {**keystone.service_credentials(), "cache_seconds": 3600}
        settings = Settings(**common, auth=AuthMode.KEYSTONE, keystone=KeystoneSettings(**credentials))
        token = (b"x-auth-token", keystone.token("alice", "alpha").encode())
        headers = [h for h in request_cost.HEADERS if h[0] != b"x-project-id"] + [token]
        modes.append(Mode("keystone", create_app(settings, store=store), headers))
    return modes, store


def _unseen_access_lines() -> None:
    """The access lines written as in service (api.access.StderrLines, one write a batch), to /dev/null."""
    for handler in logging.getLogger(ACCESS_LOGGER).handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115


async def run(
    redis_url: str, keystone: Any | None, requests: int, rounds: int
) -> tuple[list[Mode], dict[str, float]]:
    import redis

    timers = Timers()
    timers.install()  # before the apps are made, so that nothing holds an unwrapped function
    modes, store = await build(redis_url, keystone)
    _unseen_access_lines()
    server = redis.Redis.from_url(redis_url)
    try:
        for mode in modes:  # warm: connections, scripts, the token cache, the policy decisions
            for _ in range(50):
                await mode.send("POST", f"/v2/queues/q-{mode.name}/messages", POST, status=201)
            await mode.send("DELETE", f"/v2/queues/q-{mode.name}", status=204)
            await mode.send("GET", "/v2/ping", status=204)
        for r in range(rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                await one_round(mode, timers, server, requests)
                await mode.send("DELETE", f"/v2/queues/q-{mode.name}", status=204)
    finally:
        await store.aclose()
        server.close()
    return modes, {"harness": await harness_us(requests), "overhead": overhead_us()}


def table(mode: Mode, fixed: dict[str, float]) -> list[tuple[str, list[float]]]:
    """The rows of a mode's table: us a request of each op."""
    rows: list[tuple[str, list[float]]] = []
    per = {op: {row: v / max(1, mode.counts[op]) for row, v in mode.sums[op].items()} for op in OPS}
    for layer in LAYERS:
        rows.append((layer, [per[op][layer] for op in OPS]))
    rows.append(("timer overhead", [per[op]["wrapped calls"] * fixed["overhead"] for op in OPS]))
    rows.append((HARNESS, [fixed["harness"]] * len(OPS)))
    framework = []
    for i, op in enumerate(OPS):
        framework.append(per[op]["total"] - sum(r[1][i] for r in rows))
    rows.append((FRAMEWORK, framework))
    rows.append(("total (this process)", [per[op]["total"] for op in OPS]))
    rows.append((REDIS, [per[op].get(REDIS, 0.0) for op in OPS]))
    rows.append(("wrapped calls", [per[op]["wrapped calls"] for op in OPS]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.layers", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keystone", action="store_true", help="keystone mode too (the tests' real Keystone)")
    p.add_argument("--json", help="also write the tables to this file: {mode: {row: {op: us}}}")
    args = p.parse_args(argv)
    from tests.servers import RedisServer

    keystone = None
    if args.keystone:
        from tests.keystone import KeystoneServer

        keystone = KeystoneServer().start()
    server = RedisServer().start()
    try:
        # uvloop, as `charon serve` runs (uvicorn[standard]'s loop): its socket reads are the store call's
        modes, fixed = uvloop.run(run(server.url, keystone, args.requests, args.rounds))
    finally:
        server.stop()
        if keystone is not None:
            keystone.stop()
    load = os.getloadavg()
    print(
        f"{args.rounds} rounds of {args.requests:,} requests (claims and bulk deletes: a tenth); "
        f"timer {fixed['overhead']:.2f} us a wrapped call; load average {load[0]:.2f} {load[1]:.2f}"
    )
    if args.json:
        tables = {
            m.name: {row: dict(zip(OPS, cells, strict=True)) for row, cells in table(m, fixed)} for m in modes
        }
        Path(args.json).write_text(json.dumps(tables, indent=1))
    for mode in modes:
        print(f"\n{mode.name}, CPU us a request:\n")
        print("| layer | " + " | ".join(OPS) + " |")
        print("| --- " * (len(OPS) + 1) + "|")
        for row, cells in table(mode, fixed):
            print(f"| {row} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
