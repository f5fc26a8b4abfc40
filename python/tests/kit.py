"""Test kit: real servers with the module, on free loopback ports.

The server binary comes from ``REDIS_LOCK_SERVER`` (default ``redis-server``) and the module
from ``REDIS_LOCK_MODULE`` (default: the repository's ``target/debug/libredis_lock.so``), the
same variables as the Rust tests use.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

import redis

REPO = Path(__file__).resolve().parents[2]
SERVER = os.environ.get("REDIS_LOCK_SERVER", "redis-server")

#: Scales the lateness the timing tests allow (REDIS_LOCK_TEST_TIME_FACTOR, default 1): raise it on a
#: machine slower or busier than 2 cores shared with other test suites.
def _time_factor() -> float:
    raw = os.environ.get("REDIS_LOCK_TEST_TIME_FACTOR", "") or "1"
    try:
        factor = float(raw)
    except ValueError:
        factor = float("nan")
    if not factor >= 1 or factor == float("inf"):
        raise ValueError("REDIS_LOCK_TEST_TIME_FACTOR=%s: expected a number of at least 1" % raw)
    return factor


SLACK = _time_factor()


def late(seconds: float = 1.5) -> float:
    """How late past the bound the code promises a timed step may end in a test: scheduling on
    a loaded machine (1.5 s by default, times ``SLACK``). Bounds stay well under the failures
    these tests guard against (redis-py's 5 s read timeout, a 20 s pool timeout)."""
    return seconds * SLACK
MODULE = os.path.abspath(
    os.environ.get("REDIS_LOCK_MODULE", str(REPO / "target" / "debug" / "libredis_lock.so"))
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port for a cluster node: at most 55535, since the node also listens on its port
    plus 10000 (the cluster bus), and that one free too. Free ports come from the kernel's
    ephemeral range, which reaches 60999, so about one in five would not do."""
    for _ in range(200):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port at or under 55535 with a free cluster bus port")


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = "condition") -> Any:
    """Polls ``cond`` until it returns something true; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Server:
    """One server process with the module loaded."""

    def __init__(self, *extra: str, cluster: bool = False, module: bool = True) -> None:
        self.module = module
        if module and not os.path.exists(MODULE):
            raise RuntimeError(f"module not found at {MODULE} (set REDIS_LOCK_MODULE or run cargo build --features test-hooks)")
        self.dir = tempfile.mkdtemp(prefix="redis-lock-py-")
        self.extra = list(extra)
        self.cluster = cluster
        self.port = 0
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.paused = False
        self.start()

    def start(self) -> None:
        for attempt in range(5):
            self.port = free_cluster_port() if self.cluster else free_port()
            args = [
                SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self.dir,
                "--logfile", os.path.join(self.dir, "server.log"),
            ]
            if self.module:
                args += ["--loadmodule", MODULE]
            if self.cluster:
                args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf")]
            args += self.extra
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    c = redis.Redis(port=self.port, socket_timeout=1)
                    if c.ping():
                        c.close()
                        return
                except redis.RedisError:
                    time.sleep(0.02)
            self.stop()
        raise RuntimeError(f"{SERVER} did not start; log: {self.log()}")

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text()[-2000:]
        except OSError:
            return ""

    def client(self, **kw: Any) -> "redis.Redis[bytes]":
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three masters on loopback (``--cluster-enabled yes`` and ``redis-cli --cluster create``),
    the module loaded on each."""

    def __init__(self) -> None:
        self.nodes = [Server(cluster=True) for _ in range(3)]
        cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
        if cli is None:
            raise RuntimeError("redis-cli (or valkey-cli) is needed to create the cluster")
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

        def ok() -> bool:
            for n in self.nodes:
                c = n.client(socket_timeout=2)
                try:
                    info = c.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
                finally:
                    c.close()
            return True

        wait_for(ok, 30, 0.1, "cluster_state:ok")

    def client(self, **kw: Any) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kw)

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def node_on(self, port: int) -> "Server":
        return next(n for n in self.nodes if n.port == port)

    def start_slot_move(self, slot: int, src: int, dst: int) -> None:
        """Begins moving ``slot`` from the node on port ``src`` to the one on ``dst`` and
        migrates its keys, as ``redis-cli --cluster reshard`` does (SETSLOT IMPORTING /
        MIGRATING, MIGRATE ... KEYS); ``src`` still serves the slot (ASK) until
        :meth:`finish_slot_move`."""
        s, d = self.node_on(src).client(), self.node_on(dst).client()
        try:
            src_id, dst_id = s.execute_command("CLUSTER", "MYID"), d.execute_command("CLUSTER", "MYID")
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if keys:
                s.execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
        finally:
            s.close()
            d.close()

    def finish_slot_move(self, slot: int, dst: int) -> None:
        """``SETSLOT slot NODE`` on every node: the node on ``dst`` owns the slot."""
        d = self.node_on(dst).client()
        dst_id = d.execute_command("CLUSTER", "MYID")
        d.close()
        for n in self.nodes:
            c = n.client()
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            c.close()


def spawn_holder(code: str) -> "subprocess.Popen[str]":
    """A Python child process that runs ``code`` (with ``redis`` and ``redis_lock_client``
    importable) and prints ``held`` once it holds its lock."""
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line: List[str] = []

    def read() -> None:
        assert proc.stdout is not None
        line.append(proc.stdout.readline())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    if not line or line[0].strip() != "held":
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"holder process did not take its lock: {line!r} {err}")
    return proc


def restart_keeping_port(s: Server) -> None:
    """Stops ``s`` and starts it again on the same port, so that its clients reconnect to it
    (``Server.restart`` may pick another port). Its data is gone (no persistence)."""
    global free_port
    port = s.port
    s.stop()
    saved = free_port
    free_port = lambda: port  # noqa: E731 - start() asks free_port() for the port
    try:
        s.start()
    finally:
        free_port = saved


def watcher_ids(admin: Any, timeout: float = 10.0) -> "set[int]":
    """The ids of the loss watchers' connections to the server (made with the user's pool's
    arguments, so named as its connections, but not of the pool): Pub/Sub connections (flag
    P) and tracking command connections (flag t). Call it while a lock is held (a watcher
    runs); waits until at least one of each is set up."""

    def found() -> "set[int]":
        ids = set()
        kinds = set()
        for c in admin.client_list():
            flags = str(c.get("flags", ""))
            for kind in ("P", "t"):
                if kind in flags:
                    ids.add(int(c["id"]))
                    kinds.add(kind)
        return ids if kinds == {"P", "t"} else set()

    return wait_for(found, timeout, what="the loss watcher's connections")  # type: ignore[no-any-return]


def pool_clients(admin: Any, name: str, exclude: Any = frozenset()) -> int:
    """Connections the server sees with client name ``name`` (set by the pool's handshake),
    leaving out the ids in ``exclude`` (the watcher's)."""
    return sum(1 for c in admin.client_list() if c.get("name") == name and int(c["id"]) not in exclude)
