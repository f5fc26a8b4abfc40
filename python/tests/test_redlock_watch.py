"""Redlock and the loss watcher (the review of issue 25): no hold handed out whose validity ran
out while its watches were set up; an extend given up by the caller (``asyncio.wait_for``)
leaves the watcher hearing losses."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio

import kit
from kit import wait_for
from redis_lock_client import LockLostError, LockValidityError, Redlock
from redis_lock_client import _redlock_core as rc
from redis_lock_client import asyncio as alock


def _held_anywhere(servers: List[kit.Server], key: str) -> bool:
    for s in servers:
        c = s.client(socket_timeout=2)
        try:
            if c.exists(key):
                return True
        finally:
            c.close()
    return False


def test_validity_out_while_watching_is_no_hold(redlock_servers: List[kit.Server]) -> None:
    """The process stalls between the grant and the return (here: inside the registration
    with the watcher) past the validity: ``LockValidityError``, released everywhere (never
    ``True`` with no validity left)."""
    servers = redlock_servers[:3]
    cs = [s.client() for s in servers]
    rl = Redlock(cs, "stall", timeout=0.5, blocking=False, watchdog=True)
    real = rl._perform

    def perform(effect: Any) -> Any:
        if type(effect) is rc.Watch:
            time.sleep(0.6)  # a stalled process (GC, descheduling) while registering
        return real(effect)

    rl._perform = perform  # type: ignore[method-assign]
    with pytest.raises(LockValidityError):
        rl.acquire()
    wait_for(lambda: not _held_anywhere(servers, "stall"), 10, what="released everywhere")
    for c in cs:
        c.close()


def test_validity_out_while_watching_is_no_hold_asyncio(redlock_servers: List[kit.Server]) -> None:
    servers = redlock_servers[:3]

    async def main() -> None:
        cs = [redis.asyncio.Redis(host="127.0.0.1", port=s.port) for s in servers]
        rl = alock.Redlock(cs, "stall", timeout=0.5, blocking=False, watchdog=True)
        real = rl._perform

        async def perform(effect: Any) -> Any:
            if type(effect) is rc.Watch:
                time.sleep(0.6)  # a stalled loop while registering
            return await real(effect)

        rl._perform = perform  # type: ignore[method-assign]
        with pytest.raises(LockValidityError):
            await rl.acquire()
        for c in cs:
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())
    wait_for(lambda: not _held_anywhere(servers, "stall"), 10, what="released everywhere")


def test_an_extend_given_up_by_the_caller_leaves_the_watcher_hearing(redlock_servers: List[kit.Server]) -> None:
    """``asyncio.wait_for(rl.extend(), ...)`` gives up an extend out to a stalled server (its
    renewal over the watcher's connection is cancelled): a later DEL of another hold on that
    server is still noticed (the watcher set its connections up again, tracking on)."""
    srv = redlock_servers[0]
    admin = srv.client()

    async def main() -> None:
        a = redis.asyncio.Redis(host="127.0.0.1", port=srv.port)
        rl = alock.Redlock([a], "res", timeout=30, watchdog=True)
        other = alock.Redlock([a], "other", timeout=30, watchdog=True)
        await rl.acquire()
        await other.acquire()
        await asyncio.sleep(0.3)  # the watcher connected
        srv.pause()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(other.extend(), 0.05)
        finally:
            srv.resume()
        await asyncio.sleep(0.5)
        admin.delete("res")
        deadline = time.monotonic() + 3.0
        while not rl.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert rl.lost, "the DEL was not noticed"
        with pytest.raises(LockLostError):
            rl.check()
        await other.release()
        await (a.aclose() if hasattr(a, "aclose") else a.close())

    try:
        asyncio.run(main())
    finally:
        admin.close()
