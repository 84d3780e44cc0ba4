"""The embedded default store: a private redis-server on a unix socket under the data dir, AOF on."""

from __future__ import annotations

import ctypes
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from core.errors import StorageUnavailable


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends it SIGTERM when Charon dies, even by kill -9, so an
    orphaned redis-server never keeps the data dir (a second one on the same AOF would corrupt it)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class EmbeddedRedis:
    def __init__(self, data_dir: Path, binary: str = "redis-server") -> None:
        self.data_dir = data_dir.resolve()
        self.binary = binary
        self.socket = self.data_dir / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 10.0) -> str:
        exe = shutil.which(self.binary)
        if exe is None:
            raise StorageUnavailable(
                f"{self.binary} was not found: run `make install` (it installs redis-server), "
                "or set CHARON_STORAGE_URI to a Redis you run."
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
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
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
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
        self.stop()
        raise StorageUnavailable(f"redis-server did not answer within {timeout} s.")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: redis-server flushes the AOF and exits
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
