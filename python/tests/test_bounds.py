"""Issue 25, point 5: ``blocking_timeout`` bounds every step of an acquire, the first try and
the connection's handshake included (a SIGSTOPped server), and a wait that loses its
connection to a server restart queues again (same owner) until its time is up."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict

import pytest
import redis
import redis.asyncio

import kit
from redis_lock_client import Lock
from redis_lock_client import asyncio as alock

#: blocking_timeout's documented margin (WAIT_READ_MARGIN) plus scheduling slack on a shared box.
MARGIN = 1.0
SLACK = 1.0


@pytest.fixture
def own() -> Any:
    s = kit.Server()
    try:
        yield s
    finally:
        s.close()  # resumes a paused server first


def _acquire_in_thread(lock: Lock, bt: float) -> Dict[str, Any]:
    out: Dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["result"] = lock.acquire(blocking_timeout=bt)
        except redis.RedisError as e:  # a clear error is allowed: False is too
            out["error"] = e
        out["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    out["thread"] = t
    t.start()
    return out


@pytest.mark.parametrize("warm", [False, True], ids=["new-connection", "idle-connection"])
def test_blocking_timeout_bounds_a_paused_server(own: kit.Server, warm: bool) -> None:
    c = own.client()  # redis-py's defaults (redis-py 8: 5 s read timeout and retries)
    lock = Lock(c, "k", timeout=30)
    if warm:
        assert lock.acquire()
        lock.release()
    own.pause()
    try:
        out = _acquire_in_thread(lock, 2)
        out["thread"].join(2 + MARGIN + SLACK)
        assert not out["thread"].is_alive(), "acquire(blocking_timeout=2) still running against a paused server"
        assert out["elapsed"] <= 2 + MARGIN + SLACK
        assert out.get("result") is False or isinstance(out.get("error"), redis.TimeoutError), out
        if "error" in out:
            assert "blocking_timeout" in str(out["error"])
    finally:
        own.resume()
    out["thread"].join(60)
    # The withdrawn request left nothing behind once the server ran again.
    kit.wait_for(lambda: not Lock(c, "k").locked(), 10, what="nothing held")
    c.close()


def test_blocking_timeout_bounds_a_paused_server_asyncio(own: kit.Server) -> None:
    own.pause()
    try:

        async def main() -> Dict[str, Any]:
            c = redis.asyncio.Redis(host="127.0.0.1", port=own.port)
            lock = alock.Lock(c, "k", timeout=30)
            out: Dict[str, Any] = {}
            t0 = time.monotonic()
            try:
                out["result"] = await lock.acquire(blocking_timeout=2)
            except redis.RedisError as e:
                out["error"] = e
            out["elapsed"] = time.monotonic() - t0
            return out

        async def bounded() -> Dict[str, Any]:
            try:
                return await asyncio.wait_for(main(), 2 + MARGIN + SLACK)
            except asyncio.TimeoutError:
                return {"hung": True}

        out = asyncio.run(bounded())
        assert not out.get("hung"), "acquire(blocking_timeout=2) still running against a paused server"
        assert out["elapsed"] <= 2 + MARGIN + SLACK
        assert out.get("result") is False or isinstance(out.get("error"), redis.TimeoutError), out
    finally:
        own.resume()


def test_a_wait_survives_a_server_restart(own: kit.Server) -> None:
    c = own.client()
    holder = Lock(c, "k", timeout=30)
    assert holder.acquire()
    waiter = Lock(own.client(), "k", timeout=30, blocking_timeout=20, thread_local=False)
    out = _acquire_in_thread(waiter, 20)
    kit.wait_for(lambda: (holder.info() or kit_info_none()).waiting == 1, 10, what="the waiter queued")
    kit.restart_keeping_port(own)  # the holder's grant is gone with the server's data
    out["thread"].join(20)
    assert out.get("result") is True, out
    assert waiter.owned()
    waiter.release()
    c.close()


def test_a_wait_survives_a_server_restart_asyncio(own: kit.Server) -> None:
    c = own.client()
    holder = Lock(c, "k", timeout=30)
    assert holder.acquire()
    out: Dict[str, Any] = {}

    async def main() -> None:
        ac = redis.asyncio.Redis(host="127.0.0.1", port=own.port)
        waiter = alock.Lock(ac, "k", timeout=30, blocking_timeout=20)
        try:
            out["result"] = await waiter.acquire()
            out["owned"] = await waiter.owned()
            await waiter.release()
        except BaseException as e:  # noqa: BLE001 - reported below
            out["error"] = e

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    kit.wait_for(lambda: (holder.info() or kit_info_none()).waiting == 1, 10, what="the waiter queued")
    kit.restart_keeping_port(own)
    t.join(20)
    assert out.get("result") is True and out.get("owned") is True, out
    c.close()


class _NoInfo:
    waiting = 0


def kit_info_none() -> Any:
    return _NoInfo()


def test_a_wait_on_a_held_lock_still_times_out(own: kit.Server) -> None:
    c = own.client()
    holder = Lock(c, "k", timeout=30)
    assert holder.acquire()
    t0 = time.monotonic()
    assert Lock(c, "k", timeout=30).acquire(blocking_timeout=0.5) is False
    assert 0.45 <= time.monotonic() - t0 <= 0.5 + SLACK
    holder.release()
    c.close()


