"""What authentication costs a request, in process: the same hot routes as bench/request_cost.py (the app's
ASGI callable driven directly, this process's CPU time a request, redis-server's work not in it), through
three apps built side by side on one private redis-server and one store:

- `noauth`: the project is X-Project-ID (the baseline; it checks the policy rule too);
- `keystone`: CHARON_AUTH=keystone against a real Keystone (tests/keystone.py, from .venv-keystone, which
  `make install` makes), every request with alice's token, got once; the first request validates it with
  Keystone and every timed one is answered from the token cache (the Keystone calls made while timing are
  counted and must be 0);
- `signed-url`: a noauth app with CHARON_SIGNED_URL_KEY, every request a pre-signed URL's (URL-Signature and
  its headers, as POST /v2/queues/{q}/share answered them; no X-Auth-Token).

A round posts `--requests` times 10 messages, claims `--requests / 10` times 10 messages and DELETEs each
one claimed (with its claim_id), then GETs 10 messages `--requests` times, in each mode; the modes take
turns every `--block` requests (the order rotating from block to block), so that the machine's other load
falls on all of them alike; then each mode's queue is deleted (untimed). The ratios to noauth are taken round
by round (each mode against the noauth of its own round) and summarised by their median and quartiles.
Every round also times the app's `authorize(request, rule)` alone (identity and policy, no route, no store),
`--requests * 10` calls a mode: the cost authentication adds, without the noise of the rest of a request.
`--control` adds a fourth mode, noauth again in an app of its own (an A/A check: how far apart two identical
modes come out on this machine).

`--profile` then runs one more round of each mode under cProfile and prints, a request, the time spent in
the functions that differ between the modes (api/auth.py, api/keystone.py, api/policy.py, api/signed.py,
cachetools), then the functions whose own time differs most between keystone and noauth: where a cost above
noauth goes (times under the profiler are inflated, and I/O waits differ from run to run).

Run: .venv/bin/python -m bench.studies.auth_cost [--rounds 9] [--requests 3000] [--block 100] [--control]
     [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.state import state_of
from bench import request_cost
from bench.request_cost import POST

CLIENT_ID = str(uuid.uuid4()).encode()
MODES = ("noauth", "keystone", "signed-url")
CONTROL = "noauth-control"
OPS = ("post of 10 messages", "claim of 10", "delete with claim_id", "GET of 10 messages")
SIGNING_KEY = "bench-signing-key"


@dataclass
class Mode:
    name: str
    app: Any
    headers: list[tuple[bytes, bytes]]  # what every request of this mode sends besides the common ones
    queue: str
    admin: list[tuple[bytes, bytes]]  # headers that may delete the queue between rounds
    keystone_calls: list[int] = field(default_factory=lambda: [0])


async def call(
    app: Any,
    headers: list[tuple[bytes, bytes]],
    method: str,
    path: str,
    body: bytes = b"",
    query: bytes = b"",
) -> tuple[int, bytes]:
    """One request through the app's ASGI callable (bench/request_cost.py's), with the mode's headers."""
    sent = [(b"host", b"charon"), (b"client-id", CLIENT_ID), *headers, (b"content-type", b"application/json")]
    return await request_cost.call(app, method, path, body, query, headers=sent)


async def expect(
    mode: Mode, status: int, method: str, path: str, body: bytes = b"", query: bytes = b""
) -> bytes:
    got, answer = await call(mode.app, mode.headers, method, path, body, query)
    if got != status:
        raise RuntimeError(f"{mode.name}: {method} {path} answered {got}, not {status}: {answer[:300]!r}")
    return answer


def rotated(modes: list[Mode], n: int) -> list[Mode]:
    return modes[n % len(modes) :] + modes[: n % len(modes)]


async def measure(
    modes: list[Mode], requests: int, block: int, clock: Callable[[], float] = time.process_time
) -> dict[str, dict[str, float]]:
    """CPU us a request of each operation for each mode (one round): the modes take turns, a block of
    requests each (the order rotating from block to block), so that the machine's other load falls on all of
    them alike. `clock`: the CPU seconds counted (this process's by default)."""
    out: dict[str, dict[str, float]] = {m.name: dict.fromkeys(OPS, 0.0) for m in modes}
    blocks = max(1, requests // block)
    for b in range(blocks):  # posts of 10 messages
        for mode in rotated(modes, b):
            messages = f"/v2/queues/{mode.queue}/messages"
            start = clock()
            for _ in range(block):
                await expect(mode, 201, "POST", messages, POST)
            out[mode.name][OPS[0]] += clock() - start
    claim_blocks = max(1, requests // 10 // max(1, block // 10))
    for b in range(claim_blocks):  # claims of 10, each message then deleted with its claim id
        for mode in rotated(modes, b):
            claims = f"/v2/queues/{mode.queue}/claims"
            for _ in range(max(1, block // 10)):
                t0 = clock()
                answer = await expect(mode, 201, "POST", claims, b'{"ttl": 60}', b"limit=10")
                t1 = clock()
                for m in json.loads(answer)["messages"]:
                    path, _, query = m["href"].partition("?")
                    await expect(mode, 204, "DELETE", path, query=query.encode())
                out[mode.name][OPS[2]] += clock() - t1
                out[mode.name][OPS[1]] += t1 - t0
    for b in range(blocks):  # GETs of 10 messages
        for mode in rotated(modes, b):
            messages = f"/v2/queues/{mode.queue}/messages"
            start = clock()
            for _ in range(block):
                answer = await expect(mode, 200, "GET", messages, query=b"limit=10&echo=true")
            out[mode.name][OPS[3]] += clock() - start
            assert len(json.loads(answer)["messages"]) == 10
    claimed = claim_blocks * max(1, block // 10)
    counts = {OPS[0]: blocks * block, OPS[1]: claimed, OPS[2]: claimed * 10, OPS[3]: blocks * block}
    return {name: {op: cpu / counts[op] * 1e6 for op, cpu in ops.items()} for name, ops in out.items()}


def in_turns(
    build: Callable[[str], Awaitable[tuple[list[Mode], Any]]],
    prepare: Callable[[list[Mode]], Awaitable[None]],
    *,
    rounds: int,
    requests: int,
    block: int,
    server_clock: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """A study's rounds on one private redis-server: `build` the modes (and the store to close), warm each
    with 50 posts, then each round `prepare` them and `measure` them in turns. Each mode's costs, a dict a
    round. `server_clock`: count redis-server's CPU (its main thread's, /proc/<pid>/schedstat, ns) too."""
    from tests.servers import RedisServer

    server = RedisServer().start()
    assert server.proc is not None
    schedstat = Path(f"/proc/{server.proc.pid}/schedstat")

    def clock() -> float:
        return time.process_time() + int(schedstat.read_text().split()[0]) / 1e9

    loop = asyncio.new_event_loop()
    store = None
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        modes, store = loop.run_until_complete(build(server.url))
        loop.run_until_complete(prepare(modes))
        for mode in modes:  # warm: connections, scripts, what the driver and the limiter keep
            for _ in range(50):
                loop.run_until_complete(expect(mode, 201, "POST", f"/v2/queues/{mode.queue}/messages", POST))
        for r in range(rounds):
            loop.run_until_complete(prepare(modes))
            costs = loop.run_until_complete(
                measure(rotated(modes, r), requests, block, clock if server_clock else time.process_time)
            )
            for name, cost in costs.items():
                runs.setdefault(name, []).append(cost)
            print(f"round {r + 1}/{rounds} done", flush=True)
    finally:
        if store is not None:
            loop.run_until_complete(store.aclose())
        loop.close()
        server.stop()
    return runs


def turns_arguments(prog: str, doc: str | None, argv: list[str] | None) -> argparse.Namespace:
    """A study's command line: --rounds, --requests, --block."""
    p = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--block", type=int, default=100, help="requests of one mode before the next one's turn")
    return p.parse_args(argv)


async def auth_alone(mode: Mode, calls: int) -> float:
    """CPU us of the app's authorize(request, rule) alone (identity and policy; no route, no store), as a
    post of messages calls it."""
    from starlette.requests import Request

    auth = state_of(mode.app).auth
    scope = {
        "type": "http", "method": "POST", "path": f"/v2/queues/{mode.queue}/messages", "query_string": b"",
        "headers": [
            (b"host", b"charon"), (b"client-id", CLIENT_ID), *mode.headers,
            (b"content-type", b"application/json"), (b"content-length", b"2400"),
        ],
    }  # fmt: skip
    request = Request(scope)
    await auth.authorize(request, "messages:create")
    start = time.process_time()
    for _ in range(calls):
        await auth.authorize(request, "messages:create")
    return (time.process_time() - start) / calls * 1e6


async def reset(mode: Mode) -> None:
    """Delete the mode's queue (untimed), so that every round starts from an empty one."""
    status, answer = await call(mode.app, mode.admin, "DELETE", f"/v2/queues/{mode.queue}")
    if status != 204:
        raise RuntimeError(f"{mode.name}: deleting its queue answered {status}: {answer[:300]!r}")


async def build(redis_url: str, keystone: Any, control: bool) -> tuple[list[Mode], Any]:
    from api.auth import AuthMode
    from api.keystone import KeystoneSettings
    from app.main import create_app
    from app.settings import Settings
    from core.clock import SystemClock
    from storage.registry import open_store

    clock = SystemClock()
    store = open_store(redis_url, namespace=f"ac{os.getpid()}", clock=clock)
    common = {"storage_uri": "redis://unused", "sweep_interval": 0}
    noauth_app = create_app(Settings(**common), store=store, clock=clock)  # type: ignore[arg-type]
    noauth_project = [(b"x-project-id", b"bench-noauth")]
    noauth = Mode("noauth", noauth_app, noauth_project, "q-noauth", noauth_project)

    credentials = {**keystone.service_credentials(), "cache_seconds": 3600}
    ks_settings = Settings(**common, auth=AuthMode.KEYSTONE, keystone=KeystoneSettings(**credentials))  # type: ignore[arg-type]
    ks_app = create_app(ks_settings, store=store, clock=clock)
    token = [(b"x-auth-token", keystone.token("alice", "alpha").encode())]
    ks = Mode("keystone", ks_app, token, "q-keystone", token)
    validator = state_of(ks_app).auth.validator
    ask = validator._ask_keystone

    def counted(token: str) -> Any:
        ks.keystone_calls[0] += 1
        return ask(token)

    validator._ask_keystone = counted  # counts the calls to Keystone; the cache in front of it is untouched

    signed_app = create_app(Settings(**common, signed_url_key=SIGNING_KEY), store=store, clock=clock)  # type: ignore[arg-type]
    signed_project = [(b"x-project-id", b"bench-signed")]
    sharer = Mode("share", signed_app, signed_project, "q-signed", signed_project)
    share = b'{"paths": ["messages", "claims"], "methods": ["GET", "POST", "DELETE"]}'
    grant = json.loads(await expect(sharer, 200, "POST", "/v2/queues/q-signed/share", share))
    signed_headers = [
        (b"x-project-id", grant["project"].encode()),
        (b"url-signature", grant["signature"].encode()),
        (b"url-expires", grant["expires"].encode()),
        (b"url-methods", ",".join(grant["methods"]).encode()),
        (b"url-paths", ",".join(grant["paths"]).encode()),
    ]
    signed = Mode("signed-url", signed_app, signed_headers, "q-signed", signed_project)
    modes = [noauth, ks, signed]
    if control:  # noauth again, in an app of its own, its project id as long as a Keystone one
        control_app = create_app(Settings(**common), store=store, clock=clock)  # type: ignore[arg-type]
        project = [(b"x-project-id", uuid.uuid4().hex.encode())]
        modes.append(Mode(CONTROL, control_app, project, "q-control", project))
    return modes, store


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def profile(modes: list[Mode], requests: int, block: int, loop: asyncio.AbstractEventLoop) -> None:
    """One more round of each mode under cProfile: the functions the modes differ in, per request."""
    per_mode: dict[str, pstats.Stats] = {}
    for mode in modes:
        profiler = cProfile.Profile()
        profiler.enable()
        loop.run_until_complete(measure([mode], requests, block))
        profiler.disable()
        loop.run_until_complete(reset(mode))
        per_mode[mode.name] = pstats.Stats(profiler)
    total = requests * 2 + requests // 10 * 11
    print(
        f"\ncProfile, one round of each mode ({total} requests each), us a request (inflated by the profiler)"
    )
    print("\n| function | " + " | ".join(f"{m} cumulative | {m} own" for m in per_mode) + " |")
    print("| --- " * (1 + 2 * len(per_mode)) + "|")
    wanted = ("api/auth.py", "api/keystone.py", "api/policy.py", "api/signed.py", "cachetools", "hashlib")
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for name, stats in per_mode.items():
        for (path, line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            if any(w in path for w in wanted) or func in ("<built-in method _hashlib.openssl_sha256>",):
                key = f"{_short(path)}:{line}:{func}"
                rows.setdefault(key, {})[name] = (ct / total * 1e6, tt / total * 1e6)
    for key, by_mode in sorted(rows.items(), key=lambda kv: -max(v[0] for v in kv[1].values())):
        cells = [by_mode.get(m) for m in per_mode]
        print(f"| {key} | " + " | ".join(f"{c[0]:.1f} | {c[1]:.1f}" if c else "- | -" for c in cells) + " |")
    own = {
        name: {f"{_short(k[0])}:{k[1]}:{k[2]}": v[2] for k, v in stats.stats.items()}  # type: ignore[attr-defined]
        for name, stats in per_mode.items()
    }
    print("\nOwn time, keystone minus noauth, the largest differences (us a request):")
    diffs = {
        k: own["keystone"].get(k, 0.0) - own["noauth"].get(k, 0.0) for k in {*own["keystone"], *own["noauth"]}
    }
    for key in sorted(diffs, key=lambda k: -abs(diffs[k]))[:12]:
        print(f"- {key}: {diffs[key] / total * 1e6:+.1f}")
    calls = {
        name: {f"{_short(k[0])}:{k[1]}:{k[2]}": v[1] for k, v in stats.stats.items()}  # type: ignore[attr-defined]
        for name, stats in per_mode.items()
    }
    print("\nCalls (deterministic), keystone minus noauth, the largest differences (calls a request):")
    more = {
        k: calls["keystone"].get(k, 0) - calls["noauth"].get(k, 0)
        for k in {*calls["keystone"], *calls["noauth"]}
    }
    for key in sorted(more, key=lambda k: -abs(more[k]))[:25]:
        if abs(more[key]) / total >= 0.05:
            print(f"- {key}: {more[key] / total:+.2f}")
    for name, stats in per_mode.items():
        total_s = stats.total_tt  # type: ignore[attr-defined]
        n = stats.total_calls  # type: ignore[attr-defined]
        print(
            f"{name}: {total_s / total * 1e6:.0f} us and {n / total:.1f} calls a request under the profiler"
        )


def _short(path: str) -> str:
    for marker in ("/site-packages/", "/wt-authbench/", "/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.studies.auth_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--block", type=int, default=100, help="requests of one mode before the next mode's turn")
    p.add_argument("--json", help="also write every round's numbers to this file")
    p.add_argument(
        "--control", action="store_true", help=f"a fourth mode, {CONTROL}: noauth again (an A/A check)"
    )
    p.add_argument("--profile", action="store_true", help="then one round of each mode under cProfile")
    args = p.parse_args(argv)
    from tests.keystone import KeystoneServer
    from tests.servers import RedisServer

    keystone = KeystoneServer().start()
    server = RedisServer().start()
    loop = asyncio.new_event_loop()
    names = [*MODES, CONTROL] if args.control else list(MODES)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in names}
    alone: dict[str, list[float]] = {m: [] for m in names}
    store = None
    try:
        modes, store = loop.run_until_complete(build(server.url, keystone, args.control))
        for mode in modes:  # warm: connections, scripts, the token cache, the policy decisions
            for _ in range(50):
                loop.run_until_complete(expect(mode, 201, "POST", f"/v2/queues/{mode.queue}/messages", POST))
            loop.run_until_complete(reset(mode))
        warm_calls = modes[1].keystone_calls[0]
        for r in range(args.rounds):
            for name, cost in loop.run_until_complete(
                measure(rotated(modes, r), args.requests, args.block)
            ).items():
                runs[name].append(cost)
            for mode in rotated(modes, r):
                loop.run_until_complete(reset(mode))
                alone[mode.name].append(loop.run_until_complete(auth_alone(mode, args.requests * 10)))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        timed_calls = modes[1].keystone_calls[0] - warm_calls
        if args.profile:
            profile(modes, args.requests, args.block, loop)
    finally:
        if store is not None:
            loop.run_until_complete(store.aclose())
        loop.close()
        server.stop()
        keystone.stop()
    load = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "authorize_alone": alone, "args": vars(args), "load": load}, f, indent=1)
    print(
        f"\n{args.rounds} rounds of {args.requests} requests a kind, modes alternating every {args.block}; "
        f"Keystone validations: {warm_calls} warming, {timed_calls} timed; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| request | " + " | ".join(f"{m} CPU us" for m in names) + " | "
          + " | ".join(f"{m} / noauth (quartiles)" for m in names[1:]) + " |")  # fmt: skip
    print("| --- " * (1 + 2 * len(names) - 1) + "|")
    for op in OPS:
        medians = [statistics.median(run[op] for run in runs[m]) for m in names]
        cells = []
        for m in names[1:]:
            ratios = [run[op] / base[op] for run, base in zip(runs[m], runs["noauth"], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            cells.append(f"{q2:.2f}x ({q1:.2f}-{q3:.2f})")
        print(f"| {op} | " + " | ".join(f"{v:.0f}" for v in medians) + " | " + " | ".join(cells) + " |")
    medians = [statistics.median(alone[m]) for m in names]
    extra = [
        f"+{statistics.median(a - b for a, b in zip(alone[m], alone['noauth'], strict=True)):.1f} us"
        for m in names[1:]
    ]
    print(
        "| authorize() alone | " + " | ".join(f"{v:.1f}" for v in medians) + " | " + " | ".join(extra) + " |"
    )
    return 0 if timed_calls == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
