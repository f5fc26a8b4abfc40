"""The asyncio half: ``Lock`` (a drop-in for ``redis.asyncio.lock.Lock``), ``ReadLock``,
``RWLock``, ``Semaphore`` and ``Redlock`` for ``redis.asyncio`` clients (``Redis`` and
``RedisCluster``). The protocol is in ``_core.py`` (the same as the sync classes'); this face
only carries its effects out (awaited I/O, a task per watchdog)."""

from __future__ import annotations

import asyncio
import logging
import threading
from types import TracebackType
from typing import Any, Hashable, Literal, Optional, Type, Union

import redis.asyncio.lock

from . import _aio_connections as conns
from . import _core as core
from . import _watch_aio
from ._common import LockInfo, LockLostError, encode_token
from ._connections import ConnectionLimitError as ConnectionLimitError, configure_connections as configure_connections
from ._core import OnLost as OnLost, _Local as _Local, _Shared as _Shared  # noqa: F401 (_aio_redlock uses them)
from ._drive import drive_async

logger = logging.getLogger(__name__)

__all__ = ["Lock", "ReadLock", "RWLock", "Semaphore", "Redlock", "OnLost", "ConnectionLimitError", "configure_connections"]

PROBE_INTERVAL = core.PROBE_INTERVAL


async def _notify(on_lost: Optional[OnLost], err: LockLostError, name: Any) -> None:
    pending = core.notify_lost(on_lost, err, name)
    if pending is not None:
        await pending


async def _join(task: Any) -> None:
    if task is not None and task is not asyncio.current_task():
        task.cancel()
        # Waits for the watchdog to end without taking on its outcome (its own cancellation);
        # a cancellation of the caller (release()) still propagates.
        await asyncio.wait([task])


def _who() -> Hashable:
    """The caller of a semaphore: its task, else its thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


async def _pool_for(client: Any, name: Any, address: Any = None) -> Any:
    if getattr(client, "_initialize", False):
        await client.initialize()  # a RedisCluster learns its slot map on first use
    return conns.pool_of(client, name, address)


async def _perform(client: Any, e: Any) -> Any:
    """Carries out one effect of the core for ``client``."""
    t = type(e)
    if t is core.Run:
        return await asyncio.shield(client.execute_command(*e.args))
    if t is core.Take:
        pool = await _pool_for(client, e.name, e.address)
        return core.Link(await conns.take(pool, e.deadline, e.wait, e.queue), pool, conns.default_timeout(pool))
    if t is core.Call:
        await conns.connect(e.link.conn, e.deadline)
        return await conns.call(e.link.conn, e.args, e.timeout)
    if t is core.ShortRequest:
        return await conns.request(await _pool_for(client, e.name), e.args, e.deadline)
    if t is core.GiveBack:
        return await conns.give_back(e.link.pool, e.link.conn)
    if t is core.Abandon:
        return await conns.abandon(e.link.conn, e.release)
    if t is core.Sleep:
        return await asyncio.sleep(e.seconds)
    if t is core.Pause:
        await asyncio.sleep(e.seconds)
        return e.hold.stopped
    if t is core.Watch:
        return _watch_aio.watch(client, e.name, e.owner, e.on_loss)
    if t is core.Unwatch:
        return _watch_aio.unwatch(e.handle)
    if t is core.WatcherCall:
        return await _watch_aio.call(client, e.args, e.timeout)
    if t is core.Notify:
        return await _notify(e.on_lost, e.err, e.name)
    if t is core.StartWatchdog:
        e.hold.watchdog = asyncio.ensure_future(drive_async(e.steps, lambda x: _perform(client, x)))
        return None
    if t is core.StopWatchdog:
        return await _join(e.hold.watchdog)
    raise TypeError(f"unknown effect {e!r}")


# ----------------------------------------------------------------------------------------------
# Locks


class Lock(core.LockBase, redis.asyncio.lock.Lock):
    """A drop-in for ``redis.asyncio.lock.Lock`` backed by the redis-lock module (an instance
    of it, with its hooks); see the sync ``redis_lock_client.Lock`` for the differences and
    extras. Cancelling a task while it waits leaves no grant behind."""

    _is_closed = staticmethod(conns.is_closed)

    async def _perform(self, e: Any) -> Any:
        return await _perform(self.redis, e)

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise core.not_acquired(self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except Exception as e:  # noqa: BLE001 - decided in _exit_failure
            self._exit_failure(e, exc_value)

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Union[str, bytes]] = None,
        *,
        sleep: Optional[float] = None,
    ) -> bool:
        """As the sync ``acquire``. ``sleep`` is keyword-only, as in redis-py 8.2's asyncio
        Lock (accepted here on every redis-py version): checked (seconds >= 0, or None) and not
        used, since the wait is native on the server and nothing polls."""
        owner, pending = self._acquire_args(blocking, blocking_timeout, token, sleep)
        try:
            with core.passing(core._PENDING, pending):
                granted = await self.do_acquire(owner)
            return self._acquired(owner, pending, granted)
        except BaseException:
            await drive_async(self._given_up_steps(owner, pending), self._perform)
            raise

    async def do_acquire(self, token: Union[str, bytes]) -> bool:
        steps = self._acquire_steps(encode_token(token), core.pending_now())
        return self._granted(await drive_async(steps, self._perform))

    async def locked(self) -> bool:
        return self._locked_in(await self.info())

    async def owned(self) -> bool:
        if self.local.token is None:
            return False
        return await drive_async(self._owned_steps(), self._perform)

    async def release(self) -> None:
        token, hold = self._release_token()
        with core.passing(core._RELEASING, hold):
            await self.do_release(token)

    async def do_release(self, expected_token: Union[str, bytes]) -> None:
        steps = self._release_steps(encode_token(expected_token), self._hold_released(expected_token))
        await drive_async(steps, self._perform)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        self._held_token("extend")
        return await self.do_extend(additional_time, replace_ttl)

    async def do_extend(self, additional_time: float, replace_ttl: bool) -> Literal[True]:
        token, hold = self._held_token("extend")
        steps = self._extend_steps(token, hold, additional_time, replace_ttl)
        return await drive_async(steps, self._perform)

    async def reacquire(self) -> Literal[True]:
        self._held_token("reacquire")
        return await self.do_reacquire()

    async def do_reacquire(self) -> Literal[True]:
        token, hold = self._held_token("reacquire")
        return await drive_async(self._reacquire_steps(token, hold), self._perform)

    async def info(self) -> Optional[LockInfo]:
        return await drive_async(self._info_steps(), self._perform)


class ReadLock(core.ReadLockBase, Lock):
    """The shared side of a read-write lock (``LOCK.RWREAD``)."""


class RWLock(core.RWLockBase[ReadLock, Lock]):
    """A read-write lock: ``read()`` is its ``ReadLock``, ``write()`` its exclusive ``Lock``."""

    _reader_class = ReadLock
    _writer_class = Lock


class Semaphore(core.SemaphoreBase, Lock):
    """A counting semaphore (``LOCK.SEMACQUIRE``) of ``capacity`` permits, FIFO. Like
    ``asyncio.Semaphore``, one object may be shared by many tasks: each acquire takes a permit
    of its own, each ``release()`` gives back the calling task's most recent permit (else the
    oldest this object holds)."""

    _who = staticmethod(_who)


from ._aio_redlock import Redlock  # noqa: E402 (the Redlock half lives in its own file)
