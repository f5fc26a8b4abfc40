"""Connections within the user's limits and bounded steps, asyncio (issue 25, points 3 and 5):
the primitives of ``_aio_connections`` used directly, as the asyncio Lock will use them, with
``redis.asyncio`` pools (run with asyncio.run, no plugin needed)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio

import kit
from redis_lock_client import _aio_connections as conns
from redis_lock_client import _connections as sync_conns
from redis_lock_client._common import grant_token, release_args


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def pool_clients(admin: "redis.Redis[bytes]", name: str) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == name)


def test_the_module_has_the_sync_modules_names() -> None:
    import inspect

    for name in sync_conns.__all__:
        assert hasattr(conns, name), name
    for name in ("take", "give_back", "abandon", "call", "connect", "request", "reconnect", "read"):
        assert inspect.iscoroutinefunction(getattr(conns, name)), name
    assert conns.ConnectionLimitError is sync_conns.ConnectionLimitError


async def acquire(pool: Any, key: str, owner: bytes, deadline: float) -> int:
    """A try, then a wait on a wait connection: what the asyncio Lock does."""
    reply = await conns.request(pool, ["LOCK.ACQUIRE", key, owner, 60000], deadline, release=release_args(key, owner))
    fence = grant_token(reply)
    if fence is not None:
        return fence
    conn = await conns.take(pool, deadline)
    try:
        left = conns.remaining(deadline)
        assert left is not None
        reply = await conns.call(conn, ["LOCK.ACQUIRE", key, owner, 60000, "WAIT", int(left * 1000)], left + 2)
    except BaseException:
        await conns.abandon(conn, release_args(key, owner))
        raise
    await conns.give_back(pool, conn)
    fence = grant_token(reply)
    assert fence is not None
    return fence


def test_30_waiting_tasks_stay_within_a_blocking_pool_of_4(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    most = [0]
    got: List[int] = []
    inside = [0]
    most_inside = [0]

    async def main() -> None:
        pool = redis.asyncio.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=4, timeout=60, client_name="acap4")
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                most[0] = max(most[0], await asyncio.get_running_loop().run_in_executor(None, pool_clients, r, "acap4"))
                await asyncio.sleep(0.003)

        sampler = asyncio.ensure_future(sample())
        assert await acquire(pool, "acap", b"holder", time.monotonic() + 5)

        async def worker(i: int) -> None:
            owner = f"w{i}".encode()
            await acquire(pool, "acap", owner, time.monotonic() + 100)
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
            got.append(i)
            await asyncio.sleep(0.005)
            inside[0] -= 1
            await conns.request(pool, release_args("acap", owner), time.monotonic() + 5)

        tasks = [asyncio.ensure_future(worker(i)) for i in range(30)]
        deadline = time.monotonic() + 20
        while conns.in_use(pool) != (3, 27):
            assert time.monotonic() < deadline, conns.in_use(pool)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert conns.in_use(pool) == (3, 27)
        await conns.request(pool, release_args("acap", b"holder"), time.monotonic() + 5)
        await asyncio.gather(*tasks)
        stop.set()
        await sampler
        assert conns.in_use(pool) == (0, 0)
        # (Waited for: the server lists a connection we closed until it has read the close.)
        deadline = time.monotonic() + 10
        while pool_clients(r, "acap4") > conns.MAX_IDLE:
            assert time.monotonic() < deadline, pool_clients(r, "acap4")
            await asyncio.sleep(0.01)
        await pool.disconnect()

    run(main())
    assert sorted(got) == list(range(30))
    assert most_inside[0] == 1
    assert most[0] <= 4, f"the server saw {most[0]} connections of a pool of 4"


def test_no_connection_for_a_wait_raises_a_clear_error(server: kit.Server) -> None:
    async def main() -> None:
        pool = redis.asyncio.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=3, timeout=30)
        conns.configure(pool, max_wait_connections=1)
        first = await conns.take(pool, time.monotonic() + 5)
        started = time.monotonic()
        with pytest.raises(conns.ConnectionLimitError) as e:
            await conns.take(pool, time.monotonic() + 0.3)
        assert 0.25 <= time.monotonic() - started < 2
        assert e.value.limit == "max_wait_connections" and "raise max_wait_connections" in str(e.value)
        await conns.give_back(pool, first)
        assert conns.in_use(pool) == (0, 0)
        plain = redis.asyncio.ConnectionPool(host="127.0.0.1", port=server.port, max_connections=2)
        a = await conns.take(plain, None, wait=False)
        b = await conns.take(plain, None, wait=False)
        with pytest.raises(conns.ConnectionLimitError) as e2:
            await conns.take(plain, time.monotonic() + 1, wait=False)
        assert e2.value.limit == "max_connections" and "max_connections=2" in str(e2.value)
        await conns.give_back(plain, a)
        await conns.give_back(plain, b)
        await pool.disconnect()
        await plain.disconnect()

    run(main())


def test_a_request_against_a_stopped_server_ends_within_its_deadline(server: kit.Server) -> None:
    took: List[float] = []

    async def main() -> None:
        pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=server.port)
        c = await conns.take(pool, None, wait=False)
        await conns.connect(c, None)
        await conns.give_back(pool, c)
        server.pause()
        try:
            for _ in range(2):  # the first reuses the connected one, the second connects anew
                started = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError):
                    await conns.request(pool, ["LOCK.ACQUIRE", "stopped", "me", 1000], time.monotonic() + 2.0)
                took.append(time.monotonic() - started)
        finally:
            server.resume()
        assert conns.in_use(pool) == (0, 0)
        await pool.disconnect()

    run(main())
    assert all(1.9 <= t < 2.0 + kit.late() for t in took), took


def test_cancelled_waiters_leave_the_queue_and_their_places(server: kit.Server) -> None:
    async def main() -> None:
        pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=server.port)
        conns.configure(pool, max_wait_connections=1)
        first = await conns.take(pool, None)
        queued = [asyncio.ensure_future(conns.take(pool, None)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert conns.in_use(pool) == (1, 3)
        queued[0].cancel()
        await asyncio.sleep(0.01)
        assert conns.in_use(pool) == (1, 2)
        await conns.give_back(pool, first)
        second = await queued[1]
        assert conns.in_use(pool) == (1, 1)
        await conns.abandon(second, None)
        third = await queued[2]
        await conns.give_back(pool, third)
        assert conns.in_use(pool) == (0, 0)
        assert len(pool._in_use_connections) == 0
        await pool.disconnect()

    run(main())


def test_reconnect_across_a_restart() -> None:
    s = kit.Server()
    again = None
    try:
        port = s.port

        async def main() -> None:
            nonlocal again
            pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=port)
            conn = await conns.take(pool, None)
            await conns.connect(conn, None)
            s.stop()
            with pytest.raises(redis.exceptions.ConnectionError):
                await conns.call(conn, ["PING"], 2)
            started = time.monotonic()
            trying = asyncio.ensure_future(conns.reconnect(conn, time.monotonic() + 20))
            await asyncio.sleep(0.6)
            assert not trying.done()
            again = subprocess.Popen(
                [kit.SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loadmodule", kit.MODULE],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await trying
            assert time.monotonic() - started >= 0.5
            assert await conns.call(conn, ["PING"], 2) in (b"PONG", True)
            await conns.give_back(pool, conn)
            assert conns.in_use(pool) == (0, 0)
            await pool.disconnect()

        run(main())
    finally:
        if again is not None:
            again.kill()
            again.wait()
        s.close()


# ----------------------------------------------------------------------------------------------
# The asyncio Lock on these connections


def test_30_tasks_of_the_asyncio_lock_stay_within_a_blocking_pool_of_4(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The asyncio ``Lock`` itself (not the primitives): 30 tasks waiting with
    ``BlockingConnectionPool(max_connections=4)``: the server sees at most 4 connections of
    the pool, at most 2 stay connected afterwards, and the wait limit (3) holds."""
    from redis_lock_client.asyncio import Lock

    most = [0]
    got: List[int] = []
    inside = [0]
    most_inside = [0]
    after: List[int] = []

    async def main() -> None:
        pool = redis.asyncio.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=4, timeout=60, client_name="alock4")
        client = redis.asyncio.Redis(connection_pool=pool)
        holder = Lock(client, "alock", timeout=60, thread_local=False)
        assert await holder.acquire()
        loop = asyncio.get_running_loop()
        # A lock without a watchdog has no loss watcher.
        watcher: "set[int]" = set()
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                most[0] = max(most[0], await loop.run_in_executor(None, kit.pool_clients, r, "alock4", watcher))
                await asyncio.sleep(0.003)

        sampler = asyncio.ensure_future(sample())

        async def worker(i: int) -> None:
            lock = Lock(client, "alock", timeout=60, blocking_timeout=100)
            assert await lock.acquire()
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
            got.append(i)
            await asyncio.sleep(0.005)
            inside[0] -= 1
            await lock.release()

        tasks = [asyncio.ensure_future(worker(i)) for i in range(30)]
        deadline = time.monotonic() + 20
        while conns.in_use(pool) != (3, 27):
            assert time.monotonic() < deadline, conns.in_use(pool)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert conns.in_use(pool) == (3, 27)
        await holder.release()
        await asyncio.gather(*tasks)
        stop.set()
        await sampler
        assert conns.in_use(pool) == (0, 0)
        # (Waited for, up to 10 s: the server lists a connection we closed until it has read
        # the close.) Beyond the idle connections the waits leave, the releases go through
        # redis-py's own commands, which may connect connections of the pool again (several
        # at once when tasks release together) and keep them: as in the sync test, 2 more.
        deadline = time.monotonic() + 10
        while True:
            left = await loop.run_in_executor(None, kit.pool_clients, r, "alock4", watcher)
            if left <= conns.MAX_IDLE + 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        after.append(left)
        await client.aclose() if hasattr(client, "aclose") else await client.close()
        await pool.disconnect()

    run(main())
    assert sorted(got) == list(range(30))
    assert most_inside[0] == 1
    assert most[0] <= 4, f"the server saw {most[0]} connections of a pool of 4"
    assert after[0] <= conns.MAX_IDLE + 2, f"{after[0]} connections of the pool stayed connected"


def test_asyncio_lock_client_queue_timeout_and_limit_errors(server: kit.Server) -> None:
    """As the sync Lock: a wait whose blocking_timeout runs out queued in the client returns
    False within that time; a non-blocking bound acquire beyond the wait limit raises
    ``ConnectionLimitError`` at once instead of queueing."""
    import redis_lock_client
    from redis_lock_client.asyncio import Lock

    async def main() -> None:
        pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=server.port)
        client = redis.asyncio.Redis(connection_pool=pool)
        redis_lock_client.configure_connections(client, max_wait_connections=1)
        holder = Lock(client, "abusy", timeout=30, thread_local=False)
        assert await holder.acquire()
        waiter = Lock(client, "abusy", timeout=30, thread_local=False)
        long_wait = asyncio.ensure_future(waiter.acquire(blocking_timeout=20))
        deadline = time.monotonic() + 10
        while conns.in_use(pool) != (1, 0):
            assert time.monotonic() < deadline, conns.in_use(pool)
            await asyncio.sleep(0.01)
        started = time.monotonic()
        got = await asyncio.wait_for(Lock(client, "afree", timeout=30).acquire(blocking_timeout=0.5), 10)
        took = time.monotonic() - started
        assert got is False and 0.45 <= took < 1.5 + kit.late(), (got, took)
        started = time.monotonic()
        with pytest.raises(redis_lock_client.ConnectionLimitError) as e:
            await asyncio.wait_for(Lock(client, "abound", timeout=None).acquire(blocking=False), 10)
        assert time.monotonic() - started < 1
        assert e.value.limit == "max_wait_connections" and not e.value.queued
        await holder.release()
        assert await long_wait is True
        await waiter.release()
        assert conns.in_use(pool) == (0, 0)
        await client.aclose() if hasattr(client, "aclose") else await client.close()
        await pool.disconnect()

    run(main())
