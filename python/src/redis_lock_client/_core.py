"""The Lock family's protocol, written once (sans-IO) for the sync and the asyncio classes.

Everything ``Lock``, ``ReadLock``, ``RWLock`` and ``Semaphore`` decide lives here: the requests
they build, what a reply or an error reply means, the lease a hold is known to have, the
acquire flow (one request: try and queue; a wait that loses its connection queues again; an
interrupted wait leaves a release behind), release (plain and bound), extend, reacquire, info,
the watchdog's loop, and where a moved cluster key is followed. The routines are generators
that ``yield`` effects (the dataclasses below) and are run by ``_drive.drive`` with the sync
face's ``perform`` (``lock.py``) or by ``_drive.drive_async`` with the asyncio face's
(``asyncio.py``). A face only carries effects out.

``LockBase`` (and ``ReadLockBase``, ``SemaphoreBase``, ``RWLockBase``) hold what both faces'
classes share that does no I/O: the constructor, ``__repr__``, ``fencing_token``, ``lost``,
``check()``, and the routines as methods; the face classes add the thin I/O methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import (
    Any,
    Awaitable,
    Callable,
    Generator,
    Generic,
    Hashable,
    Iterator,
    List,
    Optional,
    Tuple,
    TypeVar,
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

from . import _watch_aio, _watch_sync
from ._connections import ConnectionLimitError, is_retryable_connect_error, reconnect_delays
from ._common import (
    EXTEND_SCRIPT,
    SINGLE_SERVER_MARGIN,
    UNLIMITED_TTL_MS,
    WAIT_READ_MARGIN,
    WAITED_GRANT_MARGIN,
    KeyMoved,
    LockArgumentError,
    LockInfo,
    LockLostError,
    Request,
    check_blocking_timeout,
    check_capacity,
    check_sleep,
    delay_ms,
    drift,
    encode_token,
    error_code,
    follows_moves,
    grant_token,
    make_error,
    map_response_error,
    move_to_follow,
    new_token,
    info_args,
    mark_plain_info,
    owner_form_refused,
    parse_info,
    plain_info_only,
    release_args,
    ttl_ms,
    wait_ms,
)

logger = logging.getLogger("redis_lock_client")

#: Called once when a held lock is found lost (asyncio: a coroutine function's result is
#: awaited).
OnLost = Callable[[LockLostError], Any]

Steps = Generator[Any, Any, Any]

#: How often a watchdog looks at a bound hold's connection between extends.
PROBE_INTERVAL = 0.1

#: Failures that say nothing about the lock, only about the way to the server.
TROUBLE = (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError)
#: "No watcher for this client" from either face's watcher.
UNAVAILABLE = (_watch_sync.Unavailable, _watch_aio.Unavailable)

_EXTEND_SHA = hashlib.sha1(EXTEND_SCRIPT.encode()).hexdigest()


def is_trouble(err: BaseException) -> bool:
    return isinstance(err, TROUBLE)


# ----------------------------------------------------------------------------------------------
# Effects: what a routine asks its face to do. A face's ``perform`` dispatches on the type.


@dataclass(frozen=True)
class Run:
    """One command through the client itself (``execute_command``: its pool, its retries,
    its cluster routing). Result: the reply."""

    args: List[Any]


@dataclass(frozen=True)
class Link:
    """A connection of our own and where it came from; ``default`` is that pool's read
    timeout (for requests the server answers at once)."""

    conn: Any
    pool: Any
    default: Optional[float]


@dataclass(frozen=True)
class Take:
    """A connection of the client's pool for ``name`` (or, when ``address`` is set, of that
    node's), taken until ``GiveBack`` or ``Abandon``: ``_connections.take(pool, deadline, wait,
    queue)``. ``wait``: kept beyond one immediate reply (a ``WAIT`` request, a bound hold), so
    it passes the pool's wait gate, queueing there until ``deadline`` (``time.monotonic()``;
    None: no limit), or with ``queue`` False only taking a place free at once. Result: a
    ``Link``. Raises ``ConnectionLimitError`` when none can be had in time."""

    name: Any
    address: Optional[Tuple[str, int]]
    deadline: Optional[float]
    wait: bool
    queue: bool = True


@dataclass(frozen=True)
class Call:
    """Connect ``link`` if it is not (within ``deadline``; None: the pool's own timeouts), send
    ``args``, read the reply within ``timeout`` (None: no limit). An error reply raises
    ``ResponseError`` and leaves the connection usable; any other failure leaves it to be
    abandoned."""

    link: Link
    args: List[Any]
    timeout: Optional[float]
    deadline: Optional[float]


@dataclass(frozen=True)
class ShortRequest:
    """One short request on a connection of the pool for ``name``, taken for it alone (no wait
    gate) and given back or abandoned at once, everything within ``deadline``
    (``_connections.request``). Result: the reply; an error reply raises ``ResponseError``."""

    name: Any
    args: List[Any]
    deadline: Optional[float]


@dataclass(frozen=True)
class GiveBack:
    """Keep ``link`` (its last reply was read in full) for the next request."""

    link: Link


@dataclass(frozen=True)
class Abandon:
    """Write ``release`` behind an unanswered request (if any) and close the connection.
    Never raises; completes even while the caller is being cancelled."""

    link: Link
    release: Optional[List[Any]]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Pause:
    """The watchdog's wait: ``seconds`` or until the hold is let go. Result: True when let
    go."""

    hold: "Hold"
    seconds: float


@dataclass(frozen=True)
class StartWatchdog:
    """Run ``steps`` in the background (a daemon thread; an asyncio task) and note it on
    ``hold.watchdog``."""

    hold: "Hold"
    steps: Steps


@dataclass(frozen=True)
class StopWatchdog:
    """``hold.stop`` is set: wait for its watchdog to end (unless it is the caller)."""

    hold: "Hold"


@dataclass(frozen=True)
class Watch:
    """Register the hold with the loss watcher (``_watch_sync.watch`` / ``_watch_aio.watch``).
    Result: the handle (or None)."""

    name: Any
    owner: bytes
    on_loss: Callable[[str], Any]


@dataclass(frozen=True)
class Unwatch:
    handle: Any


@dataclass(frozen=True)
class WatcherCall:
    """One command over the watcher's own connection (``_watch_*.call``); raises one of
    ``UNAVAILABLE`` when there is none."""

    args: List[Any]
    timeout: Optional[float]


@dataclass(frozen=True)
class Notify:
    """Tell the user: ``notify_lost(on_lost, err, name)`` (awaiting what it returns)."""

    on_lost: Optional[OnLost]
    err: LockLostError
    name: Any


# ----------------------------------------------------------------------------------------------
# The hold


class Hold:
    """One held lock (or permit): its owner token, the grant's fencing token, the lease as this
    process knows it, a bound hold's connection, the watcher's handle, the watchdog."""

    def __init__(
        self,
        owner: bytes,
        fence: int,
        ttl: Optional[float],
        valid_until: float,
        link: Optional[Link],
        is_closed: Callable[[Any], bool],
    ) -> None:
        self.owner = owner
        self.fence = fence
        self.ttl = ttl  # seconds; None: bound with no ttl of its own
        self.valid_until = valid_until
        self.link = link
        self.is_closed = is_closed
        self.mutex = threading.Lock()  # guards link and the lease fields (never held across I/O)
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stop = threading.Event()
        self.watchdog: Any = None  # the face's thread or task
        self.watch: Any = None  # the watcher's handle
        self.noticed = False  # on_lost was called (or is being called)

    # A bound hold's connection, for tests and for the face's repr.
    @property
    def conn(self) -> Any:
        link = self.link
        return None if link is None else link.conn

    @property
    def pool(self) -> Any:
        link = self.link
        return None if link is None else link.pool

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    def lost_error(self, name: Any) -> Optional[LockLostError]:
        """The loss, if the lease is known lost or its validity has run out."""
        self.probe(name)
        with self.mutex:
            if self.loss is not None:
                return self.loss
            if time.monotonic() >= self.valid_until:
                return LockLostError("the lock's lease ran out without a confirmed extend", name, "expired")
        return None

    def probe(self, name: Any) -> None:
        """A bound hold: records the loss when its connection is closed (seen without sending
        anything; skipped while the connection is being released)."""
        with self.mutex:
            link = self.link
            if link is None or self.loss is not None:
                return
            if self.is_closed(link.conn):
                self.loss = LockLostError(
                    "the connection the hold was bound to closed: the server ended the hold", name, "disconnected"
                )

    def set_loss(self, err: LockLostError) -> bool:
        """Records ``err`` unless a loss is already known; True when it was recorded."""
        with self.mutex:
            if self.loss is None:
                self.loss = err
                return True
        return False

    def claim_notice(self) -> bool:
        """True once: whoever gets it calls on_lost."""
        with self.mutex:
            if self.noticed or self.stop.is_set():
                return False
            self.noticed = True
            return True

    def detach(self) -> Optional[Link]:
        with self.mutex:
            link, self.link = self.link, None
        return link

    def confirm(self, sent_at: float, ttl: float, factor: float = 0.01) -> None:
        """An extend sent at ``sent_at`` set the server's ttl to ``ttl`` seconds. The last one
        sent wins, also when it shortened the lease; one confirmed after the validity ran out
        revives nothing."""
        with self.mutex:
            if self.loss is None and time.monotonic() < self.valid_until and sent_at >= self.lease_sent:
                self.lease_sent = sent_at
                self.valid_until = sent_at + ttl - drift(ttl, factor)


def notify_lost(on_lost: Optional[OnLost], err: LockLostError, name: Any) -> Optional[Awaitable[None]]:
    """Calls ``on_lost(err)``, logging what it raises; when it returns an awaitable, returns
    one that awaits it (and logs what it raises) for the caller to await."""
    if on_lost is None:
        return None
    try:
        result = on_lost(err)
    except Exception:  # noqa: BLE001 - a callback's failure must not end a background loop
        logger.exception("on_lost callback of lock %r raised", name)
        return None
    if inspect.isawaitable(result):
        return _logged(result, name)
    return None


async def _logged(awaitable: Awaitable[Any], name: Any) -> None:
    try:
        await awaitable
    except Exception:  # noqa: BLE001
        logger.exception("on_lost callback of lock %r raised", name)


# ----------------------------------------------------------------------------------------------
# Where a caller's token and hold are kept


class _Local(threading.local):
    """Per-thread token and hold, None in every thread until that thread acquires."""

    token: Optional[bytes] = None
    hold: Any = None


class _Shared:
    """The ``thread_local=False`` store: one token for all threads."""

    token: Optional[bytes] = None
    hold: Any = None


class TokenStore:
    """redis-py's: one token in ``local`` (per thread, or shared); a new acquire replaces it."""

    def __init__(self, local: Any) -> None:
        self.local = local

    def current(self) -> Tuple[Optional[bytes], Optional[Hold]]:
        token = self.local.token
        hold = getattr(self.local, "hold", None)
        if hold is not None and hold.owner != token:
            hold = None  # the token was set by hand
        return token, hold

    def put(self, token: bytes, hold: Optional[Hold]) -> None:
        self.local.token = token
        self.local.hold = hold

    def take(self) -> Tuple[Optional[bytes], Optional[Hold]]:
        token, hold = self.current()
        self.local.token = None
        self.local.hold = None
        return token, hold

    def count(self) -> int:
        return 0 if self.local.token is None else 1

    def discard(self, hold: Hold) -> None:
        """Forgets ``hold`` if it is the one recorded."""
        if getattr(self.local, "hold", None) is hold:
            self.local.token = None
            self.local.hold = None


class PermitStore:
    """A semaphore object's permits, as ``threading.Semaphore`` / ``asyncio.Semaphore`` count
    them: each acquire adds one (its own token); a release gives back the caller's (thread's or
    task's) most recent one, else the oldest one this object holds."""

    def __init__(self, who: Callable[[], Hashable]) -> None:
        self.who = who
        self.mutex = threading.Lock()
        self.permits: List[Tuple[Hashable, bytes, Optional[Hold]]] = []

    def current(self) -> Tuple[Optional[bytes], Optional[Hold]]:
        me = self.who()
        with self.mutex:
            for key, token, hold in reversed(self.permits):
                if key == me:
                    return token, hold
        return None, None

    def put(self, token: bytes, hold: Optional[Hold]) -> None:
        me = self.who()
        with self.mutex:
            self.permits.append((me, token, hold))

    def take(self) -> Tuple[Optional[bytes], Optional[Hold]]:
        me = self.who()
        with self.mutex:
            if not self.permits:
                return None, None
            index = 0
            for i in range(len(self.permits) - 1, -1, -1):
                if self.permits[i][0] == me:
                    index = i
                    break
            _, token, hold = self.permits.pop(index)
        return token, hold

    def count(self) -> int:
        with self.mutex:
            return len(self.permits)

    def discard(self, hold: Hold) -> None:
        """Forgets the permit of ``hold``, if recorded."""
        with self.mutex:
            self.permits = [p for p in self.permits if p[2] is not hold]


class PermitView:
    """A semaphore's ``local``: ``token`` and ``hold`` of the caller's most recent permit."""

    def __init__(self, store: PermitStore) -> None:
        self._store = store

    @property
    def token(self) -> Optional[bytes]:
        return self._store.current()[0]

    @property
    def hold(self) -> Optional[Hold]:
        return self._store.current()[1]


# ----------------------------------------------------------------------------------------------
# What acquire() passes to do_acquire() (redis-py's hook has only the token)


@dataclass
class Pending:
    """An acquire's wait: ``wait`` None (one try), ``math.inf`` (no limit) or seconds; ``limit``
    the seconds the whole call may take (None: each step bounded by the pool's timeout, or not
    at all for an unlimited wait). ``hold`` is what the hook got."""

    wait: Optional[float]
    limit: Optional[float]
    hold: Optional[Hold] = None


_PENDING: "contextvars.ContextVar[Optional[Pending]]" = contextvars.ContextVar("redis_lock_pending", default=None)
_RELEASING: "contextvars.ContextVar[Optional[Hold]]" = contextvars.ContextVar("redis_lock_releasing", default=None)


@contextlib.contextmanager
def passing(var: "contextvars.ContextVar[Any]", value: Any) -> Iterator[None]:
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def pending_now() -> Pending:
    """The acquire in progress (a hook called by hand: one try)."""
    p = _PENDING.get()
    return p if p is not None else Pending(None, None)


# ----------------------------------------------------------------------------------------------
# The classes' shared part


def check_name(name: Any) -> None:
    if not isinstance(name, (str, bytes, memoryview)):
        raise TypeError(f"name must be str or bytes, not {type(name).__name__}")
    if len(name) == 0:
        raise LockArgumentError("name must not be empty")


def not_acquired(name: Any) -> LockError:
    return make_error(LockError, "Unable to acquire lock within the time specified", name)


class LockBase:
    """The state and protocol of a lock; see the face classes for the API."""

    _command = "LOCK.ACQUIRE"
    #: The face's connection check (``_connections.is_closed`` or the asyncio twin).
    _is_closed: Callable[[Any], bool] = staticmethod(lambda conn: False)

    redis: Any
    local: Any
    name: Any

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
        # redis-py's __init__ is not called (it registers Lua scripts this class never runs);
        # every attribute it sets is set here.
        check_name(name)
        self.redis = redis
        self.name = name
        self.timeout = timeout
        check_sleep(sleep)
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
        self._make_store()

    def _make_store(self) -> None:
        self.local = _Local() if self.thread_local else _Shared()
        self.local.token = None
        self._store: Union[TokenStore, PermitStore] = TokenStore(self.local)

    def __repr__(self) -> str:
        # The owner token is left out: whoever has it can release or extend the lock.
        token, hold = self._store.current()
        parts = [f"name={self.name!r}", f"timeout={self.timeout!r}"]
        parts += self._repr_extra()
        if token is None:
            parts.append("not held")
        else:
            parts.append("held")
            if hold is not None:
                parts.append(f"fencing_token={hold.fence}")
                if hold.loss is not None:
                    parts.append(f"lost ({hold.loss.reason})")
                if hold.link is not None:
                    parts.append("bound")
        return f"<{type(self).__module__}.{type(self).__qualname__} {' '.join(parts)}>"

    def _repr_extra(self) -> List[str]:
        return []

    # -- what needs no I/O --------------------------------------------------------------------

    @property
    def fencing_token(self) -> Optional[int]:
        """The fencing token of the current hold (this thread's, with ``thread_local``; a
        semaphore: the caller's most recent permit), or None when not held."""
        hold = self._store.current()[1]
        return None if hold is None else hold.fence

    @property
    def lost(self) -> bool:
        """True once the current hold may no longer be held: its lease ran out without a
        confirmed extend, the server said so, or its bound connection closed."""
        hold = self._store.current()[1]
        return hold is not None and hold.lost_error(self.name) is not None

    def check(self) -> float:
        """Raises ``LockLostError`` when the hold is lost (``LockError`` when not held);
        otherwise returns how many seconds the lock is still certainly held (``inf`` for a
        bound hold without timeout)."""
        token, hold = self._store.current()
        if hold is None or token is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = hold.lost_error(self.name)
        if err is not None:
            raise err
        return max(0.0, float(hold.valid_until) - time.monotonic())

    # -- argument handling shared by the faces' methods ---------------------------------------

    def _acquire_args(
        self, blocking: Optional[bool], blocking_timeout: Optional[float], token: Any, sleep: Any = None
    ) -> Tuple[bytes, Pending]:
        check_sleep(sleep)  # checked as redis-py would use it, then unused: nothing polls
        owner = new_token() if token is None else encode_token(token)
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        bt = check_blocking_timeout(blocking_timeout)
        if not blocking:
            return owner, Pending(None, None)
        if bt is None:
            return owner, Pending(math.inf, None)
        if bt == 0:
            return owner, Pending(None, WAIT_READ_MARGIN)
        return owner, Pending(bt, bt + WAIT_READ_MARGIN)

    def _acquired(self, owner: Any, pending: Pending, granted: bool) -> bool:
        """After the hook: records the token (and the hook's hold)."""
        if granted:
            self._store.put(encode_token(owner), pending.hold)
        return bool(granted)

    def _given_up_steps(self, owner: bytes, pending: Pending) -> Steps:
        """An acquire that raises after its hook got a grant (KeyboardInterrupt can land
        anywhere, also after the grant was recorded): the caller was told nothing was
        acquired, so nothing may stay held. Forget the hold and give it back, quietly."""
        hold = pending.hold
        if hold is None:
            return None
        self._store.discard(hold)
        yield from self._give_back(owner, hold)
        return None

    def _give_back(self, owner: bytes, hold: Hold) -> Steps:
        """Releases a hold nobody will be told of, quietly (best effort)."""
        try:
            yield from self._release_steps(owner, hold)
        except Exception:  # noqa: BLE001 - best effort; the interruption is what goes on
            pass

    def _granted(self, hold: Optional[Hold]) -> bool:
        pending_now().hold = hold
        return hold is not None

    def _held_token(self, what: str) -> Tuple[bytes, Optional[Hold]]:
        token, hold = self._store.current()
        if token is None:
            raise make_error(LockError, f"Cannot {what} an unlocked lock", self.name)
        if self.timeout is None:
            raise make_error(LockError, f"Cannot {what} a lock with no timeout", self.name)
        return token, hold

    def _release_token(self) -> Tuple[bytes, Optional[Hold]]:
        token, hold = self._store.take()
        if token is None:
            raise make_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        return token, hold

    def _hold_released(self, expected_token: Any) -> Optional[Hold]:
        hold = _RELEASING.get()
        return hold if hold is not None and hold.owner == encode_token(expected_token) else None

    def _exit_failure(self, err: Exception, body_error: Optional[BaseException]) -> None:
        """``__exit__``'s release failed with ``err``. When the block raised, its exception
        goes on (a ``LockLostError`` from ``check()`` keeps its ``reason``) and the release's
        failure is logged; otherwise as redis-py: a ``LockError`` is raised with
        ``raise_on_release_error`` (else logged), any other error is raised."""
        if body_error is not None:
            logger.warning(
                "lock %r: the release on leaving the block failed (%s: %s); the block's %s goes on",
                self.name, type(err).__name__, err, type(body_error).__name__,
            )
            return
        if self.raise_on_release_error or not isinstance(err, LockError):
            raise err
        logger.warning("Lock was unlocked or no longer owned when exiting context manager.")

    def _owned_in(self, info: Optional[LockInfo]) -> bool:
        token = self._store.current()[0]
        return token is not None and info is not None and info.holds(token)

    @staticmethod
    def _locked_in(info: Optional[LockInfo]) -> bool:
        return info is not None and bool(info.holders)

    # -- requests ------------------------------------------------------------------------------

    def _request(self) -> Request:
        return Request(
            command=self._command,
            ttl_ms=UNLIMITED_TTL_MS if self._ttl_ms is None else self._ttl_ms,
            bind=self.bind,
            lock_delay_ms=self._delay_ms,
        )

    def _not_owned(self, err: ResponseError, verb: str) -> LockError:
        """The error of a release / extend / reacquire refused by the server: not owned (also
        when the key now holds another Redis type, as redis-py's Lock says), else mapped."""
        code = error_code(err)
        if code == "NOTOWNER":
            return make_error(LockNotOwnedError, f"Cannot {verb} a lock that's no longer owned", self.name)
        if code == "WRONGTYPE":
            return LockLostError(
                f"Cannot {verb} a lock that's no longer owned: the key was overwritten with another Redis type",
                self.name,
                "overwritten",
            )
        return map_response_error(err, self.name)

    # -- routines ------------------------------------------------------------------------------

    def _acquire_steps(self, owner: bytes, pending: Pending) -> Steps:
        """One request (a try, and with a wait the queueing, in one ``LOCK.ACQUIRE ... WAIT``)
        over a connection of the client's pool whose timeouts come from what is left of
        ``pending.limit``. Returns the hold, or None when not granted in time.

        - The connection: a wait or a bound hold passes the pool's wait gate
          (``max_wait_connections``), queueing in the client until the wait's own end (not the
          reply's margin beyond it); a wait whose time runs out there returns None (False),
          as an expired ``blocking_timeout``. One try never queues there: beyond the limit it
          raises ``ConnectionLimitError`` at once. Any other ``ConnectionLimitError`` (a pool
          of one connection, a pool whose connections are all in use) is raised.

        - A ``RedisCluster`` key that moved while the request waited is followed (TRYAGAIN,
          ASK, MOVED) with what is left of the wait.
        - A wait whose connection fails (a server restart) queues again, with the same owner,
          after a short backoff, until its time is up: it goes to the back of the queue, and a
          grant that survived is simply entered again (``release()`` ends it).
        - Anything else that interrupts the request (a timeout, KeyboardInterrupt, a
          cancellation) closes the connection behind a release, so no grant is left behind.
        """
        wait, limit = pending.wait, pending.limit
        req = self._request()
        started = time.monotonic()
        deadline = None if limit is None else started + limit
        wait_end = math.inf if wait is None or wait == math.inf else started + wait
        # Getting the connection: a wait's own time (not the reply's margin beyond it); one try
        # keeps to its deadline and never queues in the client for a wait connection.
        take_deadline = deadline if wait is None else (None if wait == math.inf else wait_end)
        keeps = wait is not None or req.bind  # kept beyond one immediate reply
        moved: Optional[KeyMoved] = None
        moves = 0
        delays = reconnect_delays()
        while True:
            address = None if moved is None else moved.address
            try:
                link = yield Take(self.name, address, take_deadline, keeps, queue=wait is not None)
            except ConnectionLimitError as e:
                if e.queued and wait is not None:
                    # The wait's time ran out queued in the client behind other waits: as an
                    # expired blocking_timeout.
                    return None
                raise
            now = time.monotonic()
            w: Optional[int] = None
            if wait == math.inf:
                w = 0
            elif wait is not None and wait_end - now > 0:
                w = wait_ms(wait_end - now)
            left = None if deadline is None else max(0.001, deadline - now)
            read_timeout = left if deadline is not None else (None if w == 0 else link.default)
            sent = time.monotonic()
            try:
                if moved is not None and moved.asking:
                    yield Call(link, ["ASKING"], read_timeout, deadline)
                reply = yield Call(link, req.args(self.name, owner, w), read_timeout, deadline)
                fence = grant_token(reply)
            except GeneratorExit:
                raise
            except ResponseError as e:
                yield GiveBack(link)  # the reply was read in full: the connection is clean
                nxt = move_to_follow(e, moves, self.redis)
                if nxt is None:
                    raise map_response_error(e, self.name) from e
                moved, moves = nxt, moves + 1
                continue
            except BaseException as e:
                yield Abandon(link, release_args(self.name, owner))
                if wait is not None and isinstance(e, Exception) and is_retryable_connect_error(e):
                    # The same pauses as any reconnect (_connections.reconnect_delays).
                    pause = next(delays)
                    if time.monotonic() + pause < min(wait_end, deadline or math.inf):
                        logger.warning("lock %r: the wait's connection failed (%s); queueing again in %.2f s", self.name, e, pause)
                        yield Sleep(pause)
                        continue
                if not is_trouble(e) and not req.bind and not isinstance(e, LockError):
                    yield from self._release_quietly(owner)
                if is_trouble(e) and deadline is not None and time.monotonic() >= deadline - 0.05:
                    raise TimeoutError(
                        f"lock {self.name!r}: no reply within {limit:g} s (blocking_timeout + "
                        f"{WAIT_READ_MARGIN:g} s): the server is paused, overloaded or unreachable; "
                        "the request was withdrawn"
                    ) from e
                raise
            if fence is None:
                yield GiveBack(link)
                return None
            ttl = None if self._ttl_ms is None else self._ttl_ms / 1000
            if ttl is None:
                valid_until = math.inf
            elif w is None:
                valid_until = sent + ttl - SINGLE_SERVER_MARGIN
            else:
                # A waited grant starts its lease when the server grants, just before the reply.
                valid_until = max(sent, time.monotonic() - WAITED_GRANT_MARGIN) + ttl - SINGLE_SERVER_MARGIN
            hold = Hold(owner, fence, ttl, valid_until, link if req.bind else None, type(self)._is_closed)
            try:
                if not req.bind:
                    yield GiveBack(link)  # asyncio: a cancellation may land here
                yield from self._after_grant(hold)
            except GeneratorExit:
                raise
            except BaseException:
                # Interrupted between the grant and its hand-over: no grant left behind.
                yield from self._give_back(owner, hold)
                raise
            return hold

    def _release_quietly(self, owner: bytes) -> Steps:
        """Best effort: a grant whose reply was read but never handed to us."""
        try:
            yield Run(release_args(self.name, owner))
        except Exception:  # noqa: BLE001 - NOTOWNER is the usual answer
            pass

    def _after_grant(self, hold: Hold) -> Steps:
        # Only a hold with a watchdog is watched: the watcher hears of every write to the key,
        # this client's own acquire and release included (they go over the pool's connections,
        # not the watcher's), and for a plain lock taken and released at a high rate its
        # re-reads and tracking changes cost the server more than the lock itself (measured:
        # 32 µs of server time per acquire + release instead of 2).
        if self.watchdog and not follows_moves(self.redis):
            hold.watch = yield Watch(self.name, hold.owner, self._loss_callback(hold))
        if self.watchdog:
            yield StartWatchdog(hold, self._watchdog_steps(hold, weakref.ref(self)))

    def _loss_callback(self, hold: Hold) -> Callable[[str], Any]:
        name, on_lost = self.name, self.on_lost

        def on_loss(reason: str) -> Any:
            # The watcher sees the key; what ended the hold may be known better here: a bound
            # hold whose connection closed (probe), or a lease that ran out (the server's
            # expiry removes the key, which the watcher reads as a deletion).
            hold.probe(name)
            if reason == "deleted" and time.monotonic() >= hold.valid_until:
                reason = "expired"
            err = LockLostError(f"the server ended the hold ({reason})", name, reason)
            hold.set_loss(err)
            if hold.claim_notice():
                return notify_lost(on_lost, hold.loss or err, name)
            return None

        return on_loss

    def _let_go(self, hold: Hold) -> Steps:
        """Stops the hold's watchdog and unregisters it from the watcher (before the release
        goes out, so that neither takes the release for a loss)."""
        hold.stop.set()
        if hold.watchdog is not None:
            yield StopWatchdog(hold)
        handle, hold.watch = hold.watch, None
        if handle is not None:
            yield Unwatch(handle)

    def _release_steps(self, owner: bytes, hold: Optional[Hold]) -> Steps:
        if hold is not None:
            yield from self._let_go(hold)
            link = hold.detach()
            if link is not None:
                yield from self._release_bound(owner, link)
                return None
        try:
            yield Run(release_args(self.name, owner))
        except ResponseError as e:
            raise self._not_owned(e, "release") from e
        return None

    def _release_bound(self, owner: bytes, link: Link) -> Steps:
        if type(self)._is_closed(link.conn):
            yield Abandon(link, None)
            raise LockLostError(
                "Cannot release a lock that's no longer owned: the connection it was bound to "
                "closed, which ended the hold",
                self.name,
                "disconnected",
            )
        try:
            yield Call(link, release_args(self.name, owner), link.default, None)
        except GeneratorExit:
            raise
        except ResponseError as e:
            yield GiveBack(link)
            raise self._not_owned(e, "release") from e
        except BaseException:
            yield Abandon(link, None)  # no answer: closing the connection ends the bound hold
            raise
        yield GiveBack(link)

    def _extend_steps(self, owner: bytes, hold: Optional[Hold], additional_time: float, replace_ttl: bool) -> Steps:
        """redis-py's ``extend`` on the server in one step (EXTEND_SCRIPT)."""
        ms = ttl_ms(additional_time, "additional_time") if replace_ttl else delay_ms(additional_time, "additional_time")
        sent = time.monotonic()
        args = [owner, ms, "1" if replace_ttl else "0"]
        try:
            try:
                reply = yield Run(["EVALSHA", _EXTEND_SHA, 1, self.name, *args])
            except ResponseError as e:
                if not isinstance(e, NoScriptError) and "NOSCRIPT" not in str(e):
                    raise
                reply = yield Run(["EVAL", EXTEND_SCRIPT, 1, self.name, *args])
        except ResponseError as e:
            raise self._not_owned(e, "extend") from e
        if not reply:
            raise make_error(LockNotOwnedError, "Cannot extend a lock that's no longer owned", self.name)
        if hold is not None:
            hold.confirm(sent, int(reply) / 1000)  # the script answers with the new ttl (ms)
        return True

    def _reacquire_steps(self, owner: bytes, hold: Optional[Hold]) -> Steps:
        assert self._ttl_ms is not None
        sent = time.monotonic()
        try:
            yield Run(["LOCK.EXTEND", self.name, owner, self._ttl_ms])
        except ResponseError as e:
            raise self._not_owned(e, "reacquire") from e
        if hold is not None:
            hold.confirm(sent, self._ttl_ms / 1000)
        return True

    def _own_info_steps(self, owner: bytes) -> Steps:
        """What the server says of ``owner``'s hold: ``LOCK.INFO key OWNER owner`` (its entry
        alone, O(1) whatever the number of holders), or the plain form for a server whose
        module predates the option (learnt from its refusal, and kept for the client)."""
        plain = plain_info_only(self.redis)
        try:
            reply = yield Run(list(info_args(self.name, owner, plain)))
        except ResponseError as e:
            if plain or not owner_form_refused(e):
                raise map_response_error(e, self.name) from e
            mark_plain_info(self.redis)
            try:
                reply = yield Run(["LOCK.INFO", self.name])
            except ResponseError as e2:
                raise map_response_error(e2, self.name) from e2
        return parse_info(reply)

    def _owned_steps(self) -> Steps:
        token = self._store.current()[0]
        if token is None:
            return False
        info = yield from self._own_info_steps(token)
        return self._owned_in(info)

    def _info_steps(self) -> Steps:
        try:
            reply = yield Run(["LOCK.INFO", self.name])
        except ResponseError as e:
            raise map_response_error(e, self.name) from e
        return parse_info(reply)

    # -- the watchdog --------------------------------------------------------------------------

    def _watchdog_steps(self, hold: Hold, owner_ref: "weakref.ref[Any]") -> Steps:
        """Extends the lease every third of its ttl (through the watcher's connection, else as
        one request on a connection of the pool taken for it alone, with what is left of the
        lease as deadline); a bound hold's
        connection is also looked at every PROBE_INTERVAL. Reports a loss once. Never raises
        (a failure is logged)."""
        name, on_lost = self.name, self.on_lost
        del self  # the watchdog must not keep the lock object alive
        interval = None if hold.ttl is None else hold.ttl / 3
        ttl_ms_ = None if hold.ttl is None else max(1, int(hold.ttl * 1000))
        next_extend = time.monotonic() + (interval or 0)
        try:
            while True:
                now = time.monotonic()
                step = PROBE_INTERVAL if hold.link is not None else next_extend - now
                if interval is not None:
                    step = min(step, max(0.0, next_extend - now))
                if (yield Pause(hold, max(0.0, step))) or owner_ref() is None:
                    return None  # let go, or the lock object was garbage-collected
                if hold.lost_error(name) is not None:
                    break
                if interval is None or time.monotonic() < next_extend:
                    continue
                sent = time.monotonic()
                left = max(0.01, hold.valid_until - sent)
                args = ["LOCK.EXTEND", name, hold.owner, ttl_ms_]
                try:
                    yield from _renew(name, args, left)
                    assert hold.ttl is not None
                    hold.confirm(sent, hold.ttl)
                    next_extend = sent + interval
                except ResponseError as e:
                    if hold.stopped:
                        return None
                    code = error_code(e)
                    if code in ("NOTOWNER", "WRONGTYPE"):
                        reason = "notowner" if code == "NOTOWNER" else "overwritten"
                        hold.set_loss(LockLostError("the server says this owner no longer holds the lock", name, reason))
                        break
                    logger.warning("lock watchdog: extend of %r refused: %s", name, e)
                    next_extend = time.monotonic() + min(interval, PROBE_INTERVAL * 5)
                except TROUBLE as e:
                    if hold.stopped:
                        return None
                    logger.warning("lock watchdog: extend of %r failed: %s", name, e)
                    hold.probe(name)
                    if hold.loss is not None:
                        break
                    next_extend = time.monotonic() + min(interval, PROBE_INTERVAL * 5)
            err = hold.lost_error(name)
            if err is not None and hold.claim_notice():
                yield Notify(on_lost, err, name)
        except GeneratorExit:
            raise
        except Exception:  # noqa: BLE001 - a background loop logs what ends it
            logger.exception("lock watchdog of %r failed", name)
        return None


def _renew(name: Any, args: List[Any], timeout: float) -> Steps:
    """``args`` over the watcher's connection, else as one request on a connection of the
    pool taken for it alone (never the bound connection: a reply that came too late would be
    left on it), within ``timeout``."""
    try:
        return (yield WatcherCall(args, timeout))
    except UNAVAILABLE:
        pass
    return (yield ShortRequest(name, args, time.monotonic() + timeout))


class ReadLockBase(LockBase):
    """The shared (read) side of a read-write lock (``LOCK.RWREAD``)."""

    _command = "LOCK.RWREAD"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("lock_delay") is not None:
            raise LockArgumentError("lock_delay applies to exclusive (write) locks only")
        super().__init__(*args, **kwargs)


class SemaphoreBase(LockBase):
    """A counting semaphore (``LOCK.SEMACQUIRE``): each acquire takes a permit of its own."""

    _command = "LOCK.SEMACQUIRE"
    #: Who is calling: the thread, or the asyncio task (set by the face).
    _who: Callable[[], Hashable] = staticmethod(threading.get_ident)

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

    def _make_store(self) -> None:
        # ``thread_local`` is kept for the signature: permits belong to the object, and a
        # release gives back the caller's most recent one (see PermitStore).
        store = PermitStore(type(self)._who)
        self._store = store
        self.local = PermitView(store)

    def _repr_extra(self) -> List[str]:
        return [f"capacity={self.capacity}", f"permits_held={self._store.count()}"]

    def _request(self) -> Request:
        r = super()._request()
        return Request(r.command, r.ttl_ms, self.capacity, r.bind, 0)

    def _locked_in(self, info: Optional[LockInfo]) -> bool:  # type: ignore[override]
        if info is None:
            return False
        return sum(h.count for h in info.holders) >= (info.capacity or self.capacity) or info.waiting > 0


R = TypeVar("R")
W = TypeVar("W")


class RWLockBase(Generic[R, W]):
    """A read-write lock: ``read()`` its reader, ``write()`` its exclusive writer; both on the
    same key, with the same options (``lock_delay`` goes to the writer)."""

    _reader_class: Any = None
    _writer_class: Any = None
    reader: R
    writer: W

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
        self.reader = self._reader_class(redis, name, **common)
        self.writer = self._writer_class(redis, name, lock_delay=lock_delay, **common)

    def read(self) -> R:
        """The reader (``ReadLock``)."""
        return self.reader

    def write(self) -> W:
        """The writer (exclusive ``Lock``)."""
        return self.writer

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__} name={self.name!r} reader={self.reader!r} writer={self.writer!r}>"

