"""redis_lock_client.asyncio: the main cases for redis.asyncio clients (coroutines run with
asyncio.run, no plugin needed)."""

from __future__ import annotations

import asyncio
import inspect
import signal
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
from redis.exceptions import LockError, LockNotOwnedError

import kit
from redis_lock_client import LockHeldError, LockLostError, QuorumUnreachableError
from redis_lock_client.asyncio import Lock, ReadLock, Redlock, RWLock, Semaphore


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def until(cond: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def waiting(r: Any, key: str) -> int:
    info = await Lock(r, key).info()
    return 0 if info is None else info.waiting


def test_signature_is_redis_asyncio_s() -> None:
    ours = inspect.signature(Lock.__init__).parameters
    theirs = inspect.signature(redis.asyncio.lock.Lock.__init__).parameters
    positional = [p for p in ours.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    # redis-py's parameters, in order, with the same defaults; redis-py 5 has no
    # raise_on_release_error yet (added in 6), which comes last in ours.
    names = [p.name for p in positional]
    assert names[: len(theirs)] == list(theirs)
    assert set(names[len(theirs) :]) <= {"raise_on_release_error"}
    for p in positional:
        if p.name in theirs:
            assert p.default == theirs[p.name].default, p.name
    # acquire: redis-py's parameters in order; the keyword-only `sleep` (redis-py 8.2+) is in
    # ours on every version.
    mine = list(inspect.signature(Lock.acquire).parameters)
    theirs_acquire = list(inspect.signature(redis.asyncio.lock.Lock.acquire).parameters)
    assert mine[: len(theirs_acquire)] == theirs_acquire
    assert set(mine[len(theirs_acquire) :]) <= {"sleep"}


def test_basic_api(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        lock = r.lock("k", timeout=10, blocking_timeout=1, lock_class=Lock)
        assert isinstance(lock, Lock)
        async with lock:
            assert await lock.owned() and await lock.locked()
            assert lock.fencing_token and lock.fencing_token > 0
            assert await lock.extend(10)
            info = await lock.info()
            assert info is not None and 19000 < info.holders[0].ttl_ms <= 20000
            assert await lock.extend(3, replace_ttl=True)
            assert await lock.reacquire()
            other = Lock(r, "k", timeout=10)
            assert await other.acquire(blocking=False) is False
            t0 = time.monotonic()
            assert await other.acquire(blocking_timeout=0.2) is False
            assert time.monotonic() - t0 >= 0.19
        assert not await lock.locked()
        with pytest.raises(LockError, match="not owned"):
            await lock.release()
        await lock.acquire()
        await r.delete("k")
        with pytest.raises(LockNotOwnedError):
            await lock.release()
        async with Lock(r, "k", timeout=10, raise_on_release_error=False):
            await r.delete("k")
        assert await Lock(r, "k", timeout=10).acquire()
        with pytest.raises(LockError, match="Unable to acquire"):
            async with Lock(r, "k", timeout=10, blocking_timeout=0.1):
                pass
        await r.aclose() if hasattr(r, "aclose") else await r.close()

    run(main())


def test_fifo_with_16_tasks(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        holder = Lock(r, "fifo", timeout=30)
        assert await holder.acquire()
        order: List[int] = []

        async def worker(i: int) -> None:
            lock = Lock(r, "fifo", timeout=30, blocking_timeout=60, thread_local=False)
            assert await lock.acquire()
            order.append(i)
            await asyncio.sleep(0.005)
            await lock.release()

        tasks = []
        for i in range(16):
            tasks.append(asyncio.ensure_future(worker(i)))
            await until(lambda i=i: _eq(waiting(r, "fifo"), i + 1), what=f"waiter {i}")
        await holder.release()
        await asyncio.gather(*tasks)
        assert order == list(range(16))

    run(main())


async def _eq(aw: Any, v: int) -> bool:
    return bool(await aw == v)


def test_a_long_wait_with_default_settings_keeps_its_place(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)  # redis-py's defaults
        await r.flushall()
        await r.execute_command("LOCK.ACQUIRE", "long", "holder", 60000)
        lock = Lock(r, "long", timeout=30, blocking_timeout=60)
        first = asyncio.ensure_future(lock.acquire())
        await until(lambda: _eq(waiting(r, "long"), 1), what="our waiter")
        slow = redis.asyncio.Redis(port=server.port, socket_timeout=None)
        second = asyncio.ensure_future(slow.execute_command("LOCK.ACQUIRE", "long", "second", 30000, "WAIT", 0))
        await until(lambda: _eq(waiting(r, "long"), 2), what="the second waiter")
        await asyncio.sleep(12)  # over two of redis-py 8's 5 s read timeouts
        assert await waiting(r, "long") == 2
        await r.execute_command("LOCK.RELEASE", "long", "holder")
        assert await first is True
        assert not second.done()
        assert await lock.owned()
        await lock.release()
        assert isinstance(await second, int)

    run(main())


def test_cancelled_wait_leaves_the_queue(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        holder = Lock(r, "c", timeout=30)
        await holder.acquire()
        lock = Lock(r, "c", timeout=30, blocking_timeout=30)
        task = asyncio.ensure_future(lock.acquire())
        await until(lambda: _eq(waiting(r, "c"), 1), what="the waiter")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: _eq(waiting(r, "c"), 0), what="the waiter to leave")
        await holder.release()
        assert not await holder.locked()

    run(main())


@pytest.mark.parametrize("round_", range(4))
def test_cancel_racing_the_grant_leaves_no_grant_behind(server: kit.Server, round_: int) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        key = f"race{round_}"
        await r.delete(key)
        holder = Lock(r, key, timeout=30, thread_local=False)
        await holder.acquire()
        lock = Lock(r, key, timeout=30, blocking_timeout=30, thread_local=False)
        task = asyncio.ensure_future(lock.acquire())
        await until(lambda: _eq(waiting(r, key), 1), what="the waiter")
        nxt = Lock(r, key, timeout=30, blocking_timeout=30, thread_local=False)
        ntask = asyncio.ensure_future(nxt.acquire())
        await until(lambda: _eq(waiting(r, key), 2), what="the next waiter")
        # Release and cancel in the same step: the grant may already be on its way.
        await holder.release()
        for _ in range(round_):
            await asyncio.sleep(0)
        task.cancel()
        try:
            got = await task
        except asyncio.CancelledError:
            got = False
        if got:
            await lock.release()
        assert await ntask is True
        assert await nxt.owned()
        await nxt.release()

    run(main())


def test_bound_holds_and_sigkill(server: kit.Server) -> None:
    code = f"""
import asyncio, redis.asyncio
from redis_lock_client.asyncio import Lock
async def main():
    r = redis.asyncio.Redis(port={server.port})
    lock = Lock(r, "crash")
    assert await lock.acquire(blocking=False)
    print("held", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""

    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.delete("crash")
        proc = kit.spawn_holder(code)
        killed = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        waiter = Lock(r, "crash", timeout=5, blocking_timeout=30)
        assert await waiter.acquire()
        assert time.monotonic() - killed < 10
        await waiter.release()
        lost: List[LockLostError] = []
        bound = Lock(r, "b", timeout=30, bind=True, on_lost=lost.append)
        assert await bound.acquire()
        await bound.local.hold.conn.disconnect()
        await until(lambda: _not(bound.locked()), what="the bound hold to end")
        await until(lambda: bool(lost), what="the loss report")
        assert bound.lost and lost[0].reason == "disconnected"

    run(main())


async def _not(aw: Any) -> bool:
    return not await aw


def test_watchdog(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        reported: List[LockLostError] = []

        async def on_lost(err: LockLostError) -> None:
            reported.append(err)

        # A lease of 1.5 s renewed every 0.5 s, held for 4 leases: a loop stalled for 1 s on a
        # loaded machine still renews in time (a 0.5 s lease lapsed with a load of 15 on 2 cores).
        ttl = 1.5 * kit.SLACK
        lock = Lock(r, "w", timeout=ttl, on_lost=on_lost)
        assert await lock.acquire()
        end = time.monotonic() + 4 * ttl
        while time.monotonic() < end:
            assert await lock.owned() and not lock.lost
            await asyncio.sleep(0.1)
        await r.delete("w")
        deleted = time.monotonic()
        await until(lambda: bool(reported), what="the loss report")
        assert time.monotonic() - deleted < kit.late(1.0)
        # The loss watcher sees the DEL at once ("deleted"); a renewal of the watchdog under
        # way meanwhile says "notowner" (before the watcher, issue 25, the only way to notice).
        assert reported[0].reason in ("deleted", "notowner")
        with pytest.raises(LockLostError):
            lock.check()

    run(main())


def test_read_write_and_semaphore(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port, protocol=3)
        await r.flushall()
        rw = RWLock(r, "rw", timeout=10)
        rw2 = RWLock(r, "rw", timeout=10)
        assert await rw.read().acquire() and await rw2.read().acquire()
        assert await rw.write().acquire(blocking=False) is False
        await rw.read().release()
        await rw2.read().release()
        async with rw.write():
            assert await ReadLock(r, "rw", timeout=10).acquire(blocking=False) is False
        sems = [Semaphore(r, "s", 2, timeout=10) for _ in range(3)]
        assert await sems[0].acquire() and await sems[1].acquire()
        assert await sems[0].locked()
        waiter = asyncio.ensure_future(sems[2].acquire(blocking_timeout=10))
        await until(lambda: _eq(waiting(r, "s"), 1), what="the permit waiter")
        await sems[0].release()
        assert await waiter is True
        await sems[1].release()
        await sems[2].release()

    run(main())


def test_async_redlock_with_two_paused(redlock_servers: List[kit.Server]) -> None:
    async def main() -> None:
        cs = [redis.asyncio.Redis(port=s.port) for s in redlock_servers]
        for c in cs:
            await c.ping()
        redlock_servers[0].pause()
        redlock_servers[1].pause()
        rl = Redlock(cs, "job", timeout=10, instance_timeout=0.2, blocking=False)
        t0 = time.monotonic()
        assert await rl.acquire()
        assert time.monotonic() - t0 < 3
        assert len(rl.fencing_tokens) == 3
        with pytest.raises(LockHeldError):
            await Redlock(cs, "job", timeout=10, instance_timeout=0.2, blocking=False).acquire()
        await rl.extend()
        await rl.release()
        redlock_servers[2].pause()
        with pytest.raises(QuorumUnreachableError):
            await Redlock(cs, "job", timeout=10, instance_timeout=0.2, blocking=False).acquire()
        for s in redlock_servers:
            s.resume()
        async with Redlock(cs, "job", timeout=10, watchdog=True) as held:
            assert await held.owned()

    run(main())


def test_async_bad_arguments(server: kit.Server) -> None:
    from redis_lock_client import LockArgumentError

    async def main() -> None:
        # Made inside the running loop: redis-py's asyncio pool makes an asyncio.Lock in its
        # constructor, which needs a loop on Python 3.8/3.9 once an earlier asyncio.run() ended.
        r = redis.asyncio.Redis(port=server.port)
        with pytest.raises(LockArgumentError):
            Lock(r, "k", timeout=0)
        with pytest.raises(LockArgumentError):
            ReadLock(r, "k", timeout=1, lock_delay=1)
        with pytest.raises(LockArgumentError):
            Semaphore(r, "k", 0)
        with pytest.raises(LockArgumentError):
            await Lock(r, "k", timeout=1).acquire(token="")
        with pytest.raises(LockArgumentError):
            await Lock(r, "k", timeout=1).acquire(blocking_timeout=-1)
        await r.aclose() if hasattr(r, "aclose") else await r.close()

    run(main())
