"""Real servers for the tests: a private redis-server and a MongoDB wire-protocol server (SecantusDB) on free
loopback ports, and a live Charon process.

Every process a test or fixture starts that could outlive it (a server, a worker, a long CLI run) is started
with spawn(): it leads a process group of its own, which reap() kills (tests/conftest.py calls it when the run
ends, interrupted or not), and the kernel kills it when the run dies even by kill -9."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import httpx
import redis

from app.embedded import die_with_parent
from app.settings import Settings

# --- Tethered processes -------------------------------------------------------------------------------------

_SPAWNED: list[subprocess.Popen[Any]] = []


def spawn(args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen(args, **popen), tethered to the test run: the process leads a process group of its own
    (so a terminal's Ctrl-C reaches only pytest, whose teardown stops it), which reap() kills with everything
    the process started; and, started from the main thread, the kernel SIGKILLs it when the run dies."""
    # PR_SET_PDEATHSIG fires when the thread that forked the child ends, not the process: a server started
    # from a worker thread (asyncio.to_thread) would die with that thread, so it relies on reap() alone.
    main = threading.current_thread() is threading.main_thread()
    _SPAWNED[:] = [p for p in _SPAWNED if p.returncode is None]  # forget those waited for
    proc = subprocess.Popen(args, process_group=0, preexec_fn=_die_with_the_run if main else None, **popen)
    _SPAWNED.append(proc)
    return proc


def run(args: Sequence[str], *, timeout: float, **popen: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run(args, capture_output=True, text=True, timeout=timeout) through spawn(): a long command
    in the foreground of a test (a fuzz run), whose whole process group is killed when the test is
    interrupted or the command overruns `timeout` (then TimeoutExpired)."""
    proc = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def reap() -> None:
    """SIGKILL the process group of every spawned process not waited for yet, and wait for it: what a
    fixture's stop() did not end, as when the run is interrupted."""
    for proc in _SPAWNED:
        _kill_group(proc)
    for proc in _SPAWNED:
        with suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    _SPAWNED.clear()


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    # Only while the leader is not waited for: until then its pid, and so its group's id, cannot be reused
    # (pid_max is often 32768), so the group killed is the one spawn() made.
    if proc.returncode is None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _die_with_the_run() -> None:
    """A tethered process's child, before exec: SIGKILL when the test run dies (SIGTERM would wait for a
    SIGCONT if the server was stopped with SIGSTOP by a test)."""
    die_with_parent(signal.SIGKILL)


# --- Ports --------------------------------------------------------------------------------------------------
# The ports the tests choose for their servers come from below the kernel's ephemeral range (32768 and up on
# Linux), a slice of 1,000 for each pytest-xdist worker, handed out in turn (one again only after the 999
# others). So a port the kernel gives to a bind(0) or an outgoing connection is never one of ours, two workers
# never choose the same port, and a server that a fault test stops and restarts on its port does not find it
# taken in between (with bind(0), another worker's next server could take it). Cluster bus ports (+10000)
# come from 22000-29999.
_PORT_BASE, _PORT_SLICE, _PORT_SLICES, _BUS_OFFSET = 12000, 1000, 8, 10000


def _worker_slice() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... (set by pytest-xdist)
    return int(worker.removeprefix("gw") or 0) % _PORT_SLICES


# A random start in the slice: a nested pytest run (tests/test_interrupt.py) inherits the worker's variable.
_next_port = itertools.count(random.randrange(_PORT_SLICE))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, bus: bool = False) -> int:
    """A port nobody is bound to, none of the worker's last 999; with `bus`, its Redis Cluster bus port (the
    port + 10000) is free too."""
    low = _PORT_BASE + _worker_slice() * _PORT_SLICE
    for _ in range(_PORT_SLICE):
        port = low + next(_next_port) % _PORT_SLICE
        if _bindable(port) and (not bus or _bindable(port + _BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free port in {low}-{low + _PORT_SLICE - 1}")


def free_cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too."""
    return free_port(bus=True)


class ServerProcess:
    """A test server started as a child process on 127.0.0.1:<free port>."""

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _launch(self, args: list[str], *, ready: Callable[[], bool], timeout: float) -> None:
        """Start `args` and return once `ready()`; RuntimeError when the process exits or is too slow. Its
        stderr stays the test run's, so a server that fails to start says why."""
        self.proc = spawn(args, stdout=subprocess.DEVNULL)
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
    """A real Redis Cluster of `size` primaries (and `replicas` replicas of each) on loopback: redis-server
    --cluster-enabled on free ports, joined by `redis-cli --cluster create`, ready once every node says
    cluster_state:ok."""

    def __init__(self, size: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="charon-cluster-")
        self.replicas, self.node_timeout_ms = replicas, node_timeout_ms
        self.nodes = [RedisServer() for _ in range(size * (1 + replicas))]
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
            args += ["--cluster-enabled", "yes", "--dir", self.dir.name, "--repl-diskless-sync-delay", "0"]
            args += ["--cluster-config-file", f"nodes-{node.port}.conf"]
            args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
            node._launch(args, ready=lambda n=node: _answers(n.port), timeout=10)
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        replicas = ["--cluster-replicas", str(self.replicas)]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, *replicas, "--cluster-yes"],
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
        self.proc = spawn([self.python, *argv], env=self.env, stdout=self.stdout, stderr=self.stderr)
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
        """SIGTERM, and the process must exit within its shutdown timeout (requests in flight get that long)
        and 10 s more (a shutdown that hangs is a defect: it is killed, so that it does not outlive the
        test, and the test fails)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            allowed = (
                float(
                    self.env.get("CHARON_SHUTDOWN_TIMEOUT", Settings.model_fields["shutdown_timeout"].default)
                )
                + 10
            )
            try:
                self.proc.wait(allowed)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"charon on :{self.port} did not exit in {allowed:g} s after SIGTERM"
                ) from None


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
            self.procs.append(spawn([str(spark_class), *args], stdout=log, stderr=log, env=env))

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


# --- Replicated Redis for the failover tests: Sentinel, and a Cluster with replicas -------------------------


def _answers_with(port: int, password: str | None) -> bool:
    try:
        return bool(redis.Redis(port=port, password=password, socket_timeout=1).ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise RuntimeError(what)


class RedisSentinels:
    """A Redis primary and `replicas` replicas, watched by three sentinels (`redis-server --sentinel`) that
    fail over `down_after_ms` after the primary stops answering; all on free loopback ports, the Redis
    servers behind PASSWORD and the sentinels behind SENTINEL_PASSWORD."""

    SERVICE = "charon-primary"
    PASSWORD = "data-secret"
    SENTINEL_PASSWORD = "sentinel-secret"

    def __init__(
        self, replicas: int = 1, *, down_after_ms: int = 1000, failover_timeout_ms: int = 2000
    ) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="charon-sentinel-")
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.servers = [RedisServer() for _ in range(1 + replicas)]
        self.sentinels = [ServerProcess() for _ in range(3)]
        for sentinel in self.sentinels:
            sentinel.name = "redis-sentinel"

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    @property
    def url(self) -> str:
        """The redis+sentinel:// URI of the primary, with both passwords."""
        return f"redis+sentinel://:{self.PASSWORD}@{self.hosts}/{self.SERVICE}/0?sentinel_password={self.SENTINEL_PASSWORD}"

    @property
    def zaqar_url(self) -> str:
        """The same primary in Zaqar's form (redis://sentinels?master=...)."""
        return (
            f"redis://:{self.PASSWORD}@{self.hosts}?master={self.SERVICE}&dbid=0"
            f"&sentinel_password={self.SENTINEL_PASSWORD}"
        )

    def start(self) -> RedisSentinels:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed; `make install` installs it")
        primary = self.servers[0]
        for server in self.servers:
            args = [
                exe,
                "--port",
                str(server.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            args += ["--requirepass", self.PASSWORD, "--masterauth", self.PASSWORD, "--dir", self.dir.name]
            args += ["--repl-diskless-sync-delay", "0"]
            if server is not primary:
                args += ["--replicaof", "127.0.0.1", str(primary.port)]
            server._launch(args, ready=lambda s=server: _answers_with(s.port, self.PASSWORD), timeout=10)
        _wait(self._replicas_linked, "the replicas did not sync with the primary", 30)
        for sentinel in self.sentinels:
            conf = Path(self.dir.name) / f"sentinel-{sentinel.port}.conf"
            conf.write_text(
                f"port {sentinel.port}\nbind 127.0.0.1\ndir {self.dir.name}\n"
                f"logfile {self.dir.name}/sentinel-{sentinel.port}.log\n"
                f"requirepass {self.SENTINEL_PASSWORD}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel auth-pass {self.SERVICE} {self.PASSWORD}\n"
                f"sentinel sentinel-pass {self.SENTINEL_PASSWORD}\n"
                f"sentinel down-after-milliseconds {self.SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.SERVICE} {self.failover_timeout_ms}\n"
            )
            ready = lambda s=sentinel: _answers_with(s.port, self.SENTINEL_PASSWORD)  # noqa: E731
            sentinel._launch([exe, str(conf), "--sentinel"], ready=ready, timeout=10)
        _wait(self._watching, "the sentinels did not find each other and the replicas", 30)
        return self

    def _sentinel(self, sentinel: ServerProcess) -> redis.Redis:
        return redis.Redis(
            port=sentinel.port, password=self.SENTINEL_PASSWORD, decode_responses=True, socket_timeout=1
        )

    def _replicas_linked(self) -> bool:
        return all(
            redis.Redis(port=s.port, password=self.PASSWORD).info("replication").get("master_link_status")
            == "up"
            for s in self.servers[1:]
        )

    def _watching(self) -> bool:
        for sentinel in self.sentinels:
            state = self._sentinel(sentinel).sentinel_master(self.SERVICE)
            if state["num-other-sentinels"] < 2 or state["num-slaves"] < len(self.servers) - 1:
                return False
        return True

    def primary(self) -> RedisServer:
        """The server the sentinels name as primary now (asking each live sentinel in turn)."""
        for sentinel in self.sentinels:
            try:
                _, port = self._sentinel(sentinel).sentinel_get_master_addr_by_name(self.SERVICE)
            except redis.exceptions.ConnectionError:
                continue
            return next(s for s in self.servers if s.port == int(port))
        raise RuntimeError("no sentinel answers")

    def client(self, server: RedisServer) -> redis.Redis:
        return redis.Redis(port=server.port, password=self.PASSWORD, decode_responses=True)

    def configure(self, **options: int | str) -> None:
        """CONFIG SET on every live Redis server (a replica keeps it for when it is promoted)."""
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                for name, value in options.items():
                    self.client(server).config_set(name.replace("_", "-"), value)

    def kill_primary(self) -> RedisServer:
        """kill -9 the primary; returns it."""
        primary = self.primary()
        assert primary.proc is not None
        primary.proc.kill()
        primary.proc.wait(10)
        return primary

    def wait_promoted(self, old: RedisServer, timeout: float) -> RedisServer:
        """The replica the sentinels promoted in `old`'s place, once it says it is a primary."""
        found: list[RedisServer] = []

        def promoted() -> bool:
            new = self.primary()
            if new is old or self.client(new).info("replication")["role"] != "master":
                return False
            found.append(new)
            return True

        _wait(promoted, "the sentinels promoted no replica", timeout)
        return found[0]

    @contextmanager
    def replicas_cut_off(self) -> Iterator[None]:
        """The replicas stopped (SIGSTOP) and their links closed by the primary (CLIENT KILL TYPE replica)
        meanwhile: what the primary writes then reaches none of them, as when a replica's link is down."""
        primary = self.primary()
        replicas = [s.proc for s in self.servers if s is not primary and s.proc is not None]
        for proc in replicas:
            proc.send_signal(signal.SIGSTOP)
        try:
            self.client(primary).client_kill_filter(_type="replica")
            yield
        finally:
            for proc in replicas:
                proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            if process.proc is not None and process.proc.poll() is None:
                process.proc.send_signal(signal.SIGCONT)
                process.stop()
        self.dir.cleanup()


class ReplicatedRedisCluster(RedisCluster):
    """A RedisCluster of `size` primaries with a replica each and a short cluster-node-timeout (a replica
    takes over about twice that after its primary stops answering)."""

    def __init__(self, size: int = 3, *, node_timeout_ms: int = 1000) -> None:
        super().__init__(size, replicas=1, node_timeout_ms=node_timeout_ms)

    def start(self) -> ReplicatedRedisCluster:
        super().start()
        _wait(self._replicas_linked, "the cluster's replicas did not sync", 30)
        return self

    def _live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def _replicas_linked(self) -> bool:
        roles = [redis.Redis(port=n.port).info("replication") for n in self._live()]
        replicas = [r for r in roles if r["role"] == "slave"]
        return len(replicas) == len(self.nodes) // 2 and all(
            r["master_link_status"] == "up" for r in replicas
        )

    def primary_of(self, key: str) -> RedisServer:
        """The node that serves `key`'s slot now, as a live node's CLUSTER SLOTS says."""
        node = redis.Redis(port=self._live()[0].port, decode_responses=True)
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in node.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(n for n in self.nodes if n.port == int(primary[1]))
        raise RuntimeError(f"no node serves slot {slot}")

    def kill_primary_of(self, key: str) -> RedisServer:
        """kill -9 the primary of `key`'s slot; returns it."""
        primary = self.primary_of(key)
        assert primary.proc is not None
        primary.proc.kill()
        primary.proc.wait(10)
        return primary

    def wait_promoted(self, key: str, old: RedisServer, timeout: float) -> RedisServer:
        """The replica that took over `key`'s slot from `old`, once every live node agrees and says ok."""
        found: list[RedisServer] = []

        def promoted() -> bool:
            try:
                new = self.primary_of(key)
                agreed = all(_cluster_ok(n.port) for n in self._live())
            except redis.exceptions.ConnectionError:
                return False
            if new is old or not agreed:
                return False
            found.append(new)
            return True

        _wait(promoted, "no replica took over the slot", timeout)
        return found[0]
