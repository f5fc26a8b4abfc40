"""Sync locks: ``Lock`` (a drop-in for ``redis.lock.Lock``), ``ReadLock``, ``RWLock`` and
``Semaphore``, on one server or a Redis Cluster. The protocol is in ``_core.py``; this face
only carries its effects out (blocking sockets, a daemon thread per watchdog)."""

from __future__ import annotations

import functools
import threading
import time
from types import TracebackType
from typing import Any, Literal, Optional, Type, Union

import redis.lock

from . import _connections as conns
from . import _core as core
from . import _watch_sync
from ._common import LockInfo, encode_token
from ._core import OnLost as OnLost, _Local as _Local, _Shared as _Shared  # noqa: F401 (re-exported)
from ._drive import drive

__all__ = ["Lock", "ReadLock", "RWLock", "Semaphore", "OnLost"]

#: How often a watchdog looks at a bound hold's connection between extends.
PROBE_INTERVAL = core.PROBE_INTERVAL


def _perform(client: Any, e: Any) -> Any:
    """Carries out one effect of the core for ``client``."""
    t = type(e)
    if t is core.Run:
        return client.execute_command(*e.args)
    if t is core.Take:
        pool = conns.pool_of(client, e.name, e.address)
        return core.Link(conns.take(pool, e.deadline, e.wait, e.queue), pool, conns.default_timeout(pool))
    if t is core.Call:
        conns.connect(e.link.conn, e.deadline)
        return conns.call(e.link.conn, e.args, e.timeout)
    if t is core.ShortRequest:
        return conns.request(conns.pool_of(client, e.name), e.args, e.deadline)
    if t is core.GiveBack:
        return conns.give_back(e.link.pool, e.link.conn)
    if t is core.Abandon:
        return conns.abandon(e.link.conn, e.release)
    if t is core.Sleep:
        return time.sleep(e.seconds)
    if t is core.Pause:
        return e.hold.stop.wait(e.seconds)
    if t is core.Watch:
        return _watch_sync.watch(client, e.name, e.owner, e.on_loss)
    if t is core.Unwatch:
        return _watch_sync.unwatch(e.handle)
    if t is core.WatcherCall:
        return _watch_sync.call(client, e.args, e.timeout)
    if t is core.Notify:
        return core.notify_lost(e.on_lost, e.err, e.name)
    if t is core.StartWatchdog:
        e.hold.watchdog = threading.Thread(
            target=drive, args=(e.steps, functools.partial(_perform, client)), name="redis-lock-watchdog", daemon=True
        )
        return e.hold.watchdog.start()
    if t is core.StopWatchdog:
        w = e.hold.watchdog
        if w is not None and w is not threading.current_thread():
            w.join()
        return None
    raise TypeError(f"unknown effect {e!r}")


class Lock(core.LockBase, redis.lock.Lock):
    """A distributed lock held in the redis-lock module: a drop-in for ``redis.lock.Lock``
    (an instance of it; the hooks ``do_acquire``, ``do_release``, ``do_extend`` and
    ``do_reacquire`` are called as redis-py calls them).

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
    ``on_lost`` (called once when the lock is found lost; implies ``watchdog``).
    """

    _is_closed = staticmethod(conns.is_closed)

    def _perform(self, e: Any) -> Any:
        return _perform(self.redis, e)

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise core.not_acquired(self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except Exception as e:  # noqa: BLE001 - decided in _exit_failure
            self._exit_failure(e, exc_value)

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
        fresh one). ``sleep`` (seconds >= 0, or None) is checked and not used: the wait is
        native on the server, nothing polls."""
        owner, pending = self._acquire_args(blocking, blocking_timeout, token, sleep)
        try:
            with core.passing(core._PENDING, pending):
                granted = self.do_acquire(owner)
            return self._acquired(owner, pending, granted)
        except BaseException:
            drive(self._given_up_steps(owner, pending), self._perform)
            raise

    def do_acquire(self, token: Union[str, bytes]) -> bool:
        return self._granted(drive(self._acquire_steps(encode_token(token), core.pending_now()), self._perform))

    def locked(self) -> bool:
        """True when anyone holds the lock (a semaphore: when no permit is free)."""
        return self._locked_in(self.info())

    def owned(self) -> bool:
        """True when this lock's token (this thread's, with ``thread_local``) holds it."""
        return drive(self._owned_steps(), self._perform) if self.local.token is not None else False

    def release(self) -> None:
        """Releases the lock (all of the owner's holds). ``LockError`` when this thread does
        not hold it; ``LockNotOwnedError`` when the server says it is no longer held."""
        token, hold = self._release_token()
        with core.passing(core._RELEASING, hold):
            self.do_release(token)

    def do_release(self, expected_token: Union[str, bytes]) -> None:
        drive(self._release_steps(encode_token(expected_token), self._hold_released(expected_token)), self._perform)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Adds ``additional_time`` seconds to the lock's remaining ttl (with ``replace_ttl``:
        sets the ttl to it), on the server in one step."""
        self._held_token("extend")
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: float, replace_ttl: bool) -> Literal[True]:
        token, hold = self._held_token("extend")
        return drive(self._extend_steps(token, hold, additional_time, replace_ttl), self._perform)

    def reacquire(self) -> Literal[True]:
        """Resets the lock's ttl to ``timeout``."""
        self._held_token("reacquire")
        return self.do_reacquire()

    def do_reacquire(self) -> Literal[True]:
        token, hold = self._held_token("reacquire")
        return drive(self._reacquire_steps(token, hold), self._perform)

    def info(self) -> Optional[LockInfo]:
        """LOCK.INFO of the key (None when the key does not exist)."""
        return drive(self._info_steps(), self._perform)  # type: ignore[no-any-return]


class ReadLock(core.ReadLockBase, Lock):
    """The shared (read) side of a read-write lock (``LOCK.RWREAD``): many readers hold it at
    once, each with its own lease; a queued writer makes new readers queue behind it. Same API
    as ``Lock``; ``lock_delay`` is for writers only."""


class RWLock(core.RWLockBase[ReadLock, Lock]):
    """A read-write lock: ``rw.read()`` is its ``ReadLock``, ``rw.write()`` its exclusive
    ``Lock``; both on the same key, with the same options (``lock_delay`` goes to the writer).

    >>> rw = RWLock(r, "catalog", timeout=30)
    >>> with rw.read():
    ...     ...
    """

    _reader_class = ReadLock
    _writer_class = Lock


class Semaphore(core.SemaphoreBase, Lock):
    """A counting semaphore (``LOCK.SEMACQUIRE``): at most ``capacity`` permits held at once,
    granted in FIFO order. Like ``threading.Semaphore``, one object may be acquired several
    times, from one thread or several: each acquire takes a permit of its own (its own token),
    each ``release()`` gives one back (the calling thread's most recent, else the oldest this
    object holds). ``fencing_token``, ``lost`` and ``check()`` are about the calling thread's
    most recent permit. ``locked()`` is True when no permit is free (an acquire would have to
    wait), as ``asyncio.Semaphore.locked()``."""
