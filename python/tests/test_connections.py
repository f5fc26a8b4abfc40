"""Connections within the user's limits (issue 25, point 3) and bounded steps (point 5, the
I/O half), sync: waits and bound holds take their connections from the user's pool, at most
``max_wait_connections`` of them wait at once (first come first served beyond it), a clear
error when none can be had in time, at most ``MAX_IDLE`` idle connections left connected, a
request bounded by its deadline against a stopped server, and a reconnect across a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List

import pytest
import redis
import redis.asyncio

import kit
from kit import wait_for
from redis_lock_client import Lock, _connections as conns


def pool_clients(admin: "redis.Redis[bytes]", name: str, exclude: Any = frozenset()) -> int:
    """Connections the server sees with client name ``name`` (set by the pool's handshake),
    but for the ids in ``exclude`` (the loss watcher's: not of the pool)."""
    return kit.pool_clients(admin, name, exclude)


class Sampler:
    """Samples the server's client list every few ms; keeps the largest count for ``name``
    (leaving out the ids in ``exclude``)."""

    def __init__(self, server: kit.Server, name: str, exclude: Any = frozenset()) -> None:
        self.admin = server.client()
        self.name = name
        self.exclude = exclude
        self.most = 0
        self.stop = threading.Event()
        self.failure: List[BaseException] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.most = max(self.most, pool_clients(self.admin, self.name, self.exclude))
                time.sleep(0.003)
        except BaseException as e:  # noqa: BLE001 - reported by close()
            self.failure.append(e)

    def close(self) -> int:
        self.stop.set()
        self.thread.join(10)
        self.admin.close()
        if self.failure:
            raise self.failure[0]
        return self.most


def test_30_waiting_threads_stay_within_a_blocking_pool_of_4(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=4, timeout=60, client_name="cap4")
    client = redis.Redis(connection_pool=pool)
    holder = Lock(client, "cap", timeout=60, thread_local=False)
    assert holder.acquire()
    # A lock without a watchdog has no loss watcher (whose connections would have names of
    # their own anyway).
    watcher: "set[int]" = set()
    sampler = Sampler(server, "cap4", watcher)
    inside = [0]
    most_inside = [0]
    got: List[int] = []
    errors: List[BaseException] = []
    guard = threading.Lock()

    def worker(i: int) -> None:
        try:
            lock = Lock(client, "cap", timeout=60, blocking_timeout=120)
            assert lock.acquire()
            with guard:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
                got.append(i)
            time.sleep(0.005)
            with guard:
                inside[0] -= 1
            lock.release()
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(30)]
    try:
        for t in threads:
            t.start()
        # The wait limit is max_connections - 1 = 3: three waits queue on the server.
        wait_for(lambda: Lock(r, "cap").info().waiting == 3, 20, what="3 waits on the server")  # type: ignore[union-attr]
        time.sleep(0.3)
        assert Lock(r, "cap").info().waiting == 3  # type: ignore[union-attr]
        assert conns.in_use(pool) == (3, 27)
        holder.release()
        for t in threads:
            t.join(120)
    finally:
        most = sampler.close()
    assert not errors, errors
    assert sorted(got) == list(range(30))
    assert most_inside[0] == 1
    assert most <= 4, f"the server saw {most} connections of a pool of 4"
    assert conns.in_use(pool) == (0, 0)
    # What stays connected afterwards: the idle connections of the pool (the first tries and
    # releases go through redis-py's own execute_command, whose connections redis-py keeps).
    # (Waited for: the server lists a connection we closed until it has read the close.)
    wait_for(lambda: pool_clients(r, "cap4", watcher) <= conns.MAX_IDLE + 2, 10, what="the idle connections left")
    client.close()
    pool.disconnect()


def test_connections_of_waits_and_holds_come_back_and_at_most_max_idle_stay_connected(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, client_name="idle")
    taken = [conns.take(pool, time.monotonic() + 5) for _ in range(10)]
    for c in taken:
        conns.connect(c, time.monotonic() + 5)
        assert conns.call(c, ["PING"], 5) in (b"PONG", True)
    assert pool_clients(r, "idle") == 10
    assert conns.in_use(pool) == (10, 0)
    for c in taken:
        conns.give_back(pool, c)
    assert conns.in_use(pool) == (0, 0)
    # (Waited for: the server lists a connection we closed until it has read the close.)
    wait_for(lambda: pool_clients(r, "idle") == conns.MAX_IDLE, 10, what=f"{conns.MAX_IDLE} connections left")
    # The pool's own commands still work, over the connections given back.
    client = redis.Redis(connection_pool=pool)
    assert client.ping()
    assert len(pool._in_use_connections) == 0  # every connection is back in the pool
    client.close()
    pool.disconnect()


def test_a_bound_hold_counts_against_the_pool_and_goes_back_to_it(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=3, client_name="bound")
    client = redis.Redis(connection_pool=pool)
    for _ in range(10):
        a = Lock(client, "bound-a", bind=True, timeout=None)
        b = Lock(client, "bound-b", bind=True, timeout=None)
        assert a.acquire(blocking=False) and b.acquire(blocking=False)
        # Each hold keeps a connection of the pool (the wait limit is max_connections - 1 = 2).
        assert len(pool._in_use_connections) == 2
        assert conns.in_use(pool) == (2, 0)
        wait_for(lambda: pool_clients(r, "bound") <= 3, 10, what="at most 3 connections of the pool")
        a.release()
        b.release()
        assert len(pool._in_use_connections) == 0
    wait_for(lambda: pool_clients(r, "bound") <= conns.MAX_IDLE, 10, what="the idle connections left")
    client.close()
    pool.disconnect()


def test_no_connection_for_a_wait_raises_a_clear_error(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=3, timeout=30)
    conns.configure(pool, max_wait_connections=1)
    first = conns.take(pool, time.monotonic() + 5)
    started = time.monotonic()
    with pytest.raises(conns.ConnectionLimitError) as e:
        conns.take(pool, time.monotonic() + 0.3)
    took = time.monotonic() - started
    assert 0.25 <= took < 2, took
    assert e.value.limit == "max_wait_connections"
    assert e.value.value == 1
    assert "max_wait_connections=1" in str(e.value) and "raise max_wait_connections" in str(e.value)
    assert isinstance(e.value, redis.exceptions.LockError)
    conns.give_back(pool, first)
    # A pool whose connections are all in use: the pool's limit is named.
    plain = redis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=2)
    held = plain.get_connection(*conns.public_get_connection_args(plain.get_connection))
    short = conns.take(plain, time.monotonic() + 1)
    with pytest.raises(conns.ConnectionLimitError) as e2:
        conns.take(plain, time.monotonic() + 1, wait=False)
    assert e2.value.limit == "max_connections" and "max_connections=2" in str(e2.value)
    # A pool of one connection: no wait may use it (a release would find none).
    one = redis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=1)
    with pytest.raises(conns.ConnectionLimitError) as e3:
        conns.take(one, time.monotonic() + 1)
    assert "max_connections=1" in str(e3.value) and "raise the pool's max_connections" in str(e3.value)
    conns.give_back(plain, short)
    plain.release(held)
    for p in (pool, plain, one):
        p.disconnect()


def test_waiters_beyond_the_limit_queue_first_come_first_served(server: kit.Server) -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    conns.configure(pool, max_wait_connections=1)
    first = conns.take(pool, None)
    order: List[int] = []
    errors: List[BaseException] = []

    def worker(i: int) -> None:
        try:
            c = conns.take(pool, time.monotonic() + 30)
            order.append(i)
            time.sleep(0.01)
            conns.give_back(pool, c)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = []
    for i in range(8):
        t = threading.Thread(target=worker, args=(i,))
        t.start()
        threads.append(t)
        wait_for(lambda: conns.in_use(pool)[1] == i + 1, 10, what="queued")
    conns.give_back(pool, first)
    for t in threads:
        t.join(30)
    assert not errors
    assert order == list(range(8))
    assert conns.in_use(pool) == (0, 0)
    pool.disconnect()


@pytest.mark.parametrize("use_blocking_pool", [False, True])
def test_a_request_against_a_stopped_server_ends_within_its_deadline(server: kit.Server, use_blocking_pool: bool) -> None:
    """redis-py 8's defaults (5 s read timeout, 3 retries): 2 s left must mean about 2 s, for a
    new connection (connect + handshake) and for one already connected."""
    cls = redis.BlockingConnectionPool if use_blocking_pool else redis.ConnectionPool
    pool = cls(host="127.0.0.1", port=server.port)
    c = conns.take(pool, None, wait=False)
    conns.connect(c, None)
    conns.give_back(pool, c)  # one idle connected connection; the next take gets it
    took: List[float] = []
    server.pause()
    try:
        for _ in range(2):  # the first reuses the connected one, the second connects anew
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                conns.request(pool, ["LOCK.ACQUIRE", "stopped", "me", 1000], time.monotonic() + 2.0)
            took.append(time.monotonic() - started)
    finally:
        server.resume()
    assert all(1.9 <= t < 2.0 + kit.late() for t in took), took
    pool.disconnect()


def test_a_request_with_no_connection_free_ends_within_its_deadline(server: kit.Server) -> None:
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=1, timeout=20)
    held = pool.get_connection(*conns.public_get_connection_args(pool.get_connection))
    started = time.monotonic()
    with pytest.raises(conns.ConnectionLimitError):
        conns.request(pool, ["PING"], time.monotonic() + 0.5)
    assert 0.45 <= time.monotonic() - started < 0.5 + kit.late()
    pool.release(held)
    assert conns.request(pool, ["PING"], time.monotonic() + 2) in (b"PONG", True)
    pool.disconnect()


def start_on(port: int) -> "subprocess.Popen[bytes]":
    """A server with the module on ``port`` (the port of one just stopped: a restart as its
    clients see it)."""
    return subprocess.Popen(
        [kit.SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loadmodule", kit.MODULE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_reconnect_across_a_restart() -> None:
    s = kit.Server()
    again_proc = None
    try:
        pool = redis.ConnectionPool(host="127.0.0.1", port=s.port)
        conn = conns.take(pool, None)
        conns.connect(conn, None)
        port = s.port
        s.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            conns.call(conn, ["PING"], 2)
        done: Dict[str, Any] = {}

        def again() -> None:
            started = time.monotonic()
            try:
                conns.reconnect(conn, time.monotonic() + 20)
                done["after"] = time.monotonic() - started
            except BaseException as e:  # noqa: BLE001
                done["error"] = e

        t = threading.Thread(target=again)
        t.start()
        time.sleep(0.6)  # refused a few times meanwhile
        again_proc = start_on(port)
        t.join(20)
        assert "error" not in done, done
        assert done["after"] >= 0.5
        assert conns.call(conn, ["PING"], 2) in (b"PONG", True)
        conns.give_back(pool, conn)
        assert conns.in_use(pool) == (0, 0)
        pool.disconnect()
    finally:
        if again_proc is not None:
            again_proc.kill()
            again_proc.wait()
        s.close()


def test_reconnect_gives_up_at_its_deadline_and_at_once_on_bad_auth() -> None:
    s = kit.Server()
    try:
        admin = s.client()
        admin.config_set("requirepass", "right")
        admin.close()
        pool = redis.ConnectionPool(host="127.0.0.1", port=s.port, password="wrong")
        conn = conns.take(pool, None)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.AuthenticationError):
            conns.reconnect(conn, time.monotonic() + 10)
        assert time.monotonic() - started < 1
        conns.abandon(conn, None)
        s.stop()
        pool2 = redis.ConnectionPool(host="127.0.0.1", port=s.port, password="right")
        conn = conns.take(pool2, None)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            conns.reconnect(conn, time.monotonic() + 1.0)
        assert 0.95 <= time.monotonic() - started < 1.0 + kit.late()
        conns.abandon(conn, None)
        assert conns.in_use(pool2) == (0, 0)
    finally:
        s.close()


def test_a_waiter_interrupted_in_the_queue_leaves_it(server: kit.Server) -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    conns.configure(pool, max_wait_connections=1)
    first = conns.take(pool, None)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            conns.take(pool, time.monotonic() + 30)
    finally:
        timer.cancel()
    assert conns.in_use(pool) == (1, 0)
    conns.give_back(pool, first)
    assert conns.in_use(pool) == (0, 0)
    again = conns.take(pool, time.monotonic() + 1)
    conns.give_back(pool, again)
    pool.disconnect()


# ----------------------------------------------------------------------------------------------
# The Lock on these connections: deadlines, the client queue, the errors, the public limits


def acquire_in_thread(lock: Lock, limit: float, **kwargs: Any) -> Dict[str, Any]:
    """``lock.acquire(**kwargs)`` in a thread, joined for at most ``limit`` seconds: what it
    returned or raised, how long it took ("hung" when it had not returned by then)."""
    out: Dict[str, Any] = {}

    def go() -> None:
        started = time.monotonic()
        try:
            out["result"] = lock.acquire(**kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out["error"] = e
        out["took"] = time.monotonic() - started

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        out["hung"] = True
    return out


def test_a_wait_that_runs_out_queued_in_the_client_returns_false(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """One wait connection (max_wait_connections=1) serves a long wait; a second wait (another
    key, free) queues in the client behind it and its blocking_timeout runs out there: False,
    as for any expired blocking_timeout, within that timeout."""
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    conns.configure(pool, max_wait_connections=1)
    client = redis.Redis(connection_pool=pool)
    holder = Lock(client, "busy", timeout=30, thread_local=False)
    assert holder.acquire()
    waiter = Lock(client, "busy", timeout=30, thread_local=False)
    long_wait = acquire_in_thread(waiter, 0.001, blocking_timeout=20)
    wait_for(lambda: conns.in_use(pool) == (1, 0), 10, what="the long wait on the wait connection")
    out = acquire_in_thread(Lock(client, "free", timeout=30), 10, blocking_timeout=0.5)
    assert "hung" not in out, "a wait queued in the client ignored its blocking_timeout"
    assert out.get("result") is False, out
    assert 0.45 <= out["took"] < 1.5 + kit.late(), out
    assert conns.in_use(pool) == (1, 0)
    holder.release()
    wait_for(lambda: waiter.local.token is not None, 10, what="the long wait's grant")
    waiter.release()
    assert "error" not in long_wait, long_wait
    wait_for(lambda: conns.in_use(pool) == (0, 0), 10, what="the wait connection back")
    client.close()
    pool.disconnect()


def test_lock_level_connection_limit_errors(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The errors a Lock gives when no connection can be had: a non-blocking bound acquire
    beyond the wait limit raises at once (it does not queue in the client); a pool of one
    connection cannot serve a wait; a wait whose blocking_timeout runs out waiting for a
    BlockingConnectionPool's connection raises, naming max_connections, within that time."""
    import redis_lock_client

    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    conns.configure(pool, max_wait_connections=1)
    client = redis.Redis(connection_pool=pool)
    first = Lock(client, "b1", timeout=None)  # bound: keeps its connection (the one place)
    assert first.acquire(blocking=False)
    out = acquire_in_thread(Lock(client, "b2", timeout=None), 10, blocking=False)
    assert "hung" not in out, "a non-blocking bound acquire blocked in the client queue"
    err = out.get("error")
    assert isinstance(err, redis_lock_client.ConnectionLimitError), out
    assert isinstance(err, redis.exceptions.LockError)
    assert err.limit == "max_wait_connections" and err.value == 1 and not err.queued
    assert "raise max_wait_connections" in str(err)
    assert out["took"] < 1, out
    first.release()
    assert conns.in_use(pool) == (0, 0)
    # A pool of one connection: no wait or bound hold may use it (a release would find none).
    one = redis.Redis(connection_pool=redis.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=1))
    with pytest.raises(redis_lock_client.ConnectionLimitError) as e1:
        Lock(one, "one", timeout=10).acquire(blocking_timeout=1)
    assert e1.value.limit == "max_wait_connections" and "raise the pool's max_connections" in str(e1.value)
    # A BlockingConnectionPool whose connections are all in use (its timeout 30 s): the wait
    # gives up on it at its blocking_timeout.
    bpool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=2, timeout=30)
    held = [bpool.get_connection(*conns.public_get_connection_args(bpool.get_connection)) for _ in range(2)]
    out = acquire_in_thread(Lock(redis.Redis(connection_pool=bpool), "b3", timeout=10), 10, blocking_timeout=0.5)
    assert "hung" not in out, "the wait for a pool connection ignored blocking_timeout"
    err = out.get("error")
    assert isinstance(err, redis_lock_client.ConnectionLimitError) and err.limit == "max_connections", out
    assert 0.45 <= out["took"] < 1.5 + kit.late(), out
    for c in held:
        bpool.release(c)
    assert conns.in_use(bpool) == (0, 0)
    for p in (pool, one.connection_pool, bpool):
        p.disconnect()


def test_configure_connections_is_public_and_sets_the_limits(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    import redis_lock_client
    import redis_lock_client.asyncio

    assert "configure_connections" in redis_lock_client.__all__
    assert "ConnectionLimitError" in redis_lock_client.__all__
    assert redis_lock_client.asyncio.configure_connections is redis_lock_client.configure_connections
    pool = redis.ConnectionPool(host="127.0.0.1", port=server.port, client_name="conf")
    client = redis.Redis(connection_pool=pool)
    redis_lock_client.configure_connections(client, max_wait_connections=2, max_idle_connections=1)
    assert conns.wait_cap(pool) == 2
    holder = Lock(client, "conf", timeout=30, thread_local=False)
    assert holder.acquire()
    watcher: "set[int]" = set()  # no watchdog: no loss watcher
    waiters = [Lock(client, "conf", timeout=30, thread_local=False) for _ in range(3)]
    outs = [acquire_in_thread(w, 0.001, blocking_timeout=30) for w in waiters]
    wait_for(lambda: conns.in_use(pool) == (2, 1), 10, what="2 waits on connections, 1 queued in the client")
    holder.release()
    for w in waiters:
        wait_for(lambda: w.local.token is not None, 10, what="a grant")
        w.release()
    assert all("error" not in o for o in outs), outs
    wait_for(lambda: conns.in_use(pool) == (0, 0), 10, what="every wait connection back")
    # One idle connection left connected by the waits; the holder's and the releases' go
    # through redis-py's own commands, which keep theirs.
    wait_for(lambda: pool_clients(r, "conf", watcher) <= 1 + 1, 10, what="at most 2 connections left")
    # None keeps a value; a bad one is refused.
    redis_lock_client.configure_connections(client, max_idle_connections=None)
    assert conns.max_idle_of(pool) == 1
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(redis_lock_client.LockArgumentError):
            redis_lock_client.configure_connections(client, max_wait_connections=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        redis_lock_client.configure_connections(object())
    # An asyncio client: its pool (made in a loop: Python 3.8's asyncio.Lock wants one).
    async def aio() -> None:
        apool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=server.port)
        redis_lock_client.configure_connections(redis.asyncio.Redis(connection_pool=apool), max_wait_connections=5)
        assert conns.wait_cap(apool) == 5

    asyncio.run(aio())
    client.close()
    pool.disconnect()
