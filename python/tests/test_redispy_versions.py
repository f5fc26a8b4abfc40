"""What differs between the redis-py releases the package claims (5.0 to 8.2) and once broke
on some of them: run on each by the version matrix (python/compat/matrix.py)."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
from typing import Any, Callable, List

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock
from redis.exceptions import LockError

import kit
import redis_lock_client
import redis_lock_client.asyncio as aio
from redis_lock_client import ConnectionLimitError, LockLostError, Lock


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


# -- errors print as sentences ----------------------------------------------------------------

ERROR_CLASSES = sorted(
    (
        c
        for c in vars(redis_lock_client).values()
        if isinstance(c, type) and issubclass(c, Exception) and c.__module__.startswith("redis_lock_client")
    ),
    key=lambda c: c.__name__,
)


def test_every_exception_class_of_ours_is_checked_below() -> None:
    names = {c.__name__ for c in ERROR_CLASSES}
    assert {"LockLostError", "ConnectionLimitError", "LockRefusedError", "RedlockError", "LockArgumentError"} <= names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_errors_print_as_their_message_given_every_argument_positionally(cls: Callable[..., Exception]) -> None:
    # Each class's own arguments after the message, positionally (redis-py 5.0 to 8.0's LockError
    # does not call Exception.__init__, so args kept all of them and str() showed a tuple).
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]  # type: ignore[misc]
    extra: List[Any] = []
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
            break
        extra.append({"lock_name": "se", "reason": "overwritten", "code": "DEADLOCK", "limit": "max_connections", "value": 4, "queued": True}.get(p.name, None))
    err = cls("Cannot release a lock that is no longer owned", *extra)
    text = str(err)
    assert text.startswith("Cannot release a lock that is no longer owned"), text
    assert "(" not in text and "'se'" not in text, text
    assert err.args == (text,)


def test_lock_lost_error_keeps_its_fields() -> None:
    err = LockLostError("Cannot release a lock that is no longer owned", "se", "overwritten")
    assert str(err) == "Cannot release a lock that is no longer owned"
    assert (err.lock_name, err.reason, getattr(err, "message")) == ("se", "overwritten", str(err))
    limit = ConnectionLimitError("no connection within 1 s", "max_connections", 4, True)
    assert str(limit) == "no connection within 1 s"
    assert (limit.limit, limit.value, limit.queued) == ("max_connections", 4, True)


def test_a_lost_lock_raised_by_release_prints_as_a_sentence(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "se", timeout=30)
    assert lock.acquire()
    r.delete("se")
    r.set("se", "x")
    with pytest.raises(LockError) as info:
        lock.release()
    text = str(info.value)
    assert text and not text.startswith("(") and "se" in text, text


# -- acquire's signature follows redis-py's ---------------------------------------------------


def test_acquire_takes_every_parameter_redis_pys_does() -> None:
    for ours, theirs in ((Lock, redis.lock.Lock), (aio.Lock, redis.asyncio.lock.Lock)):
        mine = inspect.signature(ours.acquire).parameters
        for name, p in inspect.signature(theirs.acquire).parameters.items():
            assert name in mine, (ours, name)
            assert mine[name].kind == p.kind, (ours, name)
            assert mine[name].default == p.default, (ours, name)
    # `sleep` is keyword-only on the asyncio Lock on every version (redis-py 8.2 added it there).
    assert inspect.signature(aio.Lock.acquire).parameters["sleep"].kind is inspect.Parameter.KEYWORD_ONLY


def test_asyncio_acquire_accepts_sleep_and_does_not_poll(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    async def main() -> None:
        c = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            holder = aio.Lock(c, "sl", timeout=30)
            assert await holder.acquire(sleep=0.5)
            waiter = aio.Lock(c, "sl", timeout=30)
            task = asyncio.ensure_future(waiter.acquire(sleep=100, blocking_timeout=20))
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            start = loop.time()
            await holder.release()
            assert await task
            # A sleep of 100 s between polls would show here: the hand-over is the server's.
            assert loop.time() - start < 10
            await waiter.release()
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    run(main())


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_a_bad_sleep_is_refused_before_anything_is_sent(r: "redis.Redis[bytes]", bad: float) -> None:
    with pytest.raises(ValueError):
        Lock(r, "bs", timeout=5, sleep=bad)
    lock = Lock(r, "bs", timeout=5)
    with pytest.raises(ValueError):
        lock.acquire(sleep=bad)
    with pytest.raises(TypeError):
        lock.acquire(sleep="1")  # type: ignore[arg-type]
    alock = aio.Lock(r, "bs", timeout=5)
    with pytest.raises(ValueError):
        run(alock.acquire(sleep=bad))
    with pytest.raises(TypeError):
        run(alock.acquire(sleep="1"))  # type: ignore[arg-type]
    assert r.exists("bs") == 0


# -- asyncio connections on every pool make ---------------------------------------------------


@pytest.mark.parametrize("pool_class", ["ConnectionPool", "BlockingConnectionPool"])
def test_asyncio_acquire_on_each_pool_class(server: kit.Server, pool_class: str) -> None:
    # redis-py 5.0 to 5.2's asyncio pools have no _lock: an acquire failed with AttributeError.
    async def main() -> None:
        pool = getattr(redis.asyncio, pool_class)(host="127.0.0.1", port=server.port, max_connections=4)
        c = redis.asyncio.Redis(connection_pool=pool)
        try:
            first = aio.Lock(c, f"pool-{pool_class}", timeout=30)
            second = aio.Lock(c, f"pool-{pool_class}", timeout=30)
            assert await first.acquire()
            task = asyncio.ensure_future(second.acquire(blocking_timeout=20))
            await asyncio.sleep(0.1)
            await first.release()
            assert await task
            assert second.fencing_token is not None and first.fencing_token is None
            await second.release()
            assert not await second.locked()
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())
            await pool.disconnect()

    run(main())


# -- no warning of ours, even as errors -------------------------------------------------------

DEL_NOTICED = r"""
import asyncio, sys, warnings
import redis, redis.asyncio
from redis_lock_client.asyncio import Lock

async def main():
    port = int(sys.argv[1])
    c = redis.asyncio.Redis(host="127.0.0.1", port=port)
    seen = []
    lock = Lock(c, "warn-del", timeout=30, on_lost=lambda err: seen.append(err.reason))
    assert await lock.acquire()
    loop = asyncio.get_running_loop()
    admin = redis.Redis(host="127.0.0.1", port=port)
    # The watcher is up once the server has a client named as ours subscribed.
    deadline = loop.time() + 20
    while not any("lock-watcher" in str(x.get("name", "")) for x in admin.client_list()):
        assert loop.time() < deadline, "no watcher connection"
        await asyncio.sleep(0.02)
    admin.delete("warn-del")
    deadline = loop.time() + 20
    while not lock.lost:
        assert loop.time() < deadline, "the DEL was not noticed"
        await asyncio.sleep(0.02)
    print("noticed", seen, flush=True)
    admin.close()
    await (c.aclose() if hasattr(c, "aclose") else c.close())

asyncio.run(main())
"""


def test_asyncio_loss_watcher_notices_a_del_with_warnings_as_errors(server: kit.Server) -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", DEL_NOTICED, str(server.port)],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0 and out.stdout.startswith("noticed"), out
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_docs_asyncio_example_runs_with_warnings_as_errors(server: kit.Server) -> None:
    code = r"""
import asyncio, sys
import redis.asyncio as aredis
from redis_lock_client.asyncio import Lock

async def main():
    r = aredis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
    async with Lock(r, "orders:42", timeout=10, blocking_timeout=5) as lock:
        assert lock.fencing_token is not None
    await (r.aclose() if hasattr(r, "aclose") else r.close())

asyncio.run(main())
print("ok", flush=True)
"""
    out = subprocess.run([sys.executable, "-W", "error", "-c", code, str(server.port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out
