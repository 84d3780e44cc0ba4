"""What the quotas (docs/quotas.md) cost a request, in process and in redis-server: the hot routes of
bench/studies/auth_cost.py (posts of 10 messages of ~256 bytes, claims of 10 with a DELETE of each message,
GETs of 10 messages), driven through the app's ASGI callable on one private redis-server, for three projects
of one app:

- `none`: no quota (the build with them off: the service's defaults are unset);
- `counted`: `queues`, `messages_per_queue` and `message_bytes` set (high enough never to refuse), so every
  post counts the queue's messages and the project's bytes in its script;
- `all`: those and both request rates (high enough never to refuse), so every request also spends a leased
  token.

The projects take turns a block of requests at a time (auth_cost.measure), so the machine's other load falls
on all alike; each round starts from empty queues. Counted: this process's CPU time plus redis-server's
(its main thread's, from /proc/<pid>/schedstat, in ns), a request. Reported: the ratio of each to `none`,
median and quartiles over the rounds.

Run: .venv/bin/python -m bench.studies.quota_cost [--rounds 9] [--requests 3000] [--block 100]
"""

from __future__ import annotations

import json
import os
import statistics

from bench.studies.auth_cost import OPS, Mode, expect, in_turns, quartiles, reset, turns_arguments

COUNTED = {"queues": 1_000_000, "messages_per_queue": 1_000_000_000, "message_bytes": 10**15}
RATES = {"reads_per_second": 1_000_000, "writes_per_second": 1_000_000}
ADMIN = [(b"x-roles", b"admin")]


async def build(redis_url: str) -> tuple[list[Mode], object]:
    from app.main import create_app
    from app.settings import Settings
    from core.clock import SystemClock
    from storage.registry import open_store

    clock = SystemClock()
    store = open_store(redis_url, namespace=f"qc{os.getpid()}", clock=clock)
    settings = Settings(storage_uri="redis://unused", sweep_interval=0, access_log=False)
    app = create_app(settings, store=store, clock=clock)
    modes = []
    for name in ("none", "counted", "all"):
        project = [(b"x-project-id", f"bench-quota-{name}".encode())]
        modes.append(Mode(name, app, project, f"q-{name}", project))
    return modes, store


async def set_quotas(modes: list[Mode]) -> None:
    for mode, quotas in zip(modes[1:], (COUNTED, COUNTED | RATES), strict=True):
        admin = Mode(mode.name, mode.app, [*mode.headers, *ADMIN], mode.queue, mode.admin)
        project = dict(mode.headers)[b"x-project-id"].decode()
        await expect(admin, 200, "PUT", f"/v2/quotas/{project}", json.dumps(quotas).encode())


async def prepare(modes: list[Mode]) -> None:
    """Empty queues, and the projects' quotas (set again: a PUT is cheap, and a first round needs them)."""
    for mode in modes:
        await reset(mode)
    await set_quotas(modes)


def main(argv: list[str] | None = None) -> int:
    args = turns_arguments("bench.studies.quota_cost", __doc__, argv)
    runs = in_turns(
        build, prepare, rounds=args.rounds, requests=args.requests, block=args.block, server_clock=True
    )
    print(f"\nCPU us a request (app and redis-server), median of {args.rounds} rounds")
    print(f"(load {os.getloadavg()[0]:.2f})\n")
    print("| operation | none | counted | all | counted / none | all / none (median, quartiles) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for op in OPS:
        med = {name: statistics.median(r[op] for r in rs) for name, rs in runs.items()}
        cells = []
        for name in ("counted", "all"):
            ratios = [x[op] / n[op] for x, n in zip(runs[name], runs["none"], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            cells.append(f"{q2:.2f} ({q1:.2f}-{q3:.2f})")
        print(f"| {op} | {med['none']:.0f} | {med['counted']:.0f} | {med['all']:.0f} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
