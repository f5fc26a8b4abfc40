"""Redlock (sync): one lock over N independent servers with the module, held when a majority
(N/2+1) granted it, under the same rules as the project's Rust client (client/src/lib.rs)."""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
import weakref
import concurrent.futures
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Type, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

from . import _connections as conns
from ._common import (
    LockArgumentError,
    LockHeldError,
    LockLostError,
    LockRefusedError,
    LockValidityError,
    QuorumUnreachableError,
    Request,
    check_blocking_timeout,
    delay_ms,
    drift,
    grant_token,
    is_notowner,
    make_error,
    map_response_error,
    new_token,
    release_args,
    ttl_ms,
)

logger = logging.getLogger(__name__)

__all__ = ["Redlock", "Outcome"]

OnLost = Callable[[LockLostError], Any]

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


class Outcome:
    """What one server answered: ``kind`` is ``granted`` (``value``: the fencing token),
    ``held``, ``ok``, ``notowner``, ``refused`` (``value``: the error) or ``unreachable``
    (``value``: why)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any = None) -> None:
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}: {self.value}"


class _Instance:
    """One server: connections of our own with ``timeout`` for connecting and every reply, and
    no retries (a paused or dead server costs at most ``timeout`` per request)."""

    def __init__(self, client: Any, timeout: float) -> None:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            raise TypeError(
                "Redlock takes independent redis.Redis clients (one per server), "
                f"not {type(client).__name__}"
            )
        self.pool = pool
        self.name = conns.server_name(pool)
        self.timeout = timeout
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
            from ._common import dedicated_kwargs

            conn = self.pool.connection_class(**dedicated_kwargs(kwargs, self.timeout))
        return conn

    def put(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append((os.getpid(), conn))
                return
        conn.disconnect()

    def request(self, args: List[Any], link: Any = None, on_timeout: Optional[List[Any]] = None, keep: bool = False) -> Tuple[Outcome, Any]:
        """Sends ``args`` over ``link`` (a bound hold's connection) or a pooled connection.
        Returns the outcome and the connection that is still usable (None when it was given
        up: an unanswered acquire is abandoned behind ``on_timeout``, a release)."""
        conn = link if link is not None else self.take()
        try:
            reply = conns.call(conn, args, self.timeout)
        except ResponseError as e:
            out = Outcome("notowner") if is_notowner(e) else Outcome("refused", e)
        except BaseException as e:  # noqa: BLE001 - interrupts included: give the connection up
            conns.abandon(conn, on_timeout)
            if not isinstance(e, Exception):
                raise
            return Outcome("unreachable", f"{type(e).__name__}: {e}"), None
        else:
            out = Outcome("ok", reply)
        if link is None and not keep:
            self.put(conn)
            return out, None
        return out, conn


class _RedHold:
    def __init__(self, owner: bytes, ttl: float, valid_until: float, tokens: Dict[str, int], links: Optional[List[Any]]) -> None:
        self.owner = owner
        self.ttl = ttl
        self.valid_until = valid_until
        self.tokens = tokens
        self.links = links  # bound: one connection per server (None where it did not grant)
        self.mutex = threading.Lock()
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stop = threading.Event()
        self.watchdog: Optional[threading.Thread] = None

    def set_loss(self, err: LockLostError) -> None:
        with self.mutex:
            if self.loss is None:
                self.loss = err


class Redlock:
    """One lock over N independent servers, each with the redis-lock module: held when a
    majority (N/2+1) granted it within its validity.

    - **Validity** = timeout - time spent acquiring - clock drift (``drift_factor`` of the
      timeout + 2 ms). An acquire whose majority came too late releases everything and fails
      with ``LockValidityError``.
    - **Every attempt asks all servers at once** (without ``WAIT``: waiting on one server while
      holding another could deadlock), each bounded by ``instance_timeout``; with ``blocking``
      it retries after a random ``retry_delay`` until ``blocking_timeout`` passes.
    - **A failed attempt is released everywhere**, on the servers that granted and on those
      that did not answer (a late grant).
    - **Errors tell why**: ``LockHeldError`` (enough servers answered, the lock is held
      elsewhere), ``QuorumUnreachableError`` (too few answered), ``LockValidityError``, and
      the server's refusals (``DeadlockError``, ``WrongTypeError``, ...), never retried. Each
      lists every server's ``outcomes``. ``acquire()`` raises them instead of returning False.
    - No semaphores (a majority of independent semaphores does not bound the holders to the
      capacity) and no ``timeout=None`` (the lease is what makes a quorum lock safe).
    """

    def __init__(
        self,
        clients: Sequence[Any],
        name: Union[str, bytes],
        timeout: float,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        bind: bool = False,
        lock_delay: Optional[float] = None,
        watchdog: bool = False,
        on_lost: Optional[OnLost] = None,
        instance_timeout: float = 0.1,
        retry_delay: Tuple[float, float] = (0.001, 0.02),
        drift_factor: float = 0.01,
    ) -> None:
        if not isinstance(name, (str, bytes)) or not name:
            raise LockArgumentError("name must be a non-empty str or bytes")
        if len(clients) == 0:
            raise LockArgumentError("Redlock needs at least one server")
        if timeout is None:
            raise LockArgumentError(
                "Redlock needs a timeout: the lease is what makes a quorum lock safe "
                "(use bind=True as well to free it at once when this process dies)"
            )
        self._ttl_ms = ttl_ms(timeout, "timeout")
        self.timeout = timeout
        check_blocking_timeout(blocking_timeout)
        if not (isinstance(instance_timeout, (int, float)) and instance_timeout > 0):
            raise LockArgumentError("instance_timeout must be more than 0 seconds")
        lo, hi = retry_delay
        if not 0 <= lo <= hi:
            raise LockArgumentError("retry_delay must be (min, max) with 0 <= min <= max")
        if not 0 <= drift_factor < 1:
            raise LockArgumentError("drift_factor must be in [0, 1)")
        self.name = name
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.raise_on_release_error = raise_on_release_error
        self.bind = bool(bind)
        self._delay_ms = 0 if lock_delay is None else delay_ms(lock_delay)
        self.watchdog = bool(watchdog) or on_lost is not None
        self.on_lost = on_lost
        self.retry_delay = (float(lo), float(hi))
        self.drift_factor = float(drift_factor)
        self.instances = [_Instance(c, float(instance_timeout)) for c in clients]
        self.quorum = len(self.instances) // 2 + 1
        self.local: Any = _Local() if thread_local else _Shared()

    # -- acquire / release ----------------------------------------------------------------------

    def __enter__(self) -> "Redlock":
        self.acquire()
        return self

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
            logger.warning("Redlock was no longer held when exiting context manager.")

    def acquire(self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None) -> Literal[True]:
        """Takes the lock on a majority, or raises (see the class documentation)."""
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        bt = check_blocking_timeout(blocking_timeout)
        give_up = time.monotonic() + (0 if not blocking else (bt if bt is not None else float("inf")))
        req = Request("LOCK.ACQUIRE", self._ttl_ms, None, self.bind, self._delay_ms)
        ttl = self._ttl_ms / 1000
        same_owner = new_token()
        links: Optional[List[Any]] = [None] * len(self.instances) if self.bind else None
        while True:
            # A bound attempt takes a new owner: a hold of an earlier attempt still bound to a
            # connection we gave up on is then never re-entered.
            owner = new_token() if self.bind else same_owner
            started = time.monotonic()
            args = req.args(self.name, owner, None)
            rel = release_args(self.name, owner)

            def undo(got: List[Tuple[Outcome, Any]], owner: bytes = owner, rel: List[Any] = rel) -> None:
                # Interrupted (KeyboardInterrupt) while the requests were out: they ran on in
                # the pool's threads and may have been granted. Close the connections they
                # came back on (ends a bound hold) and release everywhere.
                for _, conn in got:
                    if conn is not None:
                        conns.abandon(conn, rel)
                self._release_everywhere(owner, None, None)

            results = self._scatter(
                lambda i: self.instances[i].request(args, links[i] if links else None, rel, links is not None),
                on_interrupt=undo,
            )
            elapsed = time.monotonic() - started
            outcomes: List[Outcome] = []
            for i, (out, conn) in enumerate(results):
                if out.kind == "ok":
                    try:
                        token = grant_token(out.value)
                    except LockError as e:
                        out = Outcome("refused", e)
                    else:
                        out = Outcome("held") if token is None else Outcome("granted", token)
                outcomes.append(out)
                if links is not None:
                    links[i] = conn
            granted = [i for i, o in enumerate(outcomes) if o.kind == "granted"]
            validity = ttl - elapsed - drift(ttl, self.drift_factor)
            if len(granted) >= self.quorum and validity > 0:
                tokens = {self.instances[i].name: int(outcomes[i].value) for i in granted}
                kept: Optional[List[Any]] = None
                if links is not None:
                    kept = [links[i] if i in granted else None for i in range(len(links))]
                    for i, conn in enumerate(links):
                        if conn is not None and i not in granted:
                            self.instances[i].put(conn)  # held nothing there
                hold = _RedHold(owner, ttl, started + ttl - drift(ttl, self.drift_factor), tokens, kept)
                self.local.token = owner
                self.local.hold = hold
                if self.watchdog:
                    self._start_watchdog(hold)
                return True
            # No usable majority: give back what we got (and what a slow server may still grant).
            if granted or any(o.kind == "unreachable" for o in outcomes):
                self._release_everywhere(owner, links, outcomes)
            error = self._classify(outcomes, len(granted))
            if time.monotonic() >= give_up or isinstance(error, LockRefusedError):
                if links is not None:
                    for i, conn in enumerate(links):
                        if conn is not None:
                            self.instances[i].put(conn)
                raise error
            lo, hi = self.retry_delay
            time.sleep(max(0.0, min(random.uniform(lo, hi), give_up - time.monotonic())))

    def release(self) -> None:
        """Releases the lock on every server. ``LockNotOwnedError`` when a majority says this
        owner no longer holds it (or it was not acquired)."""
        owner = self.local.token
        hold: Optional[_RedHold] = getattr(self.local, "hold", None)
        if owner is None or hold is None:
            raise make_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        self.local.token = None
        self.local.hold = None
        hold.stop.set()
        if hold.watchdog is not None and hold.watchdog is not threading.current_thread():
            hold.watchdog.join()
        outcomes = self._release_everywhere(owner, hold.links, None)
        if hold.links is not None:
            for i, conn in enumerate(hold.links):
                if conn is not None:
                    self.instances[i].put(conn)
        gone = sum(1 for o in outcomes if o.kind == "notowner")
        if gone >= self.quorum:
            raise make_error(
                LockNotOwnedError,
                f"Cannot release a lock that's no longer owned (on {gone} of {len(outcomes)} servers)",
                self.name,
            )

    def extend(self, additional_time: Optional[float] = None) -> Literal[True]:
        """Sets the lease on every server to ``additional_time`` seconds from now (default:
        ``timeout``; LOCK.EXTEND replaces the ttl). Raises ``LockLostError`` when the lock is
        known lost, ``QuorumUnreachableError`` when too few servers confirmed."""
        hold: Optional[_RedHold] = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "Cannot extend an unlocked lock", self.name)
        ms = self._ttl_ms if additional_time is None else ttl_ms(additional_time, "additional_time")
        self._extend(hold, ms)
        return True

    def reacquire(self) -> Literal[True]:
        return self.extend(None)

    # -- state ----------------------------------------------------------------------------------

    @property
    def fencing_tokens(self) -> Dict[str, int]:
        """``{server: token}`` for every server that granted the current hold. Tokens of
        different servers are unrelated: a protected resource must compare tokens of one
        server."""
        hold = getattr(self.local, "hold", None)
        return {} if hold is None else dict(hold.tokens)

    @property
    def validity(self) -> float:
        """Seconds the lock is still certainly held (0 once lost)."""
        hold = getattr(self.local, "hold", None)
        if hold is None or self._lost_error(hold) is not None:
            return 0.0
        return max(0.0, float(hold.valid_until) - time.monotonic())

    @property
    def lost(self) -> bool:
        hold = getattr(self.local, "hold", None)
        return hold is not None and self._lost_error(hold) is not None

    def check(self) -> float:
        """Raises ``LockLostError`` when lost, else returns the validity left (seconds)."""
        hold = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = self._lost_error(hold)
        if err is not None:
            raise err
        return max(0.0, float(hold.valid_until) - time.monotonic())

    def owned(self) -> bool:
        """Whether this owner holds the lock on a majority right now (asks every server)."""
        owner = self.local.token
        if owner is None:
            return False
        from ._common import parse_info

        results = self._scatter(lambda i: self.instances[i].request(["LOCK.INFO", self.name]))
        n = 0
        for out, _ in results:
            if out.kind == "ok":
                info = parse_info(out.value)
                if info is not None and info.holds(owner):
                    n += 1
        return n >= self.quorum

    # -- internals ------------------------------------------------------------------------------

    def _scatter(
        self,
        fn: Callable[[int], Tuple[Outcome, Any]],
        on_interrupt: Optional[Callable[[List[Tuple[Outcome, Any]]], None]] = None,
    ) -> List[Tuple[Outcome, Any]]:
        """``fn`` for every server at once. One server: in this thread (an interrupt lands in
        the request, which abandons its connection behind a release). More: in a thread pool;
        if this thread is interrupted while they run, the requests go on (each bounded by
        ``instance_timeout``): ``on_interrupt`` gets their results once they ended, then the
        interrupt propagates."""
        if len(self.instances) == 1:
            return [fn(0)]
        futures = [_pool().submit(fn, i) for i in range(len(self.instances))]
        try:
            return [f.result() for f in futures]
        except BaseException:
            if on_interrupt is not None:
                concurrent.futures.wait(futures)
                on_interrupt([f.result() for f in futures if f.exception() is None])
            raise

    def _release_everywhere(self, owner: bytes, links: Optional[List[Any]], outcomes: Optional[List[Outcome]]) -> List[Outcome]:
        args = release_args(self.name, owner)

        def one(i: int) -> Tuple[Outcome, Any]:
            link = links[i] if links is not None else None
            if links is not None and link is None:
                # No connection of ours there (it did not answer, or did not grant): a pooled
                # one releases whatever a late grant left.
                if outcomes is not None and outcomes[i].kind not in ("granted", "unreachable"):
                    return Outcome("notowner"), None
            return self.instances[i].request(args, link, None)

        results = self._scatter(one)
        if links is not None:
            for i, (_, conn) in enumerate(results):
                links[i] = conn
        return [o for o, _ in results]

    def _classify(self, outcomes: List[Outcome], granted: int) -> LockError:
        named = [(self.instances[i].name, repr(o)) for i, o in enumerate(outcomes)]
        if granted >= self.quorum:
            return LockValidityError("Redlock: a quorum granted the lock but no validity was left", self.name, named)
        reachable = sum(1 for o in outcomes if o.kind != "unreachable")
        if reachable < self.quorum:
            return QuorumUnreachableError(
                f"Redlock: only {reachable} of {len(outcomes)} servers answered, {self.quorum} needed",
                self.name,
                named,
            )
        refusals = [o.value for o in outcomes if o.kind == "refused"]
        if refusals:
            err = refusals[0]
            return map_response_error(err, self.name) if isinstance(err, ResponseError) else err
        return LockHeldError(
            f"Redlock: the lock is held by someone else ({granted} of {len(outcomes)} granted, {self.quorum} needed)",
            self.name,
            named,
        )

    def _lost_error(self, hold: _RedHold) -> Optional[LockLostError]:
        if hold.links is not None and hold.loss is None:
            alive = sum(1 for c in hold.links if c is not None and not conns.is_closed(c))
            if alive < self.quorum:
                hold.set_loss(
                    LockLostError(
                        f"the connections the hold was bound to closed ({alive} open, {self.quorum} needed)",
                        self.name,
                        "disconnected",
                    )
                )
        with hold.mutex:
            if hold.loss is not None:
                return hold.loss
            if time.monotonic() >= hold.valid_until:
                return LockLostError("the lock's validity ran out without a confirmed extend", self.name, "expired")
        return None

    def _extend(self, hold: _RedHold, ms: int) -> None:
        err = self._lost_error(hold)
        if err is not None:
            raise err
        sent = time.monotonic()
        args = ["LOCK.EXTEND", self.name, hold.owner, ms]
        # Over pooled connections, never the bound ones (a late reply would be left on them).
        results = self._scatter(lambda i: self.instances[i].request(args))
        outcomes = [o for o, _ in results]
        ok = sum(1 for o in outcomes if o.kind == "ok")
        links = hold.links
        gone = sum(
            1
            for i, o in enumerate(outcomes)
            if o.kind in ("notowner", "refused") or (links is not None and (links[i] is None or conns.is_closed(links[i])))
        )
        named = [(self.instances[i].name, repr(o)) for i, o in enumerate(outcomes)]
        ttl = ms / 1000
        with hold.mutex:
            if hold.loss is not None:
                raise hold.loss
            if ok >= self.quorum:
                if time.monotonic() >= hold.valid_until:
                    hold.loss = LockLostError("an extend was confirmed only after the validity ran out", self.name, "expired")
                    raise hold.loss
                # The last extend sent wins, also one that shortened the lease (extend(t)
                # replaces the ttl on the servers).
                if sent >= hold.lease_sent:
                    hold.lease_sent = sent
                    hold.valid_until = sent + ttl - drift(ttl, self.drift_factor)
                return
            if len(outcomes) - gone < self.quorum:
                hold.loss = LockLostError(
                    "a majority of the servers no longer hold the lock for this owner: "
                    + ", ".join(f"[{s}: {o}]" for s, o in named),
                    self.name,
                    "notowner",
                )
                raise hold.loss
        raise QuorumUnreachableError("Redlock: too few servers confirmed the extend", self.name, named)

    def _start_watchdog(self, hold: _RedHold) -> None:
        t = threading.Thread(target=_redlock_watch, args=(weakref.ref(self), hold), name="redlock-watchdog", daemon=True)
        hold.watchdog = t
        t.start()


def _redlock_watch(ref: "weakref.ref[Redlock]", hold: _RedHold) -> None:
    """The Redlock watchdog thread; holds its Redlock weakly (stops when it is collected)."""
    interval = hold.ttl / 3
    next_extend = time.monotonic() + interval
    while True:
        rl = None  # no strong reference while waiting
        step = min(0.1, max(0.0, next_extend - time.monotonic()))
        if hold.stop.wait(step):
            return
        rl = ref()
        if rl is None:
            return
        if rl._lost_error(hold) is not None:
            break
        if time.monotonic() < next_extend:
            continue
        try:
            rl._extend(hold, rl._ttl_ms)
            next_extend = time.monotonic() + interval
        except LockLostError:
            break
        except LockError as e:
            logger.warning("redlock watchdog: extend of %r not confirmed: %s", rl.name, e)
            next_extend = time.monotonic() + min(interval, 0.5)
    rl = ref()
    if hold.stop.is_set() or rl is None:
        return
    err = rl._lost_error(hold)
    if err is not None and rl.on_lost is not None:
        try:
            rl.on_lost(err)
        except Exception:  # noqa: BLE001
            logger.exception("redlock watchdog: on_lost callback of %r raised", rl.name)


class _Local(threading.local):
    """Per-thread token and hold, None in every thread until that thread acquires."""

    token: Optional[bytes] = None
    hold: Any = None


class _Shared:
    token: Optional[bytes] = None
    hold: Optional[_RedHold] = None
