"""Sync locks: ``Lock`` (a drop-in for ``redis.lock.Lock``), ``ReadLock``, ``RWLock`` and
``Semaphore``, on one server or a Redis Cluster."""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, List, Literal, Optional, Type, Union

from redis.exceptions import (
    ConnectionError,
    LockError,
    LockNotOwnedError,
    NoScriptError,
    ResponseError,
    TimeoutError,
)

from . import _connections as conns
from ._common import (
    EXTEND_SCRIPT,
    MAX_KEY_MOVES,
    SINGLE_SERVER_MARGIN,
    UNLIMITED_TTL_MS,
    WAIT_READ_MARGIN,
    WAITED_GRANT_MARGIN,
    LockArgumentError,
    LockInfo,
    LockLostError,
    Request,
    check_blocking_timeout,
    check_capacity,
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

__all__ = ["Lock", "ReadLock", "RWLock", "Semaphore", "OnLost"]

#: Called (from the watchdog's thread) once when a held lock is found lost.
OnLost = Callable[[LockLostError], Any]

#: How often a watchdog looks at a bound hold's connection between extends.
PROBE_INTERVAL = 0.1

_EXTEND_SHA: Optional[str] = None


def _script_sha() -> str:
    global _EXTEND_SHA
    if _EXTEND_SHA is None:
        import hashlib

        _EXTEND_SHA = hashlib.sha1(EXTEND_SCRIPT.encode()).hexdigest()
    return _EXTEND_SHA


def _name_ok(name: Any) -> None:
    if not isinstance(name, (str, bytes, memoryview)):
        raise TypeError(f"name must be str or bytes, not {type(name).__name__}")
    if len(name) == 0:
        raise LockArgumentError("name must not be empty")


class _Hold:
    """One held lock (or permit): the owner token, the grant's fencing token, the lease as this
    process knows it, and for a bound hold the connection it is bound to."""

    def __init__(
        self,
        owner: bytes,
        fence: int,
        ttl: Optional[float],
        valid_until: float,
        conn: Any = None,
        pool: Any = None,
    ) -> None:
        self.owner = owner
        self.fence = fence
        self.ttl = ttl  # seconds; None: bound with no ttl of its own
        self.valid_until = valid_until
        self.conn = conn
        self.pool = pool
        self.mutex = threading.Lock()  # guards conn and the lease fields
        self.conn_lock = threading.Lock()  # held while a request is out on conn
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stop = threading.Event()
        self.watchdog: Optional[threading.Thread] = None

    def lost_error(self, name: Any) -> Optional[LockLostError]:
        """The loss, if the lease is known lost or its validity has run out."""
        self.probe(name)
        with self.mutex:
            if self.loss is not None:
                return self.loss
            if time.monotonic() >= self.valid_until:
                return LockLostError(
                    "the lock's lease ran out without a confirmed extend", name, "expired"
                )
        return None

    def probe(self, name: Any) -> None:
        """A bound hold: records the loss when its connection is closed."""
        if self.conn is None or self.loss is not None:
            return
        if not self.conn_lock.acquire(blocking=False):
            return  # a request is out on it; its outcome will tell
        try:
            conn = self.conn
            if conn is not None and conns.is_closed(conn):
                self.set_loss(
                    LockLostError(
                        "the connection the hold was bound to closed: the server ended the hold",
                        name,
                        "disconnected",
                    )
                )
        finally:
            self.conn_lock.release()

    def set_loss(self, err: LockLostError) -> None:
        with self.mutex:
            if self.loss is None:
                self.loss = err

    def confirm(self, sent_at: float, ttl: float, factor: float = 0.01) -> None:
        """An extend sent at ``sent_at`` set the server's ttl to ``ttl`` seconds. The last one
        sent wins, also when it shortened the lease (``extend(t, replace_ttl=True)``, a
        ``reacquire()`` after a longer extend, the watchdog's renewal to ``timeout``); one
        confirmed after the validity ran out revives nothing."""
        with self.mutex:
            if self.loss is None and time.monotonic() < self.valid_until and sent_at >= self.lease_sent:
                self.lease_sent = sent_at
                self.valid_until = sent_at + ttl - drift(ttl, factor)


class Lock:
    """A distributed lock held in the redis-lock module: a drop-in for ``redis.lock.Lock``.

    Same constructor and methods as redis-py's (``r.lock(name, ..., lock_class=Lock)``), same
    exceptions (``LockError``, ``LockNotOwnedError`` or subclasses of them); waiting is the
    server's FIFO queue instead of polling. See docs/python.md for the differences:

    - ``sleep`` is accepted and ignored (the server wakes the waiter when the lock is free);
    - ``timeout=None`` binds the hold to a connection of its own: the lock is held until
      ``release()`` *or until that connection closes* (the process dies, the network drops),
      never forever after a crash;
    - ``fencing_token`` is the grant's fencing token (``local.token`` stays the owner token).

    Keyword-only extras: ``bind`` (tie the hold to a connection of its own also with a
    timeout), ``lock_delay`` (seconds nobody gets the lock after a hold ends without a
    release), ``watchdog`` (renew every third of the timeout in a daemon thread) and
    ``on_lost`` (called once when the watchdog finds the lock lost; implies ``watchdog``).
    """

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
        _name_ok(name)
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

    # -- redis-py's API -----------------------------------------------------------------------

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise make_error(LockError, "Unable to acquire lock within the time specified", self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def acquire(
        self,
        sleep: Optional[float] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Takes the lock; True once held. With ``blocking`` (the default) the request queues
        on the server (FIFO) for up to ``blocking_timeout`` seconds (None: no limit) and False
        comes back when that passed; without it, one try. ``token`` is the owner (default: a
        fresh one). ``sleep`` is ignored: nothing polls."""
        owner = new_token() if token is None else encode_token(token)
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        bt = check_blocking_timeout(blocking_timeout)
        wait: Optional[float] = None  # None: one try; math.inf: no limit; else seconds
        if blocking and bt != 0:
            wait = math.inf if bt is None else bt
        try:
            hold = self._acquire(owner, wait)
            if hold is None:
                return False
            self.local.token = owner
            self.local.hold = hold
        except LockError:
            raise  # a refusal: nothing was granted
        except BaseException as e:
            # Interrupted after a grant's reply was read but before it was recorded (the
            # window is small, but KeyboardInterrupt can land anywhere): give it back.
            if self.local.token is not owner and not self.bind and not conns.is_connection_trouble(e):
                try:
                    self.redis.execute_command(*release_args(self.name, owner))
                except Exception:  # noqa: BLE001 - best effort; NOTOWNER is the usual answer
                    pass
            raise
        if self.watchdog:
            self._start_watchdog(hold)
        return True

    def locked(self) -> bool:
        """True when anyone holds the lock."""
        info = self.info()
        return info is not None and bool(info.holders)

    def owned(self) -> bool:
        """True when this lock's token (this thread's, with ``thread_local``) holds it."""
        owner = self.local.token
        if owner is None:
            return False
        info = self.info()
        return info is not None and info.holds(owner)

    def release(self) -> None:
        """Releases the lock (all of the owner's holds). ``LockError`` when this thread does
        not hold it; ``LockNotOwnedError`` when the server says it is no longer held."""
        owner = self.local.token
        if owner is None:
            raise make_error(
                LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name
            )
        hold = getattr(self.local, "hold", None)
        self.local.token = None
        self.local.hold = None
        self._release(owner, hold)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Adds ``additional_time`` seconds to the lock's remaining ttl (with ``replace_ttl``:
        sets the ttl to it), on the server in one step."""
        owner = self.local.token
        if owner is None:
            raise make_error(LockError, "Cannot extend an unlocked lock", self.name)
        if self.timeout is None:
            raise make_error(LockError, "Cannot extend a lock with no timeout", self.name)
        if replace_ttl:
            ms = ttl_ms(additional_time, "additional_time")
        else:
            ms = delay_ms(additional_time, "additional_time")
        sent = time.monotonic()
        new_ms = self._run_extend_script(owner, ms, replace_ttl)
        if not new_ms:
            raise make_error(LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name)
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.confirm(sent, new_ms / 1000)  # the script answers with the new ttl (ms)
        return True

    def reacquire(self) -> Literal[True]:
        """Resets the lock's ttl to ``timeout``."""
        owner = self.local.token
        if owner is None:
            raise make_error(LockError, "Cannot reacquire an unlocked lock", self.name)
        if self.timeout is None or self._ttl_ms is None:
            raise make_error(LockError, "Cannot reacquire a lock with no timeout", self.name)
        sent = time.monotonic()
        try:
            self.redis.execute_command("LOCK.EXTEND", self.name, owner, self._ttl_ms)
        except ResponseError as e:
            if is_notowner(e):
                raise make_error(
                    LockNotOwnedError, "Cannot reacquire a lock that's no longer owned", self.name
                ) from e
            raise map_response_error(e, self.name) from e
        hold = getattr(self.local, "hold", None)
        if hold is not None:
            hold.confirm(sent, self._ttl_ms / 1000)
        return True

    # -- beyond redis-py ----------------------------------------------------------------------

    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of the current hold (this thread's, with ``thread_local``), or
        None when not held. Pass it to the resource you protect."""
        hold = getattr(self.local, "hold", None)
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """True once the current hold may no longer be held: its lease ran out without a
        confirmed extend, the watchdog heard the server say so, or its bound connection
        closed. Check it (or call ``check()``) right before acting under the lock."""
        hold = getattr(self.local, "hold", None)
        return hold is not None and hold.lost_error(self.name) is not None

    def check(self) -> float:
        """Raises ``LockLostError`` when the hold is lost (``LockError`` when not held);
        otherwise returns how many seconds the lock is still certainly held (``inf`` for a
        bound hold without timeout)."""
        hold = getattr(self.local, "hold", None)
        if hold is None or self.local.token is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = hold.lost_error(self.name)
        if err is not None:
            raise err
        return max(0.0, float(hold.valid_until) - time.monotonic())

    def info(self) -> Optional[LockInfo]:
        """LOCK.INFO of the key (None when the key does not exist)."""
        try:
            reply = self.redis.execute_command("LOCK.INFO", self.name)
        except ResponseError as e:
            raise map_response_error(e, self.name) from e
        return parse_info(reply)

    # -- internals ----------------------------------------------------------------------------

    def _request(self) -> Request:
        return Request(
            command=self._command,
            ttl_ms=UNLIMITED_TTL_MS if self._ttl_ms is None else self._ttl_ms,
            bind=self.bind,
            lock_delay_ms=self._delay_ms,
        )

    def _acquire(self, owner: bytes, wait: Optional[float]) -> Optional[_Hold]:
        req = self._request()
        ttl = None if self._ttl_ms is None else self._ttl_ms / 1000
        started = time.monotonic()
        if req.bind:
            # The request goes over the connection the hold will be bound to (for a wait as
            # well: a waiter's grant is bound to its own connection).
            reply, conn, pool = self._send_following(req, owner, wait, started)
            fence = grant_token(reply)
            if fence is None:
                conns.give_back(pool, conn)
                return None
            return _Hold(owner, fence, ttl, self._valid_until(ttl, started, wait), conn, pool)
        try:
            reply = self.redis.execute_command(*req.args(self.name, owner, None))
        except ResponseError as e:
            raise map_response_error(e, self.name) from e
        fence = grant_token(reply)
        if fence is not None:
            return _Hold(owner, fence, ttl, self._valid_until(ttl, started, None))
        if wait is None:
            return None
        if wait - (time.monotonic() - started) <= 0:
            return None
        reply, conn, pool = self._send_following(req, owner, wait, started)
        conns.give_back(pool, conn)
        fence = grant_token(reply)
        if fence is None:
            return None
        return _Hold(owner, fence, ttl, self._valid_until(ttl, started, wait))

    def _send_following(self, req: Request, owner: bytes, wait: Optional[float], started: float) -> Any:
        """Sends the request (with ``wait``: the part of it not yet spent since ``started``)
        over a connection of ours to the node that owns the key; returns (reply, connection,
        pool). On a ``RedisCluster``, if the key moved to another node while the request
        waited (resharding: the module answers ``TRYAGAIN``; a stale slot map gets ``ASK`` or
        ``MOVED``), the request is sent again where the key now lives, with what is left of
        the wait, so it queues there instead of failing or waiting past its time."""
        moved = None
        for attempt in range(MAX_KEY_MOVES + 1):
            remaining, w = wait_left(wait, started)
            pool = self._pool_for(moved)
            conn = conns.take(pool)
            if remaining is not None and remaining <= 0:
                return None, conn, pool  # the wait was spent before the key was found
            try:
                if moved is not None and moved.asking:
                    self._send(conn, pool, ["ASKING"], None, owner)
                return self._send(conn, pool, req.args(self.name, owner, w), remaining, owner), conn, pool
            except ResponseError as e:
                moved = move_to_follow(e, attempt, self.redis)
                if moved is None:
                    raise
        raise AssertionError("unreachable")

    def _pool_for(self, moved: Any) -> Any:
        """The pool of the node the request goes to: the key's by the slot map, or the one an
        ``ASK`` / ``MOVED`` named."""
        if moved is None or moved.address is None or not follows_moves(self.redis):
            return conns.pool_of(self.redis, self.name)
        host, port = moved.address
        node = self.redis.get_node(host=host, port=port)
        if node is None:
            return conns.pool_of(self.redis, self.name)
        return self.redis.get_redis_connection(node).connection_pool

    @staticmethod
    def _valid_until(ttl: Optional[float], started: float, wait: Optional[float]) -> float:
        if ttl is None:
            return math.inf
        if wait is None:
            return started + ttl - SINGLE_SERVER_MARGIN
        # A waited grant starts its lease when the server grants, just before the reply.
        return time.monotonic() + ttl - WAITED_GRANT_MARGIN - SINGLE_SERVER_MARGIN

    def _send(self, conn: Any, pool: Any, args: List[Any], wait: Optional[float], owner: bytes) -> Any:
        """One request on a connection of ours. Its read timeout: the pool's for a try, the
        wait plus a margin for a wait, none for an unlimited one. If anything interrupts it
        (the timeout, KeyboardInterrupt, any exception), the connection is abandoned behind a
        release, so no grant is left behind."""
        if wait is None:
            timeout = conns.default_timeout(pool)
        elif wait == math.inf:
            timeout = None
        else:
            timeout = wait + WAIT_READ_MARGIN
        try:
            return conns.call(conn, args, timeout)
        except ResponseError as e:
            # The reply was read in full: the connection is clean.
            conns.give_back(pool, conn)
            raise map_response_error(e, self.name) from e
        except BaseException as e:
            conns.abandon(conn, release_args(self.name, owner))
            if not self.bind and not conns.is_connection_trouble(e):
                # Belt and braces: the release written behind the request covers a late
                # grant; this covers a grant whose reply was read but not handed to us.
                try:
                    self.redis.execute_command(*release_args(self.name, owner))
                except Exception:  # noqa: BLE001 - best effort (NOTOWNER is the usual answer)
                    pass
            raise

    def _release(self, owner: bytes, hold: Optional[_Hold]) -> None:
        if hold is not None:
            self._stop_watchdog(hold)
        if hold is not None and hold.conn is not None:
            self._release_bound(owner, hold)
            return
        try:
            self.redis.execute_command(*release_args(self.name, owner))
        except ResponseError as e:
            if is_notowner(e):
                raise make_error(
                    LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
                ) from e
            raise map_response_error(e, self.name) from e

    def _release_bound(self, owner: bytes, hold: _Hold) -> None:
        with hold.conn_lock:
            conn, pool = hold.conn, hold.pool
            hold.conn = None
        if conn is None:
            return
        if conns.is_closed(conn):
            conn.disconnect()
            raise make_error(
                LockNotOwnedError,
                "Cannot release a lock that's no longer owned: the connection it was bound to "
                "closed, which ended the hold",
                self.name,
            )
        try:
            conns.call(conn, release_args(self.name, owner), conns.default_timeout(pool))
        except ResponseError as e:
            conns.give_back(pool, conn)
            if is_notowner(e):
                raise make_error(
                    LockNotOwnedError, "Cannot release a lock that's no longer owned", self.name
                ) from e
            raise map_response_error(e, self.name) from e
        except BaseException:
            # No answer: closing the connection ends the bound hold all the same.
            conns.abandon(conn, None)
            raise
        conns.give_back(pool, conn)

    def _run_extend_script(self, owner: bytes, ms: int, replace: bool) -> int:
        args = [owner, ms, "1" if replace else "0"]
        try:
            try:
                reply = self.redis.execute_command("EVALSHA", _script_sha(), 1, self.name, *args)
            except NoScriptError:
                reply = self.redis.execute_command("EVAL", EXTEND_SCRIPT, 1, self.name, *args)
        except ResponseError as e:
            if "NOSCRIPT" in str(e):
                reply = self.redis.execute_command("EVAL", EXTEND_SCRIPT, 1, self.name, *args)
            else:
                raise map_response_error(e, self.name) from e
        return int(reply or 0)

    # -- watchdog -----------------------------------------------------------------------------

    def _start_watchdog(self, hold: _Hold) -> None:
        t = threading.Thread(
            target=_watch,
            args=(self.redis, self.name, hold, self.on_lost, weakref.ref(self)),
            name=f"redis-lock-watchdog:{self.name!r}",
            daemon=True,
        )
        hold.watchdog = t
        t.start()

    @staticmethod
    def _stop_watchdog(hold: _Hold) -> None:
        hold.stop.set()
        t = hold.watchdog
        if t is not None and t is not threading.current_thread():
            t.join()


def _watch(client: Any, name: Any, hold: _Hold, on_lost: Optional[OnLost], owner_ref: "weakref.ref[Any]") -> None:
    """The watchdog: extends the lease every third of its ttl over a connection of its own
    whose read timeout is what is left of the lease; a bound hold's connection is also looked
    at every 0.1 s (without sending anything). Reports a loss once."""
    interval = None if hold.ttl is None else hold.ttl / 3
    ttl_ms_ = None if hold.ttl is None else max(1, int(hold.ttl * 1000))
    pool = None
    own = None
    next_extend = time.monotonic() + (interval or 0)
    try:
        while True:
            now = time.monotonic()
            step = PROBE_INTERVAL if hold.conn is not None else (next_extend - now)
            if interval is not None:
                step = min(step, max(0.0, next_extend - now))
            if hold.stop.wait(max(0.0, step)):
                return
            if owner_ref() is None:
                return  # the Lock object was garbage-collected without a release: stop renewing
            err = hold.lost_error(name)
            if err is not None:
                break
            if interval is None or time.monotonic() < next_extend:
                continue
            sent = time.monotonic()
            left = max(0.01, hold.valid_until - sent)
            args = ["LOCK.EXTEND", name, hold.owner, ttl_ms_]
            try:
                # Over a connection of the watchdog's own, never the bound one: a reply that
                # came too late would be left on it, ahead of the release's.
                if own is None:
                    pool = conns.pool_of(client, name)
                    own = conns.take(pool)
                try:
                    conns.call(own, args, left)
                except ResponseError:
                    raise  # the reply was read: the connection is clean
                except BaseException:
                    # No reply read: never back to the idle connections (the next wait would
                    # read this reply as its own grant).
                    dirty, own = own, None
                    conns.abandon(dirty, None)
                    raise
                assert hold.ttl is not None
                hold.confirm(sent, hold.ttl)
                next_extend = sent + interval
            except ResponseError as e:
                if hold.stop.is_set():
                    return
                if is_notowner(e):
                    hold.set_loss(
                        LockLostError(
                            "the server says this owner no longer holds the lock", name, "notowner"
                        )
                    )
                    break
                logger.warning("lock watchdog: extend of %r refused: %s", name, e)
                next_extend = time.monotonic() + min(interval, PROBE_INTERVAL * 5)
            except (ConnectionError, TimeoutError, OSError) as e:
                if hold.stop.is_set():
                    return
                logger.warning("lock watchdog: extend of %r failed: %s", name, e)
                if own is not None:
                    own.disconnect()
                    own = None
                if hold.conn is not None and conns.is_closed(hold.conn):
                    hold.set_loss(
                        LockLostError(
                            "the connection the hold was bound to closed: the server ended the hold",
                            name,
                            "disconnected",
                        )
                    )
                    break
                next_extend = time.monotonic() + min(interval, PROBE_INTERVAL * 5)
        if hold.stop.is_set():
            return
        err = hold.lost_error(name)
        if err is not None and on_lost is not None:
            try:
                on_lost(err)
            except Exception:  # noqa: BLE001 - a callback's failure must not kill silently
                logger.exception("lock watchdog: on_lost callback of %r raised", name)
    finally:
        if own is not None and pool is not None:
            conns.give_back(pool, own)


class _Local(threading.local):
    """Per-thread token and hold, None in every thread until that thread acquires."""

    token: Optional[bytes] = None
    hold: Any = None


class _Shared:
    """The ``thread_local=False`` store: one token for all threads."""

    token: Optional[bytes] = None
    hold: Optional[_Hold] = None


class ReadLock(Lock):
    """The shared (read) side of a read-write lock (``LOCK.RWREAD``): many readers hold it at
    once, each with its own lease; a queued writer makes new readers queue behind it. Same API
    as ``Lock``; ``lock_delay`` is for writers only."""

    _command = "LOCK.RWREAD"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("lock_delay") is not None:
            raise LockArgumentError("lock_delay applies to exclusive (write) locks only")
        super().__init__(*args, **kwargs)


class RWLock:
    """A read-write lock: ``rw.read()`` is its ``ReadLock``, ``rw.write()`` its exclusive
    ``Lock``; both on the same key, with the same options (``lock_delay`` goes to the writer).

    >>> rw = RWLock(r, "catalog", timeout=30)
    >>> with rw.read():
    ...     ...
    """

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
    """A counting semaphore (``LOCK.SEMACQUIRE``): at most ``capacity`` permits held at once,
    granted in FIFO order. Each acquire takes one permit under its own token; ``release()``
    gives it back. Same methods as ``Lock``; ``locked()`` is True when no permit is free (an
    acquire would have to wait), as ``asyncio.Semaphore.locked()``."""

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

    def locked(self) -> bool:
        info = self.info()
        if info is None:
            return False
        held = sum(h.count for h in info.holders)
        return held >= (info.capacity or self.capacity) or info.waiting > 0

