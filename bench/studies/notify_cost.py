"""What subscriptions (webhook notifications) and GET /metrics cost, on a live `charon serve`, loopback only.

Starts `charon serve --workers W` (embedded redis-server in a temporary CHARON_DATA_DIR, a free port,
CHARON_NOTIFICATIONS__ALLOWED_NETWORKS='["127.0.0.0/8"]', CHARON_METRICS__ALLOW_LOOPBACK=true; its stdout and
stderr, the JSON access log included, to one file) and, in this process, a webhook receiver: a small asyncio
HTTP/1.1 server that answers every POST with 204 at once and notes when each notification arrived.

1. Latency, post -> webhook (one subscription on a queue of its own each): messages posted at --rate a
   second for --seconds, in posts of 1 and then in posts of 10, each body holding its send time
   (time.time()); latency = arrival - send. Then dead letters: a queue with `_max_claim_count` 1 and a DLQ
   with the subscription; each message posted, claimed and its claim released (the release moves it), at
   --dlq-rate a second; latency = arrival - the moment the release's answer was read. p50, p90, p99, max,
   and how many arrived (every one must; a missing or duplicated one is counted).
2. Cost: bench/loadgen.py's produce and pipeline workloads (the same code `make bench` runs, in a process of
   their own) against the queue `produce-<run>` / `pipeline-<run>`, "without" (no subscription, no scraper)
   and "with" (one webhook subscription to the receiver on that queue, made before the load, so every
   posted message is delivered by the service's notifier while the load runs; and GET /metrics every
   --scrape-every seconds from this process); the two alternate, which goes first changing every round, for
   --rounds rounds. After a "with" run, the next run waits until every notification arrived (how long it
   took is reported: the notifier's own rate), so no run inherits another's backlog; each queue is deleted
   after its run. Reported: the median (and range) of the per-round ratios with / without of msgs/s and of
   the service's CPU a message (charon serve's processes and the embedded redis-server, from /proc), in the
   timed phase and all-in (until the run's last notification). --variants adds `subscription` (no scraper)
   and `metrics` (the scraper alone).
3. Parts, in this process on a private redis-server: the CPU of each piece of a notification (the post's
   outbox write, lease, finish, the webhook POST through the service's Deliverer; the POST through a plain
   httpx.AsyncClient, through bench/loadgen.py's small client).

Before each phase and each round it waits (every 20 s, at most --busy-wait seconds, 900 by default) until
`pgrep -f pytest` finds nothing, and it notes the load average at the start and end of every run. With
--profile FILE the service runs one worker under cProfile, and its costliest functions are printed at the end.

Run: .venv/bin/python -m bench.studies.notify_cost [--rounds 6] [--phases latency,cost,parts] [--json F]
     [--log F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.compare import ROOT, Service
from bench.cpu import Meter, cpu_seconds, pid_list
from bench.loadgen import Client, Connection, message_body
from tests.servers import free_port

PROJECT = "bench"
SENDERS = 4  # connections the latency phase posts from (so that one slow answer does not delay the rest)
BUSY_POLL_S = 20
BUSY_MAX_S = 900  # --busy-wait's default


# -- the webhook receiver --------------------------------------------------------------------------------


class Receiver:
    """An HTTP/1.1 server (keep-alive) that answers every request 204 at once; for each notification, its
    queue_name and body's seq, when it arrived (time.time(), its body read) and the body's `sent`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrivals: dict[str, list[tuple[float, int | None, float | None]]] = defaultdict(list)
        self.not_json = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                at = time.time()
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                self._note(at, body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _note(self, at: float, raw: bytes) -> None:
        try:
            doc = json.loads(raw)
            body = doc.get("body") or {}
            self.arrivals[doc["queue_name"]].append((at, body.get("seq"), body.get("sent")))
        except (ValueError, KeyError, AttributeError, TypeError):
            self.not_json += 1

    def distinct(self, queue: str) -> int:
        return len({seq for _, seq, _ in self.arrivals.get(queue, ())})

    async def wait(self, queue: str, n: int, within: float) -> bool:
        """Until `n` distinct sequence numbers of `queue` arrived (True) or `within` seconds passed."""
        deadline = time.monotonic() + within
        while self.distinct(queue) < n:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


# -- the machine -------------------------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def busy() -> bool:
    return subprocess.run(["pgrep", "-f", "pytest"], capture_output=True).returncode == 0


async def wait_until_quiet(what: str, notes: list[str], longest: float) -> None:
    """Poll `pgrep -f pytest` every 20 s, at most `longest` seconds; then measure anyway, and say so."""
    waited = 0.0
    while busy() and waited < longest:
        if waited == 0:
            print(f"notify_cost: pytest is running; waiting before {what}", flush=True)
        await asyncio.sleep(BUSY_POLL_S)
        waited += BUSY_POLL_S
    if busy():
        note = f"{what}: pytest still running after {waited:.0f} s; measured anyway (load {loadavg()})"
        print(f"notify_cost: {note}", flush=True)
        notes.append(note)
    elif waited:
        notes.append(f"{what}: waited {waited:.0f} s for pytest to finish")


# -- the service -------------------------------------------------------------------------------------------


def charon(workdir: Path, workers: int, log: Path, profile: Path | None = None) -> Service:
    """`charon serve`; with `profile`, one worker (uvicorn in the process itself) under cProfile, whose stats
    are written to `profile` when it stops."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHARON_")}
    env |= {
        "CHARON_DATA_DIR": str(workdir / "data"),
        "CHARON_PORT": str(port),
        "CHARON_NOTIFICATIONS__ALLOWED_NETWORKS": '["127.0.0.0/8"]',
        "CHARON_METRICS__ALLOW_LOOPBACK": "true",
    }
    argv = [sys.executable, "-m", "app.cli", "serve", "--workers", str(workers), "--log-level", "warning"]
    if profile is not None:
        argv[1:1] = ["-m", "cProfile", "-o", str(profile)]
        argv[argv.index("--workers") + 1] = "1"
    return Service("charon", argv, env, port, log)


def redis_pid(pid: int) -> int | None:
    """The embedded redis-server under `pid`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                comm = (entry / "comm").read_text().strip()
                if comm == "redis-server" and int(_stat_fields(entry.name)[1]) == pid:
                    return int(entry.name)
    return None


def _stat_fields(pid: str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


async def call(conn: Connection, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
    status, answer = await conn.request("setup", method, path, body)
    if not (200 <= status < 300 or status in ok):
        raise RuntimeError(f"{method} {path}: HTTP {status} {answer}")
    return answer


async def subscribe(conn: Connection, queue: str, hook: str) -> str:
    answer = await call(conn, "POST", f"/v2/queues/{queue}/subscriptions", {"subscriber": hook, "ttl": 3600})
    return str(answer["subscription_id"])


def percentiles(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)

    def p(q: float) -> float | None:
        return v[min(len(v) - 1, int(q * len(v)))] * 1000 if v else None

    return {"p50_ms": p(0.5), "p90_ms": p(0.9), "p99_ms": p(0.99), "max_ms": v[-1] * 1000 if v else None}


def _metric_lines(text: Any, names: tuple[str, ...]) -> list[str]:
    if not isinstance(text, str):
        return []
    return [line for line in text.splitlines() if line.startswith(names) and not line.startswith("#")]


# -- 1. latency ----------------------------------------------------------------------------------------------


async def latency_posts(
    client: Client, receiver: Receiver, run: str, per_post: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Messages at args.rate a second for args.seconds, `per_post` to a POST, to a queue with one webhook
    subscription; arrival - send for each."""
    queue = f"lat{per_post}-{run}"
    setup = client.untimed()
    await call(setup, "PUT", f"/v2/queues/{queue}", {})
    await subscribe(setup, queue, receiver.url)
    posts = int(args.rate * args.seconds / per_post)
    n, every = posts * per_post, per_post / args.rate
    sent: dict[int, float] = {}
    statuses: Counter[int] = Counter()
    start = time.monotonic() + 0.1

    async def sender(k: int) -> None:
        conn = client.untimed()
        for i in range(k, posts, SENDERS):
            await asyncio.sleep(max(0.0, start + i * every - time.monotonic()))
            now = time.time()
            batch = []
            for s in range(i * per_post, (i + 1) * per_post):
                sent[s] = now
                batch.append({"ttl": 3600, "body": {**message_body(s, run), "sent": now}})
            status, answer = await conn.request(
                "post", "POST", f"/v2/queues/{queue}/messages", {"messages": batch}
            )
            statuses[status] += 1
            if status != 201:
                print(f"notify_cost: post answered {status}: {answer}", flush=True)
        conn.close()

    await asyncio.gather(*(sender(k) for k in range(SENDERS)))
    posted_for = time.monotonic() - start
    complete = await receiver.wait(queue, n, args.wait)
    result = _latencies(receiver, queue, sent, n)
    await call(setup, "DELETE", f"/v2/queues/{queue}")
    setup.close()
    return {
        "case": f"post of {per_post}",
        "messages": n,
        "rate": args.rate,
        "posted_for_s": posted_for,
        "post_statuses": dict(statuses),
        "complete": complete,
        **result,
    }


async def latency_dead_letters(
    client: Client, receiver: Receiver, run: str, args: argparse.Namespace
) -> dict[str, Any]:
    """A source queue with `_max_claim_count` 1 and a DLQ with one webhook subscription: each message posted,
    claimed (limit 1) and released, at args.dlq_rate a second; arrival - when the release's answer came."""
    source, dlq = f"dlsrc-{run}", f"dlq-{run}"
    setup = client.untimed()
    await call(setup, "PUT", f"/v2/queues/{dlq}", {})
    await call(setup, "PUT", f"/v2/queues/{source}", {"_max_claim_count": 1, "_dead_letter_queue": dlq})
    await subscribe(setup, dlq, receiver.url)
    n, every = int(args.dlq_rate * args.seconds), 1 / args.dlq_rate
    released: dict[int, float] = {}
    problems: Counter[str] = Counter()
    conn = client.untimed()
    start = time.monotonic() + 0.1
    for s in range(n):
        await asyncio.sleep(max(0.0, start + s * every - time.monotonic()))
        status, _ = await conn.request(
            "post",
            "POST",
            f"/v2/queues/{source}/messages",
            {"messages": [{"ttl": 3600, "body": message_body(s, run)}]},
        )
        if status != 201:
            problems[f"post {status}"] += 1
            continue
        status, claimed = await conn.request(
            "claim", "POST", f"/v2/queues/{source}/claims?limit=1", {"ttl": 60, "grace": 60}
        )
        if status != 201 or not claimed or len(claimed["messages"]) != 1:
            problems[f"claim {status}"] += 1
            continue
        _, claim_id = loadgen.href_ids(claimed["messages"][0]["href"])
        status, _ = await conn.request("release", "DELETE", f"/v2/queues/{source}/claims/{claim_id}")
        released[s] = time.time()
        if status != 204:
            problems[f"release {status}"] += 1
    conn.close()
    complete = await receiver.wait(dlq, len(released), args.wait)
    result = _latencies(receiver, dlq, released, len(released))
    stats = await call(setup, "GET", f"/v2/queues/{dlq}/stats")
    for q in (source, dlq):
        await call(setup, "DELETE", f"/v2/queues/{q}")
    setup.close()
    return {
        "case": "dead letter (release -> DLQ subscriber)",
        "messages": len(released),
        "rate": args.dlq_rate,
        "problems": dict(problems),
        "dlq_total": stats["messages"]["total"],
        "complete": complete,
        **result,
    }


def _latencies(receiver: Receiver, queue: str, since: dict[int, float], n: int) -> dict[str, Any]:
    first: dict[int, float] = {}
    copies: Counter[int] = Counter()
    for at, seq, _ in receiver.arrivals.get(queue, ()):
        if seq is None:
            continue
        copies[seq] += 1
        first.setdefault(seq, at)
    lat = [first[s] - t for s, t in since.items() if s in first]
    return {
        "arrived": len(first),
        "missing": sum(1 for s in since if s not in first),
        "duplicated": sum(c - 1 for c in copies.values()),
        "negative": sum(1 for x in lat if x < 0),
        **percentiles(lat),
        "expected": n,
    }


# -- 2. cost -------------------------------------------------------------------------------------------------


async def child_run(url: str, workload: str, run: str, messages: int, pids: list[int]) -> dict[str, Any]:
    """bench.loadgen's workload in a process of its own, on the queue named by `run` (see child())."""
    argv = [
        sys.executable,
        "-m",
        "bench.studies.notify_cost",
        "_loadgen",
        "--url",
        url,
        "--workload",
        workload,
    ]
    argv += ["--messages", str(messages), "--run", run, "--json", "--server-pids", ",".join(map(str, pids))]
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode not in (0, 1) or not out.strip().startswith(b"{"):
        raise RuntimeError(f"loadgen {workload} failed ({proc.returncode}): {err.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(out)
    return result


async def scraper(client: Client, every: float, log: list[dict[str, Any]]) -> None:
    """GET /metrics every `every` seconds (from t=0) until cancelled."""
    conn = client.untimed()
    try:
        while True:
            started = time.perf_counter()
            status, text = await conn.request("metrics", "GET", "/metrics")
            log.append(
                {
                    "status": status,
                    "ms": (time.perf_counter() - started) * 1000,
                    "bytes": len(text) if isinstance(text, str) else 0,
                }
            )
            await asyncio.sleep(max(0.0, every - (time.perf_counter() - started)))
    finally:
        conn.close()


VARIANTS = {  # name: (a webhook subscription on the queue, GET /metrics every --scrape-every s)
    "without": (False, False),
    "with": (True, True),
    "subscription": (True, False),
    "metrics": (False, True),
}


async def cost_run(
    client: Client, receiver: Receiver, svc: Service, workload: str, variant: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One loadgen run on a fresh queue, in `variant`; with a subscription, until every notification
    arrived. CPU: the timed phase's (loadgen's --server-pids: charon serve's processes and the embedded
    redis-server) and all-in (the same processes from before the run to its last notification, split
    between redis-server and the rest)."""
    subscribed, scraped = VARIANTS[variant]
    run = uuid.uuid4().hex[:10]
    queue = f"{workload}-{run}"
    n = args.messages * 5 if workload == "produce" else args.messages
    setup = client.untimed()
    await call(setup, "PUT", f"/v2/queues/{queue}", {})
    if subscribed:
        await subscribe(setup, queue, receiver.url)
    scrapes: list[dict[str, Any]] = []
    task = asyncio.create_task(scraper(client, args.scrape_every, scrapes)) if scraped else None
    assert svc.proc is not None
    redis = redis_pid(svc.proc.pid)
    load_before, t0 = loadavg(), time.monotonic()
    own_before, all_before = time.process_time(), cpu_seconds(svc.proc.pid)
    redis_before = cpu_seconds(redis) if redis else 0.0
    try:
        result = await child_run(svc.url, workload, run, n, [svc.proc.pid])
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    out: dict[str, Any] = {
        "variant": variant,
        "workload": workload,
        "messages": n,
        "msgs_per_s": result["msgs_per_s"],
        "seconds": result["seconds"],
        "server_cpu_us_per_msg": result.get("server_cpu_us_per_msg"),
        "server_cores": result.get("server_cores"),
        "loadgen_cores": result.get("client_cores"),
        "lost": result["lost"],
        "duplicated": result["duplicated"],
        "non_2xx": {k: v["non_2xx"] for k, v in result["requests"].items() if v["non_2xx"]},
        "load_start": load_before,
        "loadgen_process_s": time.monotonic() - t0,
    }
    if scraped:
        out["scrapes"] = len(scrapes)
        out["scrape_statuses"] = dict(Counter(s["status"] for s in scrapes))
        out["scrape_ms_max"] = max((s["ms"] for s in scrapes), default=None)
    if subscribed:
        out["notified_by_loadgen_end"] = receiver.distinct(queue)
        complete = await receiver.wait(queue, n, max(args.wait, n / 100))
        arrivals = [at for at, _, _ in receiver.arrivals.get(queue, ())]
        out["notified"] = receiver.distinct(queue)
        out["notified_copies"] = len(arrivals) - out["notified"]
        out["notify_complete"] = complete
        out["all_notified_after_s"] = time.monotonic() - t0 if complete else None
        if len(arrivals) > 1:
            out["notify_rate_per_s"] = (len(arrivals) - 1) / (max(arrivals) - min(arrivals))
        receiver.arrivals.pop(queue, None)
    all_cpu = cpu_seconds(svc.proc.pid) - all_before
    redis_cpu = (cpu_seconds(redis) - redis_before) if redis else 0.0
    out |= {
        "all_in_cpu_us_per_msg": all_cpu / n * 1e6,
        "all_in_redis_us_per_msg": redis_cpu / n * 1e6,
        "all_in_workers_us_per_msg": (all_cpu - redis_cpu) / n * 1e6,
        "bench_process_cpu_s": time.process_time() - own_before,  # the receiver and the scraper
        "load_end": loadavg(),
    }
    await call(setup, "DELETE", f"/v2/queues/{queue}")
    setup.close()
    return out


# -- 3. where a notification's CPU goes (in process) ----------------------------------------------------


class ThreadedReceiver:
    """A Receiver on an event loop of its own in another thread, so that this thread's CPU
    (time.thread_time()) is the sender's alone."""

    def __init__(self) -> None:
        self.receiver = Receiver()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receiver", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.receiver.start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.receiver.stop())
        self._loop.close()

    def __enter__(self) -> Receiver:
        self._thread.start()
        self._ready.wait(10)
        return self.receiver

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def parts(args: argparse.Namespace) -> dict[str, Any]:
    """A notification's work, piece by piece, in this process on a private redis-server (no HTTP server in
    front): this thread's CPU and redis-server's, per message or per delivery, median of --rounds rounds.

    - post: a post of 10 messages to a queue with one subscription against one without (the outbox write);
    - lease, finish: Store.lease_deliveries (32 at a time) and Store.finish_deliveries (a lease's worth at
      once, as the notifier) of what the posts owed;
    - deliver: service.delivery.Deliverer.deliver (service/delivery/http1.py through the SSRF guard), 4 at a
      time (max_per_subscriber), to the receiver (in another thread); and, for scale, the same POST from a
      plain httpx.AsyncClient (no SSRF guard; what the Deliverer used before) and from bench/loadgen.py's
      small HTTP client."""
    from ipaddress import ip_network

    import httpx

    from core.models import NewMessage, QueueRef, SubscriptionId
    from service.delivery import Deliverer, NotificationSettings
    from service.notifier import notification_document
    from storage.redis.store import RedisStore
    from tests.servers import RedisServer

    server = RedisServer().start()
    assert server.proc is not None
    redis = server.proc.pid
    out: dict[str, list[float]] = defaultdict(list)
    try:
        with ThreadedReceiver() as receiver:
            store = RedisStore.from_url(server.url, namespace=f"n{uuid.uuid4().hex[:6]}")
            sub_q, plain_q = QueueRef(PROJECT, "parts-sub"), QueueRef(PROJECT, "parts-plain")
            subscription, _ = await store.create_subscription(
                sub_q,
                SubscriptionId(uuid.uuid4().hex),
                subscriber=receiver.url,
                ttl=3600,
                options={},
                confirmed=True,
                max_per_queue=100,
            )
            batch = [NewMessage(body=message_body(i, "parts"), ttl=3600) for i in range(10)]
            settings = NotificationSettings(allowed_networks=(ip_network("127.0.0.0/8"),))
            deliverer = Deliverer(settings)
            plain = httpx.AsyncClient(trust_env=False, timeout=settings.webhook_timeout)
            posts = args.part_posts
            document: dict[str, Any] = {}
            for r in range(args.rounds):
                for q in (plain_q, sub_q) if r % 2 == 0 else (sub_q, plain_q):
                    t, c = time.thread_time(), cpu_seconds(redis)
                    for _ in range(posts):
                        await store.post_messages(
                            q, batch, client_id="c", default_ttl=3600, default_delay=0, body_size=2600
                        )
                    kind = "post, subscribed" if q == sub_q else "post"
                    out[f"{kind}: this process"].append((time.thread_time() - t) / (posts * 10) * 1e6)
                    out[f"{kind}: redis-server"].append((cpu_seconds(redis) - c) / (posts * 10) * 1e6)
                owed = posts * 10
                lease_cpu = finish_cpu = lease_redis = finish_redis = 0.0
                leased = 0
                while leased < owed:
                    t, c = time.thread_time(), cpu_seconds(redis)
                    got = await store.lease_deliveries("bench", lease_ms=60_000, limit=32)
                    lease_cpu += time.thread_time() - t
                    lease_redis += cpu_seconds(redis) - c
                    if not got:
                        raise RuntimeError(f"leased {leased} of {owed} deliveries")
                    leased += len(got)
                    if not document:
                        document = notification_document(got[0], int(time.time() * 1000))
                    t, c = time.thread_time(), cpu_seconds(redis)
                    await store.finish_deliveries(got)  # as the notifier finishes what was delivered
                    finish_cpu += time.thread_time() - t
                    finish_redis += cpu_seconds(redis) - c
                out["lease: this process"].append(lease_cpu / owed * 1e6)
                out["lease: redis-server"].append(lease_redis / owed * 1e6)
                out["finish: this process"].append(finish_cpu / owed * 1e6)
                out["finish: redis-server"].append(finish_redis / owed * 1e6)
                k = r % len(SENDS)
                for kind in SENDS[k:] + SENDS[:k]:
                    spent = await _deliveries(kind, deliverer, plain, subscription, document, receiver, owed)
                    out[kind].append(spent)
            await deliverer.aclose()
            await plain.aclose()
            await store.aclose()
    finally:
        server.stop()
    return {k: statistics.median(v) for k, v in out.items()} | {"rounds": args.rounds, "posts": posts}


SENDS = (
    "deliver (Deliverer)",
    "POST (httpx.AsyncClient alone)",
    "POST (bench/loadgen.py client)",
)


async def _deliveries(
    kind: str,
    deliverer: Any,
    plain: Any,
    subscription: Any,
    document: dict[str, Any],
    receiver: Receiver,
    n: int,
) -> float:
    """This thread's CPU us per delivery, `n` of them, 4 at a time."""
    queue = document["queue_name"]
    before = len(receiver.arrivals.get(queue, ()))
    raw = json.dumps(document).encode()

    async def sender(_: int) -> None:
        if "httpx.AsyncClient" in kind:
            for _ in range(n // 4):
                headers = {"Content-Type": "application/json"}
                async with plain.stream("POST", subscription.subscriber, content=raw, headers=headers) as a:
                    async for _chunk in a.aiter_raw():
                        pass
                assert a.status_code == 204, a.status_code
            return
        if kind.startswith("POST"):
            client = Client(f"http://127.0.0.1:{receiver.port}", PROJECT)
            conn = client.untimed()
            for _ in range(n // 4):
                status, _answer = await conn.request("hook", "POST", "/hook", raw=raw)
                assert status == 204, status
            conn.close()
            return
        for _ in range(n // 4):
            outcome = await deliverer.deliver(subscription, document)
            assert outcome.delivered, outcome

    t = time.thread_time()
    await asyncio.gather(*(sender(i) for i in range(4)))
    spent = time.thread_time() - t
    if len(receiver.arrivals.get(queue, ())) - before != n // 4 * 4:
        raise RuntimeError(f"{kind}: {len(receiver.arrivals.get(queue, ())) - before} of {n} arrived")
    return spent / (n // 4 * 4) * 1e6


# -- the report ------------------------------------------------------------------------------------------


def ratios(runs: list[dict[str, Any]], workload: str, key: str, variant: str = "with") -> list[float]:
    """`variant` / without of `key`, round by round."""
    by_round: dict[int, dict[str, float]] = defaultdict(dict)
    for r in runs:
        if r["workload"] == workload and r.get(key):
            by_round[r["round"]][r["variant"]] = r[key]
    return [v[variant] / v["without"] for v in by_round.values() if variant in v and "without" in v]


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def server_log_summary(log: Path) -> dict[str, Any]:
    """The access log's non-2xx answers by method, route and status, and every other line that is not the
    access log (warnings, errors, tracebacks), from the service's output."""
    non_2xx: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    other: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                other.append(line)
                continue
            if "status" in entry and "route" in entry:
                status = entry["status"]
                statuses[str(status)[:1] + "xx" if status else "none"] += 1
                if not (isinstance(status, int) and 200 <= status < 300):
                    non_2xx[f"{entry['method']} {entry['route']} {status}"] += 1
                continue
        other.append(line)
    return {"statuses": dict(statuses), "non_2xx": dict(non_2xx), "other_lines": other}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Run {results['started']} UTC, commit {results['commit']}: `{results['command']}`, charon serve "
        f"--workers {results['workers']}, embedded redis-server"
        + (", under cProfile." if results.get("profiled") else "."),
        "",
        "| case | messages | arrived | missing | dup | p50 ms | p90 ms | p99 ms | max ms | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results["latency"]:
        lines.append(
            f"| {c['case']} at {c['rate']:g}/s | {c['messages']:,} | {c['arrived']:,} | {c['missing']} | "
            f"{c['duplicated']} | {_ms(c['p50_ms'])} | {_ms(c['p90_ms'])} | {_ms(c['p99_ms'])} | "
            f"{_ms(c['max_ms'])} | {c['load']} |"
        )
    runs = results["cost"]
    variants = [v for v in results["variants"] if v != "without"]
    if runs:
        lines += [
            "",
            "Ratios to `without`, median of the rounds (range): msgs/s in the timed phase; the service's CPU "
            "per message in the timed phase; the same all-in, from the run's start to its last notification.",
            "",
            "| workload | variant | rounds | msgs/s | CPU/msg, timed | CPU/msg, all-in | msgs/s, median "
            "(without: this) | notifier deliveries/s | load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for w in results["workloads"]:
            mine = [r for r in runs if r["workload"] == w]
            loads = sorted(float(r[k].split()[0]) for r in mine for k in ("load_start", "load_end"))
            base = statistics.median(r["msgs_per_s"] for r in mine if r["variant"] == "without")
            for v in variants:
                rate = ratios(runs, w, "msgs_per_s", v)
                if not rate:
                    continue
                these = [r for r in mine if r["variant"] == v]
                notify = [r["notify_rate_per_s"] for r in these if r.get("notify_rate_per_s")]
                lines.append(
                    f"| {w} | {v} | {len(rate)} | {_spread(rate)} | "
                    f"{_spread(ratios(runs, w, 'server_cpu_us_per_msg', v))} | "
                    f"{_spread(ratios(runs, w, 'all_in_cpu_us_per_msg', v))} | "
                    f"{base:,.0f}: {statistics.median(r['msgs_per_s'] for r in these):,.0f} | "
                    f"{f'{statistics.median(notify):,.0f}' if notify else '-'} | "
                    f"{loads[0]:.1f}-{loads[-1]:.1f} |"
                )
        lines += ["", "Runs (load average at start / end):", ""]
        lines += [
            "| round | workload | variant | msgs/s | CPU us/msg timed | all-in: workers + redis us/msg | "
            "notified by loadgen end / all | all after s | deliveries/s | scrapes | lost, dup | load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in runs:
            notified = f"{r['notified_by_loadgen_end']:,} / {r['notified']:,}" if "notified" in r else "-"
            lines.append(
                f"| {r['round']} | {r['workload']} | {r['variant']} | {r['msgs_per_s']:,.0f} | "
                f"{r['server_cpu_us_per_msg'] or 0:,.0f} | {r['all_in_workers_us_per_msg']:,.0f} + "
                f"{r['all_in_redis_us_per_msg']:,.0f} | {notified} | {_ms(r.get('all_notified_after_s'))} | "
                f"{_ms(r.get('notify_rate_per_s'))} | {r.get('scrapes', '-')} | "
                f"{r['lost']}, {r['duplicated']} | "
                f"{r['load_start']} / {r['load_end']} |"
            )
    if results.get("parts"):
        pt = results["parts"]
        lines += [
            "",
            f"Where a notification's CPU goes, in process (median of {pt['rounds']} rounds of {pt['posts']} "
            f"posts of 10 messages, then their {pt['posts'] * 10:,} deliveries; load {pt['load']}), us:",
            "",
            "| piece | this process | redis-server |",
            "| --- | --- | --- |",
        ]
        for piece in ("post", "post, subscribed", "lease", "finish"):
            per = "a message" if piece.startswith("post") else "a delivery"
            mine, redis = pt[f"{piece}: this process"], pt[f"{piece}: redis-server"]
            lines.append(f"| {piece}, {per} | {mine:.1f} | {redis:.1f} |")
        for piece in SENDS:
            lines.append(f"| {piece}, a delivery | {pt[piece]:.1f} | - |")
    counted = [
        line
        for key in ("notifier_metrics", "notifier_metrics_end")
        for line in results.get(key, [])
        if not line.endswith(" 0.0")
    ]
    if counted:
        lines += [
            "",
            "The service's own counters (GET /metrics after the latency phase, then at the end):",
            "",
        ]
        lines += [f"    {line}" for line in counted]
    log = results["server_log"] or {"statuses": {}, "non_2xx": {}, "other_lines": []}
    lines += ["", f"Server log: answers by class {log['statuses']}; non-2xx {log['non_2xx'] or 'none'}."]
    if log["other_lines"]:
        lines.append(f"Other lines ({len(log['other_lines'])}), the first 20:")
        lines += [f"    {line[:300]}" for line in log["other_lines"][:20]]
    if results["notes"]:
        lines += ["", "Notes:", *(f"- {n}" for n in results["notes"])]
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, workdir: Path, log: Path) -> dict[str, Any]:
    notes: list[str] = []
    results: dict[str, Any] = {"latency": [], "cost": [], "notes": notes}
    if not {"latency", "cost"} & set(args.phases):
        return results
    receiver = Receiver()
    await receiver.start()
    try:
        with charon(workdir, args.workers, log, args.profile) as svc:
            client = Client(svc.url, PROJECT, Meter())
            run = uuid.uuid4().hex[:10]
            if "latency" in args.phases:
                await wait_until_quiet("the latency phase", notes, args.busy_wait)
                for per_post in (1, 10):
                    load = loadavg()
                    case = await latency_posts(client, receiver, run, per_post, args)
                    case["load"] = f"{load} / {loadavg()}"
                    results["latency"].append(case)
                    print(f"  latency {case['case']}: {json.dumps(case)}", flush=True)
                load = loadavg()
                case = await latency_dead_letters(client, receiver, run, args)
                case["load"] = f"{load} / {loadavg()}"
                results["latency"].append(case)
                print(f"  latency {case['case']}: {json.dumps(case)}", flush=True)
                _, text = await client.untimed().request("metrics", "GET", "/metrics")
                results["notifier_metrics"] = _metric_lines(
                    text,
                    (
                        "charon_notifications_total",
                        "charon_notification_latency_seconds_count",
                        "charon_notification_latency_seconds_sum",
                        "charon_notifier_backlog",
                    ),
                )
            if "cost" in args.phases:
                for r in range(args.rounds):
                    await wait_until_quiet(f"round {r + 1}", notes, args.busy_wait)
                    for workload in args.workloads:
                        k = r % len(args.variants)
                        order = args.variants[k:] + args.variants[:k]
                        for variant in order:
                            out = await cost_run(client, receiver, svc, workload, variant, args)
                            out["round"] = r + 1
                            results["cost"].append(out)
                            print(f"  {progress(out)}", flush=True)
                _, text = await client.untimed().request("metrics", "GET", "/metrics")
                results["notifier_metrics_end"] = _metric_lines(
                    text, ("charon_notifications_total", "charon_notifier_backlog")
                )
    finally:
        await receiver.stop()
    results["receiver"] = {"connections": receiver.connections, "not_json": receiver.not_json}
    return results


def progress(out: dict[str, Any]) -> str:
    return (
        f"round {out['round']} {out['workload']:<8} {out['variant']:<12} {out['msgs_per_s']:>7,.0f} msgs/s, "
        f"CPU {out['server_cpu_us_per_msg'] or 0:,.0f} us/msg (all-in {out['all_in_cpu_us_per_msg']:,.0f}), "
        f"notified {out.get('notified', '-')} (all after {_ms(out.get('all_notified_after_s'))} s), "
        f"load {out['load_start']} / {out['load_end']}"
    )


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "?"


async def child(args: argparse.Namespace) -> dict[str, Any]:
    """bench.loadgen.run_workload with the run id given (`--run`), so that the queue it loads is the one the
    parent subscribed to."""
    client = Client(args.url, args.project, Meter(pid_list(args.server_pids)))
    start = time.perf_counter()
    result = await getattr(loadgen, args.workload.replace("-", "_"))(client, args, args.run)
    timed = result.get("seconds", time.perf_counter() - start)
    return {
        "workload": args.workload,
        "url": args.url,
        "messages": args.messages,
        **result,
        "requests_per_s": client.recorder.requests() / timed,
        "retried_5xx": dict(sorted(client.retries.items())),
        "requests": client.recorder.summary(),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench.studies.notify_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--phases", default="latency,cost,parts", help="some of latency, cost, parts (default: all three)"
    )
    p.add_argument("--workers", type=int, default=2, help="charon serve workers (default 2)")
    p.add_argument("--rate", type=float, default=100.0, help="latency: messages a second (default 100)")
    p.add_argument("--seconds", type=float, default=20.0, help="latency: seconds of posting (default 20)")
    p.add_argument("--dlq-rate", type=float, default=20.0, help="latency: dead letters a second (default 20)")
    p.add_argument("--wait", type=float, default=60.0, help="longest wait for the last notification, seconds")
    p.add_argument("--rounds", type=int, default=5, help="cost: rounds of with and without (default 5)")
    p.add_argument("--workloads", default="produce,pipeline", help="cost: loadgen workloads")
    p.add_argument("--messages", type=int, default=20_000, help="cost: messages a run (produce: 5x)")
    p.add_argument(
        "--variants",
        default="without,with",
        help="cost: the variants, from " + ", ".join(VARIANTS) + " (default without,with; subscription and "
        "metrics are one each, to tell their costs apart)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        help="run the service with one worker under cProfile and write its stats to this file at the end",
    )
    p.add_argument("--scrape-every", type=float, default=5.0, help="cost, with: seconds between scrapes")
    p.add_argument(
        "--busy-wait",
        type=float,
        default=BUSY_MAX_S,
        help="longest wait for `pgrep -f pytest` to find nothing before each phase and round (default 900 s)",
    )
    p.add_argument(
        "--part-posts", type=int, default=300, help="parts: posts of 10 messages a round (default 300)"
    )
    p.add_argument("--log", type=Path, help="keep the service's output (its access log) in this file")
    p.add_argument("--json", type=Path, help="also write every result to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_loadgen"]:  # the load generator's process (cost_run)
        p = loadgen.parser()
        p.add_argument("--run", required=True)
        return loadgen.run_cli(p.parse_args(argv[1:]), child)
    args = parser().parse_args(argv)
    args.phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    args.workloads = [x.strip() for x in args.workloads.split(",") if x.strip()]
    args.variants = [x.strip() for x in args.variants.split(",") if x.strip()]
    if "without" not in args.variants or set(args.variants) - set(VARIANTS):
        parser().error(f"--variants: some of {', '.join(VARIANTS)}, without among them")
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="charon-notify-") as tmp:
        log = Path(tmp) / "charon.log"
        try:
            results = asyncio.run(measure(args, Path(tmp), log))
            if "parts" in args.phases:
                asyncio.run(wait_until_quiet("the parts", results["notes"], args.busy_wait))
                load = loadavg()
                results["parts"] = asyncio.run(parts(args))
                results["parts"]["load"] = f"{load} / {loadavg()}"
        finally:
            if args.log and log.exists():
                shutil.copy(log, args.log)
        results["server_log"] = server_log_summary(log) if log.exists() else None
    results |= {
        "started": f"{started:%Y-%m-%d %H:%M}",
        "commit": commit(),
        "command": " ".join(["python -m bench.studies.notify_cost", *argv]),
        "workers": 1 if args.profile else args.workers,
        "variants": args.variants,
        "profiled": bool(args.profile),
        "workloads": args.workloads,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(markdown(results))
    if args.profile and args.profile.exists():
        import pstats

        print(f"\nThe service's profile ({args.profile}), by own time:\n", flush=True)
        pstats.Stats(str(args.profile), stream=sys.stdout).sort_stats("tottime").print_stats(40)
    bad = sum(c["missing"] + c["duplicated"] for c in results["latency"])
    bad += sum(
        r["lost"] + r["duplicated"] + (0 if r.get("notify_complete", True) else 1) for r in results["cost"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
