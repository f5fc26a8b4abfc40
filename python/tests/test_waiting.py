"""Waiting is the server's FIFO queue: order, long waits with redis-py's default client
settings, and interrupted waits that leave no grant behind."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Dict, List

import pytest
import redis

import kit
from kit import wait_for
from redis_lock_client import Lock

DEFAULT_SOCKET_TIMEOUT = redis.Redis().connection_pool.connection_kwargs.get("socket_timeout")


def waiting(r: "redis.Redis[bytes]", key: str) -> int:
    info = Lock(r, key).info()
    return 0 if info is None else info.waiting


def holders(r: "redis.Redis[bytes]", key: str) -> List[bytes]:
    info = Lock(r, key).info()
    return [] if info is None else [h.owner for h in info.holders]


def test_fifo_with_16_threads(r: "redis.Redis[bytes]") -> None:
    holder = Lock(r, "fifo", timeout=30, thread_local=False)
    assert holder.acquire()
    order: List[int] = []
    errors: List[BaseException] = []

    def worker(i: int) -> None:
        try:
            lock = Lock(r, "fifo", timeout=30, blocking_timeout=60)
            assert lock.acquire()
            order.append(i)
            time.sleep(0.005)
            lock.release()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = []
    for i in range(16):
        t = threading.Thread(target=worker, args=(i,))
        t.start()
        threads.append(t)
        # Start the next one only once this one is queued: arrival order is then known.
        wait_for(lambda: waiting(r, "fifo") == i + 1, 10, what=f"waiter {i} to queue")
    holder.release()
    for t in threads:
        t.join(60)
    assert not errors
    assert order == list(range(16))


def _queue_behind(r: "redis.Redis[bytes]", server: kit.Server, key: str, owner: str, out: Dict[str, Any]) -> threading.Thread:
    """A raw waiter on a connection with no read timeout (the reference for the order)."""

    def run() -> None:
        c = server.client(socket_timeout=None)
        out[owner] = c.execute_command("LOCK.ACQUIRE", key, owner, 30000, "WAIT", 0)
        out[owner + "-at"] = time.monotonic()
        c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_30_s_wait_with_redis_py_default_settings_keeps_its_place(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """redis-py 8 defaults to a 5 s read timeout with retries: a WAIT sent through
    execute_command would be re-sent after 5 s at the back of the queue. Ours is not."""
    key = "long-wait"
    holder = Lock(r, key, timeout=120, thread_local=False)
    assert holder.acquire()
    lock = Lock(r, key, timeout=30, blocking_timeout=90)  # r: redis-py's default settings
    out: Dict[str, Any] = {}

    def wait() -> None:
        out["acquired"] = lock.acquire()
        out["at"] = time.monotonic()
        out["token"] = lock.local.token
        time.sleep(0.5)
        lock.release()

    t = threading.Thread(target=wait)
    t.start()
    wait_for(lambda: waiting(r, key) == 1, 10, what="our waiter to queue")
    time.sleep(1)
    other = _queue_behind(r, server, key, "second", out)
    wait_for(lambda: waiting(r, key) == 2, 10, what="the second waiter to queue")
    time.sleep(28)  # the first waiter has now waited 30 s
    assert waiting(r, key) == 2  # nobody left the queue (a retry would leave and re-join)
    holder.release()
    t.join(30)
    other.join(30)
    assert out.get("acquired") is True, "our waiter was not granted first: it lost its place"
    assert isinstance(out["second"], int)
    assert out["at"] < out["second-at"]  # granted in arrival order


@pytest.mark.skipif(not DEFAULT_SOCKET_TIMEOUT, reason="this redis-py has no default read timeout")
def test_control_redis_py_defaults_lose_the_place_of_a_plain_wait(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The trap the test above guards against, shown: the same wait sent through redis-py's
    execute_command with its defaults is re-sent after the read timeout, behind a later
    waiter. (If this ever fails, redis-py changed its defaults; the test above still holds.)"""
    key = "control"
    r.execute_command("LOCK.ACQUIRE", key, "holder", 60000)
    out: Dict[str, Any] = {}

    def plain() -> None:
        try:
            out["first"] = r.execute_command("LOCK.ACQUIRE", key, "first", 30000, "WAIT", 30000)
        except redis.RedisError as e:  # a retry that also timed out
            out["first"] = e
        out["first-at"] = time.monotonic()

    t = threading.Thread(target=plain, daemon=True)
    t.start()
    wait_for(lambda: waiting(r, key) == 1, 10, what="the plain waiter to queue")
    time.sleep(0.5)
    other = _queue_behind(r, server, key, "second", out)
    wait_for(lambda: waiting(r, key) == 2 and "second" not in out, 10, what="the second waiter")
    time.sleep(DEFAULT_SOCKET_TIMEOUT + 1.5)  # past the first waiter's read timeout
    r.execute_command("LOCK.RELEASE", key, "holder")
    other.join(30)
    assert isinstance(out["second"], int)
    assert holders(r, key) == [b"second"]  # the later waiter went first: the trap is real
    r.delete(key)
    t.join(40)


def test_wait_interrupted_by_keyboard_interrupt_leaves_the_queue(r: "redis.Redis[bytes]") -> None:
    key = "interrupt"
    holder = Lock(r, key, timeout=30, thread_local=False)
    assert holder.acquire()
    lock = Lock(r, key, timeout=30, blocking_timeout=30)
    main = threading.main_thread().ident
    assert threading.current_thread() is threading.main_thread()
    timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))  # type: ignore[arg-type]
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    assert lock.local.token is None
    wait_for(lambda: waiting(r, key) == 0, 10, what="the interrupted waiter to leave the queue")
    holder.release()
    assert holders(r, key) == []
    assert not lock.locked()


@pytest.mark.parametrize("round_", range(4))
def test_interrupt_racing_the_grant_leaves_no_grant_behind(r: "redis.Redis[bytes]", round_: int) -> None:
    """The holder releases and the waiter is interrupted at the same moment: whichever wins,
    the lock ends either with our waiter holding it (acquire returned True) or with the next
    waiter, never stuck with an owner that gave up."""
    key = f"race{round_}"
    holder = Lock(r, key, timeout=30, thread_local=False)
    assert holder.acquire()
    lock = Lock(r, key, timeout=30, blocking_timeout=30)
    nxt = Lock(r, key, timeout=30, blocking_timeout=30, thread_local=False)
    out: Dict[str, Any] = {}
    main = threading.main_thread().ident

    def next_waiter() -> None:
        out["next"] = nxt.acquire()

    def release_and_interrupt() -> None:
        holder.release()
        if round_ % 2:
            time.sleep(0.0005 * round_)
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]

    got = None
    interrupted = False
    threading.Timer(0.3, lambda: threading.Thread(target=next_waiter).start()).start()
    timer = threading.Timer(1.0, release_and_interrupt)
    timer.start()
    try:
        got = lock.acquire()
        time.sleep(2)  # the interrupt lands here if acquire won
    except KeyboardInterrupt:
        interrupted = True
    timer.join()
    if got:
        assert lock.owned()
        lock.release()
    assert interrupted or got
    wait_for(lambda: out.get("next") is True, 10, what="the next waiter to get the lock")
    assert nxt.owned()
    nxt.release()


def test_abandoned_wait_whose_grant_already_arrived_is_handed_back(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The mechanism under an interrupted wait, made deterministic: the grant's reply is in
    our socket, unread, when the wait is given up."""
    from redis_lock_client import _connections as conns

    key = "late-grant"
    r.execute_command("LOCK.ACQUIRE", key, "holder", 30000)
    pool = conns.pool_of(r, key)
    conn = conns.take(pool)
    conn.send_command("LOCK.ACQUIRE", key, "quitter", 30000, "WAIT", 0)
    wait_for(lambda: waiting(r, key) == 1, 10, what="the waiter to queue")
    r.execute_command("LOCK.RELEASE", key, "holder")
    wait_for(lambda: holders(r, key) == [b"quitter"], 10, what="the grant")
    conns.abandon(conn, ["LOCK.RELEASE", key, "quitter", "ALL"])
    wait_for(lambda: holders(r, key) == [], 10, what="the grant to be handed back")


def test_client_side_read_timeout_leaves_nothing_behind() -> None:
    """The server stops answering (SIGSTOP) during a wait: the client gives up at the wait
    plus a margin with redis-py's TimeoutError, and once the server runs again the waiter is
    gone and the lock is still the holder's, then free."""
    s = kit.Server()
    try:
        r = s.client()
        holder = Lock(r, "k", timeout=30, thread_local=False)
        assert holder.acquire()
        lock = Lock(r, "k", timeout=30, blocking_timeout=0.5)
        threading.Timer(0.2, s.pause).start()
        t0 = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            lock.acquire()
        assert 1.5 < time.monotonic() - t0 < 20
        s.resume()
        wait_for(lambda: waiting(r, "k") == 0, 10, what="the waiter to be gone")
        assert holders(r, "k") == [holder.local.token]
        holder.release()
        assert holders(r, "k") == []
    finally:
        s.close()


def test_waits_reuse_their_connections(r: "redis.Redis[bytes]") -> None:
    """Each wait takes a connection of its own (no read timeout, no retries), kept for the
    next wait instead of opened anew."""
    holder = Lock(r, "k", timeout=30, thread_local=False)
    holder.acquire()
    lock = Lock(r, "k", timeout=30)
    for _ in range(3):
        assert lock.acquire(blocking_timeout=0.05) is False
    before = r.info("stats")["total_connections_received"]
    for _ in range(5):
        assert lock.acquire(blocking_timeout=0.05) is False
    assert r.info("stats")["total_connections_received"] == before
    holder.release()


def test_an_interrupt_after_the_grant_was_recorded_leaves_no_grant(r: "redis.Redis[bytes]") -> None:
    """The window the race above can hit (once in tens of runs): the interrupt lands after the
    grant was recorded, before acquire returns. The caller gets the exception, never True, so
    nobody would release: the lock must be free again."""

    class InterruptedLate(Lock):
        def _acquired(self, owner: Any, pending: Any, granted: bool) -> bool:
            super()._acquired(owner, pending, granted)
            raise KeyboardInterrupt

    lock = InterruptedLate(r, "late-interrupt", timeout=30)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire()
    assert lock.local.token is None
    assert Lock(r, "late-interrupt", timeout=30).acquire(blocking=False), "the grant stayed held"
