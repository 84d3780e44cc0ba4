"""A load generator for any Zaqar-v2-compatible endpoint: one process, asyncio, loopback.

Workloads (see bench/README.md):
  produce   16 producers post batches of 10 messages (~256 bytes each) until --messages are posted (with
            --idempotency, each post with an Idempotency-Key of its own)
  pipeline  --messages are posted (untimed), then 16 consumers claim (limit 10) and delete each message
            with its claim id
  pipeline-bulk  the same, but each claim's messages are deleted with one bulk DELETE (?ids=...&claim_ids=C)
  dlq       a queue with `_max_claim_count` 2 and a DLQ; consumers claim and release until every message is
            dead-lettered; then the DLQ is drained with bulk deletes (timed), timing also how long until its
            first message can be claimed
  depth     claim latency (one consumer, claim then release) on queues of 1,000 and of --depth-big messages,
            taking turns (see depth())
  ping      GET /v2/ping from 16 connections for --duration seconds
  idle      16 consumers wait on an empty queue, long polling (`claims?wait=20`) or short polling (a claim
            every 100 ms, jittered); --idle-seconds of idle (store commands, from --redis-url's INFO, and
            server CPU), then --idle-messages posted one at a time at random moments: post-to-claim latency
            p50/p99

With --server-pids (the service's processes and its redis-server) a run reports the servers' CPU per message
in its timed phase (bench/cpu.py), and always the load generator's own.

Every body carries a sequence number; every run reads all its messages back and reports the lost and the
duplicated ones (both must be 0), msgs/s, requests/s, p50/p95/p99 per request type and the non-2xx answers.

Every request a 5xx answers (503 most often: Zaqar's answer to any storage error) is tried again, as a client
would (a backoff from 50 ms doubling to 1 s, jittered, at most RETRY_5XX_ATTEMPTS tries within
RETRY_5XX_WITHIN seconds; a 5xx past those bounds ends the run), and the run reports how many were retried
(`retried_5xx`, by request type; the non-2xx counts say which status). A post answered 5xx may have stored
its messages (or some of them), and one without an Idempotency-Key cannot know, so it is posted again: a
copy of its messages beyond the first, up to one for each 5xx it got, is reported as
`duplicated_by_post_retry`, not as `duplicated` (with an Idempotency-Key the retry carries the same key,
and every copy counts).

The HTTP client is a small HTTP/1.1 client on asyncio streams (keep-alive when the server allows it, a new
connection when it answers `Connection: close`, as gunicorn's sync workers do): a load generator that costs
less per request than the servers it measures, so that both share the two cores as evenly as possible.

With --transport ws the timed requests of produce and pipeline are Zaqar's websocket actions instead
(message_post, claim_create, message_delete, message_delete_many), one websocket a producer or consumer.

Run: .venv/bin/python -m bench.loadgen --url http://127.0.0.1:8888 --workload produce [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bench.cpu import Meter, pid_list

WORKLOADS = ("produce", "pipeline", "pipeline-bulk", "dlq", "depth", "ping", "idle")
WS_WORKLOADS = ("produce", "pipeline", "pipeline-bulk")  # --transport ws: their timed requests as actions
BATCH = 10
CLAIM_LIMIT = 10
CLAIM_TTL = 60
PAD = 210  # makes each body about 256 bytes of JSON
RETRY_5XX_ATTEMPTS = 12  # tries of one request answered 5xx, the first included
RETRY_5XX_WITHIN = 10.0  # seconds from its first try: no retry starts later
RETRY_5XX_BACKOFF = (0.05, 1.0)  # first pause, longest pause; it doubles, and each is jittered (x 0.5 to 1)


class HttpError(Exception):
    pass


@dataclass
class Recorder:
    """Latencies (seconds) and answers per request type."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, kind: str, status: int, seconds: float) -> None:
        self.latencies[kind].append(seconds)
        self.statuses[kind][status] += 1

    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values())

    def summary(self) -> dict[str, Any]:
        out = {}
        for kind, values in sorted(self.latencies.items()):
            values = sorted(values)
            out[kind] = {
                "count": len(values),
                "p50_ms": _pct(values, 0.50) * 1000,
                "p95_ms": _pct(values, 0.95) * 1000,
                "p99_ms": _pct(values, 0.99) * 1000,
                "non_2xx": {str(s): n for s, n in sorted(self.statuses[kind].items()) if not 200 <= s < 300},
            }
        return out


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


class Connection:
    """One HTTP/1.1 connection, one request at a time."""

    def __init__(
        self,
        host: str,
        port: int,
        headers: dict[str, str],
        recorder: Recorder,
        retries: Counter[str],
        counted_by_listing: Counter[str] | None = None,
    ) -> None:
        self.host, self.port, self.recorder, self.retries = host, port, recorder, retries
        # stats that still answered 5xx after the retries, by queue role: counted through the listing
        self.counted_by_listing = counted_by_listing if counted_by_listing is not None else Counter[str]()
        fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.fixed = f"Host: {host}:{port}\r\n{fixed}"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.retried = 0  # 5xx answers the last request() retried

    async def request(
        self,
        kind: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON body or None). A 5xx is tried again after a pause (see RETRY_5XX_*), and each
        retry counted in `self.retries[kind]` and `self.retried`; every try is recorded (latency, status). The
        last answer is returned, a 5xx when the bounds ran out."""
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        head = f"{method} {path} HTTP/1.1\r\n{self.fixed}"
        head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if payload or method in ("POST", "PUT", "PATCH"):
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        data = head.encode() + b"\r\n" + payload
        self.retried = 0
        status, content = await self._send(kind, data)
        if status >= 500:
            first_pause, longest = RETRY_5XX_BACKOFF
            deadline = time.monotonic() + RETRY_5XX_WITHIN
            for attempt in range(RETRY_5XX_ATTEMPTS - 1):
                pause = min(longest, first_pause * 2**attempt) * random.uniform(0.5, 1.0)
                if time.monotonic() + pause > deadline:
                    break
                await asyncio.sleep(pause)
                self.retried += 1
                self.retries[kind] += 1
                status, content = await self._send(kind, data)
                if status < 500:
                    break
        if not content:
            return status, None
        try:
            return status, json.loads(content)
        except ValueError:  # an error page that is not JSON (a proxy's, a server's own)
            return status, content.decode("utf-8", "replace")

    async def _send(self, kind: str, data: bytes) -> tuple[int, bytes]:
        """One try: (status, body). Tries once more on a fresh connection when a kept-alive one was closed by
        the server before it answered."""
        for attempt in (0, 1):
            reused = self.writer is not None
            if self.writer is None:
                await self._connect()
            assert self.reader is not None
            assert self.writer is not None
            start = time.perf_counter()
            try:
                self.writer.write(data)
                status, content, close = await self._response(self.reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if reused and attempt == 0:
                    continue
                raise
            self.recorder.add(kind, status, time.perf_counter() - start)
            if close:
                self.close()
            return status, content
        raise AssertionError("unreachable")

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    @staticmethod
    async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, chunked, close = 0, False, lines[0].startswith("HTTP/1.0")
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value
            elif name == "connection":
                close = value == "close"
        if chunked:
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await reader.readexactly(size + 2))
            await reader.readuntil(b"\r\n")
            return status, b"".join(p[:-2] for p in parts), close
        return status, (await reader.readexactly(length) if length else b""), close

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class WsConnection(Connection):
    """One websocket of Zaqar's transport (api/websocket.py), one action at a time: the requests the timed
    phases of produce and pipeline make, each as its action, answered in the HTTP shape the workloads read
    (a post's `resources`, a claim's messages with their hrefs). Anything else is not a websocket action
    here (set-up and read-back go over HTTP, untimed)."""

    def __init__(
        self, host: str, port: int, headers: dict[str, str], recorder: Recorder, retries: Counter[str]
    ):
        super().__init__(host, port, headers, recorder, retries)
        self.ws_headers = {k: v for k, v in headers.items() if k in ("Client-ID", "X-Project-ID")}
        self.ws: Any = None

    async def request(
        self,
        kind: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        target, _, query = path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if p)
        parts = target.split("/")  # "", "v2", "queues", q, ...
        queue = parts[3]
        if (method, parts[4:]) == ("POST", ["messages"]):
            action, sent = "message_post", {"messages": body["messages"]}
        elif (method, parts[4:]) == ("POST", ["claims"]):
            action, sent = "claim_create", {**body, "limit": int(params["limit"])}
        elif method == "DELETE" and len(parts) == 6 and parts[4] == "messages":
            action, sent = "message_delete", {"message_id": parts[5], "claim_id": params["claim_id"]}
        elif method == "DELETE" and parts[4:] == ["messages"]:
            ids, claims = params["ids"].split(","), params["claim_ids"].split(",")
            action, sent = "message_delete_many", {"message_ids": ids, "claim_ids": claims}
        else:
            raise NotImplementedError(f"{method} {path} over the websocket")
        frame = json.dumps(
            {"action": action, "headers": self.ws_headers, "body": {"queue_name": queue, **sent}}
        )
        if self.ws is None:
            from websockets.asyncio.client import connect

            self.ws = await connect(f"ws://{self.host}:{self.port}/", compression=None, max_size=None)
        self.retried = 0
        start = time.perf_counter()
        await self.ws.send(frame)
        answer = json.loads(await self.ws.recv())
        status = int(answer["headers"]["status"])
        self.recorder.add(kind, status, time.perf_counter() - start)
        out = answer.get("body")
        if action == "message_post" and status == 201:
            out = {"resources": [f"/v2/queues/{queue}/messages/{i}" for i in out["message_ids"]]}
        elif action == "claim_create" and status == 204:
            out = None
        return status, out

    def close(self) -> None:
        if self.ws is not None:
            ws, self.ws = self.ws, None
            asyncio.get_running_loop().create_task(ws.close())


def message_body(seq: int, run: str) -> dict[str, Any]:
    return {"seq": seq, "run": run, "pad": "x" * PAD}


def href_ids(href: str) -> tuple[str, str | None]:
    """(message id, claim id) from `/v2/queues/q/messages/ID?claim_id=CID`."""
    path, _, query = href.partition("?")
    claim = query.split("claim_id=", 1)[1].split("&")[0] if "claim_id=" in query else None
    return path.rsplit("/", 1)[1], claim


class Client:
    def __init__(self, url: str, project: str, meter: Meter | None = None, transport: str = "http") -> None:
        self.transport = transport
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Client-ID": str(uuid.uuid4()), "X-Project-ID": project, "Accept": "application/json"}
        self.recorder = Recorder()
        self.meter = meter or Meter()  # CPU of the servers (and of this process) in the timed phases
        self.retries: Counter[str] = Counter()  # 5xx retried, by request type, timed requests or not
        # queue -> sequence number -> 5xx retried by the posts (without Idempotency-Key) that carried it
        self.post_retried: defaultdict[str, Counter[int]] = defaultdict(Counter)
        self.counted_by_listing: Counter[str] = Counter()  # see stats_total

    def connection(self, recorder: Recorder | None = None) -> Connection:
        """A connection of the timed phases: HTTP, or with --transport ws a websocket (WsConnection)."""
        rec = recorder or self.recorder
        if self.transport == "ws":
            return WsConnection(self.host, self.port, self.headers, rec, self.retries)
        return Connection(self.host, self.port, self.headers, rec, self.retries, self.counted_by_listing)

    def untimed(self) -> Connection:
        """A connection whose requests are not part of the results (set-up and read-back), over HTTP."""
        return Connection(
            self.host, self.port, self.headers, Recorder(), self.retries, self.counted_by_listing
        )


async def gather(n: int, worker: Callable[[int], Awaitable[None]]) -> None:
    await asyncio.gather(*(worker(i) for i in range(n)))


def _check(status: int, body: Any, what: str, conn: Connection) -> None:
    if not 200 <= status < 300:
        tried = f" (after {conn.retried} retries of a 5xx)" if conn.retried else ""
        raise HttpError(f"{what}: HTTP {status}{tried} {body}")


async def post_all(
    client: Client, queue: str, n: int, run: str, concurrency: int, *, timed: bool, keyed: bool = False
) -> None:
    """Post messages 0..n-1 in batches of BATCH from `concurrency` connections."""
    next_seq = iter(range(0, n, BATCH))

    async def producer(_: int) -> None:
        conn = client.connection() if timed else client.untimed()
        for first in next_seq:
            batch = [{"ttl": 3600, "body": message_body(s, run)} for s in range(first, min(first + BATCH, n))]
            key = {"Idempotency-Key": f"{run}-{first}"} if keyed else None
            status, body = await conn.request(
                "post", "POST", f"/v2/queues/{queue}/messages", {"messages": batch}, headers=key
            )
            _check(status, body, "post", conn)
            if conn.retried and not keyed:  # each 5xx may have stored the batch (or part of it) once more
                seqs = range(first, first + len(batch))
                client.post_retried[queue].update(dict.fromkeys(seqs, conn.retried))
        conn.close()

    await gather(concurrency, producer)


async def drain(
    client: Client,
    queue: str,
    n: int,
    *,
    within: float,
    timed: bool,
    concurrency: int = 16,
    bulk: bool = False,
    recorder: Recorder | None = None,
) -> tuple[Counter[int], float | None]:
    """Claim and delete (each message with its claim id; with `bulk`, all of a claim's messages in one
    DELETE with ids and claim_ids) until each of the n messages was seen or `within` seconds pass. Returns
    the sequence numbers seen (with how often) and when the first claim returned messages. (Every sequence
    number, not n deliveries: a post retried after a 5xx may have queued a copy.) Timed requests go to
    `recorder`, by default the client's."""
    seen: Counter[int] = Counter()
    first_at: list[float] = []
    start = time.perf_counter()

    async def consumer(_: int) -> None:
        conn = client.connection(recorder) if timed else client.untimed()
        while len(seen) < n and time.perf_counter() - start < within:
            status, body = await claim(conn, queue)
            if status == 204 or not body:
                await asyncio.sleep(0.05)
                continue
            if not first_at:
                first_at.append(time.perf_counter())
            messages = body["messages"] if isinstance(body, dict) else body
            for m in messages:
                seen[m["body"]["seq"]] += 1
            if bulk:
                await bulk_delete(conn, queue, messages)
                continue
            for m in messages:
                message_id, claim_id = href_ids(m["href"])
                status, answer = await conn.request(
                    "delete", "DELETE", f"/v2/queues/{queue}/messages/{message_id}?claim_id={claim_id}"
                )
                if status != 403:  # Zaqar 23 refuses some DLQ deletes (its old claim): counted in non-2xx,
                    _check(status, answer, "delete", conn)  # and the message comes again (a duplicate)
        conn.close()

    await gather(concurrency, consumer)
    return seen, (first_at[0] - start if first_at else None)


async def bulk_delete(conn: Connection, queue: str, messages: list[dict[str, Any]]) -> None:
    """Delete claimed messages with one request: `DELETE messages?ids=a,b&claim_ids=C` (204; a 403 lists those
    not deleted, counted in non-2xx, and they come again). Zaqar 23 with its default configuration ignores
    claim_ids and deletes the ids regardless of claim."""
    ids = [href_ids(m["href"]) for m in messages]
    claim_ids = ",".join(dict.fromkeys(c for _, c in ids if c))
    path = f"/v2/queues/{queue}/messages?ids={','.join(i for i, _ in ids)}&claim_ids={claim_ids}"
    status, answer = await conn.request("bulk_delete", "DELETE", path)
    if status != 403:
        _check(status, answer, "bulk delete", conn)


async def claim(conn: Connection, queue: str) -> tuple[int, Any]:
    """POST a claim (limit CLAIM_LIMIT, ttl CLAIM_TTL, grace 60): 201 with messages or 204."""
    status, body = await conn.request(
        "claim", "POST", f"/v2/queues/{queue}/claims?limit={CLAIM_LIMIT}", {"ttl": CLAIM_TTL, "grace": 60}
    )
    _check(status, body, "claim", conn)
    return status, body


async def release(conn: Connection, queue: str, claimed: Any) -> None:
    """DELETE the claim that returned `claimed` (its id is in the messages' hrefs)."""
    _, claim_id = href_ids(claimed["messages"][0]["href"])
    status, answer = await conn.request("release", "DELETE", f"/v2/queues/{queue}/claims/{claim_id}")
    _check(status, answer, "release", conn)


def integrity(seen: Counter[int], n: int, post_retried: Counter[int] | None = None) -> dict[str, int]:
    """Lost and duplicated among messages 0..n-1. A copy beyond the first of a message whose post was retried
    after a 5xx (up to one a retry: `post_retried`) is `duplicated_by_post_retry`, not `duplicated`."""
    retried = post_retried or Counter[int]()
    excused = sum(min(c - 1, retried[s]) for s, c in seen.items() if c > 1 and s in retried)
    copies = sum(c - 1 for c in seen.values() if c > 1) + sum(1 for s in seen if not 0 <= s < n)
    return {
        "lost": sum(1 for s in range(n) if s not in seen),
        "duplicated": copies - excused,
        "duplicated_by_post_retry": excused,
    }


async def read_back(client: Client, queue: str, n: int) -> Counter[int]:
    """Every message in the queue, by paging through the listing (echo on, all clients)."""
    conn, seen = client.untimed(), Counter[int]()
    path = f"/v2/queues/{queue}/messages?echo=true&limit=20"
    while True:
        status, body = await conn.request("list", "GET", path)
        _check(status, body, "list", conn)
        if status == 204 or not body or not body.get("messages"):
            break
        for m in body["messages"]:
            seen[m["body"]["seq"]] += 1
        nxt = next((link["href"] for link in body.get("links", []) if link.get("rel") == "next"), None)
        if nxt is None:
            break
        path = nxt
    conn.close()
    return seen


async def stats_total(conn: Connection, queue: str) -> int:
    """The queue's message count. (Zaqar 23's Redis driver answers 503 now and then when a claim expires while
    it counts: retried, as every 5xx, and it still shows in the non-2xx column.) When the stats still answer
    5xx after the retries, the messages are counted through the listing instead (claimed ones included),
    and the run says how often (`stats_counted_by_listing`): a peer's failing stats are a result, not a
    reason to lose the run's numbers."""
    status, body = await conn.request("stats", "GET", f"/v2/queues/{queue}/stats")
    if status >= 500:
        conn.counted_by_listing["stats"] += 1
        return await listed_total(conn, queue)
    _check(status, body, "stats", conn)
    return int(body["messages"]["total"])


async def listed_total(conn: Connection, queue: str) -> int:
    """The queue's messages, claimed, delayed or not, counted by paging through the listing (its requests are
    recorded as `count`). `marker=0` is "from the start" to both Charon (a counter) and Zaqar 23, whose Redis
    driver answers 503 to `include_claimed=true` without a marker (it asks ZRANK of None)."""
    query = "echo=true&include_claimed=true&include_delayed=true&limit=20&marker=0"
    n, path = 0, f"/v2/queues/{queue}/messages?{query}"
    while True:
        status, body = await conn.request("count", "GET", path)
        _check(status, body, "count by listing", conn)
        if status == 204 or not body or not body.get("messages"):
            return n
        n += len(body["messages"])
        nxt = next((link["href"] for link in body.get("links", []) if link.get("rel") == "next"), None)
        if nxt is None:
            return n
        path = nxt


async def set_metadata(conn: Connection, queue: str, metadata: dict[str, Any]) -> None:
    """PUT the queue with its metadata (Zaqar v2 creates queues this way; a PATCH would need a queue)."""
    status, body = await conn.request("setup", "PUT", f"/v2/queues/{queue}", metadata)
    _check(status, body, "create queue", conn)


async def produce(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    queue = f"produce-{run}"
    if args.queue_metadata:
        await set_metadata(client.untimed(), queue, json.loads(args.queue_metadata))
    phase = client.meter.start()
    start = time.perf_counter()
    await post_all(client, queue, args.messages, run, args.concurrency, timed=True, keyed=args.idempotency)
    elapsed = time.perf_counter() - start
    cpu = phase.done(args.messages)
    seen = await read_back(client, queue, args.messages)
    return {
        "msgs_per_s": args.messages / elapsed,
        "seconds": elapsed,
        **cpu,
        **integrity(seen, args.messages, client.post_retried[queue]),
    }


async def pipeline(
    client: Client, args: argparse.Namespace, run: str, *, bulk: bool = False
) -> dict[str, Any]:
    queue = f"pipeline-{run}"
    if args.queue_metadata:
        await set_metadata(client.untimed(), queue, json.loads(args.queue_metadata))
    await post_all(client, queue, args.messages, run, args.concurrency, timed=False)
    phase = client.meter.start()
    start = time.perf_counter()
    n, within, concurrency = args.messages, args.duration, args.concurrency
    seen, _ = await drain(client, queue, n, within=within, timed=True, concurrency=concurrency, bulk=bulk)
    elapsed = time.perf_counter() - start
    cpu = phase.done(seen.total())
    left = await stats_total(client.untimed(), queue)
    return {
        "msgs_per_s": seen.total() / elapsed,
        "seconds": elapsed,
        "left_in_queue": left,
        **cpu,
        **integrity(seen, args.messages, client.post_retried[queue]),
    }


async def pipeline_bulk(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    return await pipeline(client, args, run, bulk=True)


async def dlq(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    queue, dead = f"dlq-{run}", f"dlq-{run}-dead"  # no dot: Zaqar splits scoped names on "."
    setup = client.untimed()
    await set_metadata(setup, dead, {})
    await set_metadata(
        setup,
        queue,
        {"_max_claim_count": 2, "_dead_letter_queue": dead, "_dead_letter_queue_messages_ttl": 3600},
    )
    await post_all(client, queue, args.messages, run, args.concurrency, timed=False)
    phase = client.meter.start()
    start = time.perf_counter()
    done = asyncio.Event()

    async def consumer(_: int) -> None:
        conn = client.connection()
        while not done.is_set() and time.perf_counter() - start < args.duration:
            status, body = await claim(conn, queue)
            if status == 204 or not body:
                if await stats_total(conn, queue) == 0:
                    done.set()
                else:
                    await asyncio.sleep(0.01)
                continue
            await release(conn, queue, body)
        conn.close()

    await gather(args.concurrency, consumer)
    moving = time.perf_counter() - start
    cpu = phase.done(args.messages)  # stats_total below is not part of the moves
    in_dlq = await stats_total(setup, dead)
    # the drain, timed apart (its requests in drain_requests), each claim's messages deleted with one request
    drained = Recorder()
    phase = client.meter.start()
    drain_start = time.perf_counter()
    seen, first = await drain(
        client, dead, args.messages, within=args.drain_timeout, timed=True, bulk=True, recorder=drained
    )
    draining = time.perf_counter() - drain_start
    drain_cpu = phase.done(seen.total(), prefix="drain_")
    setup.close()
    return {
        "moves_per_s": in_dlq / moving,
        "seconds": moving,
        "dead_lettered": in_dlq,
        **cpu,
        "drain_msgs_per_s": seen.total() / draining,
        "drain_seconds": draining,
        **drain_cpu,
        "dlq_claimable_after_s": first,
        "drain_requests": drained.summary(),
        **integrity(seen, args.messages, client.post_retried[queue]),
    }


async def depth(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    """Claim latency against depth: one consumer claims (limit 10) and releases on a queue of 1,000 and on
    one of `--depth-big`, taking turns between the two, once both are full, so that both are timed against
    the same store (`p50_ratio`). The 1,000 queue is also timed alone before the big one is posted
    (`claim_p50_ms@1000 alone`): `store_ratio`, after over alone, is what the big post did to every queue
    of the store, whatever its depth. (On Redis, a keyspace that crosses a power of two, 2^20 keys here,
    is rehashed a little at a time, which slows every command until it is done: bench/README.md.)"""
    out: dict[str, Any] = {}
    sizes = (1000, args.depth_big)
    queues = {n: f"depth-{n}-{run}" for n in sizes}

    async def turns(recorders: dict[int, Recorder], claims: int) -> None:
        conns = {n: client.connection(rec) for n, rec in recorders.items()}
        for _ in range(claims):
            for n, conn in conns.items():
                _, body = await claim(conn, queues[n])
                await release(conn, queues[n], body)
        for conn in conns.values():
            conn.close()

    await post_all(client, queues[1000], 1000, run, args.concurrency, timed=False)
    await turns(alone := {1000: Recorder()}, args.depth_claims)
    out["claim_p50_ms@1000 alone"] = alone[1000].summary()["claim"]["p50_ms"]
    await post_all(client, queues[args.depth_big], args.depth_big, run, args.concurrency, timed=False)
    await turns(recorders := {n: Recorder() for n in sizes}, args.depth_claims)
    for n, rec in recorders.items():
        for kind, stats in rec.summary().items():
            client.recorder.latencies[f"{kind}@{n}"] = rec.latencies[kind]
            client.recorder.statuses[f"{kind}@{n}"] = rec.statuses[kind]
            out[f"{kind}_p50_ms@{n}"] = stats["p50_ms"]
    for n in sizes:
        seen = await read_back(client, queues[n], n) if n <= 20_000 else None
        if seen is not None:
            out[f"integrity@{n}"] = integrity(seen, n, client.post_retried[queues[n]])
        out[f"queued@{n}"] = await stats_total(client.untimed(), queues[n])
    out["p50_ratio"] = out[f"claim_p50_ms@{args.depth_big}"] / out["claim_p50_ms@1000"]
    out["store_ratio"] = out["claim_p50_ms@1000"] / out["claim_p50_ms@1000 alone"]
    out["lost"] = out["duplicated"] = 0  # claims were released: nothing is consumed, the counts above
    return out


async def ping(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    phase = client.meter.start()
    start = time.perf_counter()

    async def pinger(_: int) -> None:
        conn = client.connection()
        while time.perf_counter() - start < args.duration:
            status, _ = await conn.request("ping", "GET", "/v2/ping")
            if status not in (200, 204):
                raise HttpError(f"ping: HTTP {status}")
        conn.close()

    await gather(args.concurrency, pinger)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, **phase.done(client.recorder.requests()), "lost": 0, "duplicated": 0}


async def store_commands(redis_url: str | None) -> int | None:
    """Commands the redis-server has executed so far (INFO stats), None without a URL."""
    if not redis_url:
        return None
    import redis.asyncio

    r = redis.asyncio.Redis.from_url(redis_url)
    try:
        return int((await r.info("stats"))["total_commands_processed"])
    finally:
        await r.aclose()


class Pollers:
    """Consumers that claim from `queue` until stopped, long polling (`?wait=`) or short polling (a pause of
    --poll-interval after each 204, jittered by 10 %, their first claims spread over one interval: as
    independent clients would be; without the jitter, one slow answer puts several in step for good, and
    they poll in bursts). Each deletes what it claims (with the claim id) and notes the latency from the
    post's send time in the body to the claim's answer. A consumer's error ends `pause` at once."""

    def __init__(self, client: Client, queue: str, args: argparse.Namespace, n: int) -> None:
        self.client, self.queue, self.args, self.n = client, queue, args, n
        self.long = args.poll == "long"
        self.path = f"/v2/queues/{queue}/claims?limit={CLAIM_LIMIT}" + (
            f"&wait={args.wait}" if self.long else ""
        )
        self.latencies: list[float] = []
        self.seen: Counter[int] = Counter()
        self.all_seen = asyncio.Event()
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tasks = [asyncio.ensure_future(self._consume(i)) for i in range(args.concurrency)]

    async def _consume(self, i: int) -> None:
        conn, claim_body = self.client.connection(), {"ttl": CLAIM_TTL, "grace": 60}
        try:
            if not self.long:
                await asyncio.sleep(self.args.poll_interval * i / self.args.concurrency)
            while True:
                status, body = await conn.request("claim", "POST", self.path, claim_body)
                arrived = time.perf_counter()
                _check(status, body, "claim", conn)
                if status == 204 or not body:
                    if not self.long:
                        await asyncio.sleep(self.args.poll_interval * random.uniform(0.9, 1.1))
                    continue
                for m in body["messages"]:
                    self.latencies.append(arrived - m["body"]["sent"])
                    self.seen[m["body"]["seq"]] += 1
                for m in body["messages"]:
                    message_id, claim_id = href_ids(m["href"])
                    path = f"/v2/queues/{self.queue}/messages/{message_id}?claim_id={claim_id}"
                    status, answer = await conn.request("delete", "DELETE", path)
                    _check(status, answer, "delete", conn)
                if len(self.seen) >= self.n:
                    self.all_seen.set()
        except Exception as e:
            if not self.failure.done():
                self.failure.set_exception(e)
            raise
        finally:
            conn.close()

    async def pause(self, seconds: float, until: asyncio.Event | None = None) -> None:
        """Sleep `seconds`, or less once `until` is set; raise a consumer's error as soon as there is one."""
        waiter: asyncio.Future[Any] = asyncio.ensure_future(until.wait() if until else asyncio.sleep(seconds))
        either: list[asyncio.Future[Any]] = [waiter, self.failure]
        await asyncio.wait(either, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.failure.done():
            self.failure.result()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.failure.done() and not self.failure.cancelled():
            self.failure.exception()  # retrieved (and raised by pause, if anyone paused since)


async def post_at_random(client: Client, pollers: Pollers, run: str, spread: float) -> None:
    """Post messages 0..pollers.n-1 one a POST, at random moments over `spread` seconds, from a connection of
    their own; each body holds the moment its post was sent (`sent`, this process's perf_counter)."""
    producer = client.connection()
    start = time.perf_counter()
    for seq, at in enumerate(sorted(random.uniform(0, spread) for _ in range(pollers.n))):
        await pollers.pause(max(0.0, start + at - time.perf_counter()))
        message = {"ttl": 3600, "body": {**message_body(seq, run), "sent": time.perf_counter()}}
        path = f"/v2/queues/{pollers.queue}/messages"
        status, answer = await producer.request("post", "POST", path, {"messages": [message]})
        _check(status, answer, "post", producer)
    producer.close()


async def idle(client: Client, args: argparse.Namespace, run: str) -> dict[str, Any]:
    """16 consumers (Pollers) on an empty queue. First --idle-seconds with nothing to claim: the store's
    commands (INFO of --redis-url) and the servers' CPU. Then --idle-messages posted at random moments over
    --idle-spread seconds: post-to-claim latency, when the claim's answer arrived minus when the message's
    post was sent."""
    queue = f"idle-{run}"
    setup = client.untimed()
    await set_metadata(setup, queue, {})
    setup.close()
    pollers = Pollers(client, queue, args, args.idle_messages)
    try:
        await pollers.pause(0.5)  # every consumer has its first claim in
        claims_before = len(client.recorder.latencies["claim"])
        commands_before = await store_commands(args.redis_url)
        phase = client.meter.start()
        await pollers.pause(args.idle_seconds)
        idle_cpu = phase.done(1, prefix="idle_")
        commands_after = await store_commands(args.redis_url)
        idle_claims = len(client.recorder.latencies["claim"]) - claims_before
        phase = client.meter.start()
        start = time.perf_counter()
        await post_at_random(client, pollers, run, args.idle_spread)
        await pollers.pause(args.duration, until=pollers.all_seen)
        delivering = time.perf_counter() - start
        delivery_cpu = phase.done(len(pollers.seen))
        commands_end = await store_commands(args.redis_url)
    finally:
        await pollers.stop()
    latencies = sorted(pollers.latencies)
    out: dict[str, Any] = {
        "poll": f"long (wait={args.wait})" if pollers.long else f"short ({args.poll_interval * 1000:.0f} ms)",
        "seconds": delivering,
        "idle_seconds": args.idle_seconds,
        "idle_claim_requests": idle_claims,
        **{k: v for k, v in idle_cpu.items() if not k.endswith("_us_per_msg")},
        "post_to_claim_p50_ms": _pct(latencies, 0.50) * 1000 if latencies else None,
        "post_to_claim_p99_ms": _pct(latencies, 0.99) * 1000 if latencies else None,
        **delivery_cpu,
        **integrity(pollers.seen, args.idle_messages),
    }
    if commands_before is not None and commands_after is not None and commands_end is not None:
        out["idle_store_commands"] = commands_after - commands_before - 1  # not the INFO that read it
        out["idle_store_commands_per_s"] = out["idle_store_commands"] / args.idle_seconds
        out["store_commands_per_msg"] = (commands_end - commands_after - 1) / max(len(pollers.seen), 1)
    return out


async def run_workload(args: argparse.Namespace) -> dict[str, Any]:
    run = uuid.uuid4().hex[:10]
    if args.transport == "ws" and args.workload not in WS_WORKLOADS:
        raise SystemExit(f"--transport ws runs {', '.join(WS_WORKLOADS)} only")
    client = Client(args.url, args.project, Meter(pid_list(args.server_pids)), args.transport)
    start = time.perf_counter()
    result = await globals()[args.workload.replace("-", "_")](client, args, run)
    wall = time.perf_counter() - start
    timed = result.get("seconds", wall)
    return {
        "workload": args.workload,
        "url": args.url,
        "messages": args.idle_messages if args.workload == "idle" else args.messages,
        "concurrency": args.concurrency,
        "transport": args.transport,
        **result,
        "requests_per_s": client.recorder.requests() / timed if args.workload != "depth" else None,
        "retried_5xx": dict(sorted(client.retries.items())),
        "stats_counted_by_listing": client.counted_by_listing.total(),
        "requests": client.recorder.summary(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"workload {result['workload']} against {result['url']}"]
    for key, value in result.items():
        if key in ("workload", "url", "requests", "drain_requests"):
            continue
        lines.append(f"  {key:<26} {value:,.2f}" if isinstance(value, float) else f"  {key:<26} {value}")
    lines.append(f"  {'request':<12} {'count':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  non-2xx")
    for kind, s in result["requests"].items():
        lines.append(
            f"  {kind:<12} {s['count']:>8} {s['p50_ms']:>8.2f} {s['p95_ms']:>8.2f} {s['p99_ms']:>8.2f}  "
            f"{s['non_2xx'] or '-'}"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench.loadgen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8888")
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument("--messages", type=int, default=20_000, help="messages per run (default 20,000)")
    p.add_argument("--duration", type=float, default=120.0, help="time bound of the timed phase, seconds")
    p.add_argument("--drain-timeout", type=float, default=150.0, help="dlq: time bound of the DLQ drain")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--depth-big", type=int, default=1_000_000)
    p.add_argument("--depth-claims", type=int, default=500, help="depth: claims timed per queue")
    p.add_argument("--project", default="bench")
    p.add_argument(
        "--idempotency", action="store_true", help="produce: every post carries an Idempotency-Key of its own"
    )
    p.add_argument(
        "--queue-metadata",
        help="produce, pipeline, pipeline-bulk: a JSON object the queue is made with first (e.g. "
        "'{\"_enable_encrypt_messages\": true}')",
    )
    p.add_argument("--server-pids", default="", help="pids (comma-separated) of the server processes")
    p.add_argument("--redis-url", help="idle: the service's redis-server, to count its commands")
    p.add_argument("--poll", choices=("long", "short"), default="long", help="idle: how consumers wait")
    p.add_argument("--wait", type=int, default=20, help="idle, long polling: the claims' wait (seconds)")
    p.add_argument("--poll-interval", type=float, default=0.1, help="idle, short polling: pause after a 204")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle: time with nothing to claim")
    p.add_argument("--idle-messages", type=int, default=1000, help="idle: messages posted after it")
    p.add_argument("--idle-spread", type=float, default=10.0, help="idle: seconds the posts spread over")
    p.add_argument(
        "--transport",
        choices=("http", "ws"),
        default="http",
        help="the timed requests over HTTP, or as Zaqar's websocket actions (Charon; produce, pipeline, "
        "pipeline-bulk)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


Workload = Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]


def run_cli(args: argparse.Namespace, workload: Workload) -> int:
    """A load generator's command: run `workload` on uvloop (when installed), print its result (JSON with
    --json, else the table), and exit 0 when nothing was lost or duplicated. bench/amqp.py's too."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    result = asyncio.run(workload(args))
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0 if result.get("lost", 0) == 0 and result.get("duplicated", 0) == 0 else 1


def main(argv: list[str] | None = None) -> int:
    return run_cli(parser().parse_args(argv), run_workload)


if __name__ == "__main__":
    sys.exit(main())
