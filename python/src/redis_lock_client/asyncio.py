"""The asyncio half: ``Lock`` (a drop-in for ``redis.asyncio.lock.Lock``), ``ReadLock``,
``RWLock``, ``Semaphore`` and ``Redlock`` for ``redis.asyncio`` clients (``Redis`` and
``RedisCluster``). Same behaviour as the sync classes; the watchdog is a task."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import random
import threading
import time
import weakref
from types import TracebackType
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from redis.exceptions import (
    ConnectionError,
    LockError,
    LockNotOwnedError,
    NoScriptError,
    ResponseError,
    TimeoutError,
)

from ._common import (
    EXTEND_SCRIPT,
    MAX_KEY_MOVES,
    SINGLE_SERVER_MARGIN,
    UNLIMITED_TTL_MS,
    WAIT_READ_MARGIN,
    WAITED_GRANT_MARGIN,
    LockArgumentError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockRefusedError,
    LockValidityError,
    QuorumUnreachableError,
    Request,
    check_blocking_timeout,
    check_capacity,
    dedicated_kwargs,
    delay_ms,
    drift,
    encode_token,
    grant_token,
    is_notowner,
    follows_moves,
    move_to_follow,
    make_error,
    map_response_error,
    new_token,
    parse_info,
    release_args,
    ttl_ms,
    wait_left,
)

logger = logging.getLogger(__name__)

__all__ = ["Lock", "ReadLock", "RWLock", "Semaphore", "Redlock", "OnLost"]

#: Called once when a held lock is found lost: a plain function or a coroutine function.
OnLost = Callable[[LockLostError], Any]

PROBE_INTERVAL = 0.1
MAX_IDLE = 16

_EXTEND_SHA: Optional[str] = None


def _script_sha() -> str:
    global _EXTEND_SHA
    if _EXTEND_SHA is None:
        import hashlib

        _EXTEND_SHA = hashlib.sha1(EXTEND_SCRIPT.encode()).hexdigest()
    return _EXTEND_SHA


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


async def _notify(on_lost: Optional[OnLost], err: LockLostError, name: Any) -> None:
    if on_lost is None:
        return
    try:
        result = on_lost(err)
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001
        logger.exception("lock watchdog: on_lost callback of %r raised", name)


# ----------------------------------------------------------------------------------------------
# Locks


class _Hold:
    def __init__(self, owner: bytes, fence: int, ttl: Optional[float], valid_until: float, conn: Any = None, source: Any = None) -> None:
        self.owner = owner
        self.fence = fence
        self.ttl = ttl
        self.valid_until = valid_until
        self.conn = conn
        self.source = source
        self.conn_lock = asyncio.Lock()
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stopped = False
        self.watchdog: Optional["asyncio.Task[None]"] = None

    def lost_error(self, name: Any) -> Optional[LockLostError]:
        if self.loss is None and self.conn is not None and not self.conn_lock.locked() and _is_closed(self.conn):
            self.loss = LockLostError(
                "the connection the hold was bound to closed: the server ended the hold", name, "disconnected"
            )
        if self.loss is not None:
            return self.loss
        if time.monotonic() >= self.valid_until:
            return LockLostError("the lock's lease ran out without a confirmed extend", name, "expired")
        return None

    def set_loss(self, err: LockLostError) -> None:
        if self.loss is None:
            self.loss = err

    def confirm(self, sent: float, ttl: float) -> None:
        """As the sync hold's: the last extend sent wins, also when it shortened the lease."""
        if self.loss is None and time.monotonic() < self.valid_until and sent >= self.lease_sent:
            self.lease_sent = sent
            self.valid_until = sent + ttl - drift(ttl, 0.01)


class _Local(threading.local):
    """Per-thread token and hold, None in every thread until that thread acquires."""

    token: Optional[bytes] = None
    hold: Any = None


class _Shared:
    token: Optional[bytes] = None
    hold: Any = None


class Lock:
    """A drop-in for ``redis.asyncio.lock.Lock`` backed by the redis-lock module (see the sync
    ``redis_lock_client.Lock`` for the differences and extras)."""

    _command = "LOCK.ACQUIRE"

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes, memoryview],
        timeout: Optional[float] = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        bind: bool = False,
        lock_delay: Optional[float] = None,
        watchdog: bool = False,
        on_lost: Optional[OnLost] = None,
    ) -> None:
        if not isinstance(name, (str, bytes, memoryview)):
            raise TypeError(f"name must be str or bytes, not {type(name).__name__}")
        if len(name) == 0:
            raise LockArgumentError("name must not be empty")
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self._ttl_ms = None if timeout is None else ttl_ms(timeout, "timeout")
        check_blocking_timeout(blocking_timeout)
        self.bind = bool(bind) or timeout is None
        self.lock_delay = lock_delay
        self._delay_ms = 0 if lock_delay is None else delay_ms(lock_delay)
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be callable")
        self.watchdog = bool(watchdog) or on_lost is not None
        self.on_lost = on_lost
        self.local: Any = _Local() if self.thread_local else _Shared()
        self.local.token = None

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise make_error(LockError, "Unable to acquire lock within the time specified", self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """As the sync ``acquire`` (redis-py's asyncio Lock has no ``sleep`` argument here).
        Cancelling the task while it waits leaves no grant behind."""
        owner = new_token() if token is None else encode_token(token)
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        bt = check_blocking_timeout(blocking_timeout)
        wait: Optional[float] = None
        if blocking and bt != 0:
            wait = math.inf if bt is None else bt
        try:
            hold = await self._acquire(owner, wait)
        except LockError:
            raise  # a refusal: nothing was granted
        except BaseException as e:
            # Cancelled (or interrupted) while the first, immediate request was out on the
            # client's own connection: the server may have granted it, and redis-py dropped the
            # reply with the connection. Give it back, as the sync acquire does (a wait on a
            # connection of ours is handed back by _send; a bound hold ends with its connection).
            if not self.bind and not _trouble(e):
                try:
                    await asyncio.shield(self.redis.execute_command(*release_args(self.name, owner)))
                except BaseException:  # noqa: BLE001 - best effort; NOTOWNER is the usual answer
                    pass
            raise
        if hold is None:
            return False
        self.local.token = owner
        self.local.hold = hold
        if self.watchdog:
            hold.watchdog = asyncio.ensure_future(_watch(self.redis, self.name, hold, self.on_lost, weakref.ref(self)))
        return True

    async def locked(self) -> bool:
        info = await self.info()
        return info is not None and bool(info.holders)

    async def owned(self) -> bool:
        owner = self.local.token
        if owner is None:
            return False
        info = await self.info()
        return info is not None and info.holds(owner)

    async def release(self) -> None:
        owner = self.local.token
        if owner is None:
            raise make_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        hold: Optional[_Hold] = getattr(self.local, "hold", None)
        self.local.token = None
        self.local.hold = None
        if hold is not None:
            await _stop_watchdog(hold)
            if hold.conn is not None:
                await self._release_bound(owner, hold)
                return
        try:
            await self.redis.execute_command(*release_args(self.name, owner))
        except ResponseError as e:
            if is_notowner(e):
                raise make_error(LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name) from e
            raise map_response_error(e, self.name) from e

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        owner = self.local.token
        if owner is None:
            raise make_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise make_error(LockError, "Cannot extend a lock with no timeout", self.name)
        ms = ttl_ms(additional_time, "additional_time") if replace_ttl else delay_ms(additional_time, "additional_time")
        sent = time.monotonic()
        args = [owner, ms, "1" if replace_ttl else "0"]
        try:
            try:
                reply = await self.redis.execute_command("EVALSHA", _script_sha(), 1, self.name, *args)
            except NoScriptError:
                reply = await self.redis.execute_command("EVAL", EXTEND_SCRIPT, 1, self.name, *args)
        except ResponseError as e:
            if "NOSCRIPT" not in str(e):
                raise map_response_error(e, self.name) from e
            reply = await self.redis.execute_command("EVAL", EXTEND_SCRIPT, 1, self.name, *args)
        if not reply:
            raise make_error(LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name)
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.confirm(sent, int(reply) / 1000)
        return True

    async def reacquire(self) -> Literal[True]:
        owner = self.local.token
        if owner is None:
            raise make_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self._ttl_ms is None:
            raise make_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        sent = time.monotonic()
        try:
            await self.redis.execute_command("LOCK.EXTEND", self.name, owner, self._ttl_ms)
        except ResponseError as e:
            if is_notowner(e):
                raise make_error(LockNotOwnedError, "Cannot reacquire a lock that's no longer owned", self.name) from e
            raise map_response_error(e, self.name) from e
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.confirm(sent, self._ttl_ms / 1000)
        return True

    @property
    def fencing_token(self) -> Optional[int]:
        hold = getattr(self.local, "hold", None)
        return None if hold is None else int(hold.fence)

    @property
    def lost(self) -> bool:
        hold = getattr(self.local, "hold", None)
        return hold is not None and hold.lost_error(self.name) is not None

    def check(self) -> float:
        hold = getattr(self.local, "hold", None)
        if hold is None or self.local.token is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = hold.lost_error(self.name)
        if err is not None:
            raise err
        return max(0.0, float(hold.valid_until) - time.monotonic())

    async def info(self) -> Optional[LockInfo]:
        try:
            reply = await self.redis.execute_command("LOCK.INFO", self.name)
        except ResponseError as e:
            raise map_response_error(e, self.name) from e
        return parse_info(reply)

    # -- internals ----------------------------------------------------------------------------

    def _request(self) -> Request:
        return Request(self._command, UNLIMITED_TTL_MS if self._ttl_ms is None else self._ttl_ms, None, self.bind, self._delay_ms)

    def _valid_until(self, ttl: Optional[float], started: float, waited: bool) -> float:
        if ttl is None:
            return math.inf
        if not waited:
            return started + ttl - SINGLE_SERVER_MARGIN
        return time.monotonic() + ttl - WAITED_GRANT_MARGIN - SINGLE_SERVER_MARGIN

    async def _acquire(self, owner: bytes, wait: Optional[float]) -> Optional[_Hold]:
        req = self._request()
        ttl = None if self._ttl_ms is None else self._ttl_ms / 1000
        started = time.monotonic()
        if req.bind:
            reply, conn, source = await self._send_following(req, owner, wait, started)
            fence = grant_token(reply)
            if fence is None:
                _give_back(source, conn)
                return None
            return _Hold(owner, fence, ttl, self._valid_until(ttl, started, wait is not None), conn, source)
        try:
            reply = await self.redis.execute_command(*req.args(self.name, owner, None))
        except ResponseError as e:
            raise map_response_error(e, self.name) from e
        fence = grant_token(reply)
        if fence is not None:
            return _Hold(owner, fence, ttl, self._valid_until(ttl, started, False))
        if wait is None:
            return None
        if wait - (time.monotonic() - started) <= 0:
            return None
        reply, conn, source = await self._send_following(req, owner, wait, started)
        _give_back(source, conn)
        fence = grant_token(reply)
        if fence is None:
            return None
        return _Hold(owner, fence, ttl, self._valid_until(ttl, started, True))

    async def _send_following(self, req: Request, owner: bytes, wait: Optional[float], started: float) -> Any:
        """As the sync class's: the request over a connection of ours to the key's node,
        sent again (with what is left of the wait) where the key now lives when a
        ``RedisCluster`` node answers ``TRYAGAIN``, ``ASK`` or ``MOVED``. Returns (reply,
        connection, source)."""
        moved = None
        for attempt in range(MAX_KEY_MOVES + 1):
            remaining, w = wait_left(wait, started)
            source = self._source_for(moved)
            conn = _take(source)
            if remaining is not None and remaining <= 0:
                return None, conn, source  # the wait was spent before the key was found
            try:
                if moved is not None and moved.asking:
                    await self._send(conn, source, ["ASKING"], None, owner)
                reply = await self._send(conn, source, req.args(self.name, owner, w), remaining, owner)
                return reply, conn, source
            except ResponseError as e:
                moved = move_to_follow(e, attempt, self.redis)
                if moved is None:
                    raise
        raise AssertionError("unreachable")

    def _source_for(self, moved: Any) -> Any:
        """The node (or pool) the request goes to: the key's by the slot map, or the one an
        ``ASK`` / ``MOVED`` named."""
        if moved is None or moved.address is None or not follows_moves(self.redis):
            return _source_of(self.redis, self.name)
        host, port = moved.address
        node = self.redis.get_node(host=host, port=port)
        return node if node is not None else _source_of(self.redis, self.name)

    async def _send(self, conn: Any, source: Any, args: List[Any], wait: Optional[float], owner: bytes) -> Any:
        default = _default_timeout(source)
        if wait is None:
            timeout = default
        elif wait == math.inf:
            timeout = None
        else:
            timeout = wait + WAIT_READ_MARGIN
        try:
            return await _call(conn, args, timeout, default)
        except ResponseError as e:
            _give_back(source, conn)
            raise map_response_error(e, self.name) from e
        except BaseException as e:
            # Cancelled, timed out, interrupted: the release written behind the request hands a
            # late grant back, and closing the connection takes a queued request out.
            await _abandon(conn, release_args(self.name, owner))
            if not self.bind and not _trouble(e):
                try:
                    await asyncio.shield(self.redis.execute_command(*release_args(self.name, owner)))
                except BaseException:  # noqa: BLE001 - best effort
                    pass
            raise

    async def _release_bound(self, owner: bytes, hold: _Hold) -> None:
        async with hold.conn_lock:
            conn, source = hold.conn, hold.source
            hold.conn = None
        if conn is None:
            return
        if _is_closed(conn):
            await _abandon(conn, None)
            raise make_error(
                LockNotOwnedError,
                "Cannot release a lock that's no longer owned: the connection it was bound to closed, which ended the hold",
                self.name,
            )
        try:
            await _call(conn, release_args(self.name, owner), _default_timeout(source), _default_timeout(source))
        except ResponseError as e:
            _give_back(source, conn)
            if is_notowner(e):
                raise make_error(LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name) from e
            raise map_response_error(e, self.name) from e
        except BaseException:
            await _abandon(conn, None)  # closing ends the bound hold all the same
            raise
        _give_back(source, conn)


async def _stop_watchdog(hold: Any) -> None:
    hold.stopped = True
    t = hold.watchdog
    if t is not None and t is not asyncio.current_task():
        t.cancel()
        # Waits for the watchdog to end without taking on its outcome (its own cancellation);
        # a cancellation of the caller (release()) still propagates.
        await asyncio.wait([t])


async def _watch(client: Any, name: Any, hold: _Hold, on_lost: Optional[OnLost], owner_ref: "weakref.ref[Any]") -> None:
    interval = None if hold.ttl is None else hold.ttl / 3
    ttl_ms_ = None if hold.ttl is None else max(1, int(hold.ttl * 1000))
    source = None
    own = None
    next_extend = time.monotonic() + (interval or 0)
    try:
        while True:
            now = time.monotonic()
            step = PROBE_INTERVAL if hold.conn is not None else next_extend - now
            if interval is not None:
                step = min(step, max(0.0, next_extend - now))
            await asyncio.sleep(max(0.0, step))
            if hold.stopped or owner_ref() is None:
                return  # released, or the Lock object was garbage-collected
            if hold.lost_error(name) is not None:
                break
            if interval is None or time.monotonic() < next_extend:
                continue
            sent = time.monotonic()
            left = max(0.01, hold.valid_until - sent)
            args = ["LOCK.EXTEND", name, hold.owner, ttl_ms_]
            try:
                # A connection of the watchdog's own, never the bound one (a late reply would
                # be left on it).
                if own is None:
                    source = _source_of(client, name)
                    own = _take(source)
                try:
                    await _call(own, args, left, left)
                except ResponseError:
                    raise  # the reply was read: the connection is clean
                except BaseException:
                    # No reply read (timed out, failed, or cancelled by release()): the
                    # connection must never go back to the idle ones, where the next wait
                    # would read this reply as its own grant.
                    dirty, own = own, None
                    await _abandon(dirty, None)
                    raise
                assert hold.ttl is not None and interval is not None
                hold.confirm(sent, hold.ttl)
                next_extend = sent + interval
            except ResponseError as e:
                if is_notowner(e):
                    hold.set_loss(LockLostError("the server says this owner no longer holds the lock", name, "notowner"))
                    break
                logger.warning("lock watchdog: extend of %r refused: %s", name, e)
                next_extend = time.monotonic() + min(interval or 0.5, 0.5)
            except (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError) as e:
                logger.warning("lock watchdog: extend of %r failed: %s", name, e)
                if own is not None:
                    await _abandon(own, None)
                    own = None
                if hold.conn is not None:
                    conn = hold.conn
                    if _is_closed(conn):
                        hold.set_loss(LockLostError("the connection the hold was bound to closed: the server ended the hold", name, "disconnected"))
                        break
                next_extend = time.monotonic() + min(interval or 0.5, 0.5)
        if not hold.stopped:
            err = hold.lost_error(name)
            if err is not None:
                await _notify(on_lost, err, name)
    finally:
        if own is not None and source is not None:
            _give_back(source, own)


class ReadLock(Lock):
    """The shared side of a read-write lock (``LOCK.RWREAD``)."""

    _command = "LOCK.RWREAD"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("lock_delay") is not None:
            raise LockArgumentError("lock_delay applies to exclusive (write) locks only")
        super().__init__(*args, **kwargs)


class RWLock:
    """A read-write lock: ``read()`` is its ``ReadLock``, ``write()`` its exclusive ``Lock``."""

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes, memoryview],
        timeout: Optional[float] = None,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        bind: bool = False,
        lock_delay: Optional[float] = None,
        watchdog: bool = False,
        on_lost: Optional[OnLost] = None,
    ) -> None:
        common: Any = dict(
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
            bind=bind,
            watchdog=watchdog,
            on_lost=on_lost,
        )
        self.name = name
        self.reader = ReadLock(redis, name, **common)
        self.writer = Lock(redis, name, lock_delay=lock_delay, **common)

    def read(self) -> ReadLock:
        return self.reader

    def write(self) -> Lock:
        return self.writer


class Semaphore(Lock):
    """A counting semaphore (``LOCK.SEMACQUIRE``) of ``capacity`` permits, FIFO."""

    _command = "LOCK.SEMACQUIRE"

    def __init__(
        self,
        redis: Any,
        name: Union[str, bytes, memoryview],
        capacity: int,
        timeout: Optional[float] = None,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        bind: bool = False,
        watchdog: bool = False,
        on_lost: Optional[OnLost] = None,
    ) -> None:
        self.capacity = check_capacity(capacity)
        super().__init__(
            redis,
            name,
            timeout=timeout,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
            bind=bind,
            watchdog=watchdog,
            on_lost=on_lost,
        )

    def _request(self) -> Request:
        r = super()._request()
        return Request(r.command, r.ttl_ms, self.capacity, r.bind, 0)

    async def locked(self) -> bool:
        info = await self.info()
        if info is None:
            return False
        return sum(h.count for h in info.holders) >= (info.capacity or self.capacity) or info.waiting > 0


from ._aio_redlock import Redlock  # noqa: E402 (the Redlock half lives in its own file)
