"""A shop whose consumers fail in a few recognisable ways, driven through the HTTP API: the dead letters the
pipeline tests analyse, and (`python -m tests.pipeline.scenario`) the example report under docs/.

Every message dies the way a real one would: claimed and released until `_max_claim_count` moves it, rejected
by its consumer (POST .../dead_letter), or expired with `_dead_letter_on_expiry`. Time is a ManualClock that
the scenario moves forward between rounds, so the deaths spread over hours. A few messages are posted to a
DLQ directly (no provenance), and a few bodies are not objects or are longer than the test's body limit.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from core.clock import ManualClock
from storage.base import Store

CLIENT_ID = "3381af92-2b9e-11e3-b191-71861300734c"
# the consumers: each claim is made by one of its queue's workers (drawn by their own random generator, so
# that the messages and their fates do not depend on them)
WORKERS = {
    "orders": ("0a0e1b2c-0000-4000-8000-00000000a001", "0a0e1b2c-0000-4000-8000-00000000a002"),
    "payments": ("0b0e1b2c-0000-4000-8000-00000000b001",),
    "emails": ("0c0e1b2c-0000-4000-8000-00000000c001", "0c0e1b2c-0000-4000-8000-00000000c002"),
    "sms": ("0c0e1b2c-0000-4000-8000-00000000c003",),
}
DLQ_TTL = 1_209_600  # the longest message ttl: nothing the scenario makes expires before the test reads it
HUGE_CHARS = 5_000  # longer than the tests' --max-body-bytes
TEST_MAX_BODY_BYTES = 4_096

QUEUES: dict[str, dict[str, Any]] = {
    "orders": {"_max_claim_count": 3, "_dead_letter_queue": "orders.dlq"},
    "payments": {"_max_claim_count": 2, "_dead_letter_queue": "payments.dlq"},
    "emails": {"_max_claim_count": 4, "_dead_letter_queue": "notify.dlq"},
    "sms": {"_max_claim_count": 2, "_dead_letter_queue": "notify.dlq"},
    "sessions": {"_dead_letter_queue": "sessions.dlq", "_dead_letter_on_expiry": True},
}


@dataclass
class Shop:
    """What the scenario did, for the tests to check against."""

    project: str
    dlqs: list[str] = field(default_factory=list)
    posted: int = 0
    direct: list[str] = field(default_factory=list)  # ids posted straight into a DLQ


def _body(rng: random.Random, queue: str, n: int) -> tuple[Any, str]:
    """A body for `queue` and what its consumer does with it: ok | fail (release) | reject."""
    hexid = "".join(rng.choice("0123456789abcdef") for _ in range(12))
    if queue == "orders":
        roll = rng.random()
        body: Any = {
            "order_id": 10_000 + n,
            "customer": {
                "id": str(uuid.UUID(int=rng.getrandbits(128))),
                "tier": rng.choice(["gold", "basic"]),
            },
            "items": [{"sku": f"SKU-{rng.randint(1, 40)}", "qty": rng.randint(1, 3)}],
        }
        if roll < 0.25:
            body["error"] = f"inventory service timeout after {rng.choice([30, 60])}s (request {hexid})"
            return body, "fail"
        if roll < 0.32:
            return {"order_id": "n/a", "items": None}, "fail"  # a poison message, posted again and again
        if roll < 0.36:
            return rng.choice(["order 42 please", [10_000 + n, "rush"], 17]), "fail"
        if roll < 0.38:
            return {"order_id": 10_000 + n, "note": "x" * HUGE_CHARS}, "fail"
        return body, "ok"
    if queue == "payments":
        roll = rng.random()
        body = {"payment_id": f"pay_{hexid}", "amount": rng.randint(5, 500) + 0.99, "currency": "EUR"}
        if roll < 0.3:
            body["error"] = f"card declined: code {rng.choice([5, 51, 54])} at 0x{hexid[:6]}"
            return body, "fail"
        if roll < 0.45:
            body["exception"] = {
                "type": "KeyError",
                "message": f"'iban' missing for account {rng.randint(1, 99999)}",
            }
            return body, "fail"
        if roll < 0.55:
            return body, "reject"
        return body, "ok"
    if queue in ("emails", "sms"):
        roll = rng.random()
        body = {"to": f"user{n}@example.com" if queue == "emails" else f"+4479{n:07d}", "template": "welcome"}
        if roll < 0.35:
            body["reason"] = (
                f"mailbox full (552 5.2.2) for user{n}" if queue == "emails" else "carrier rejected 21610"
            )
            return body, "fail"
        return body, "ok"
    return {"session": hexid, "user": n % 50}, "expire"


class _Api:
    def __init__(self, http: httpx.AsyncClient, project: str):
        self.http = http
        self.headers = {"Client-ID": CLIENT_ID, "X-Project-ID": project}

    async def call(
        self, method: str, url: str, expect: tuple[int, ...], *, client: str = CLIENT_ID, **kw: Any
    ) -> httpx.Response:
        r = await self.http.request(method, url, headers={**self.headers, "Client-ID": client}, **kw)
        assert r.status_code in expect, (method, url, r.status_code, r.text)
        return r


async def run(
    http: httpx.AsyncClient,
    store: Store,
    clock: ManualClock,
    *,
    project: str,
    rounds: int,
    per_round: int,
    seed: int = 7,
) -> Shop:
    """`rounds` rounds; in each, every queue gets about `per_round` messages and the consumers work through
    what they can claim. Then the consumers go on until every failing message is in a DLQ."""
    rng, workers = random.Random(seed), random.Random(seed + 1)
    api = _Api(http, project)
    shop = Shop(project=project, dlqs=sorted({m["_dead_letter_queue"] for m in QUEUES.values()}))
    for name, meta in QUEUES.items():
        await api.call(
            "PUT", f"/v2/queues/{name}", (201, 204), json={**meta, "_dead_letter_queue_messages_ttl": DLQ_TTL}
        )
    fate: dict[str, str] = {}
    for r in range(rounds):
        for name in QUEUES:
            batch = []
            for i in range(per_round):
                body, what = _body(rng, name, r * 1000 + i)
                ttl = 60 if what == "expire" else DLQ_TTL
                batch.append(({"body": body, "ttl": ttl}, what))
            for start in range(0, len(batch), 10):
                chunk = batch[start : start + 10]
                res = await api.call(
                    "POST", f"/v2/queues/{name}/messages", (201,), json={"messages": [m for m, _ in chunk]}
                )
                for href, (_, what) in zip(res.json()["resources"], chunk, strict=True):
                    fate[href.rsplit("/", 1)[1]] = what
                shop.posted += len(chunk)
        await _consume(api, fate, rng, workers)
        clock.advance(rng.randint(60, 900))
        await store.sweep()
    for _ in range(8):  # the failing ones use up their claims (the eager move happens on release)
        await _consume(api, fate, rng, workers)
        clock.advance(900)
        await store.sweep()
    for text in ("replayed by hand", "ops test"):
        res = await api.call(
            "POST",
            "/v2/queues/orders.dlq/messages",
            (201,),
            json={"messages": [{"body": {"note": text}, "ttl": DLQ_TTL}]},
        )
        shop.direct.append(res.json()["resources"][0].rsplit("/", 1)[1])
    return shop


async def _consume(api: _Api, fate: dict[str, str], rng: random.Random, workers: random.Random) -> None:
    for name in QUEUES:
        if name == "sessions":
            continue  # nobody consumes sessions: they expire into their DLQ
        while True:
            worker = workers.choice(WORKERS[name])
            r = await api.call(
                "POST",
                f"/v2/queues/{name}/claims?limit=20",
                (201, 204),
                json={"ttl": 300, "grace": 60},
                client=worker,
            )
            if r.status_code == 204:
                break
            messages = r.json()["messages"]
            claim_id = messages[0]["href"].rsplit("claim_id=", 1)[1]
            for m in messages:
                what = fate.get(m["id"], "ok")
                url = f"/v2/queues/{name}/messages/{m['id']}"
                if what == "ok":
                    await api.call("DELETE", f"{url}?claim_id={claim_id}", (204,))
                elif what == "reject":
                    reason = rng.choice(["validation", "fraud check"])
                    detail = f"amount {rng.randint(1, 999)} exceeds limit for {m['body']['payment_id']}"
                    await api.call(
                        "POST",
                        f"{url}/dead_letter?claim_id={claim_id}",
                        (200,),
                        json={"reason": reason, "description": detail},
                        client=worker,
                    )
            # the failed ones come back after a while (release with a delay), as a consumer's backoff would
            delay = rng.randint(60, 600)
            await api.call("DELETE", f"/v2/queues/{name}/claims/{claim_id}?delay={delay}", (204, 404))


async def _main(args: argparse.Namespace) -> None:
    from app.main import create_app
    from app.settings import Settings
    from storage.registry import open_store

    clock = ManualClock(ManualClock().now_ms() - args.hours * 3_600_000)
    store = open_store(args.storage_uri, clock=clock)
    app = create_app(Settings(storage_uri=args.storage_uri), store=store, clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://charon") as http:
        shop = await run(
            http,
            store,
            clock,
            project=args.project,
            rounds=args.rounds,
            per_round=args.per_round,
            seed=args.seed,
        )
    await store.aclose()
    print(f"{shop.posted} messages posted to project {shop.project}; DLQs {', '.join(shop.dlqs)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Fill a store with the scenario's dead letters.")
    parser.add_argument("--storage-uri", required=True)
    parser.add_argument("--project", default="shop")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=25)
    parser.add_argument("--hours", type=int, default=10, help="the clock starts this long ago")
    parser.add_argument("--seed", type=int, default=7, help="another seed: other bodies (a later pass)")
    asyncio.run(_main(parser.parse_args()))
