"""CPU seconds (user + system, from /proc) of server process trees and of the load generator itself, around
a timed phase: what a system spends per message, which a noisy shared machine disturbs less than rates.

A load generator given `--server-pids 12,34` (each pid with every process under it: charon serve's
supervisor and workers, gunicorn's master and workers, RabbitMQ's beam.smp and its port programs, a
redis-server) reads them when a timed phase starts and ends:

    meter = Meter(pids)
    phase = meter.start()
    ...  # the timed phase
    result.update(phase.done(messages))   # server_cpu_s, server_cpu_us_per_msg, client_cpu_s, ...
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces): [0] is the state."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(*pids: int) -> float:
    """User + system CPU of each pid and every process under it (a process that has ended is not counted;
    its CPU went to its parent's children's times only once the parent waited for it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry.name)
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo, counted = 0.0, list(pids), set[int]()
    while todo:
        p = todo.pop()
        if p in counted:
            continue
        counted.add(p)
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
        todo += children.get(p, [])
    return total


class Phase:
    """CPU of the servers and of this process since `Meter.start()`."""

    def __init__(self, pids: tuple[int, ...]) -> None:
        self.pids = pids
        self.server = cpu_seconds(*pids) if pids else 0.0
        self.client = time.process_time()
        self.wall = time.perf_counter()

    def done(self, messages: int, prefix: str = "") -> dict[str, float]:
        """`{prefix}server_cpu_s`, `..._us_per_msg`, the same for the client (this process), and the share of
        one core each used (`..._cores`: CPU seconds / wall seconds). No server keys without server pids."""
        client = time.process_time() - self.client
        wall = max(time.perf_counter() - self.wall, 1e-9)
        per = 1e6 / max(messages, 1)
        out: dict[str, float] = {
            f"{prefix}client_cpu_s": client,
            f"{prefix}client_cpu_us_per_msg": client * per,
            f"{prefix}client_cores": client / wall,
        }
        if self.pids:
            server = cpu_seconds(*self.pids) - self.server
            out |= {
                f"{prefix}server_cpu_s": server,
                f"{prefix}server_cpu_us_per_msg": server * per,
                f"{prefix}server_cores": server / wall,
            }
        return out


class Meter:
    def __init__(self, pids: list[int] | tuple[int, ...] = ()) -> None:
        self.pids = tuple(pids)

    def start(self) -> Phase:
        return Phase(self.pids)


def pid_list(text: str) -> list[int]:
    """`--server-pids 12,34` as a list."""
    return [int(p) for p in text.split(",") if p.strip()]
