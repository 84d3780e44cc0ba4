"""`charon notify`: a notifier in a process of its own (service/notifier.py), against the configured store.

`charon serve` starts one beside its API workers (CHARON_NOTIFICATIONS__PROCESS, the default), lowers its CPU
priority by CHARON_NOTIFICATIONS__NICE, restarts it when it dies and stops it when it stops (`Supervised`);
an operator may run more anywhere (deliveries are leased, so notifiers share the work). Its Prometheus values
go to the serve's shared directory (app/workers.py share_metrics), so GET /metrics on any worker counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time

from app import logs
from app.settings import Settings
from core import sealing
from core.clock import SystemClock

log = logging.getLogger("charon.notify")

RESTART_WAIT_S = 1.0  # a notifier process that died is started again this much later
BUSY_CORES = 0.5  # the service's API processes are busy while they use more CPU than this, together
LOAD_SPAN_S = 0.05  # ServiceLoad measures over at least this long (the kernel counts CPU in 10 ms ticks)


class ServiceLoad:
    """Whether `charon serve`'s API processes are busy: the CPU its process (`parent`) and their children
    used since the last look, without this process and the embedded store (`store_binary`, which also
    serves the notifier), above BUSY_CORES. The notifier, already at the lowest CPU priority, then also
    holds back its use of the store (service/notifier.py BUSY_WAIT_S), which the API's requests share."""

    def __init__(self, parent: int, store_binary: str = "redis-server") -> None:
        self._parent = parent
        self._store = os.path.basename(store_binary)[:15]  # as /proc/PID/stat names it (TASK_COMM_LEN)
        self._own = os.getpid()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._last: tuple[float, float] | None = None
        self._busy = False

    def _cpu(self) -> float:
        pids = {self._parent}
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{self._parent}/task"):
                with contextlib.suppress(OSError), open(f"{task.path}/children") as children:
                    pids.update(int(p) for p in children.read().split())
        pids.discard(self._own)
        ticks = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:  # it exited
                continue
            name, _, rest = stat.partition("(")[2].rpartition(")")
            if name == self._store:
                continue
            fields = rest.split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks / self._tick

    def __call__(self) -> bool:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < LOAD_SPAN_S:
            return self._busy
        cpu = self._cpu()
        if self._last is not None:
            self._busy = (cpu - self._last[1]) / (now - self._last[0]) > BUSY_CORES
        self._last = (now, cpu)
        return self._busy


async def notify(settings: Settings, parent: int | None = None) -> None:
    """Deliver until SIGTERM/SIGINT; then what is in flight is cancelled (due again when its lease ends).
    With `parent` (charon serve's PID), yield to its API processes while they are busy (ServiceLoad)."""
    from app.main import deliverer, notifier, open_configured_store, trustee

    clock = SystemClock()
    sealing.use(settings.encryption.keyring())  # the notifications show clear bodies
    store, embedded = open_configured_store(settings, clock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with deliverer(settings, trustee(settings)) as sender:
            busy = None if parent is None else ServiceLoad(parent, settings.redis_server)
            running = asyncio.create_task(notifier(store, sender, settings, clock, busy=busy).run())
            await stop.wait()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    finally:
        await store.aclose()
        if embedded is not None:
            embedded.stop()


def main(settings: Settings, *, nice: bool, parent: int | None) -> int:
    """With `parent` (charon serve's PID), the process ends when that one does, even by kill -9: the kernel
    sends it SIGTERM then; and if it is gone already (it died while this one started), at once."""
    if parent is not None:
        from app.embedded import die_with_parent

        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:
            return 0
    if nice and settings.notifications.nice:
        os.nice(settings.notifications.nice)
    logs.configure(settings.log_format, settings.log_level)
    asyncio.run(notify(settings, parent))
    return 0


class Supervised:
    """`charon serve`'s notifier process: started with it, started again RESTART_WAIT_S after it dies (its
    deliveries' leases end and another try takes them), stopped with it. One that exits 0 was told to stop
    (SIGTERM or SIGINT, as a terminal's Ctrl-C or systemd sends the whole service): it is not started
    again, since the service is stopping too."""

    def __init__(self, argv: list[str]) -> None:
        self._argv = argv
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart and a stop do not cross
        self._thread = threading.Thread(target=self._watch, name="charon-notifier-watch", daemon=True)

    def start(self) -> None:
        self._process = subprocess.Popen(self._argv)  # noqa: S603 - our own interpreter and module
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            assert self._process is not None
            code = self._process.wait()
            if code == 0 or self._stopping.wait(RESTART_WAIT_S):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                log.warning("the notifier process exited (%s); starting another", code)
                self._process = subprocess.Popen(self._argv)  # noqa: S603 - as in start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stopping.set()
            process = self._process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
