"""Redlock for ``redis.asyncio`` (exported as ``redis_lock_client.asyncio.Redlock``).

The protocol is ``_redlock_core``'s; this face carries its effects out on asyncio streams (a
round asks every server at once with ``gather``) and runs the watchdog as a task."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import weakref
from typing import Any, List, Literal, Optional, Tuple

from redis.exceptions import LockError, ResponseError

from . import _aio_connections as conns
from . import _redlock_core as rc
from . import _watch_aio
from ._common import dedicated_kwargs
from ._drive import drive_async
from ._redlock_core import Answer, Hold, OnLost, Send

logger = logging.getLogger(__name__)

__all__ = ["Redlock", "OnLost"]


# ----------------------------------------------------------------------------------------------
# Connections of our own, one server's


_is_closed = conns.is_closed


async def _abandon(conn: Any, behind: Optional[Tuple[Any, ...]]) -> None:
    """Writes ``behind`` after an unanswered request and closes the connection; completes even
    while the calling task is being cancelled (which then propagates)."""
    await conns.abandon(conn, None if behind is None else list(behind))


class _Instance(rc.InstanceBase):
    """One server: connections of our own (no retries), every step bounded by ``timeout``;
    idle ones are kept per process and event loop."""

    def __init__(self, client: Any, timeout: float) -> None:
        super().__init__(client, timeout, "redis.asyncio.Redis")
        self._idle: List[Tuple[int, Any, Any]] = []  # (pid, event loop, connection)

    def take(self) -> Any:
        loop = asyncio.get_running_loop()
        pid = os.getpid()
        while self._idle:
            owner_pid, owner_loop, conn = self._idle.pop()
            # Another process's (fork) or event loop's streams are unusable here.
            if owner_pid == pid and owner_loop is loop and not _is_closed(conn):
                return conn
        return self.pool.connection_class(**dedicated_kwargs(self.pool.connection_kwargs, None, True))

    def put(self, conn: Any) -> None:
        if len(self._idle) < 8:
            self._idle.append((os.getpid(), asyncio.get_running_loop(), conn))
        else:
            asyncio.ensure_future(conn.disconnect())

    async def _call(self, conn: Any, args: Tuple[Any, ...]) -> Any:
        if not getattr(conn, "is_connected", False):
            await asyncio.wait_for(conn.connect(), self.timeout)
        await conn.send_command(*args)
        return await asyncio.wait_for(conn.read_response(disconnect_on_error=False), self.timeout)

    async def request(self, send: Send) -> Answer:
        """Carries out one send; as the sync face's (a cancellation propagates after the
        connection was given up)."""
        if send.watcher:
            try:
                return Answer(await _watch_aio.call(self.client, list(send.args), self.timeout))
            except _watch_aio.Unavailable:
                pass
            except Exception as e:  # noqa: BLE001 - the answer, typed by the core
                return Answer(None, e)
        conn = send.link if send.link is not None else self.take()
        try:
            reply = await self._call(conn, send.args)
        except ResponseError as e:  # the reply was read: the connection is clean
            return self.settle(send, Answer(None, e), conn)
        except BaseException as e:  # noqa: BLE001 - cancellation included: give the connection up
            await _abandon(conn, send.behind)
            if isinstance(e, Exception):
                return Answer(None, e)
            raise
        return self.settle(send, Answer(reply), conn)


class Redlock(rc.RedlockBase):
    """Redlock over N independent ``redis.asyncio.Redis`` clients: see the sync
    ``redis_lock_client.Redlock`` (same rules, same errors, same backoff); the watchdog is a
    task and ``on_lost`` may be a coroutine function."""

    _public_name = "redis_lock_client.asyncio.Redlock"

    _instance = _Instance
    _closed = staticmethod(_is_closed)
    _watcher = _watch_aio

    async def __aenter__(self) -> "Redlock":
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self.release()
        except LockError as e:
            self._exit_error(e)

    async def acquire(self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None) -> Literal[True]:
        return await drive_async(self._acquire_steps(blocking, blocking_timeout), self._perform)

    async def release(self) -> None:
        await drive_async(self._release_steps(), self._perform)

    async def extend(self, additional_time: Optional[float] = None) -> Literal[True]:
        return await drive_async(self._extend_steps(additional_time), self._perform)

    async def reacquire(self) -> Literal[True]:
        return await self.extend(None)

    async def owned(self) -> bool:
        return await drive_async(self._owned_steps(), self._perform)

    async def locked(self) -> bool:
        return await drive_async(self._locked_steps(), self._perform)

    # -- the effects ----------------------------------------------------------------------------

    async def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is rc.Scatter:
            return await self._scatter(effect.sends)
        if kind is rc.Sleep:
            await asyncio.sleep(effect.seconds)
        elif kind is rc.StartWatchdog:
            hold = effect.hold
            hold.alarm = asyncio.Event()
            hold.task = asyncio.ensure_future(_watchdog(weakref.ref(self), hold))
        elif kind is rc.StopWatchdog:
            await _stop(effect.hold)
        elif kind is rc.Pause:
            try:
                await asyncio.wait_for(effect.hold.alarm.wait(), effect.seconds)
            except asyncio.TimeoutError:
                pass
            effect.hold.alarm.clear()
        elif kind is rc.Notify:
            result = self._callback(effect.error)
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception:  # noqa: BLE001 - the user's coroutine: logged, not lost
                    logger.exception("redlock watchdog: on_lost coroutine of %r raised", self.name)
        else:
            return self._perform_local(effect)
        return None

    async def _scatter(self, sends: Tuple[Send, ...]) -> List[Answer]:
        """Every send at once (``gather``). Cancelled while they run: each request still out
        gives its connection up, and so is a connection that a request which had already ended
        kept (a bound grant); then the cancellation propagates (into the core, which releases)."""
        tasks = [asyncio.ensure_future(self.instances[s.server].request(s)) for s in sends]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for s, t in zip(sends, tasks):
                if t.done() and not t.cancelled() and t.exception() is None and t.result().conn is not None:
                    await _abandon(t.result().conn, s.behind)
            raise


async def _stop(hold: Hold) -> None:
    """Ends the watchdog task (cancelled, its extend in flight given up) and waits for it; a
    cancellation of the caller still propagates."""
    t = hold.task
    if t is not None and t is not asyncio.current_task():
        t.cancel()
        await asyncio.wait([t])


async def _watchdog(ref: "weakref.ref[Redlock]", hold: Hold) -> None:
    """The watchdog task: the core's loop, its Redlock held weakly (it stops when the Redlock
    is garbage-collected)."""

    async def perform(effect: Any) -> Any:
        rl = ref()
        if rl is None:
            raise rc.Gone()
        return await rl._perform(effect)

    try:
        await drive_async(rc.watchdog_steps(ref, hold), perform)
    except Exception:  # noqa: BLE001 - a background task: logged, never silent
        logger.exception("redlock watchdog failed")
