"""Redlock (sync): one lock over N independent servers with the module, held when a majority
(N/2+1) granted it, under the same rules as the project's Rust client (client/src/lib.rs).

The protocol is ``_redlock_core``'s; this face carries its effects out with blocking sockets
and a thread pool (a round asks every server at once)."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Literal, Optional, Tuple

from redis.exceptions import LockError, ResponseError

from . import _connections as conns
from . import _redlock_core as rc
from . import _watch_sync
from ._common import dedicated_kwargs
from ._drive import drive
from ._redlock_core import Answer, Hold, OnLost, Outcome, Send

logger = logging.getLogger(__name__)

__all__ = ["Redlock", "Outcome", "OnLost"]

_executor: Optional[ThreadPoolExecutor] = None
_executor_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The threads that ask the servers (one pool per process, see _after_fork)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="redlock")
        return _executor


def _after_fork() -> None:
    # A forked child inherits the parent's pool without its threads: work submitted there
    # would never run (and the lock may have been held by another thread at the fork).
    global _executor, _executor_lock
    _executor = None
    _executor_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class _Instance(rc.InstanceBase):
    """One server: connections of our own with ``timeout`` for connecting and every reply, and
    no retries (a paused or dead server costs at most ``timeout`` per request)."""

    def __init__(self, client: Any, timeout: float) -> None:
        super().__init__(client, timeout, "redis.Redis")
        self._idle: List[Tuple[int, Any]] = []  # (pid, connection)
        self._lock = threading.Lock()

    def take(self) -> Any:
        pid = os.getpid()
        conn = None
        with self._lock:
            while self._idle and conn is None:
                owner_pid, c = self._idle.pop()
                if owner_pid == pid:
                    conn = c
                # else: inherited through fork: its socket is the parent's, never ours to use
        if conn is not None and conns.is_closed(conn):
            conn.disconnect()
        if conn is None:
            kwargs = dict(self.pool.connection_kwargs)
            kwargs["socket_connect_timeout"] = self.timeout
            conn = self.pool.connection_class(**dedicated_kwargs(kwargs, self.timeout, False))
        return conn

    def put(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append((os.getpid(), conn))
                return
        conn.disconnect()

    def request(self, send: Send) -> Answer:
        """Carries out one send. A connection whose reply was not read is given up (with
        ``send.behind`` written after the request); an interrupt propagates after that."""
        if send.watcher:
            try:
                return Answer(_watch_sync.call(self.client, list(send.args), self.timeout))
            except _watch_sync.Unavailable:
                pass
            except Exception as e:  # noqa: BLE001 - the answer, typed by the core
                return Answer(None, e)
        conn = send.link if send.link is not None else self.take()
        try:
            reply = conns.call(conn, list(send.args), self.timeout)
        except ResponseError as e:  # the reply was read: the connection is clean
            return self.settle(send, Answer(None, e), conn)
        except BaseException as e:  # noqa: BLE001 - interrupts included: give the connection up
            conns.abandon(conn, None if send.behind is None else list(send.behind))
            if isinstance(e, Exception):
                return Answer(None, e)
            raise
        return self.settle(send, Answer(reply), conn)


class Redlock(rc.RedlockBase):
    """One lock over N independent servers, each with the redis-lock module: held when a
    majority (N/2+1) granted it within its validity.

    - **Validity** = timeout - time spent acquiring - clock drift (``drift_factor`` of the
      timeout + 2 ms). An acquire whose majority came too late releases everything and fails
      with ``LockValidityError``.
    - **Every attempt asks all servers at once** (without ``WAIT``: waiting on one server while
      holding another could deadlock), each bounded by ``instance_timeout``. With ``blocking``
      it retries until ``blocking_timeout`` passes (None: for ever): after a held lock, after a
      random ``retry_delay``; without a quorum of answers, backing off (the pause doubles from
      20 ms up to 1 s, jittered) with a WARNING logged at once and then at most every 10 s.
    - **A failed attempt is released everywhere**, on the servers that granted and on those
      that did not answer (a late grant).
    - **Errors tell why**: ``LockHeldError`` (enough servers answered, the lock is held
      elsewhere), ``QuorumUnreachableError`` (too few answered), ``LockValidityError``, and
      the server's refusals (``DeadlockError``, ``WrongTypeError``, ...), never retried. Each
      lists every server's ``outcomes``. ``acquire()`` raises them instead of returning False.
    - No semaphores (a majority of independent semaphores does not bound the holders to the
      capacity) and no ``timeout=None`` (the lease is what makes a quorum lock safe).
    """

    _public_name = "redis_lock_client.Redlock"

    _instance = _Instance
    _closed = staticmethod(conns.is_closed)
    _watcher = _watch_sync

    def __enter__(self) -> "Redlock":
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.release()
        except LockError as e:
            self._exit_error(e)

    def acquire(self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None) -> Literal[True]:
        """Takes the lock on a majority, or raises (see the class documentation)."""
        return drive(self._acquire_steps(blocking, blocking_timeout), self._perform)

    def release(self) -> None:
        """Releases the lock on every server. ``LockNotOwnedError`` when a majority says this
        owner no longer holds it (or it was not acquired)."""
        drive(self._release_steps(), self._perform)

    def extend(self, additional_time: Optional[float] = None) -> Literal[True]:
        """Sets the lease on every server to ``additional_time`` seconds from now (default:
        ``timeout``; LOCK.EXTEND replaces the ttl). Raises ``LockLostError`` when the lock is
        known lost, ``QuorumUnreachableError`` when too few servers confirmed."""
        return drive(self._extend_steps(additional_time), self._perform)

    def reacquire(self) -> Literal[True]:
        return self.extend(None)

    def owned(self) -> bool:
        """Whether this owner holds the lock on a majority right now (asks every server)."""
        return drive(self._owned_steps(), self._perform)

    def locked(self) -> bool:
        """Whether a majority of the servers show the lock held, by anyone (asks every server;
        ``QuorumUnreachableError`` when the answers cannot tell)."""
        return drive(self._locked_steps(), self._perform)

    # -- the effects ----------------------------------------------------------------------------

    def _perform(self, effect: Any) -> Any:
        kind = type(effect)
        if kind is rc.Scatter:
            return self._scatter(effect.sends)
        if kind is rc.Sleep:
            time.sleep(effect.seconds)
        elif kind is rc.StartWatchdog:
            hold = effect.hold
            hold.alarm = threading.Event()
            hold.task = threading.Thread(
                target=_watchdog, args=(weakref.ref(self), hold), name="redlock-watchdog", daemon=True
            )
            hold.task.start()
        elif kind is rc.StopWatchdog:
            hold = effect.hold
            if hold.alarm is not None:
                hold.alarm.set()
            if hold.task is not None and hold.task is not threading.current_thread():
                hold.task.join()
        elif kind is rc.Pause:
            effect.hold.alarm.wait(effect.seconds)
            effect.hold.alarm.clear()
        elif kind is rc.Notify:
            self._callback(effect.error)
        else:
            return self._perform_local(effect)
        return None

    def _scatter(self, sends: Tuple[Send, ...]) -> List[Answer]:
        """Every send at once. One: in this thread. More: in the thread pool; if this thread
        is interrupted while they run, the requests go on (each bounded by
        ``instance_timeout``): the connections they kept are given up once they ended, then
        the interrupt propagates (into the core, which releases)."""
        if len(sends) == 1:
            return [self.instances[sends[0].server].request(sends[0])]
        futures = [_pool().submit(self.instances[s.server].request, s) for s in sends]
        try:
            return [f.result() for f in futures]
        except BaseException:
            concurrent.futures.wait(futures)
            for s, f in zip(sends, futures):
                kept = f.result().conn if f.exception() is None else None
                if kept is not None:
                    conns.abandon(kept, None if s.behind is None else list(s.behind))
            raise


def _watchdog(ref: "weakref.ref[Redlock]", hold: Hold) -> None:
    """The watchdog thread: the core's loop, its Redlock held weakly (it stops when the
    Redlock is garbage-collected)."""

    def perform(effect: Any) -> Any:
        rl = ref()
        if rl is None:
            raise rc.Gone()
        return rl._perform(effect)

    try:
        drive(rc.watchdog_steps(ref, hold), perform)
    except Exception:  # noqa: BLE001 - a background thread: logged, never silent
        logger.exception("redlock watchdog failed")
