"""The asyncio half: ``Lock`` (a drop-in for ``redis.asyncio.lock.Lock``), ``ReadLock``,
``RWLock``, ``Semaphore`` and ``Redlock`` for ``redis.asyncio`` clients (``Redis`` and
``RedisCluster``). The protocol is in ``_core.py`` (the same as the sync classes'); this face
only carries its effects out (awaited I/O, a task per watchdog)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from types import TracebackType
from typing import Any, Hashable, List, Literal, Optional, Tuple, Type, Union

import redis.asyncio.lock
from redis.exceptions import ConnectionError, TimeoutError

from . import _core as core
from . import _watch_aio
from ._common import LockInfo, LockLostError, dedicated_kwargs, encode_token
from ._core import OnLost as OnLost, _Local as _Local, _Shared as _Shared  # noqa: F401 (_aio_redlock uses them)
from ._drive import drive_async

logger = logging.getLogger(__name__)

__all__ = ["Lock", "ReadLock", "RWLock", "Semaphore", "Redlock", "OnLost"]

PROBE_INTERVAL = core.PROBE_INTERVAL
MAX_IDLE = 16

# ----------------------------------------------------------------------------------------------
# Connections of our own (see _connections.py for why)

_idle: "weakref.WeakKeyDictionary[Any, List[Tuple[int, Any, Any]]]" = weakref.WeakKeyDictionary()
_idle_lock = threading.Lock()


def _source_of(client: Any, name: Any) -> Any:
    """What makes connections for ``name``: the client's pool, or for a ``RedisCluster`` the
    node that owns the key's slot (both have ``connection_class`` and ``connection_kwargs``)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:
        return get_node(name)
    raise TypeError(
        "expected a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster client, "
        f"not {type(client).__name__}"
    )


def _default_timeout(source: Any) -> Optional[float]:
    t = source.connection_kwargs.get("socket_timeout")
    return None if t is None else float(t)


def _new_connection(source: Any) -> Any:
    # No read timeout on the connection itself: every read here is bounded by wait_for.
    return source.connection_class(**dedicated_kwargs(source.connection_kwargs, None))


def _is_closed(conn: Any) -> bool:
    """Seen without blocking or sending: the stream reader met the end of the stream."""
    reader = getattr(conn, "_reader", None)
    if reader is None:
        return True
    try:
        return bool(reader.at_eof())
    except Exception:  # noqa: BLE001
        return False


def _take(source: Any) -> Any:
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    while True:
        with _idle_lock:
            try:
                stack = _idle.get(source)
            except TypeError:
                stack = None
            item = stack.pop() if stack else None
        if item is None:
            return _new_connection(source)
        owner_pid, owner_loop, conn = item
        if owner_pid != pid or owner_loop is not loop:
            continue  # another process's or event loop's streams: unusable here
        if _is_closed(conn):
            continue
        return conn


def _give_back(source: Any, conn: Any) -> None:
    loop = asyncio.get_running_loop()
    with _idle_lock:
        try:
            stack = _idle.setdefault(source, [])
        except TypeError:
            stack = None
        if stack is not None and len(stack) < MAX_IDLE:
            stack.append((os.getpid(), loop, conn))
            return
    asyncio.ensure_future(conn.disconnect())


async def _call(conn: Any, args: List[Any], timeout: Optional[float], connect_timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply within ``timeout`` (None: no limit)."""
    if not getattr(conn, "is_connected", False):
        await asyncio.wait_for(conn.connect(), connect_timeout)
    await conn.send_command(*args)
    read = conn.read_response(disconnect_on_error=False)
    if timeout is None:
        return await read
    return await asyncio.wait_for(read, timeout)


async def _abandon_now(conn: Any, release: Optional[List[Any]]) -> None:
    try:
        if release is not None and getattr(conn, "is_connected", False):
            await conn.send_packed_command(conn.pack_command(*release), check_health=False)
    except BaseException:  # noqa: BLE001
        pass
    finally:
        try:
            await conn.disconnect(nowait=True)
        except TypeError:
            await conn.disconnect()
        except BaseException:  # noqa: BLE001
            pass


async def _abandon(conn: Any, release: Optional[List[Any]]) -> None:
    """Writes ``release`` behind an unanswered request and closes the connection; shielded,
    so it completes even while the calling task is being cancelled."""
    task = asyncio.ensure_future(_abandon_now(conn, release))
    # _abandon_now never raises; if the caller is cancelled meanwhile, the task still finishes
    # on its own and the cancellation propagates (it used to be swallowed here).
    await asyncio.shield(task)


def _trouble(e: BaseException) -> bool:
    return isinstance(e, (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError))


class conns:
    """The connection functions this face uses, under the sync module's names (to become
    ``from . import _aio_connections as conns``)."""

    pool_of = staticmethod(_source_of)
    default_timeout = staticmethod(_default_timeout)
    new_connection = staticmethod(_new_connection)
    take = staticmethod(_take)
    give_back = staticmethod(_give_back)
    abandon = staticmethod(_abandon)
    is_closed = staticmethod(_is_closed)
    is_connection_trouble = staticmethod(_trouble)

    @staticmethod
    async def connect(conn: Any, timeout: Optional[float]) -> None:
        """Connects ``conn`` if it is not, within ``timeout`` (handshake included)."""
        if not getattr(conn, "is_connected", False):
            await asyncio.wait_for(conn.connect(), timeout)

    @staticmethod
    async def call(conn: Any, args: List[Any], timeout: Optional[float]) -> Any:
        return await _call(conn, args, timeout, timeout)


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


async def _stop_watchdog(hold: Any) -> None:
    hold.stopped = True
    await _join(hold.watchdog)


def _who() -> Hashable:
    """The caller of a semaphore: its task, else its thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


def _pool_for(client: Any, name: Any, address: Any) -> Any:
    if address is not None:
        node = client.get_node(host=address[0], port=address[1])
        if node is not None:
            return node
    return conns.pool_of(client, name)


async def _perform(client: Any, e: Any) -> Any:
    """Carries out one effect of the core for ``client``."""
    t = type(e)
    if t is core.Run:
        return await asyncio.shield(client.execute_command(*e.args))
    if t is core.Take:
        if getattr(client, "_initialize", False):
            await client.initialize()  # a RedisCluster learns its slot map on first use
        pool = _pool_for(client, e.name, e.address)
        return core.Link(conns.take(pool), pool, conns.default_timeout(pool))
    if t is core.Call:
        await conns.connect(e.link.conn, e.connect_timeout)
        return await conns.call(e.link.conn, e.args, e.timeout)
    if t is core.GiveBack:
        return conns.give_back(e.link.pool, e.link.conn)
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
    ) -> bool:
        """As the sync ``acquire`` (redis-py's asyncio Lock has no ``sleep`` argument here)."""
        owner, pending = self._acquire_args(blocking, blocking_timeout, token)
        with core.passing(core._PENDING, pending):
            try:
                return self._acquired(owner, pending, await self.do_acquire(owner))
            except BaseException:
                await drive_async(self._unrecorded_steps(owner, pending), self._perform)
                raise

    async def do_acquire(self, token: Union[str, bytes]) -> bool:
        steps = self._acquire_steps(encode_token(token), core.pending_now())
        return self._granted(await drive_async(steps, self._perform))

    async def locked(self) -> bool:
        return self._locked_in(await self.info())

    async def owned(self) -> bool:
        return self._owned_in(await self.info()) if self.local.token is not None else False

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
