"""redis_lock_client.Lock as a drop-in for redis.lock.Lock: signature, methods, exceptions."""

from __future__ import annotations

import inspect
import threading
import time

import pytest
import redis
import redis.lock
from redis.exceptions import LockError, LockNotOwnedError

from kit import wait_for
from redis_lock_client import Lock, LockArgumentError, LockInfo


def commands_sent(r: "redis.Redis[bytes]") -> int:
    stats = r.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_lock."))


def test_constructor_signature_is_redis_pys() -> None:
    ours = inspect.signature(Lock.__init__).parameters
    theirs = inspect.signature(redis.lock.Lock.__init__).parameters
    positional = [p for p in ours.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    # redis-py's parameters, in order, with the same defaults; redis-py 5 has no
    # raise_on_release_error yet (added in 6), which comes last in ours.
    names = [p.name for p in positional]
    assert names[: len(theirs)] == list(theirs)
    assert set(names[len(theirs) :]) <= {"raise_on_release_error"}
    for p in positional:
        if p.name in theirs:
            assert p.default == theirs[p.name].default, p.name
    mine = inspect.signature(Lock.acquire).parameters
    assert list(mine) == list(inspect.signature(redis.lock.Lock.acquire).parameters)
    for name in ("extend", "reacquire", "release", "locked", "owned"):
        assert list(inspect.signature(getattr(Lock, name)).parameters) == list(
            inspect.signature(getattr(redis.lock.Lock, name)).parameters
        ), name


def test_one_line_switch_through_r_lock(r: "redis.Redis[bytes]") -> None:
    lock = r.lock("orders:42", timeout=10, blocking_timeout=5, lock_class=Lock)
    assert isinstance(lock, Lock)
    with lock as held:
        assert held is lock
        assert lock.owned() and lock.locked()
        assert isinstance(lock.fencing_token, int) and lock.fencing_token > 0
        assert isinstance(lock.local.token, bytes)  # the owner token, as in redis-py
        info = lock.info()
        assert isinstance(info, LockInfo) and info.mode == "write"
        assert info.holders[0].owner == lock.local.token
        assert 9000 < info.holders[0].ttl_ms <= 10000
        # Module 0.3.0+: how long the owner has held it, from its first grant.
        assert info.holders[0].held_ms is not None and 0 <= info.holders[0].held_ms < 5000
    assert not lock.locked() and not lock.owned()
    assert lock.fencing_token is None
    assert r.exists("orders:42") == 0


def test_non_blocking_and_blocking_timeout(r: "redis.Redis[bytes]") -> None:
    a = Lock(r, "k", timeout=10)
    b = Lock(r, "k", timeout=10)
    assert a.acquire()
    assert b.acquire(blocking=False) is False
    t0 = time.monotonic()
    assert b.acquire(blocking_timeout=0.3) is False
    assert time.monotonic() - t0 >= 0.29
    assert b.acquire(blocking_timeout=0) is False  # one try, as redis-py
    nb = Lock(r, "k", timeout=10, blocking=False)
    assert nb.acquire() is False
    with pytest.raises(LockError, match="Unable to acquire lock"):
        with Lock(r, "k", timeout=10, blocking_timeout=0.1):
            pass
    a.release()
    assert b.acquire(blocking=False) is True
    b.release()


def test_fencing_tokens_increase(r: "redis.Redis[bytes]") -> None:
    tokens = []
    for _ in range(5):
        with Lock(r, "fence", timeout=5) as lock:
            tokens.append(lock.fencing_token)
    assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_release_errors_are_redis_pys(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=10)
    with pytest.raises(LockError, match="not owned or is already unlocked"):
        lock.release()
    lock.acquire()
    r.delete("k")
    with pytest.raises(LockNotOwnedError, match="no longer owned"):
        lock.release()
    # After a failed release the lock object is reset, as redis-py's.
    with pytest.raises(LockError):
        lock.release()


def test_expired_lock_is_not_owned(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=0.2)
    assert lock.acquire()
    wait_for(lambda: not lock.locked(), 5, what="the lease to run out")
    assert not lock.owned()
    assert lock.lost
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_context_manager_raise_on_release_error(r: "redis.Redis[bytes]", caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(LockNotOwnedError):
        with Lock(r, "k", timeout=10):
            r.delete("k")
    with Lock(r, "k", timeout=10, raise_on_release_error=False):
        r.delete("k")
    assert "no longer owned" in caplog.text


def test_extend_adds_and_replaces(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=10)
    lock.acquire()
    assert lock.extend(20) is True
    ttl = lock.info().holders[0].ttl_ms  # type: ignore[union-attr]
    assert 29000 < ttl <= 30000
    assert lock.extend(5, replace_ttl=True) is True
    ttl = lock.info().holders[0].ttl_ms  # type: ignore[union-attr]
    assert 4000 < ttl <= 5000
    assert lock.reacquire() is True
    ttl = lock.info().holders[0].ttl_ms  # type: ignore[union-attr]
    assert 9000 < ttl <= 10000
    assert 8 < lock.check() <= 10
    lock.release()


def test_extend_and_reacquire_need_a_timeout_and_a_hold(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k")
    with pytest.raises(LockError, match="unlocked"):
        lock.extend(1)
    with pytest.raises(LockError, match="unlocked"):
        lock.reacquire()
    lock.acquire()
    with pytest.raises(LockError, match="no timeout"):
        lock.extend(1)
    with pytest.raises(LockError, match="no timeout"):
        lock.reacquire()
    lock.release()


def test_thread_local_tokens(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=10)
    lock.acquire()
    seen = {}

    def other() -> None:
        seen["owned"] = lock.owned()
        seen["token"] = lock.local.token
        try:
            lock.release()
        except LockError as e:
            seen["error"] = e

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["owned"] is False and seen["token"] is None
    assert isinstance(seen["error"], LockError)
    assert lock.owned()
    lock.release()

    shared = Lock(r, "k", timeout=10, thread_local=False)
    shared.acquire()
    t = threading.Thread(target=shared.release)
    t.start()
    t.join()
    assert not shared.locked()


def test_explicit_token(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=10)
    assert lock.acquire(token="my-token")
    assert lock.local.token == b"my-token"
    assert lock.info().holders[0].owner == b"my-token"  # type: ignore[union-attr]
    lock.release()
    assert lock.acquire(token=b"\x00\xffbinary")
    assert lock.owned()
    lock.release()


def test_sleep_is_accepted_and_ignored(r: "redis.Redis[bytes]") -> None:
    a = Lock(r, "k", timeout=10, thread_local=False)
    a.acquire()
    b = Lock(r, "k", timeout=10, sleep=100)  # a sleep this long would fail the test if used
    timer = threading.Timer(0.2, a.release)
    timer.start()
    t0 = time.monotonic()
    assert b.acquire(sleep=100, blocking_timeout=10)
    assert time.monotonic() - t0 < 5
    b.release()
    # b is granted inside a's release, maybe before the timer's thread has read its reply: wait
    # for it, or the fixture closes the client under that read (seen under load).
    timer.join(10)
    assert not timer.is_alive()


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        (dict(timeout=0), LockArgumentError, "timeout must be more than 0"),
        (dict(timeout=-1), LockArgumentError, "timeout must be more than 0"),
        (dict(timeout=float("nan")), LockArgumentError, "NaN"),
        (dict(timeout="10"), TypeError, "timeout must be a number"),
        (dict(timeout=2.0**47), LockArgumentError, "at most 2\\^47"),
        (dict(timeout=1, blocking_timeout=-1), LockArgumentError, "blocking_timeout"),
        (dict(timeout=1, lock_delay=-1), LockArgumentError, "lock_delay"),
        (dict(timeout=1, on_lost=5), TypeError, "on_lost"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(
    r: "redis.Redis[bytes]", kwargs: dict, exc: type, text: str  # type: ignore[type-arg]
) -> None:
    before = commands_sent(r)
    with pytest.raises(exc, match=text):
        Lock(r, "k", **kwargs)
    assert commands_sent(r) == before
    assert issubclass(LockArgumentError, ValueError)


def test_bad_call_arguments(r: "redis.Redis[bytes]") -> None:
    lock = Lock(r, "k", timeout=10)
    before = commands_sent(r)
    with pytest.raises(LockArgumentError, match="token must be 1 to 1024 bytes"):
        lock.acquire(token="")
    with pytest.raises(LockArgumentError, match="token must be 1 to 1024 bytes"):
        lock.acquire(token="x" * 1025)
    with pytest.raises(TypeError, match="token"):
        lock.acquire(token=1.5)  # type: ignore[arg-type]
    with pytest.raises(LockArgumentError, match="blocking_timeout"):
        lock.acquire(blocking_timeout=-0.5)
    with pytest.raises(TypeError, match="name"):
        Lock(r, 42)  # type: ignore[arg-type]
    with pytest.raises(LockArgumentError, match="name"):
        Lock(r, "")
    assert commands_sent(r) == before
    lock.acquire()
    with pytest.raises(LockArgumentError, match="additional_time"):
        lock.extend(-1)
    with pytest.raises(LockArgumentError, match="additional_time"):
        lock.extend(0, replace_ttl=True)
    lock.release()


def test_decode_responses_and_resp3_clients(server: object) -> None:
    import kit

    assert isinstance(server, kit.Server)
    for kw in (dict(decode_responses=True), dict(protocol=3), dict(protocol=3, decode_responses=True)):
        c = server.client(**kw)
        c.flushall()
        lock = Lock(c, "k", timeout=10)
        assert lock.acquire()
        assert lock.owned() and lock.locked()
        info = lock.info()
        assert info is not None and info.mode == "write" and info.delay == 0
        assert lock.extend(1) and lock.reacquire()
        lock.release()
        assert lock.info() is None
        c.close()


def test_generated_tokens_fit_the_servers_compact_form(r: "redis.Redis[bytes]") -> None:
    # The server keeps a lone holder with an owner of at most 32 bytes in one small value; a
    # held Lock with a generated token costs what a lock held by a 1-byte owner does.
    lock = Lock(r, "compact-a", timeout=60)
    assert lock.acquire(blocking=False)
    token = lock.local.token
    assert isinstance(token, bytes) and len(token) == 32
    r.execute_command("LOCK.ACQUIRE", "compact-b", "x", 60000)
    usage = [r.memory_usage(k, samples=0) for k in ("compact-a", "compact-b")]
    assert usage[0] == usage[1], usage
    lock.release()
