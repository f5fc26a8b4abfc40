"""Regression tests from the review of the Python client: the local lease after extend() and
reacquire(), a cancelled asyncio acquire, an interrupted sync Redlock acquire."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio
from redis.exceptions import LockError, LockNotOwnedError

import kit
from kit import wait_for
from redis_lock_client import Lock, Redlock
from redis_lock_client import asyncio as alock


def holders_on(servers: List[kit.Server], key: str) -> List[List[bytes]]:
    out = []
    for s in servers:
        c = s.client()
        info = Lock(c, key).info()
        c.close()
        out.append([] if info is None else [h.owner for h in info.holders])
    return out


# -- the local lease follows extend() and reacquire() --------------------------------------------


def test_extend_moves_the_local_lease_with_the_servers_ttl(r: "redis.Redis[bytes]") -> None:
    """extend() used to count the new lease as 1 ms (the script answered 1): a lock extended
    from 1 s to 31 s was reported lost after 1 s while the server still held it."""
    lock = Lock(r, "k", timeout=1)
    assert lock.acquire()
    lock.extend(30)
    assert lock.check() > 20
    time.sleep(1.5)  # past the first lease
    assert lock.owned()
    assert not lock.lost
    assert lock.check() > 20
    lock.release()


def test_a_shorter_lease_is_not_overstated(r: "redis.Redis[bytes]") -> None:
    """extend(t, replace_ttl=True) and reacquire() may shorten the lease on the server: the
    local validity must follow (it kept the longer one)."""
    lock = Lock(r, "k", timeout=2)
    assert lock.acquire()
    lock.extend(30)
    assert lock.check() > 20
    lock.reacquire()  # back to 2 s on the server
    assert lock.check() <= 2
    lock.extend(30)
    lock.extend(0.5, replace_ttl=True)
    assert lock.check() <= 0.5
    wait_for(lambda: not lock.owned(), 10, what="the server to expire the hold")
    assert lock.lost


def test_async_extend_moves_the_local_lease(server: kit.Server) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        lock = alock.Lock(r, "ak", timeout=1)
        assert await lock.acquire()
        await lock.extend(30)
        assert lock.check() > 20
        await asyncio.sleep(1.5)
        assert await lock.owned()
        assert not lock.lost
        assert lock.check() > 20
        await lock.reacquire()
        assert lock.check() <= 1
        await lock.release()
        await r.aclose() if hasattr(r, "aclose") else await r.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_redlock_extend_to_a_shorter_lease(redlock_servers: List[kit.Server]) -> None:
    cs = [s.client() for s in redlock_servers]
    rl = Redlock(cs, "rk", timeout=30, blocking=False)
    assert rl.acquire()
    assert rl.validity > 20
    rl.extend(1)  # LOCK.EXTEND replaces the ttl: 1 s left on every server
    assert rl.validity <= 1
    wait_for(lambda: rl.lost, 10, what="the shortened lease to run out")
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers, "rk")), 10, what="the servers to expire it")
    with pytest.raises(LockNotOwnedError):
        rl.release()


# -- an asyncio acquire cancelled while its first request is out -----------------------------


def test_async_acquire_cancelled_after_the_servers_grant_leaves_nothing(server: kit.Server) -> None:
    """Adapted for issue 25: the first try no longer goes through ``execute_command`` (it is
    one request, try and wait, on a connection of ours), so the task is cancelled at every
    await of the acquire in turn, the grant's reply included: nothing may stay held."""

    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        for k in range(12):
            lock = alock.Lock(r, "ck", timeout=30)
            task = asyncio.ensure_future(lock.acquire())
            for _ in range(k):
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                assert lock.local.token is None
            else:
                await lock.release()  # it completed before the cancel landed
            info = await alock.Lock(r, "ck").info()
            assert info is None or not info.holders, (k, info)
        await (r.aclose() if hasattr(r, "aclose") else r.close())

    asyncio.run(asyncio.wait_for(main(), 60))


# -- a sync Redlock acquire interrupted while the requests are out -----------------------------


def test_redlock_acquire_interrupted_leaves_no_grant(redlock_servers: List[kit.Server]) -> None:
    """KeyboardInterrupt while the requests to 5 servers run in the pool's threads: 3 servers
    granted at once, 2 are paused (the wait for their answers is where the interrupt lands).
    The grants must be handed back, not kept for the whole 30 s lease."""
    assert threading.current_thread() is threading.main_thread()
    cs = [s.client() for s in redlock_servers]
    for c in cs:
        c.ping()
    redlock_servers[3].pause()
    redlock_servers[4].pause()
    try:
        rl = Redlock(cs, "ik", timeout=30, blocking=False, instance_timeout=3)
        main = threading.main_thread().ident
        timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))  # type: ignore[arg-type]
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            rl.acquire()
        timer.join()
    finally:
        for s in redlock_servers:
            s.resume()
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers, "ik")), 10, what="ik to be free everywhere")


# -- a release that cancels the asyncio watchdog in the middle of its extend -----------------


def test_release_during_a_watchdog_extend_leaves_no_unread_reply(server: kit.Server) -> None:
    """release() cancels the watchdog task; if that lands while its LOCK.EXTEND is out, the
    connection must not go back to the idle ones with the reply unread: the next wait taking
    it would read that reply (1) as its own grant and believe it holds a busy lock."""

    async def main() -> None:
        r = redis.asyncio.Redis(port=server.port)
        await r.flushall()
        busy = alock.Lock(r, "busy", timeout=30)
        assert await busy.acquire()
        lock = alock.Lock(r, "w", timeout=3, watchdog=True)  # renews at 1 s, 2 s, ...
        assert await lock.acquire()
        await asyncio.sleep(1.5)  # the first renewal connected the watchdog's connection
        server.pause()
        try:
            await asyncio.sleep(1.0)  # the renewal sent at 2 s is out, unanswered
            releasing = asyncio.ensure_future(lock.release())
            await asyncio.sleep(0.3)
        finally:
            server.resume()
        try:
            await releasing
        except LockError:
            pass  # the lease may have run out while the server was stopped
        other = alock.Lock(r, "busy", timeout=30, blocking_timeout=1)
        assert await other.acquire() is False  # busy holds it
        assert await busy.owned()
        await busy.release()

    asyncio.run(asyncio.wait_for(main(), 60))


# -- Redlock connections after fork ----------------------------------------------------------


def test_redlock_in_a_forked_child_uses_connections_of_its_own(redlock_servers: List[kit.Server]) -> None:
    """A Redlock used before fork keeps idle connections and a thread pool. The child must not
    use either: the pool has no threads in the child (its requests never ran: a hang), and the
    connections' sockets are shared with the parent (replies interleave, and a bound hold taken
    on one does not end when the child dies, since the parent still has the socket open)."""
    import os

    cs = [s.client() for s in redlock_servers[:3]]
    rl = Redlock(cs, "fk", timeout=30, blocking=False, bind=True)
    assert rl.acquire()
    rl.release()  # its connections are idle now
    pid = os.fork()
    if pid == 0:  # the child: take the lock bound, and die without releasing it
        code = 1
        signal.alarm(20)  # a hang (the parent's thread pool, without its threads) kills it
        try:
            code = 0 if rl.acquire() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    # The child's connections closed with it: its bound holds end at once, not at the ttl.
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers[:3], "fk")), 10, what="fk to be freed by the child's exit")


# -- a cancelled release() is not swallowed ---------------------------------------------------


def test_cancelling_release_while_it_stops_the_watchdog_propagates() -> None:
    """release() first stops the watchdog task and waits for it; a cancellation of release()
    landing there used to be swallowed (the task went on as if never cancelled)."""
    from redis_lock_client.asyncio import _join  # what the StopWatchdog effect runs

    class _Hold:
        stopped = False
        watchdog: Any = None

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1)  # e.g. abandoning its connection
            raise

    async def main() -> None:
        hold = _Hold()
        hold.watchdog = asyncio.ensure_future(slow_to_stop())
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(_join(hold.watchdog))
        await asyncio.sleep(0.2)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        await asyncio.wait([hold.watchdog])

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_cancel_during_the_clean_up_of_an_abandoned_request_propagates() -> None:
    """The clean-up of an unanswered request is shielded (it completes), but a cancellation
    of the caller that lands during it must still propagate, not be swallowed."""
    from redis_lock_client._aio_connections import abandon as _abandon

    class _SlowConn:
        is_connected = True
        closed = False

        def pack_command(self, *args: Any) -> bytes:
            return b""

        async def send_packed_command(self, data: Any, check_health: bool = True) -> None:
            await asyncio.sleep(1)

        async def disconnect(self, nowait: bool = False) -> None:
            self.closed = True

    async def main() -> None:
        conn = _SlowConn()
        cleaning = asyncio.ensure_future(_abandon(conn, ["LOCK.RELEASE", "k", "o", "ALL"]))
        await asyncio.sleep(0.2)
        cleaning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cleaning
        for _ in range(300):  # the shielded clean-up still completes
            if conn.closed:
                break
            await asyncio.sleep(0.01)
        assert conn.closed

    asyncio.run(asyncio.wait_for(main(), 60))
