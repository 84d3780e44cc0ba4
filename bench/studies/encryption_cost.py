"""What encryption at rest (`_enable_encrypt_messages`, core/sealing.py) costs a request, in process: the hot
routes of bench/studies/auth_cost.py (posts of 10 messages of ~256 bytes, claims of 10 with a DELETE of each
message, GETs of 10 messages), driven through the app's ASGI callable on one private redis-server, on two
queues of one app that has a key: `clear` (no encryption) and `encrypted` (`_enable_encrypt_messages:
true`). The two take turns a block of requests at a time (auth_cost.measure), so the machine's other load
falls on both alike; each round starts from empty queues. Reported: this process's CPU us a request of each
(redis-server's work not in it) and the ratio encrypted / clear, median and quartiles over the rounds.

Run: .venv/bin/python -m bench.studies.encryption_cost [--rounds 9] [--requests 3000] [--block 100]
"""

from __future__ import annotations

import base64
import json
import os
import statistics

from bench.studies.auth_cost import OPS, Mode, expect, in_turns, quartiles, reset, turns_arguments

ENCRYPTED = json.dumps({"_enable_encrypt_messages": True}).encode()


async def build(redis_url: str) -> tuple[list[Mode], object]:
    from app.main import create_app
    from app.settings import Settings
    from core.clock import SystemClock
    from storage.registry import open_store

    clock = SystemClock()
    store = open_store(redis_url, namespace=f"ec{os.getpid()}", clock=clock)
    keys = f"bench:{base64.b64encode(os.urandom(32)).decode()}"
    settings = Settings(
        storage_uri="redis://unused", sweep_interval=0, access_log=False, encryption={"keys": keys}
    )  # type: ignore[arg-type]
    app = create_app(settings, store=store, clock=clock)
    project = [(b"x-project-id", b"bench-encryption")]
    return [
        Mode("clear", app, project, "q-clear", project),
        Mode("encrypted", app, project, "q-sealed", project),
    ], store


async def prepare(modes: list[Mode]) -> None:
    """Empty queues, the encrypted one made with its key set (a post alone would make a clear queue)."""
    for mode in modes:
        await reset(mode)
    encrypted = modes[1]
    await expect(encrypted, 201, "PUT", f"/v2/queues/{encrypted.queue}", ENCRYPTED)


def main(argv: list[str] | None = None) -> int:
    args = turns_arguments("bench.studies.encryption_cost", __doc__, argv)
    runs = in_turns(build, prepare, rounds=args.rounds, requests=args.requests, block=args.block)
    print(f"\nCPU us a request, median of {args.rounds} rounds (load {os.getloadavg()[0]:.2f})\n")
    print("| operation | clear | encrypted | encrypted / clear (median, quartiles) |")
    print("| --- | --- | --- | --- |")
    for op in OPS:
        clear = statistics.median(r[op] for r in runs["clear"])
        sealed = statistics.median(r[op] for r in runs["encrypted"])
        ratios = [e[op] / c[op] for e, c in zip(runs["encrypted"], runs["clear"], strict=True)]
        q1, q2, q3 = quartiles(ratios)
        print(f"| {op} | {clear:.0f} | {sealed:.0f} | {q2:.2f} ({q1:.2f}-{q3:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
