"""Issue 25, points 2 to 4 and the watcher hooks (sync and asyncio), against a real server:
redis-py's exact behaviour (a key overwritten by another type is "not owned", the classes are
redis-py's, the do_* hooks are called), ``LockLostError`` surviving ``with``, and Semaphore
objects used as ``threading.Semaphore`` / ``asyncio.Semaphore`` are."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List, Optional

import pytest
import redis
import redis.asyncio
import redis.asyncio.lock
import redis.lock

import kit
from redis_lock_client import (
    Lock,
    LockError,
    LockLostError,
    LockNotOwnedError,
    ReadLock,
    RWLock,
    Semaphore,
    _watch_aio,
    _watch_sync,
)
from redis_lock_client import asyncio as alock


def holders(r: "redis.Redis[bytes]", key: str) -> List[bytes]:
    info = Lock(r, key).info()
    return [] if info is None else [h.owner for h in info.holders]


def aclient(server: kit.Server) -> "redis.asyncio.Redis[bytes]":
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port)


async def aclose(c: Any) -> None:
    await (c.aclose() if hasattr(c, "aclose") else c.close())


# -- 2. a key overwritten with another type: "not owned", as redis-py says --------------------


@pytest.mark.parametrize("op", ["release", "extend", "reacquire"])
def test_overwritten_key_is_not_owned(r: "redis.Redis[bytes]", op: str) -> None:
    lock = Lock(r, "k", timeout=30)
    assert lock.acquire()
    r.set("k", "someone else's")
    with pytest.raises(LockNotOwnedError) as caught:
        if op == "release":
            lock.release()
        elif op == "extend":
            lock.extend(10)
        else:
            lock.reacquire()
    assert isinstance(caught.value, LockLostError) and caught.value.reason == "overwritten"


@pytest.mark.parametrize("op", ["release", "extend", "reacquire"])
def test_overwritten_key_is_not_owned_asyncio(server: kit.Server, op: str) -> None:
    async def main() -> None:
        r = aclient(server)
        await r.flushall()
        lock = alock.Lock(r, "k", timeout=30)
        assert await lock.acquire()
        await r.set("k", "someone else's")
        with pytest.raises(LockNotOwnedError) as caught:
            if op == "release":
                await lock.release()
            elif op == "extend":
                await lock.extend(10)
            else:
                await lock.reacquire()
        assert isinstance(caught.value, LockLostError) and caught.value.reason == "overwritten"
        await aclose(r)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_classes_are_redis_pys(r: "redis.Redis[bytes]") -> None:
    for lock in (Lock(r, "k"), ReadLock(r, "k"), Semaphore(r, "k", 2), RWLock(r, "k").write()):
        assert isinstance(lock, redis.lock.Lock)
    for alk in (alock.Lock(r, "k"), alock.ReadLock(r, "k"), alock.Semaphore(r, "k", 2)):
        assert isinstance(alk, redis.asyncio.lock.Lock)
    theirs = redis.lock.Lock(r, "x", timeout=5)
    ours = Lock(r, "x", timeout=5)
    for attr in vars(theirs):
        assert hasattr(ours, attr), attr
    for attr in ("lua_release", "lua_extend", "lua_reacquire", "LUA_RELEASE_SCRIPT", "register_scripts"):
        assert hasattr(ours, attr), attr


class _Hooked(Lock):
    calls: List[str] = []

    def do_acquire(self, token: Any) -> bool:
        self.calls.append("acquire")
        return super().do_acquire(token)

    def do_release(self, expected_token: Any) -> None:
        self.calls.append("release")
        super().do_release(expected_token)

    def do_extend(self, additional_time: float, replace_ttl: bool) -> Any:
        self.calls.append("extend")
        return super().do_extend(additional_time, replace_ttl)

    def do_reacquire(self) -> Any:
        self.calls.append("reacquire")
        return super().do_reacquire()


def test_subclass_hooks_are_called(r: "redis.Redis[bytes]") -> None:
    lock = _Hooked(r, "k", timeout=30)
    assert lock.acquire()
    assert lock.fencing_token is not None
    lock.extend(5)
    lock.reacquire()
    lock.release()
    assert _Hooked.calls == ["acquire", "extend", "reacquire", "release"]
    assert holders(r, "k") == []


class _Refusing(Lock):
    def do_acquire(self, token: Any) -> bool:
        return False  # a user's policy: never take it


def test_a_hook_decides(r: "redis.Redis[bytes]") -> None:
    lock = _Refusing(r, "k", timeout=30)
    assert lock.acquire(blocking=False) is False
    assert lock.local.token is None and holders(r, "k") == []


class _AHooked(alock.Lock):
    calls: List[str] = []

    async def do_acquire(self, token: Any) -> bool:
        self.calls.append("acquire")
        return await super().do_acquire(token)

    async def do_release(self, expected_token: Any) -> None:
        self.calls.append("release")
        await super().do_release(expected_token)

    async def do_extend(self, additional_time: float, replace_ttl: bool) -> Any:
        self.calls.append("extend")
        return await super().do_extend(additional_time, replace_ttl)

    async def do_reacquire(self) -> Any:
        self.calls.append("reacquire")
        return await super().do_reacquire()


def test_subclass_hooks_are_called_asyncio(server: kit.Server) -> None:
    async def main() -> None:
        r = aclient(server)
        await r.flushall()
        lock = _AHooked(r, "k", timeout=30)
        assert await lock.acquire()
        await lock.extend(5)
        await lock.reacquire()
        await lock.release()
        assert _AHooked.calls == ["acquire", "extend", "reacquire", "release"]
        assert await lock.info() is None or not (await lock.locked())
        await aclose(r)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_repr(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "reprkey", timeout=30)
    assert "reprkey" in repr(lock) and "not held" in repr(lock) and "timeout=30" in repr(lock)
    lock.acquire()
    text = repr(lock)
    assert " held" in text and f"fencing_token={lock.fencing_token}" in text
    assert lock.local.token.decode() not in text  # the owner token is a secret
    lock.release()
    sem = Semaphore(r, "s", 3)
    sem.acquire()
    assert "capacity=3" in repr(sem) and "permits_held=1" in repr(sem)
    sem.release()
    assert "reprkey" in repr(RWLock(r, "reprkey")) and "asyncio" in repr(alock.Lock(r, "x"))


# -- 3. LockLostError survives `with` ---------------------------------------------------------


def test_lock_lost_error_survives_with(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=0.2)
    with pytest.raises(LockLostError) as caught:
        with lock:
            kit.wait_for(lambda: not lock.locked(), 10, what="the lease to run out")
            lock.check()
    assert caught.value.reason == "expired"
    assert lock.local.token is None


def test_release_error_still_raised_when_the_body_did_not_raise(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=0.2)
    with pytest.raises(LockNotOwnedError):
        with lock:
            kit.wait_for(lambda: not lock.locked(), 10, what="the lease to run out")


def test_lock_lost_error_survives_async_with(server: kit.Server) -> None:
    async def main() -> None:
        r = aclient(server)
        await r.flushall()
        lock = alock.Lock(r, "k", timeout=0.2)
        with pytest.raises(LockLostError) as caught:
            async with lock:
                while await lock.locked():
                    await asyncio.sleep(0.02)
                lock.check()
        assert caught.value.reason == "expired"
        await aclose(r)

    asyncio.run(asyncio.wait_for(main(), 30))


# -- 4. Semaphore objects as threading.Semaphore / asyncio.Semaphore --------------------------


def test_semaphore_acquired_twice_in_one_thread(r: "redis.Redis[bytes]") -> None:
    sem = Semaphore(r, "s", 3, timeout=30)
    assert sem.acquire()
    first = sem.local.token
    assert sem.acquire()
    second = sem.local.token  # the caller's most recent permit
    assert first is not None and second is not None and first != second  # a permit each
    assert sorted(holders(r, "s")) == sorted([first, second])
    sem.release()
    assert holders(r, "s") == [first]
    sem.release()
    assert holders(r, "s") == []
    with pytest.raises(LockError):
        sem.release()


def test_semaphore_shared_by_threads(r: "redis.Redis[bytes]") -> None:
    sem = Semaphore(r, "s", 3, timeout=30, blocking_timeout=30)
    inside = [0]
    most = [0]
    errors: List[BaseException] = []
    mutex = threading.Lock()

    def work() -> None:
        try:
            for _ in range(5):
                with sem:
                    token = sem.fencing_token
                    with mutex:
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                    time.sleep(0.005)
                    assert sem.fencing_token == token  # still this thread's permit
                    sem.check()
                    with mutex:
                        inside[0] -= 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert 1 <= most[0] <= 3
    assert holders(r, "s") == []


def test_semaphore_released_by_another_thread(r: "redis.Redis[bytes]") -> None:
    sem = Semaphore(r, "s", 2, timeout=30)
    assert sem.acquire()
    t = threading.Thread(target=sem.release)  # threading.Semaphore allows it
    t.start()
    t.join(10)
    assert holders(r, "s") == []


def test_semaphore_shared_by_tasks(server: kit.Server) -> None:
    async def main() -> None:
        r = aclient(server)
        await r.flushall()
        sem = alock.Semaphore(r, "s", 2, timeout=30, blocking_timeout=30)
        inside = [0]
        most = [0]

        async def work() -> None:
            for _ in range(3):
                async with sem:
                    token = sem.fencing_token
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    await asyncio.sleep(0.01)
                    assert sem.fencing_token == token  # still this task's permit
                    sem.check()
                    inside[0] -= 1

        await asyncio.gather(*(work() for _ in range(10)))
        assert 1 <= most[0] <= 2
        info = await sem.info()
        assert info is None or not info.holders, info
        await aclose(r)

    asyncio.run(asyncio.wait_for(main(), 60))


# -- the watcher's hooks (its implementation is another part of the issue) --------------------


class _Recorder:
    def __init__(self) -> None:
        self.watched: List[Any] = []
        self.unwatched: List[Any] = []
        self.calls: List[List[Any]] = []


def test_watcher_hooks(r: "redis.Redis[bytes]", monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder()

    def watch(client: Any, name: Any, owner: bytes, on_loss: Any) -> Any:
        handle = _watch_sync.Handle(None, None)  # type: ignore[arg-type]
        rec.watched.append((name, owner, on_loss, handle))
        return handle

    def call(client: Any, args: List[Any], timeout: Optional[float]) -> Any:
        rec.calls.append(args)
        return client.execute_command(*args)

    monkeypatch.setattr(_watch_sync, "watch", watch)
    monkeypatch.setattr(_watch_sync, "unwatch", rec.unwatched.append)
    monkeypatch.setattr(_watch_sync, "call", call)
    seen: List[LockLostError] = []
    lock = Lock(r, "k", timeout=0.6, on_lost=seen.append)
    assert lock.acquire()
    name, owner, on_loss, handle = rec.watched[0]
    assert name == "k" and owner == lock.local.token
    kit.wait_for(lambda: rec.calls, 5, what="a renewal through the watcher's call")
    assert rec.calls[0][:3] == ["LOCK.EXTEND", "k", owner]
    on_loss("deleted")
    on_loss("deleted")
    assert lock.lost and len(seen) == 1 and seen[0].reason == "deleted"
    with pytest.raises(LockLostError) as caught:
        lock.check()
    assert caught.value.reason == "deleted"
    lock.release()
    assert rec.unwatched == [handle]


def test_watcher_hooks_asyncio(server: kit.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder()

    def watch(client: Any, name: Any, owner: bytes, on_loss: Any) -> Any:
        handle = _watch_aio.Handle(None, None)  # type: ignore[arg-type]
        rec.watched.append((name, owner, on_loss, handle))
        return handle

    async def call(client: Any, args: List[Any], timeout: Optional[float]) -> Any:
        rec.calls.append(args)
        return await client.execute_command(*args)

    monkeypatch.setattr(_watch_aio, "watch", watch)
    monkeypatch.setattr(_watch_aio, "unwatch", rec.unwatched.append)
    monkeypatch.setattr(_watch_aio, "call", call)

    async def main() -> None:
        r = aclient(server)
        await r.flushall()
        seen: List[LockLostError] = []

        async def on_lost(err: LockLostError) -> None:
            seen.append(err)

        lock = alock.Lock(r, "k", timeout=0.6, on_lost=on_lost)
        assert await lock.acquire()
        name, owner, on_loss, handle = rec.watched[0]
        assert owner == lock.local.token
        while not rec.calls:
            await asyncio.sleep(0.02)
        assert rec.calls[0][:3] == ["LOCK.EXTEND", "k", owner]
        pending = on_loss("expired")
        assert pending is not None
        await pending
        assert on_loss("expired") is None
        assert lock.lost and len(seen) == 1 and seen[0].reason == "expired"
        await lock.release()
        assert rec.unwatched == [handle]
        await aclose(r)

    asyncio.run(asyncio.wait_for(main(), 30))
