"""Read-write locks, semaphores, and the module's error replies as typed exceptions."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest
import redis
from redis.exceptions import LockError, ResponseError

import kit
from kit import wait_for
from redis_lock_client import (
    CapacityMismatchError,
    DeadlockError,
    Lock,
    LockArgumentError,
    LockRefusedError,
    MaxWaitersError,
    ModuleMissingError,
    ReadLock,
    RWLock,
    Semaphore,
    WrongKindError,
    WrongTypeError,
)


def test_readers_share_writers_exclude(r: "redis.Redis[bytes]") -> None:
    rw1 = RWLock(r, "cat", timeout=10)
    rw2 = RWLock(r, "cat", timeout=10)
    assert rw1.read().acquire()
    assert rw2.read().acquire(blocking=False)
    info = rw1.read().info()
    assert info is not None and info.mode == "read" and len(info.holders) == 2
    assert rw1.read().owned() and rw2.read().owned()
    assert rw1.write().acquire(blocking=False) is False
    rw1.read().release()
    rw2.read().release()
    with rw1.write():
        assert rw2.read().acquire(blocking=False) is False
        assert rw1.write().info().mode == "write"  # type: ignore[union-attr]


def test_a_queued_writer_makes_new_readers_wait_and_readers_are_granted_together(r: "redis.Redis[bytes]") -> None:
    reader = ReadLock(r, "cat", timeout=30, thread_local=False)
    assert reader.acquire()
    writer = Lock(r, "cat", timeout=30, blocking_timeout=30, thread_local=False)
    later = [ReadLock(r, "cat", timeout=30, blocking_timeout=30, thread_local=False) for _ in range(3)]
    order: List[str] = []
    tw = threading.Thread(target=lambda: (writer.acquire(), order.append("writer")))
    tw.start()
    wait_for(lambda: reader.info().waiting == 1, 10, what="the writer to queue")  # type: ignore[union-attr]
    assert later[0].acquire(blocking=False) is False  # behind the writer: no starvation
    trs = [threading.Thread(target=lambda l=l: (l.acquire(), order.append("reader"))) for l in later]
    for i, t in enumerate(trs):
        t.start()
        wait_for(lambda i=i: reader.info().waiting == 2 + i, 10, what="readers to queue")  # type: ignore[union-attr]
    reader.release()
    tw.join(10)
    assert order == ["writer"]
    writer.release()
    for t in trs:
        t.join(10)
    info = reader.info()
    assert info is not None and info.mode == "read" and len(info.holders) == 3
    for l in later:
        l.release()


def test_semaphore_capacity_and_fifo(r: "redis.Redis[bytes]") -> None:
    permits = [Semaphore(r, "pool", 2, timeout=30, thread_local=False) for _ in range(4)]
    assert permits[0].acquire() and permits[1].acquire()
    assert permits[0].locked()
    assert permits[2].acquire(blocking=False) is False
    info = permits[0].info()
    assert info is not None and info.mode == "semaphore" and info.capacity == 2
    tokens = {permits[0].fencing_token, permits[1].fencing_token}
    assert len(tokens) == 2
    got: List[int] = []
    ts = [threading.Thread(target=lambda i=i: (permits[i].acquire(blocking_timeout=30), got.append(i))) for i in (2, 3)]
    for n, t in enumerate(ts):
        t.start()
        wait_for(lambda n=n: permits[0].info().waiting == n + 1, 10, what="permit waiters")  # type: ignore[union-attr]
    permits[0].release()
    wait_for(lambda: got == [2], 10, what="the first waiter's permit")
    permits[1].release()
    wait_for(lambda: got == [2, 3], 10, what="the second waiter's permit")
    for t in ts:
        t.join(10)
    permits[2].release()
    permits[3].release()
    assert not permits[0].locked()
    assert permits[0].info() is None


def test_semaphore_errors(r: "redis.Redis[bytes]") -> None:
    s = Semaphore(r, "pool", 2, timeout=30)
    s.acquire()
    with pytest.raises(CapacityMismatchError, match="another capacity"):
        Semaphore(r, "pool", 3, timeout=30).acquire()
    with pytest.raises(WrongKindError):
        Lock(r, "pool", timeout=30).acquire()
    with pytest.raises(WrongKindError):
        Semaphore(r, "lock", 2, timeout=30).acquire() if Lock(r, "lock", timeout=30).acquire() else None
    for bad in (0, -1, 2**31):
        with pytest.raises(LockArgumentError, match="capacity"):
            Semaphore(r, "pool", bad, timeout=30)
    with pytest.raises(TypeError, match="capacity"):
        Semaphore(r, "pool", 2.5, timeout=30)  # type: ignore[arg-type]
    s.release()


def test_semaphore_extend_watchdog_and_bound(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    s = Semaphore(r, "pool", 1, timeout=0.5, watchdog=True)
    assert s.acquire()
    time.sleep(1.6)
    assert s.owned() and not s.lost
    s.release()
    b = Semaphore(r, "pool", 1)  # timeout=None: bound
    assert b.acquire()
    b.local.hold.conn.disconnect()
    wait_for(lambda: not b.locked(), 10, what="the bound permit to come back")


def test_errors_are_typed_and_still_redis_pys(r: "redis.Redis[bytes]") -> None:
    r.set("str", "x")
    with pytest.raises(WrongTypeError) as e:
        Lock(r, "str", timeout=5).acquire()
    assert isinstance(e.value, LockError) and isinstance(e.value, ResponseError)
    assert isinstance(e.value, LockRefusedError) and e.value.code == "WRONGTYPE"
    assert e.value.lock_name == "str"  # type: ignore[attr-defined]
    with pytest.raises(WrongTypeError):
        Lock(r, "str", timeout=5).locked()

    # An owner that reads and asks to write: DEADLOCK.
    reader = ReadLock(r, "rw", timeout=5)
    reader.acquire(token="me")
    with pytest.raises(DeadlockError, match="DEADLOCK"):
        Lock(r, "rw", timeout=5).acquire(token="me")
    reader.release()


def test_a_wait_that_would_close_a_cycle_is_refused(r: "redis.Redis[bytes]") -> None:
    a1 = Lock(r, "acct:alice", timeout=30, thread_local=False)
    b2 = Lock(r, "acct:bob", timeout=30, thread_local=False)
    assert a1.acquire(token="t1") and b2.acquire(token="t2")
    waiter = Lock(r, "acct:bob", timeout=30, blocking_timeout=10, thread_local=False)
    t = threading.Thread(target=lambda: waiter.acquire(token="t1"))
    t.start()
    wait_for(lambda: b2.info().waiting == 1, 10, what="t1 to wait for bob")  # type: ignore[union-attr]
    with pytest.raises(DeadlockError, match="cycle"):
        Lock(r, "acct:alice", timeout=30, blocking_timeout=10).acquire(token="t2")
    b2.release()
    t.join(10)
    assert waiter.owned()
    waiter.release()
    a1.release()


def test_max_waiters(r: "redis.Redis[bytes]") -> None:
    r.config_set("lock.max-waiters", 1)
    holder = Lock(r, "k", timeout=30, thread_local=False)
    holder.acquire()
    first = Lock(r, "k", timeout=30, blocking_timeout=10, thread_local=False)
    t = threading.Thread(target=first.acquire)
    t.start()
    wait_for(lambda: holder.info().waiting == 1, 10, what="one waiter")  # type: ignore[union-attr]
    with pytest.raises(MaxWaitersError, match="MAXWAITERS"):
        Lock(r, "k", timeout=30, blocking_timeout=10).acquire()
    # The refused wait's connection stays usable: the next wait on it works.
    holder.release()
    t.join(10)
    first.release()
    ok = Lock(r, "k", timeout=30, blocking_timeout=1)
    assert ok.acquire()
    ok.release()


def test_module_missing_is_said_plainly() -> None:
    s = kit.Server(module=False)
    try:
        c = s.client()
        with pytest.raises(ModuleMissingError, match="module loaded"):
            Lock(c, "k", timeout=5).acquire()
        c.close()
    finally:
        s.close()
