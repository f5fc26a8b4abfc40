"""Redlock for ``redis.asyncio`` (exported as ``redis_lock_client.asyncio.Redlock``).

The protocol is ``_redlock_core``'s; this face carries its effects out on asyncio streams (a
round asks every server at once with ``gather``) and runs the watchdog as a task."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import weakref
from types import TracebackType
from typing import Any, List, Literal, Optional, Tuple, Type

from redis.exceptions import LockError, ResponseError

from . import _watch_aio
from ._common import dedicated_kwargs
from ._drive import drive_async
from ._redlock_core import (
    Answer,
    Gone,
    Hold,
    Log,
    Notify,
    OnLost,
    Park,
    Pause,
    RedlockBase,
    RedlockCore,
    Scatter,
    Send,
    Sleep,
    StartWatchdog,
    StopWatchdog,
    Unwatch,
    Watch,
)

logger = logging.getLogger(__name__)

__all__ = ["Redlock", "OnLost"]


# ----------------------------------------------------------------------------------------------
# Connections of our own, one server's


def _is_closed(conn: Any) -> bool:
    """Seen without blocking or sending: the stream reader met the end of the stream."""
    reader = getattr(conn, "_reader", None)
    if reader is None:
        return True
    try:
        return bool(reader.at_eof())
    except Exception:  # noqa: BLE001 - an unknown reader: assume open
        return False


async def _abandon_now(conn: Any, behind: Optional[Tuple[Any, ...]]) -> None:
    try:
        if behind is not None and getattr(conn, "is_connected", False):
            await conn.send_packed_command(conn.pack_command(*behind), check_health=False)
    except BaseException:  # noqa: BLE001 - best effort, the close below is what counts
        pass
    finally:
        try:
            await conn.disconnect(nowait=True)
        except TypeError:
            await conn.disconnect()
        except BaseException:  # noqa: BLE001
            pass


async def _abandon(conn: Any, behind: Optional[Tuple[Any, ...]]) -> None:
    """Writes ``behind`` after an unanswered request and closes the connection; shielded, so
    it completes even while the calling task is being cancelled (which then propagates)."""
    await asyncio.shield(asyncio.ensure_future(_abandon_now(conn, behind)))


class _Instance:
    """One server: connections of our own (no retries), every step bounded by ``timeout``;
    idle ones are kept per process and event loop."""

    def __init__(self, client: Any, timeout: float) -> None:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            raise TypeError(f"Redlock takes independent redis.asyncio.Redis clients, not {type(client).__name__}")
        self.client = client
        self.pool = pool
        kw = pool.connection_kwargs
        self.name = str(kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}")
        self.timeout = timeout
        self._idle: List[Tuple[int, Any, Any]] = []  # (pid, event loop, connection)

    def take(self) -> Any:
        loop = asyncio.get_running_loop()
        pid = os.getpid()
        while self._idle:
            owner_pid, owner_loop, conn = self._idle.pop()
            # Another process's (fork) or event loop's streams are unusable here.
            if owner_pid == pid and owner_loop is loop and not _is_closed(conn):
                return conn
        return self.pool.connection_class(**dedicated_kwargs(self.pool.connection_kwargs, None))

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
            answer = Answer(await self._call(conn, send.args))
        except ResponseError as e:
            answer = Answer(None, e)  # the reply was read: the connection is clean
        except BaseException as e:  # noqa: BLE001 - cancellation included: give the connection up
            await _abandon(conn, send.behind)
            if not isinstance(e, Exception):
                raise
            return Answer(None, e)
        if send.link is None and not send.keep:
            self.put(conn)
            return answer
        return Answer(answer.reply, answer.error, conn)


def _server_lost(core: RedlockCore, hold: Hold, server: int, reason: str) -> None:
    """The watcher's report (from its task): judged by the core; the watchdog wakes."""
    core.server_lost(hold, server, reason)
    alarm = hold.alarm
    if alarm is not None:
        alarm.set()


class Redlock(RedlockBase):
    """Redlock over N independent ``redis.asyncio.Redis`` clients: see the sync
    ``redis_lock_client.Redlock`` (same rules, same errors, same backoff); the watchdog is a
    task and ``on_lost`` may be a coroutine function."""

    _public_name = "redis_lock_client.asyncio.Redlock"

    def _instance(self, client: Any, timeout: float) -> _Instance:
        return _Instance(client, timeout)

    @staticmethod
    def _closed(conn: Any) -> bool:
        return _is_closed(conn)

    async def __aenter__(self) -> "Redlock":
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError as e:
            self._exit_error(e)

    async def acquire(self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None) -> Literal[True]:
        return await drive_async(self._acquire_steps(blocking, blocking_timeout), self._perform)  # type: ignore[return-value]

    async def release(self) -> None:
        await drive_async(self._release_steps(), self._perform)

    async def extend(self, additional_time: Optional[float] = None) -> Literal[True]:
        return await drive_async(self._extend_steps(additional_time), self._perform)  # type: ignore[return-value]

    async def reacquire(self) -> Literal[True]:
        return await self.extend(None)

    async def owned(self) -> bool:
        return await drive_async(self._owned_steps(), self._perform)

    async def locked(self) -> bool:
        return await drive_async(self._locked_steps(), self._perform)

    # -- the effects ----------------------------------------------------------------------------

    async def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is Scatter:
            return list(await asyncio.gather(*(self.instances[s.server].request(s) for s in effect.sends)))
        if kind is Sleep:
            await asyncio.sleep(effect.seconds)
        elif kind is Park:
            for i, conn in effect.conns:
                self.instances[i].put(conn)
        elif kind is Log:
            logger.log(effect.level, effect.message, *effect.args)
        elif kind is Watch:
            i = effect.server
            hold = effect.hold
            on_loss = functools.partial(_server_lost, self._core, hold, i)
            return _watch_aio.watch(self.instances[i].client, self.name, hold.owner, on_loss)
        elif kind is Unwatch:
            for handle in effect.handles:
                _watch_aio.unwatch(handle)
        elif kind is StartWatchdog:
            hold = effect.hold
            hold.alarm = asyncio.Event()
            hold.task = asyncio.ensure_future(_watchdog(weakref.ref(self), hold))
        elif kind is StopWatchdog:
            await _stop(effect.hold)
        elif kind is Pause:
            alarm = effect.hold.alarm
            try:
                await asyncio.wait_for(alarm.wait(), effect.seconds)
            except asyncio.TimeoutError:
                pass
            alarm.clear()
        elif kind is Notify:
            if self.on_lost is not None:
                try:
                    result = self.on_lost(effect.error)
                    if inspect.isawaitable(result):
                        await result
                except Exception:  # noqa: BLE001 - the user's callback: logged, not lost
                    logger.exception("redlock watchdog: on_lost callback of %r raised", self.name)
        else:
            raise TypeError(f"unknown effect {effect!r}")
        return None


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
            raise Gone()
        return await rl._perform(effect)

    rl = ref()
    if rl is None:
        return
    steps = rl._core.watch(hold)
    del rl
    try:
        await drive_async(steps, perform)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a background task: logged, never silent
        logger.exception("redlock watchdog of %r failed", hold.owner)
