"""A private RabbitMQ broker (Debian's rabbitmq-server) on free loopback ports, for the benchmarks.

Debian's own start is refused by policy-rc.d in a container, and its wrapper (/usr/sbin/rabbitmq-server)
wants the `rabbitmq` user and /var/lib/rabbitmq; this runs the server script of the installed release
directly, as the current user, with every file (database, logs, config, enabled plugins, pid file, the
Erlang cookie in HOME) under a temporary directory, the AMQP listener, the Erlang distribution port and a
private epmd on free loopback ports. No plugins. The Erlang schedulers do not busy-wait (`+sbwt none` and
its dirty-scheduler twins, RabbitMQ's advice when the node shares its cores with other processes): on a
2-core machine that also runs the load generator, a spinning scheduler would take CPU from the client and
count as the broker's own CPU.

    with RabbitMQ() as broker:
        broker.url    # amqp://guest:guest@127.0.0.1:PORT/
        broker.pid    # the server script's process: beam.smp and its port programs run under it

The private epmd runs as a child of this process (not daemonised by erl), so that it can be waited for.
Stopping runs `rabbitmqctl stop` and then ends that epmd (`epmd -kill` on its port): nothing is left
running, no zombie either.

Run alone (start, print the URL and version, stop): .venv/bin/python -m bench.rabbitmq
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.servers import free_port

RELEASES = Path("/usr/lib/rabbitmq/lib")
CONFIG = """\
log.console = false
log.file.level = warning
disk_free_limit.absolute = 50MB
"""
EPMD = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
ERL_ARGS = "-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none +sbwtdio none"
INSTALL_HINT = "rabbitmq-server is missing: run 'sudo apt-get install rabbitmq-server' (make bench as root)"


def release() -> tuple[str, Path]:
    """(version, sbin directory) of the newest rabbitmq_server release installed."""
    found = []
    for path in RELEASES.glob("rabbitmq_server-*/sbin/rabbitmq-server"):
        version = path.parent.parent.name.removeprefix("rabbitmq_server-")
        key = tuple(int(x) for x in re.findall(r"\d+", version))
        found.append((key, version, path.parent))
    if not found:
        raise RuntimeError(INSTALL_HINT)
    _, version, sbin = max(found)
    return version, sbin


class RabbitMQ:
    """A private broker, started by `with` (ready once `rabbitmqctl await_startup` says so), stopped after."""

    def __init__(self, startup_timeout: float = 90.0) -> None:
        self.version, self.sbin = release()
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.startup_timeout = startup_timeout
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid  # the server script (sh); beam.smp and its erl_child_setup run under it

    @property
    def log(self) -> Path:
        assert self.tmp is not None
        return Path(self.tmp.name) / "startup.log"

    def _environment(self, base: Path) -> dict[str, str]:
        (base / "home").mkdir()
        (base / "rabbitmq.conf").write_text(CONFIG)
        (base / "enabled_plugins").write_text("[].\n")
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(base / "home"),  # the Erlang cookie, shared by server and rabbitmqctl
            "RABBITMQ_NODENAME": f"bench{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),  # absent: none
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),  # absent: not Debian's /etc one
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
        }

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """rabbitmqctl against this broker (same environment)."""
        return subprocess.run(
            [str(self.sbin / "rabbitmqctl"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def __enter__(self) -> RabbitMQ:
        self.tmp = tempfile.TemporaryDirectory(prefix="charon-rabbitmq-")
        self.env = self._environment(Path(self.tmp.name))
        # epmd as our own child (erl would start it as a daemon, an orphan that nobody reaps once killed)
        self.epmd = subprocess.Popen(
            [EPMD, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(self.sbin / "rabbitmq-server")],
                env=self.env,
                cwd=self.tmp.name,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            self._await_startup()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _await_startup(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited at start:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if self.ctl("await_startup", "--timeout", "10", timeout=30).returncode == 0 and _listens(
                    self.port
                ):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"rabbitmq-server did not start in {self.startup_timeout:.0f} s; see {self.log}")

    def __exit__(self, *_: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ctl("stop", timeout=60)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        if self.epmd is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [EPMD, "-port", str(self.epmd_port), "-kill"],
                    env=self.env,
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
            try:
                self.epmd.wait(10)
            except subprocess.TimeoutExpired:
                self.epmd.kill()
                self.epmd.wait(5)
            self.epmd = None
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> int:
    with RabbitMQ() as broker:
        print(f"RabbitMQ {broker.version} at {broker.url} (server pid {broker.pid})")
        print(broker.ctl("status").stdout[:1500])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
