"""The AMQP side of the benchmark: bench/loadgen.py's workloads against RabbitMQ, with aio-pika and uvloop.

Same messages as the HTTP load generator (about 256 bytes of JSON with a sequence number and a run id), the
same count, 16 clients (each its own connection and channel), quorum queues, and the same integrity check
(lost and duplicated sequence numbers). Workloads (see bench/README.md):

  produce      16 producers publish with publisher confirms in batches of 10 (publish 10, then await
               their 10 confirms) until --messages are confirmed; then the queue is read back
  produce-one  the same, one message at a time (publish, await its confirm)
  pipeline     --messages published (untimed), then 16 consumers (prefetch 10) ack each message
  dlq          a quorum queue with x-delivery-limit (each message delivered --deliveries times, as often as
               Charon's dlq workload claims it), a dead-letter exchange with x-dead-letter-strategy
               at-least-once into a quorum DLQ; 16 consumers (prefetch 10) nack with requeue until every
               message is in the DLQ (timed: moves/s); then the DLQ is drained, ack each (timed: drain)

With --server-pids (RabbitMQ's beam.smp) it reports the server's CPU per message in each timed phase, and
always its own (client) CPU: on a 2-core machine this Python client, not the broker, is often the limit.

Run: .venv/bin/python -m bench.amqp --url amqp://guest:guest@127.0.0.1:5672/ --workload pipeline [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from bench.cpu import Meter, pid_list
from bench.loadgen import BATCH, Recorder, integrity, message_body, run_cli

WORKLOADS = ("produce", "produce-one", "pipeline", "dlq")
PREFETCH = 10
QUORUM: dict[str, Any] = {"x-queue-type": "quorum"}
PUBLISH_RETRIES = 5  # a publish the broker nacks is published again, as a client would, at most this often


class Amqp:
    """Connections to one broker, the timed requests' latencies, and the CPU meter."""

    def __init__(self, url: str, meter: Meter) -> None:
        self.url, self.meter = url, meter
        self.recorder = Recorder()
        self.retries: Counter[str] = Counter()
        self.connections: list[AbstractConnection] = []
        self.control: AbstractChannel | None = None  # for counting

    async def channel(self, *, prefetch: int = 0) -> AbstractChannel:
        """A channel (publisher confirms on) on a connection of its own, closed by `close()`."""
        connection = await aio_pika.connect(self.url)
        self.connections.append(connection)
        channel = await connection.channel(publisher_confirms=True)
        if prefetch:
            await channel.set_qos(prefetch_count=prefetch)
        return channel

    async def close(self) -> None:
        for connection in self.connections:
            with contextlib.suppress(Exception):
                await connection.close()
        self.connections.clear()
        self.control = None

    async def count(self, queue: str) -> int:
        """Ready messages in `queue` (a passive declare)."""
        if self.control is None:
            self.control = await self.channel()
        declared = await self.control.declare_queue(queue, passive=True)
        assert declared.declaration_result.message_count is not None
        return declared.declaration_result.message_count


def body(seq: int, run: str) -> bytes:
    return json.dumps(message_body(seq, run)).encode()


async def gather(n: int, worker: Callable[[int], Awaitable[None]]) -> None:
    await asyncio.gather(*(worker(i) for i in range(n)))


async def publish_all(
    amqp: Amqp, queue: str, n: int, run: str, concurrency: int, *, batch: int, timed: bool
) -> None:
    """Publish messages 0..n-1 from `concurrency` channels, `batch` at a time, each batch's confirms awaited
    before the next. A nacked message is published again (counted in `retries["publish nack"]`)."""
    next_seq: Iterator[int] = iter(range(0, n, batch))
    recorder = amqp.recorder if timed else Recorder()

    async def producer(_: int) -> None:
        exchange = (await amqp.channel()).default_exchange

        async def one(seq: int) -> None:
            for attempt in range(PUBLISH_RETRIES):
                try:
                    await exchange.publish(aio_pika.Message(body(seq, run)), routing_key=queue)
                    return
                except aio_pika.exceptions.DeliveryError:
                    if attempt == PUBLISH_RETRIES - 1:
                        raise
                    amqp.retries["publish nack"] += 1
                    await asyncio.sleep(0.05 * 2**attempt)

        for first in next_seq:
            start = time.perf_counter()
            if batch == 1:
                await one(first)
            else:
                await asyncio.gather(*(one(s) for s in range(first, min(first + batch, n))))
            recorder.add("publish" if batch == 1 else f"publish {batch}", 200, time.perf_counter() - start)

    await gather(concurrency, producer)


async def declare(amqp: Amqp, name: str, arguments: dict[str, Any] | None = None) -> None:
    channel = await amqp.channel()
    await channel.declare_queue(name, durable=True, arguments={**QUORUM, **(arguments or {})})
    await channel.close()


async def consume(
    amqp: Amqp,
    queue: str,
    concurrency: int,
    handle: Callable[[AbstractIncomingMessage], Awaitable[None]],
    *,
    done: Callable[[], bool],
    within: float,
    no_ack: bool = False,
) -> None:
    """`concurrency` consumers (each its own connection and channel, PREFETCH unacknowledged at most) pass
    every delivery to `handle` until `done()` or `within` seconds; then they cancel. With no_ack, the broker
    sends without waiting for acknowledgements (a read-back)."""
    finished = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        await handle(message)
        if done():
            finished.set()

    queues: list[tuple[AbstractQueue, str]] = []
    for _ in range(concurrency):
        channel = await amqp.channel(prefetch=0 if no_ack else PREFETCH)
        q = await channel.get_queue(queue, ensure=False)
        queues.append((q, await q.consume(on_message, no_ack=no_ack)))
    if not done():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), within)
    for q, tag in queues:
        with contextlib.suppress(Exception):
            await q.cancel(tag)


def seq_of(message: AbstractIncomingMessage) -> int:
    return int(json.loads(message.body)["seq"])


async def drain(
    amqp: Amqp, queue: str, n: int, concurrency: int, *, within: float, ack: bool = True
) -> Counter[int]:
    """Consume until every one of the n sequence numbers was seen (ack each; ack=False: a read-back, the
    broker not waiting for acknowledgements)."""
    seen: Counter[int] = Counter()

    async def handle(message: AbstractIncomingMessage) -> None:
        seen[seq_of(message)] += 1
        if ack:
            await message.ack()

    await consume(
        amqp, queue, concurrency, handle, done=lambda: len(seen) >= n, within=within, no_ack=not ack
    )
    return seen


async def produce(amqp: Amqp, args: argparse.Namespace, run: str, *, batch: int = BATCH) -> dict[str, Any]:
    queue = f"produce-{run}"
    await declare(amqp, queue)
    phase = amqp.meter.start()
    start = time.perf_counter()
    await publish_all(amqp, queue, args.messages, run, args.concurrency, batch=batch, timed=True)
    elapsed = time.perf_counter() - start
    cpu = phase.done(args.messages)
    seen = await drain(amqp, queue, args.messages, 1, within=args.duration, ack=False)
    return {
        "msgs_per_s": args.messages / elapsed,
        "seconds": elapsed,
        "batch": batch,
        **cpu,
        **integrity(seen, args.messages),
    }


async def produce_one(amqp: Amqp, args: argparse.Namespace, run: str) -> dict[str, Any]:
    return await produce(amqp, args, run, batch=1)


async def pipeline(amqp: Amqp, args: argparse.Namespace, run: str) -> dict[str, Any]:
    queue = f"pipeline-{run}"
    await declare(amqp, queue)
    await publish_all(amqp, queue, args.messages, run, args.concurrency, batch=BATCH, timed=False)
    phase = amqp.meter.start()
    start = time.perf_counter()
    seen = await drain(amqp, queue, args.messages, args.concurrency, within=args.duration)
    elapsed = time.perf_counter() - start
    cpu = phase.done(seen.total())
    return {
        "msgs_per_s": seen.total() / elapsed,
        "seconds": elapsed,
        "left_in_queue": await amqp.count(queue),
        **cpu,
        **integrity(seen, args.messages),
    }


async def dlq(amqp: Amqp, args: argparse.Namespace, run: str) -> dict[str, Any]:
    queue, dead, exchange = f"dlq-{run}", f"dlq-{run}-dead", f"dlx-{run}"
    channel = await amqp.channel()
    dlx = await channel.declare_exchange(exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    dlq_queue = await channel.declare_queue(dead, durable=True, arguments=QUORUM)
    await dlq_queue.bind(dlx, routing_key=dead)
    await declare(
        amqp,
        queue,
        {
            # a message returned more than x-delivery-limit times is dead-lettered: --deliveries in all
            "x-delivery-limit": args.deliveries - 1,
            "x-dead-letter-exchange": exchange,
            "x-dead-letter-routing-key": dead,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",  # at-least-once dead-lettering needs it
        },
    )
    await publish_all(amqp, queue, args.messages, run, args.concurrency, batch=BATCH, timed=False)
    deliveries: Counter[int] = Counter()
    in_dlq = 0

    async def handle(message: AbstractIncomingMessage) -> None:
        deliveries[seq_of(message)] += 1
        await message.nack(requeue=True)

    async def moved() -> None:  # the DLQ's count, until it holds every message
        nonlocal in_dlq
        while in_dlq < args.messages:
            in_dlq = await amqp.count(dead)
            await asyncio.sleep(0.02)

    phase = amqp.meter.start()
    start = time.perf_counter()
    watcher = asyncio.ensure_future(moved())
    await consume(
        amqp,
        queue,
        args.concurrency,
        handle,
        done=lambda: sum(deliveries.values()) >= args.deliveries * args.messages,
        within=args.duration,
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(watcher, max(1.0, args.duration - (time.perf_counter() - start)))
    moving = time.perf_counter() - start
    cpu = phase.done(in_dlq)

    first: list[float] = []
    seen: Counter[int] = Counter()

    async def ack(message: AbstractIncomingMessage) -> None:
        if not first:
            first.append(time.perf_counter())
        seen[seq_of(message)] += 1
        await message.ack()

    phase = amqp.meter.start()
    drain_start = time.perf_counter()
    await consume(
        amqp,
        dead,
        args.concurrency,
        ack,
        done=lambda: len(seen) >= args.messages,
        within=args.drain_timeout,
    )
    draining = time.perf_counter() - drain_start
    return {
        "moves_per_s": in_dlq / moving,
        "seconds": moving,
        "dead_lettered": in_dlq,
        "deliveries_each": {str(k): v for k, v in sorted(Counter(deliveries.values()).items())},
        **cpu,
        "drain_msgs_per_s": seen.total() / draining,
        "drain_seconds": draining,
        "dlq_first_delivery_after_s": first[0] - drain_start if first else None,
        **phase.done(seen.total(), prefix="drain_"),
        "left_in_source": await amqp.count(queue),
        **integrity(seen, args.messages),
    }


async def run_workload(args: argparse.Namespace) -> dict[str, Any]:
    run = uuid.uuid4().hex[:10]
    amqp = Amqp(args.url, Meter(pid_list(args.server_pids)))
    workload = {"produce": produce, "produce-one": produce_one, "pipeline": pipeline, "dlq": dlq}
    try:
        result = await workload[args.workload](amqp, args, run)
    finally:
        await amqp.close()
    return {
        "workload": args.workload,
        "url": args.url,
        "messages": args.messages,
        "concurrency": args.concurrency,
        **result,
        "requests_per_s": None,
        "retried": dict(sorted(amqp.retries.items())),
        "requests": amqp.recorder.summary(),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench.amqp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument("--messages", type=int, default=20_000, help="messages per run (default 20,000)")
    p.add_argument("--duration", type=float, default=120.0, help="time bound of the timed phase, seconds")
    p.add_argument("--drain-timeout", type=float, default=150.0, help="dlq: time bound of the DLQ drain")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--deliveries",
        type=int,
        default=2,
        help="dlq: deliveries of each message before it is dead-lettered (Charon's _max_claim_count 2: 2)",
    )
    p.add_argument("--server-pids", default="", help="pids (comma-separated) of the server processes")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_cli(parser().parse_args(argv), run_workload)


if __name__ == "__main__":
    sys.exit(main())
