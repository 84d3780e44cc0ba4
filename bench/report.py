"""What bench/compare.py prints: the targets (issues 8 and 20) with what the run measured, and every run's
rates, server and load-generator CPU per message, integrity and request latencies, as Markdown.

`results` is {workload: {system: result}}: a result is bench/loadgen.py's or bench/amqp.py's JSON, or
{"failed": why} when the run did not finish (a target that needs it is then not met).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

Results = dict[str, dict[str, Any]]
Target = tuple[str, float | None, str, bool]  # what, measured (None: its run failed), goal, met

# Systems' labels in the results
CHARON, ZAQAR, RABBITMQ, BARE = "charon", "zaqar", "rabbitmq", "bare_fastapi"
RABBITMQ_ONE = "rabbitmq one-by-one"
CHARON_WS = "charon websocket"  # Charon's timed requests as Zaqar's websocket actions (bench/loadgen.py)
LONG, SHORT, ZAQAR_SHORT = "charon long poll", "charon short poll", "zaqar short poll"
# Charon with every counted quota and request rate set (far above what the bench uses, so all is counted and
# nothing refused), and Charon with its queues encrypted at rest (bench/compare.py VARIANTS)
CHARON_QUOTAS, CHARON_ENCRYPTED = "charon quotas", "charon encrypted"
# results[VARIANT_ROUNDS][workload][system]: server CPU us a message of each round (None: failed), Charon and
# its variants taking turns (bench/compare.py variant_rounds); not a workload of the tables
VARIANT_ROUNDS = "variant rounds"
CLIENT_BOUND = 0.7  # the load generator (one Python process) used this share of a core or more


def value(results: Results, workload: str, system: str, key: str) -> float | None:
    """A number from a finished run; None when the run is missing, failed or lacks the key."""
    r = results.get(workload, {}).get(system)
    if not r or "failed" in r or r.get(key) is None:
        return None
    return float(r[key])


def targets(results: Results) -> list[Target]:
    """Each target whose runs were part of this run: issue 8's (against Zaqar, claimable, depth, ping),
    issue 20's (bulk acknowledge against pipeline and RabbitMQ, DLQ drain, long polling), issue 42's (the
    same against Zaqar in server CPU a message too, produce and ping raised, the consume path's server CPU a
    message against RabbitMQ's) and issue 44's (Charon's variants against Charon)."""
    rows: list[Target] = []

    def ran(*pairs: tuple[str, str]) -> bool:
        return all(system in results.get(workload, {}) for workload, system in pairs)

    def ratio(label: str, a: tuple[str, str, str], b: tuple[str, str, str], goal: float) -> None:
        if not ran(a[:2], b[:2]):
            return
        x, y = value(results, *a), value(results, *b)
        measured = x / y if x is not None and y else None
        rows.append((label, measured, f">= {goal}", measured is not None and measured >= goal))

    def cpu(label: str, a: tuple[str, str], b: tuple[str, str], goal: float, prefix: str = "") -> None:
        """Server CPU a message, a's over b's, at most `goal`."""
        if not ran(a, b):
            return
        key = f"{prefix}server_cpu_us_per_msg"
        x, y = value(results, *a, key), value(results, *b, key)
        measured = x / y if x is not None and y else None
        rows.append((label, measured, f"<= {goal}", measured is not None and measured <= goal))

    def bound(label: str, at: tuple[str, str, str], goal: str, ok: Callable[[float], bool]) -> None:
        if ran(at[:2]):
            v = value(results, *at)
            rows.append((label, v, goal, v is not None and ok(v)))

    ratio(
        "produce msgs/s, Charon / Zaqar",
        ("produce", CHARON, "msgs_per_s"),
        ("produce", ZAQAR, "msgs_per_s"),
        4.0,
    )
    cpu("produce server CPU/msg, Charon / Zaqar", ("produce", CHARON), ("produce", ZAQAR), 0.25)
    ratio(
        "pipeline consume msgs/s, Charon / Zaqar",
        ("pipeline", CHARON, "msgs_per_s"),
        ("pipeline", ZAQAR, "msgs_per_s"),
        5.0,
    )
    cpu("pipeline server CPU/msg, Charon / Zaqar", ("pipeline", CHARON), ("pipeline", ZAQAR), 0.2)
    ratio("dlq moves/s, Charon / Zaqar", ("dlq", CHARON, "moves_per_s"), ("dlq", ZAQAR, "moves_per_s"), 5.0)
    cpu("dlq server CPU/move, Charon / Zaqar", ("dlq", CHARON), ("dlq", ZAQAR), 0.2)
    bound(
        "dlq: seconds until dead-lettered messages are claimable (Charon)",
        ("dlq", CHARON, "dlq_claimable_after_s"),
        "< 1",
        lambda v: v < 1,
    )
    bound(
        "depth: claim p50 at the big depth / at 1k, taking turns (Charon)",
        ("depth", CHARON, "p50_ratio"),
        "<= 1.5",
        lambda v: v <= 1.5,
    )
    ratio(
        "GET /v2/ping req/s, Charon / bare FastAPI",
        ("ping", CHARON, "requests_per_s"),
        ("ping", BARE, "requests_per_s"),
        1.5,
    )
    ratio(
        "pipeline-bulk msgs/s / pipeline msgs/s (Charon)",
        ("pipeline-bulk", CHARON, "msgs_per_s"),
        ("pipeline", CHARON, "msgs_per_s"),
        2.0,
    )
    ratio(
        "pipeline-bulk msgs/s (Charon) / RabbitMQ pipeline msgs/s",
        ("pipeline-bulk", CHARON, "msgs_per_s"),
        ("pipeline", RABBITMQ, "msgs_per_s"),
        1.0,
    )
    cpu(
        "pipeline-bulk server CPU/msg, Charon / RabbitMQ pipeline",
        ("pipeline-bulk", CHARON),
        ("pipeline", RABBITMQ),
        0.8,
    )
    ratio(
        "DLQ drain msgs/s, Charon (bulk acknowledge) / RabbitMQ",
        ("dlq", CHARON, "drain_msgs_per_s"),
        ("dlq", RABBITMQ, "drain_msgs_per_s"),
        1.0,
    )
    cpu("DLQ drain server CPU/msg, Charon / RabbitMQ", ("dlq", CHARON), ("dlq", RABBITMQ), 0.8, "drain_")
    ratio(
        "idle: store commands, short polling (100 ms) / long polling (Charon)",
        ("idle", SHORT, "idle_store_commands"),
        ("idle", LONG, "idle_store_commands"),
        10.0,
    )
    bound(
        "idle: post-to-claim p50 ms, long polling (Charon)",
        ("idle", LONG, "post_to_claim_p50_ms"),
        "<= 5",
        lambda v: v <= 5,
    )
    # issue 44: what the features cost a message: the median over the rounds of each round's ratio
    labels = {
        CHARON_QUOTAS: ("Charon with quotas / without", 1.1),
        CHARON_ENCRYPTED: ("queues encrypted / not", 1.2),
    }
    for workload, by_system in results.get(VARIANT_ROUNDS, {}).items():
        for variant, (what, goal) in labels.items():
            if variant not in by_system:
                continue
            pairs = zip(by_system[variant], by_system.get(CHARON, []), strict=False)
            each = [x / y for x, y in pairs if x is not None and y]
            measured = statistics.median(each) if each else None
            label = f"{workload} server CPU/msg, {what} (median of {len(by_system[variant])} rounds)"
            rows.append((label, measured, f"<= {goal}", measured is not None and measured <= goal))
    return rows


def _num(v: Any, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def _cpu(r: dict[str, Any], prefix: str = "") -> tuple[str, str, str]:
    """(server CPU us/msg, load generator CPU us/msg, "server / loadgen" cores)."""
    server, client = r.get(f"{prefix}server_cpu_us_per_msg"), r.get(f"{prefix}client_cpu_us_per_msg")
    cores = f"{_num(r.get(f'{prefix}server_cores'), '.2f')} / {_num(r.get(f'{prefix}client_cores'), '.2f')}"
    return _num(server), _num(client), cores


def _row(workload: str, system: str, r: dict[str, Any], prefix: str = "", requests: str = "requests") -> str:
    if "failed" in r:
        return f"| {workload} | {system} | **failed** | | | | | | | {r['failed']} | | |"
    rate = r.get(f"{prefix}msgs_per_s") if prefix else (r.get("msgs_per_s") or r.get("moves_per_s"))
    reqs = r.get(requests) or {}
    p50 = ", ".join(f"{k} {v['p50_ms']:.1f}" for k, v in reqs.items()) or "-"
    bad = {k: v["non_2xx"] for k, v in reqs.items() if v["non_2xx"]} or "-"
    retried = "-" if prefix else (r.get("retried_5xx") or r.get("retried") or "-")  # a run's, on its row
    dup = f"{r.get('duplicated', '-')}"
    if r.get("duplicated_by_post_retry"):
        dup += f" (+{r['duplicated_by_post_retry']} after a post retried on a 5xx)"
    server, client, cores = _cpu(r, prefix)
    reqs_s = "-" if prefix else _num(r.get("requests_per_s"))
    return (
        f"| {workload} | {system} | {_num(rate)} | {server} | {client} | {cores} | {reqs_s} | "
        f"{r.get('lost', '-')} | {dup} | {p50} | {bad} | {retried} |"
    )


def markdown(results: Results, heading: str) -> str:
    out = [heading, "", "| target | measured | goal | met |", "| --- | --- | --- | --- |"]
    if not targets(results):
        out.append("| (no target needs only these workloads and peers) | | | |")
    for label, measured, goal, ok in targets(results):
        shown = "run failed" if measured is None else f"{measured:.2f}"
        out.append(f"| {label} | {shown} | {goal} | {'yes' if ok else '**no**'} |")
    out += [
        "",
        "| workload | system | msgs/s | server CPU us/msg | loadgen CPU us/msg | cores server / loadgen "
        "| req/s | lost | dup | p50 ms by request | non-2xx | 5xx retried |",
        "| --- " * 12 + "|",
    ]
    for workload, by_system in results.items():
        if workload in ("idle", VARIANT_ROUNDS):
            continue
        for system, r in by_system.items():
            out.append(_row(workload, system, r))
            if workload == "dlq" and "drain_msgs_per_s" in r:
                out.append(_row("dlq drain", system, r, prefix="drain_", requests="drain_requests"))
    out += _idle(results.get("idle", {}))
    out += _variant_rounds(results.get(VARIANT_ROUNDS, {}))
    out += _notes(results)
    return "\n".join(out)


def _variant_rounds(by_workload: dict[str, Any]) -> list[str]:
    if not by_workload:
        return []
    out = ["", "| variant rounds | system | server CPU us/msg, each round |", "| --- | --- | --- |"]
    for workload, by_system in by_workload.items():
        for system, cpus in by_system.items():
            out.append(
                f"| {workload} | {system} | {', '.join('failed' if c is None else _num(c) for c in cpus)} |"
            )
    return out


def _idle(by_system: dict[str, Any]) -> list[str]:
    if not by_system:
        return []
    out = [
        "",
        "| idle | claims/s while idle | store commands/s while idle | server cores while idle | "
        "post-to-claim p50 ms | p99 ms | server CPU us/msg delivering | store commands/msg delivering | lost "
        "| dup |",
        "| --- " * 10 + "|",
    ]
    for system, r in by_system.items():
        if "failed" in r:
            out.append(f"| {system} | **failed**: {r['failed']} | | | | | | | | |")
            continue
        claims = r["idle_claim_requests"] / r["idle_seconds"]
        out.append(
            f"| {system} | {claims:,.1f} | {_num(r.get('idle_store_commands_per_s'), ',.1f')} | "
            f"{_num(r.get('idle_server_cores'), '.3f')} | {_num(r.get('post_to_claim_p50_ms'), '.2f')} | "
            f"{_num(r.get('post_to_claim_p99_ms'), '.2f')} | {_num(r.get('server_cpu_us_per_msg'))} | "
            f"{_num(r.get('store_commands_per_msg'), '.1f')} | {r.get('lost', '-')} | "
            f"{r.get('duplicated', '-')} |"
        )
    return out


def _notes(results: Results) -> list[str]:
    out = [""]
    runs = [
        (w, s, r)
        for w, by in results.items()
        if w != VARIANT_ROUNDS
        for s, r in by.items()
        if "failed" not in r
    ]
    if any(r.get("retried_5xx") for *_, r in runs):
        out.append(
            "5xx retried: requests answered 5xx and tried again after a pause, by request type, set-up and "
            "read-back included (non-2xx counts the timed requests' answers, each 5xx among them). A copy "
            "beyond the first of a message whose post was retried on a 5xx is in brackets in dup, not in "
            "its count (see bench/README.md)."
        )
        out.append("")
    by_listing = "stats_counted_by_listing"
    listed = [f"{w} {s} ({r[by_listing]})" for w, s, r in runs if r.get(by_listing)]
    if listed:
        out.append(
            "Stats unanswered: the queue's stats still answered 5xx after every retry, so the run counted "
            "its messages through the listing instead (the `count` requests), this many times: "
            + "; ".join(listed)
            + "."
        )
        out.append("")
    bound = [
        f"{w} {s} ({r['client_cores']:.2f} of a core; broker {r.get('server_cores', 0):.2f})"
        for w, s, r in runs
        if s.startswith(RABBITMQ) and r.get("client_cores", 0) >= CLIENT_BOUND
    ]
    if bound:
        out.append(
            "Client-bound: in these RabbitMQ runs the load generator (one Python process, aio-pika) used "
            f"{CLIENT_BOUND:.0%} of a core or more, about what one process gets on this 2-core machine "
            "beside the broker: their rates are the Python client's more than the broker's: "
            + "; ".join(bound)
            + "."
        )
    for system, r in results.get("dlq", {}).items():
        if "failed" not in r:
            after = r.get("dlq_claimable_after_s", r.get("dlq_first_delivery_after_s"))
            extra = f", deliveries per message {r['deliveries_each']}" if "deliveries_each" in r else ""
            out.append(
                f"- dlq, {system}: dead-lettered messages claimable after {_num(after, '.3f')} s{extra}"
            )
    for system, r in results.get("depth", {}).items():
        if "failed" not in r:
            p50s = {k: round(v, 2) for k, v in r.items() if k.startswith("claim_p50_ms@")}
            store = ""
            if "store_ratio" in r:
                store = f", the 1k queue after the big post / alone {r['store_ratio']:.2f}"
            out.append(f"- depth, {system}: claim p50 ms {p50s}, ratio {r.get('p50_ratio', 0):.2f}{store}")
    return out
