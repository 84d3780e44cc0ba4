"""Real servers for the tests: a private redis-server and a MongoDB wire-protocol server (SecantusDB) on free
loopback ports, and a live Charon process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port P below 55536 whose cluster bus port P + 10000 is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port + 10000)) != 0:
                return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class ServerProcess:
    """A test server started as a child process on 127.0.0.1:<free port>."""

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _launch(self, args: list[str], *, ready: Callable[[], bool], timeout: float) -> None:
        """Start `args` and return once `ready()`; RuntimeError when the process exits or is too slow. Its
        stderr stays the test run's, so a server that fails to start says why."""
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


class RedisServer(ServerProcess):
    """redis-server on 127.0.0.1:<free port>; AOF when a data dir is given (crash tests)."""

    name = "redis-server"

    def __init__(self, data_dir: Path | None = None, fsync: str = "always") -> None:
        super().__init__()
        self.data_dir = data_dir
        self.fsync = fsync

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed; `make install` installs it")
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.data_dir is not None:
            args += ["--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", self.fsync]
        else:
            args += ["--appendonly", "no"]
        self._launch(args, ready=lambda: _answers(self.port), timeout=10)
        return self


class RedisCluster:
    """A real Redis Cluster of `size` primaries (no replicas) on loopback: redis-server --cluster-enabled on
    free ports, joined by `redis-cli --cluster create`, ready once every node says cluster_state:ok."""

    def __init__(self, size: int = 3) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="charon-cluster-")
        self.nodes = [RedisServer() for _ in range(size)]
        for node in self.nodes:
            node.port = free_cluster_port()

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        exe = shutil.which("redis-server")
        cli = shutil.which("redis-cli")
        if exe is None or cli is None:
            raise RuntimeError("redis-server/redis-cli are not installed; `make install` installs them")
        for node in self.nodes:
            args = [exe, "--port", str(node.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            args += ["--cluster-enabled", "yes", "--dir", self.dir.name]
            args += ["--cluster-config-file", f"nodes-{node.port}.conf", "--cluster-node-timeout", "5000"]
            node._launch(args, ready=lambda n=node: _answers(n.port), timeout=10)
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(_cluster_ok(n.port) for n in self.nodes):
                return self
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.dir.cleanup()


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except redis.exceptions.ConnectionError:
        return False


def _cluster_ok(port: int) -> bool:
    return redis.Redis(port=port, decode_responses=True).cluster("INFO").get("cluster_state") == "ok"


class MongoServer(ServerProcess):
    """SecantusDB (tests/secantus_launch.py) on 127.0.0.1:<free port>: in memory, a one-node replica set."""

    name = "the MongoDB test server (SecantusDB)"

    def __init__(self, *, standalone: bool = False) -> None:
        super().__init__()
        self.standalone = standalone

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/"

    def start(self) -> MongoServer:
        args = [sys.executable, "-m", "tests.secantus_launch", "--port", str(self.port)]

        def listens() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        self._launch([*args, "--standalone"] if self.standalone else args, ready=listens, timeout=30)
        return self


def redis_servers_on(data_dir: Path) -> list[str]:
    """The command lines of running redis-server processes that use `data_dir`."""
    out = subprocess.run(["pgrep", "-af", "redis-server"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(data_dir) in line]


class CharonProcess:
    """`charon serve` as a real process (uvicorn), on a free port."""

    def __init__(
        self,
        storage_uri: str | None,
        data_dir: Path | None = None,
        namespace: str = "charon",
        env: dict[str, str] | None = None,
        *,
        log_level: str = "warning",
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        python: str = sys.executable,
    ) -> None:
        """`stdout`, `stderr`: where its output goes (else the test's); `python`: the interpreter of the
        virtualenv it runs in."""
        self.port = free_port()
        self.python = python
        self.log_level, self.stdout, self.stderr = log_level, stdout, stderr
        self.env = dict(os.environ, CHARON_NAMESPACE=namespace, **(env or {}))
        if storage_uri is not None:
            self.env["CHARON_STORAGE_URI"] = storage_uri
            if storage_uri.startswith(
                "mongodb"
            ):  # SecantusDB under load: tests.conftest.SLOW_SERVER_TIMEOUT_S
                self.env.setdefault("CHARON_STORAGE_TIMEOUT", "60")
        else:
            self.env.pop("CHARON_STORAGE_URI", None)
        if data_dir is not None:
            self.env["CHARON_DATA_DIR"] = str(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CharonProcess:
        argv = ["-m", "app.cli", "serve", "--port", str(self.port), "--log-level", self.log_level]
        self.proc = subprocess.Popen(
            [self.python, *argv], env=self.env, stdout=self.stdout, stderr=self.stderr
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v2/ping", timeout=1).status_code == 204:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("charon exited at start")
            time.sleep(0.1)
        raise RuntimeError("charon did not start")

    def kill(self) -> None:
        """kill -9, then wait until the embedded store (if any) has died with it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(15)
        data_dir = self.env.get("CHARON_DATA_DIR")
        deadline = time.monotonic() + 10
        while data_dir and redis_servers_on(Path(data_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, and the process must exit within 15 s (a shutdown that hangs is a defect: it is killed,
        so that it does not outlive the test, and the test fails)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"charon on :{self.port} did not exit in 15 s after SIGTERM") from None


class SparkStandalone:
    """A Spark standalone cluster from the installed PySpark: a master and one worker (`cores` cores), each
    its own JVM on 127.0.0.1, started with spark-class as a cluster's machines start them."""

    def __init__(self, work_dir: Path, cores: int = 2) -> None:
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.work_dir, self.cores = work_dir, cores
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spark_class(self, *args: str) -> None:
        import pyspark

        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
        with (self.work_dir / f"{args[0].rsplit('.', 1)[1].lower()}.log").open("ab") as log:
            self.procs.append(subprocess.Popen([str(spark_class), *args], stdout=log, stderr=log, env=env))

    def alive_workers(self) -> int:
        try:
            state = httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return 0
        return int(state.get("aliveworkers", 0))

    def start(self, timeout: float = 90) -> SparkStandalone:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(self.port), "--webui-port", str(self.ui_port))  # fmt: skip
        self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(self.cores),
            "--memory", "2g", "--webui-port", str(self.worker_ui_port),
            "--work-dir", str(self.work_dir / "work"), self.master,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                self.stop()
                raise RuntimeError(f"a Spark daemon exited at start (logs in {self.work_dir})")
            if self.alive_workers() >= 1:
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Spark standalone cluster did not start (logs in {self.work_dir})")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
