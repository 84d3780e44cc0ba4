"""The embedded default store: a private redis-server on a unix socket under the data dir, AOF on.

One store per data directory: `charon.lock` in it is held (flock) by the service and by the redis-server it
starts, which inherits the lock, so the directory stays locked until both have exited (a service killed with
-9 leaves its redis-server flushing the AOF for a moment; a new service waits for it, then starts)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from core.errors import StorageUnavailable

log = logging.getLogger("charon.embedded")

LOCK_WAIT_S = 10.0  # how long a starting service waits for a previous one's redis-server to finish
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent dies, even by kill -9 (Linux only)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _die_with_parent() -> None:
    """Runs in the child before exec: an orphaned redis-server never keeps the data dir."""
    die_with_parent()


class DataDirInUse(StorageUnavailable):
    pass


def _running(pid: str) -> bool:
    """Whether `pid` (as the lock file has it) names a process that is running (not a zombie)."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (ValueError, OSError, IndexError):
        return False


def lock_data_dir(data_dir: Path, wait_s: float = LOCK_WAIT_S) -> int:
    """An open descriptor holding `data_dir`/charon.lock (with this process's PID in it); raises DataDirInUse
    naming the directory and the PID holding it: at once when that service is running, else (it died, and
    the redis-server it started is finishing its AOF) when the lock is still held after `wait_s`."""
    path = data_dir / "charon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            if _running(holder) or time.monotonic() >= deadline:
                os.close(fd)
                raise DataDirInUse(
                    f"The data directory {data_dir} is in use by another Charon service (PID {holder}, or "
                    "the redis-server it started); stop that one, or give this one another CHARON_DATA_DIR."
                ) from None
            time.sleep(0.1)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class EmbeddedRedis:
    """The embedded store: `start()` it, `supervise()` it (a redis-server that dies, killed for memory or by
    hand, is started again from its AOF, as a service manager would), `stop()` it."""

    RESTART_WAIT_S = 1.0  # after a death, before it is started again (and between tries)

    def __init__(self, data_dir: Path, binary: str = "redis-server") -> None:
        self.data_dir = data_dir.resolve()
        self.binary = binary
        self.socket = self.data_dir / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: int | None = None
        self._stopping = threading.Event()
        self._restart = threading.Lock()  # a restart and a stop do not cross

    @property
    def uri(self) -> str:
        return f"unix://{self.socket}"

    @staticmethod
    def running(data_dir: Path) -> str | None:
        """The URI of the embedded store a `charon serve` runs under `data_dir` now, if one answers there."""
        socket = Path(data_dir) / "redis.sock"
        if not socket.is_socket():
            return None
        client = redis.Redis(unix_socket_path=str(socket), socket_timeout=2)
        try:
            client.ping()
        except (redis.exceptions.RedisError, OSError):
            return None
        finally:
            client.close()
        return f"unix://{socket.resolve()}"

    def start(self, timeout: float = 10.0) -> str:
        exe = shutil.which(self.binary)
        if exe is None:
            raise StorageUnavailable(
                f"{self.binary} was not found: run `make run` (it installs redis-server), "
                "or set CHARON_STORAGE_URI to a Redis you run."
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock_data_dir(self.data_dir)
        try:
            return self._launch(exe, timeout)
        except StorageUnavailable:
            self.stop()  # and the lock released
            raise

    def supervise(self) -> None:
        """Watch the redis-server from a thread: when it dies while the service runs, start it again (with the
        data directory's lock the service still holds), logging each death."""
        threading.Thread(target=self._watch, name="charon-embedded-redis", daemon=True).start()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.wait(self.RESTART_WAIT_S):
                return
            with self._restart:
                if self._stopping.is_set():
                    return
                log.error(
                    "the embedded redis-server exited (%s); starting it again from %s", code, self.data_dir
                )
                exe = shutil.which(self.binary)
                try:
                    self._launch(exe or self.binary, timeout=10.0)
                except StorageUnavailable as exc:
                    log.error("the embedded redis-server did not start again: %s", exc)
                    continue
                log.warning("the embedded redis-server runs again at %s", self.uri)

    def _launch(self, exe: str, timeout: float) -> str:
        """Start the redis-server (the lock already held) and return its URI once it answers."""
        assert self._lock is not None, "start() takes the data directory's lock first"
        self.socket.unlink(missing_ok=True)
        self._proc = subprocess.Popen(  # noqa: S603 - our own binary and arguments
            [
                exe,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--hz",  # rehash a grown keyspace in seconds, not minutes (docs/storage.md)
                "100",
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            pass_fds=(self._lock,),  # the redis-server holds the data dir's lock until it exits too
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise StorageUnavailable(f"redis-server exited; see {self.data_dir / 'redis.log'}.")
            try:
                redis.Redis(unix_socket_path=str(self.socket)).ping()
                return self.uri
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        self._proc.kill()
        self._proc.wait()
        raise StorageUnavailable(f"redis-server did not answer within {timeout} s.")

    def stop(self) -> None:
        self._stopping.set()
        with self._restart:
            self._stop()

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: redis-server flushes the AOF and exits
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._lock is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock)
            self._lock = None
