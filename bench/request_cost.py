"""CPU per request of the hot routes, in process: the app's ASGI callable driven directly (no HTTP server, no
network client), on a private redis-server, and this process's CPU time (time.process_time) per request.
Without a server and a load generator sharing the cores, it is much steadier than rates; it measures what
Charon's own Python costs a request (the redis-server's work is not in it).

`--against <commit>` runs the same measurement on an earlier revision (a git worktree under .bench/, its
code first on sys.path) in alternation with this checkout, `--rounds` times each, and prints both medians
and their ratio.

Run: .venv/bin/python -m bench.request_cost [--against <commit>] [--rounds 5] [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from starlette.types import ASGIApp, Message, Scope

ROOT = Path(__file__).resolve().parents[1]
HEADERS = [
    (b"host", b"charon"),
    (b"client-id", b"3381af92-2b9e-11e3-b191-71861300734c"),
    (b"x-project-id", b"bench"),
    (b"content-type", b"application/json"),
]
POST = json.dumps(
    {"messages": [{"ttl": 3600, "body": {"seq": i, "pad": "x" * 210}} for i in range(10)]}
).encode()


async def call(
    app: ASGIApp,
    method: str,
    path: str,
    body: bytes = b"",
    query: bytes = b"",
    *,
    headers: list[tuple[bytes, bytes]] = HEADERS,
) -> tuple[int, bytes]:
    """One request through the app's ASGI callable; its status and body."""
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
        "raw_path": path.encode(), "root_path": "", "scheme": "http", "query_string": query,
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8888), "state": {},
    }  # fmt: skip
    sent = False
    status, chunks = 0, []

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def measure(redis_url: str, requests: int) -> dict[str, float]:
    from app.main import create_app
    from app.settings import Settings
    from storage.registry import open_store

    store = open_store(redis_url, namespace=f"rc{os.getpid()}")
    app = create_app(Settings(storage_uri="redis://unused", sweep_interval=0), store=store)
    out: dict[str, float] = {}
    try:
        for _ in range(50):  # warm: connections, scripts loaded, caches
            await call(app, "POST", "/v2/queues/q/messages", POST)
        start = time.process_time()
        for _ in range(requests):
            status, _ = await call(app, "POST", "/v2/queues/q/messages", POST)
            assert status == 201, status
        out["post of 10 messages"] = (time.process_time() - start) / requests * 1e6
        claims, deletes = 0.0, 0.0
        for _ in range(requests // 10):
            claim, delete = await claim_and_delete(app, "q")
            claims += claim
            deletes += delete
        out["claim of 10"] = claims / (requests // 10) * 1e6
        out["delete with claim_id"] = deletes / (requests // 10 * 10) * 1e6
    finally:
        await store.aclose()
    return out


async def claim_and_delete(app: ASGIApp, queue: str) -> tuple[float, float]:
    """A claim of 10 on `queue`, then a DELETE of each claimed message with its claim id: the CPU seconds of
    the claim and of the deletes."""
    t0 = time.process_time()
    status, body = await call(app, "POST", f"/v2/queues/{queue}/claims", b'{"ttl": 60}', b"limit=10")
    t1 = time.process_time()
    assert status == 201, status
    for m in json.loads(body)["messages"]:
        path, _, query = m["href"].partition("?")
        status, _ = await call(app, "DELETE", path, query=query.encode())
        assert status == 204, status
    return t1 - t0, time.process_time() - t1


def run_in(code: Path, redis_url: str, requests: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{ROOT}")
    # run as a file, so that `app`, `api`, ... come from `code` (first on PYTHONPATH), not from this checkout
    argv = [sys.executable, str(Path(__file__)), "--child", redis_url, "--requests", str(requests)]
    done = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.request_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="an earlier revision to compare with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(measure(args.child, args.requests))))
        return 0
    from bench.revisions import worktree
    from tests.servers import RedisServer

    trees = {"this": ROOT}
    if args.against:
        trees = {args.against: worktree(args.against), "this": ROOT}
    server = RedisServer().start()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for r in range(args.rounds):
            for name in list(trees)[:: 1 if r % 2 else -1]:
                runs[name].append(run_in(trees[name], server.url, args.requests))
    finally:
        server.stop()
    names = list(trees)
    print(
        "| request | "
        + " | ".join(f"{n} CPU us" for n in names)
        + (" | this / base |" if args.against else " |")
    )
    print("| --- " * (len(names) + 1 + bool(args.against)) + "|")
    for what in runs["this"][0]:
        medians = [statistics.median(run[what] for run in runs[n]) for n in names]
        ratio = f" | {medians[-1] / medians[0]:.2f}" if args.against else ""
        print(f"| {what} | " + " | ".join(f"{m:.0f}" for m in medians) + ratio + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
