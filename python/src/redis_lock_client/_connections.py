"""Connections for waits, bound holds and other requests of our own (sync), taken from the
user's connection pool so that its ``max_connections`` holds.

Why connections of our own at all: redis-py's client retries a command after a timeout or a
dropped connection. For ``LOCK.ACQUIRE ... WAIT`` that is wrong: the re-sent command joins the
*back* of the FIFO queue. And a bound hold lives as long as the connection it was granted on,
so that connection must stay with the hold. So every such request goes over a connection that
is taken out of the user's pool (it counts against ``max_connections``), used with no redis-py
``Retry`` and timeouts of our choosing, and sent and read directly (never through
``execute_command``).

The rules, per connection pool:

* ``take(pool, deadline, wait=True)`` (a wait) first passes a *wait gate*: at most
  ``max_wait_connections`` connections of the pool serve waits at once (default
  :data:`DEFAULT_MAX_WAIT_CONNECTIONS`, and never more than the pool's ``max_connections`` minus
  one, so a short command such as a release always finds a connection). Waiters beyond it queue
  here, in the client, first come first served.
* The connection itself comes from the pool the way the pool hands them out
  (``BlockingConnectionPool``: its own wait, cut to the caller's remaining time), but is not
  connected yet: ``connect`` connects it with the socket and handshake timeouts set from the
  remaining time and no retries.
* No connection within the caller's time: :class:`ConnectionLimitError`, naming the limit.
* ``give_back`` returns a connection whose last reply was read in full; it stays connected only
  while the pool has fewer than ``max_idle_connections`` (default :data:`MAX_IDLE`) idle
  connected connections, else it is disconnected first (redis-py reconnects it lazily when the
  pool hands it out again). ``abandon`` closes a connection whose reply was not read (after
  writing a release behind the request) and then returns it, disconnected, to the pool.

Every connection taken must end in ``give_back`` or ``abandon``: until then it holds a place of
the pool (and, for a wait, of the wait gate).
"""

from __future__ import annotations

import collections
import inspect
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from queue import Empty
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from redis.exceptions import ConnectionError, LockError, ResponseError, TimeoutError

from ._common import dedicated_kwargs, no_retry

#: Idle connected connections a pool is left with when a wait or a bound hold gives its
#: connection back; the connection is disconnected before it goes back beyond that.
MAX_IDLE = 2

#: Connections of one pool that serve waits at once, unless ``configure`` says otherwise (and
#: never more than the pool's ``max_connections`` minus one).
DEFAULT_MAX_WAIT_CONNECTIONS = 64

#: Reconnecting after a server restart: the first pause, doubled up to the last.
RECONNECT_FIRST_DELAY = 0.05
RECONNECT_MAX_DELAY = 1.0


# ----------------------------------------------------------------------------------------------
# Errors and limits (shared with _aio_connections)


class ConnectionLimitError(LockError):
    """No connection could be had for a request within the caller's remaining time: the pool's
    ``max_connections`` are all in use, or (for a wait) ``max_wait_connections`` waits are under
    way and this one queued in the client until its time ran out. ``limit`` names the limit
    (``"max_connections"`` or ``"max_wait_connections"``) and ``value`` its value."""

    def __init__(self, message: str, limit: str = "", value: Optional[int] = None, queued: bool = False) -> None:
        super().__init__(message)
        setattr(self, "message", message)
        setattr(self, "lock_name", None)
        self.args = (message,)  # redis-py before 8.1 left every argument there: str() a tuple
        self.limit = limit
        self.value = value
        #: True when the caller queued in the client for a wait connection and its time ran
        #: out there (an acquire then returns False, as after its blocking_timeout).
        self.queued = queued


@dataclass
class _Settings:
    max_wait_connections: int = DEFAULT_MAX_WAIT_CONNECTIONS
    max_idle: int = MAX_IDLE


@dataclass
class _Ticket:
    """One waiter queued at a wait gate; ``wake`` is called (under the gate's mutex, so it must
    not block) when it is let in."""

    wake: Callable[[], None]
    admitted: bool = False


@dataclass
class _Gate:
    """The wait gate of one pool: how many of its connections serve waits, and who queues for
    one. Pure bookkeeping under a thread lock; the sync and asyncio modules wake tickets their
    own way."""

    mutex: threading.Lock = field(default_factory=threading.Lock)
    in_use: int = 0
    pid: int = field(default_factory=os.getpid)
    queue: Deque[_Ticket] = field(default_factory=collections.deque)

    def enter(self, cap: int, ticket: _Ticket) -> bool:
        """True: in at once. False: queued (``ticket.wake`` is called when let in)."""
        with self.mutex:
            if not self.queue and self.in_use < cap:
                self.in_use += 1
                ticket.admitted = True
                return True
            self.queue.append(ticket)
            return False

    def try_enter(self, cap: int) -> bool:
        """True: in at once; False: no place free now (and not queued)."""
        with self.mutex:
            if not self.queue and self.in_use < cap:
                self.in_use += 1
                return True
            return False

    def leave(self, cap: int) -> None:
        with self.mutex:
            self.in_use -= 1
            self._admit(cap)

    def withdraw(self, cap: int, ticket: _Ticket) -> bool:
        """A queued waiter gives up (time out, interrupt). Returns True if it had been let in
        meanwhile (the caller then holds the place and must ``leave``)."""
        with self.mutex:
            if ticket.admitted:
                return True
            try:
                self.queue.remove(ticket)
            except ValueError:
                pass
            self._admit(cap)
            return False

    def _admit(self, cap: int) -> None:
        while self.queue and self.in_use < cap:
            t = self.queue.popleft()
            try:
                t.wake()
            except Exception:  # noqa: BLE001 - its event loop is gone: nobody to let in
                continue
            t.admitted = True
            self.in_use += 1


_settings: "weakref.WeakKeyDictionary[Any, _Settings]" = weakref.WeakKeyDictionary()
_gates: "weakref.WeakKeyDictionary[Any, _Gate]" = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def configure(pool: Any, max_wait_connections: Optional[int] = None, max_idle_connections: Optional[int] = None) -> None:
    """Sets the limits of ``pool`` (a connection pool, or an asyncio cluster node): how many of
    its connections may serve waits at once, and how many idle connected connections it is
    left with when a wait or a bound hold gives its connection back. None keeps a value."""
    _check_limits(max_wait_connections, max_idle_connections)
    _set(_settings_of(pool), max_wait_connections, max_idle_connections)


def _check_limits(max_wait_connections: Any, max_idle_connections: Any) -> None:
    for value, what in ((max_wait_connections, "max_wait_connections"), (max_idle_connections, "max_idle_connections")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            from ._common import LockArgumentError, make_error

            raise make_error(LockArgumentError, f"{what} must be an int >= 0 or None, not {value!r}")


def _set(s: _Settings, max_wait_connections: Optional[int], max_idle_connections: Optional[int]) -> None:
    if max_wait_connections is not None:
        s.max_wait_connections = max_wait_connections
    if max_idle_connections is not None:
        s.max_idle = max_idle_connections


#: Limits set on a cluster client: each node's pool takes them when it is first used.
_client_settings: "weakref.WeakKeyDictionary[Any, _Settings]" = weakref.WeakKeyDictionary()


def configure_connections(
    client: Any, max_wait_connections: Optional[int] = None, max_idle_connections: Optional[int] = None
) -> None:
    """Sets the connection limits the locks of ``client`` keep to (public as
    ``redis_lock_client.configure_connections``). ``client`` is a ``redis.Redis`` or
    ``redis.asyncio.Redis`` (the limits go to its connection pool, and so hold for every
    client sharing that pool), a ``RedisCluster`` of either kind (every node's pool, also nodes
    found later), or a connection pool itself.

    - ``max_wait_connections``: how many connections of the pool may serve waits and bound
      holds at once (default 64; never more than the pool's ``max_connections`` - 1, so that a
      release always finds a connection). More waiters queue in the client, first come first
      served; one whose ``blocking_timeout`` runs out there gets False from ``acquire``.
    - ``max_idle_connections``: how many idle connections the pool is left with, connected,
      when a wait or bound hold gives its connection back (default 2); beyond it they are
      disconnected (redis-py reconnects them when it uses them again).

    None keeps a value as it is. Raises ``LockArgumentError`` for anything but an int >= 0."""
    _check_limits(max_wait_connections, max_idle_connections)
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        configure(pool, max_wait_connections, max_idle_connections)
        return
    if hasattr(client, "get_node_from_key"):
        with _registry_lock:
            s = _client_settings.get(client)
            if s is None:
                s = _client_settings[client] = _Settings()
        _set(s, max_wait_connections, max_idle_connections)
        for node in list(getattr(client, "get_nodes", lambda: [])()):
            node_pool = _node_pool(node)
            if node_pool is not None:
                configure(node_pool, max_wait_connections, max_idle_connections)
        return
    if hasattr(client, "connection_kwargs") and hasattr(client, "max_connections"):
        configure(client, max_wait_connections, max_idle_connections)  # a pool (or an asyncio node)
        return
    raise TypeError(
        "expected a redis.Redis, redis.asyncio.Redis, a RedisCluster of either or a connection "
        f"pool, not {type(client).__name__}"
    )


def _node_pool(node: Any) -> Any:
    """A cluster node's pool: the sync node's client's pool (None: not connected yet), or the
    asyncio node itself."""
    node_client = getattr(node, "redis_connection", None)
    if node_client is not None:
        return getattr(node_client, "connection_pool", None)
    if hasattr(node, "acquire_connection"):
        return node
    return None


def inherit_settings(client: Any, pool: Any) -> Any:
    """``pool`` (of a cluster ``client``'s node) takes the limits set on the client, if any
    and if it has none of its own yet; returns ``pool``."""
    s = _client_settings.get(client) if _weakrefable(client) else None
    if s is not None:
        with _registry_lock:
            known = _known(pool)
        if not known:
            configure(pool, s.max_wait_connections, s.max_idle)
    return pool


def _weakrefable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _known(pool: Any) -> bool:
    try:
        return pool in _settings
    except TypeError:
        return (id(_settings), id(pool)) in _by_id


#: For pools that cannot be weakly referenced (redis.asyncio's ClusterNode has __slots__, and
#: in redis-py 5 no hash): by id, the pool kept alive with its entry (a few per cluster node).
_by_id: Dict[Tuple[int, int], Tuple[Any, Any]] = {}


def _registered(table: "weakref.WeakKeyDictionary[Any, Any]", pool: Any, make: Callable[[], Any]) -> Any:
    with _registry_lock:
        try:
            item = table.get(pool)
            if item is None:
                item = table[pool] = make()
            return item
        except TypeError:
            pass
        key = (id(table), id(pool))
        entry = _by_id.get(key)
        if entry is None or entry[0] is not pool:
            entry = _by_id[key] = (pool, make())
        return entry[1]


def _replace(table: "weakref.WeakKeyDictionary[Any, Any]", pool: Any, item: Any) -> None:
    with _registry_lock:
        try:
            table[pool] = item
        except TypeError:
            _by_id[(id(table), id(pool))] = (pool, item)


def _settings_of(pool: Any) -> _Settings:
    return _registered(_settings, pool, _Settings)  # type: ignore[no-any-return]


def gate_of(pool: Any) -> _Gate:
    gate: _Gate = _registered(_gates, pool, _Gate)
    if gate.pid != os.getpid():
        # Inherited through fork: the parent's waits are not this process's. (redis-py resets
        # the pool itself the same way.)
        gate = _Gate()
        _replace(_gates, pool, gate)
    return gate


def max_connections_of(pool: Any) -> Optional[int]:
    """The pool's ``max_connections`` (None: none known)."""
    m = getattr(pool, "max_connections", None)
    return m if isinstance(m, int) and not isinstance(m, bool) else None


def wait_cap(pool: Any) -> int:
    """How many connections of ``pool`` may serve waits at once: ``max_wait_connections``, and
    at most ``max_connections - 1``."""
    cap = _settings_of(pool).max_wait_connections
    m = max_connections_of(pool)
    if m is not None:
        cap = min(cap, m - 1)
    return max(0, cap)


def max_idle_of(pool: Any) -> int:
    return _settings_of(pool).max_idle


def wait_limit_error(pool: Any, queued: bool) -> ConnectionLimitError:
    cap = wait_cap(pool)
    s = _settings_of(pool)
    m = max_connections_of(pool)
    if cap == 0:
        why = (
            f"no connection of this pool may serve a wait (max_connections={m}: a wait needs one "
            "connection and a release another)"
            if m is not None and m - 1 <= s.max_wait_connections
            else "max_wait_connections is 0"
        )
    else:
        why = (
            f"{cap} waits or bound holds already hold connections of this pool"
            + (
                " and this one queued behind them until its time ran out"
                if queued
                else " and a try that must not block does not queue behind them"
            )
        )
    how = (
        "raise the pool's max_connections"
        if m is not None and m - 1 <= s.max_wait_connections
        else "raise max_wait_connections"
    )
    return ConnectionLimitError(
        f"no connection for a wait: {why} (max_wait_connections={s.max_wait_connections}, "
        f"max_connections={m}; the wait limit is the smaller of max_wait_connections and "
        f"max_connections - 1); {how}, or wait less long",
        "max_wait_connections",
        cap,
        queued,
    )


def pool_limit_error(pool: Any, cause: Optional[BaseException] = None) -> ConnectionLimitError:
    m = max_connections_of(pool)
    extra = f" ({cause})" if cause is not None else ""
    return ConnectionLimitError(
        f"no connection free in the pool within the time left: all its max_connections={m} "
        f"connections are in use{extra}; waits and bound holds each use one of them for as long "
        "as they last: raise the pool's max_connections (or its timeout for a "
        "BlockingConnectionPool)",
        "max_connections",
        m,
    )


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value; None: no limit), never
    below 0."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def _shorter(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def expired(deadline: Optional[float] = None) -> TimeoutError:
    return TimeoutError("the time for this request ran out before it could be sent")


def reconnect_delays(first: float = RECONNECT_FIRST_DELAY, most: float = RECONNECT_MAX_DELAY) -> Iterator[float]:
    """The pauses between reconnect attempts: ``first``, doubled each time up to ``most``."""
    d = first
    while True:
        yield d
        d = min(most, d * 2)


def is_retryable_connect_error(err: BaseException) -> bool:
    """Whether a failure to connect is worth another try after a pause: refused, reset,
    unreachable, timed out. Not an authentication or permission failure, nor any error reply."""
    if isinstance(err, ResponseError):
        return False
    name = type(err).__name__
    if name in ("AuthenticationError", "AuthorizationError", "AuthenticationWrongNumberOfArgsError"):
        return False
    try:
        from redis.exceptions import AuthenticationError

        if isinstance(err, AuthenticationError):
            return False
    except ImportError:  # pragma: no cover - every supported redis-py has it
        pass
    return is_connection_trouble(err)


def pause_before_retry(err: BaseException, deadline: Optional[float], delays: Iterator[float]) -> Tuple[float, bool]:
    """After a failed connect: how long to pause before the next try, and whether the deadline
    comes with the pause (then the failure is raised after it). Raises ``err`` at once when it
    is not worth another try or the deadline has passed."""
    if not is_retryable_connect_error(err):
        raise err
    left = remaining(deadline)
    if left is not None and left <= 0:
        raise err
    pause = next(delays)
    if left is not None and pause >= left:
        return left, True
    return pause, False


# ----------------------------------------------------------------------------------------------
# What we change on a connection of the pool while we use it, and put back after


@dataclass
class _Borrowed:
    pool: Any
    wait: bool
    socket_timeout: Any
    socket_connect_timeout: Any
    retry: Any


_borrowed: "weakref.WeakKeyDictionary[Any, _Borrowed]" = weakref.WeakKeyDictionary()


def _lend(pool: Any, conn: Any, wait: bool, aio: bool = False) -> None:
    """Records ``conn`` as ours and makes it ours: no retries, the pool's timeouts (``connect``
    sets them from a deadline); ``aio``: an asyncio connection."""
    rec = _Borrowed(
        pool,
        wait,
        getattr(conn, "socket_timeout", None),
        getattr(conn, "socket_connect_timeout", None),
        getattr(conn, "retry", None),
    )
    _borrowed[conn] = rec
    if hasattr(conn, "retry"):
        conn.retry = no_retry(aio)


def _unlend(conn: Any) -> Optional[_Borrowed]:
    """Puts back what ``_lend`` changed; returns the record (None: not a connection of a pool)."""
    rec = _borrowed.pop(conn, None)
    if rec is None:
        return None
    for attr in ("socket_timeout", "socket_connect_timeout", "retry"):
        if hasattr(conn, attr):
            setattr(conn, attr, getattr(rec, attr))
    return rec


def _set_connect_timeouts(conn: Any, timeout: Optional[float]) -> None:
    """Timeouts for connecting and the handshake: ``timeout`` (None: the pool's own)."""
    rec = _borrowed.get(conn)
    if timeout is None:
        if rec is not None:
            conn.socket_connect_timeout = rec.socket_connect_timeout
            conn.socket_timeout = rec.socket_timeout
        return
    t = max(0.001, timeout)
    conn.socket_connect_timeout = t
    conn.socket_timeout = t


def _idle_connected(pool: Any) -> Optional[int]:
    """How many idle connections of the pool are connected (None: cannot tell)."""
    idle = getattr(pool, "_available_connections", None)
    if idle is None:
        q = getattr(pool, "pool", None)
        idle = getattr(q, "queue", None)  # BlockingConnectionPool: its LifoQueue's list
    if idle is None:
        idle = getattr(pool, "_free", None)  # asyncio cluster node
    if idle is None:
        return None
    try:
        return sum(1 for c in list(idle) if c is not None and _is_connected(c))
    except Exception:  # noqa: BLE001 - a pool of an unknown make: treat as full
        return None


def _is_connected(conn: Any) -> bool:
    if getattr(conn, "_sock", None) is not None:
        return True
    return bool(getattr(conn, "_reader", None) is not None and getattr(conn, "_writer", None) is not None)


def keep_connected(pool: Any, conn: Any) -> bool:
    """Whether a connection given back stays connected: while the pool has fewer than its idle
    limit of idle connected connections."""
    n = _idle_connected(pool)
    return n is not None and n < max_idle_of(pool)


# ----------------------------------------------------------------------------------------------
# Where connections come from


def pool_of(client: Any, name: Any, address: Optional[Tuple[str, int]] = None) -> Any:
    """The connection pool that serves ``name``: the client's, or for a ``RedisCluster`` the
    pool of the master that owns the key's slot (of the node at ``address`` when given: a key
    that moved)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:
        if address is not None:
            node = client.get_node(host=address[0], port=address[1])
            if node is not None:
                return inherit_settings(client, client.get_redis_connection(node).connection_pool)
        node = get_node(name)
        node_client = getattr(node, "redis_connection", None)
        if node_client is None:
            # Not connected yet: any command makes the cluster client create them.
            client.execute_command("LOCK.INFO", name)
            node = get_node(name)
            node_client = node.redis_connection
        return inherit_settings(client, node_client.connection_pool)
    raise TypeError(
        f"expected a redis.Redis or redis.cluster.RedisCluster client, not {type(client).__name__}"
    )


def default_timeout(pool: Any) -> Optional[float]:
    """The pool's own read timeout: for requests that the server answers at once."""
    t = pool.connection_kwargs.get("socket_timeout")
    return None if t is None else float(t)


def new_connection(pool: Any, socket_timeout: Optional[float] = None) -> Any:
    """A connection made from the pool's arguments but NOT counted by the pool, with no
    retries; ``socket_timeout`` bounds connecting and its handshake (default: the pool's own).
    For servers that are not a client's pool (Redlock's instances); waits and bound holds use
    :func:`take`."""
    if socket_timeout is None:
        socket_timeout = default_timeout(pool)
    return pool.connection_class(**dedicated_kwargs(pool.connection_kwargs, socket_timeout, False))


def _stock(pool: Any, class_name: str) -> bool:
    """Whether ``pool`` hands out connections with redis-py's own ``class_name`` code."""
    import redis

    cls = getattr(redis, class_name, None)
    return cls is not None and isinstance(pool, cls) and type(pool).get_connection is cls.get_connection


_metrics: List[Any] = []


def _record_taken(pool: Any) -> None:
    """redis-py 8 counts idle and used connections for its metrics in ``get_connection``; do
    the same when taking one its way."""
    if not _metrics:
        try:
            from redis.observability.attributes import ConnectionState, get_pool_name
            from redis.observability.recorder import record_connection_count

            _metrics.append((ConnectionState, get_pool_name, record_connection_count))
        except ImportError:
            _metrics.append(None)
    if _metrics[0] is None:
        return
    state, pool_name_of, record = _metrics[0]
    try:
        name = pool_name_of(pool)
        record(pool_name=name, connection_state=state.IDLE, counter=-1)
        record(pool_name=name, connection_state=state.USED, counter=1)
    except Exception:  # noqa: BLE001 - metrics must never fail a lock operation
        pass


def public_get_connection_args(get_connection: Any) -> List[Any]:
    """The arguments for ``pool.get_connection``: none where the command name is optional
    (redis-py 5.3 and later deprecate it), a command name where it is required (5.0 to 5.2)."""
    try:
        params = list(inspect.signature(get_connection).parameters.values())
    except (TypeError, ValueError):
        return []
    if params and params[0].name == "command_name" and params[0].default is inspect.Parameter.empty:
        return ["LOCK.ACQUIRE"]
    return []


def _slot(pool: Any, deadline: Optional[float]) -> Any:
    """A connection of ``pool``, counted as in use by it, not necessarily connected; waits for
    one (a ``BlockingConnectionPool``) at most until ``deadline``."""
    if _stock(pool, "BlockingConnectionPool") and hasattr(pool, "pool"):
        pool._checkpid()
        t = _shorter(getattr(pool, "timeout", None), remaining(deadline))
        in_maintenance = bool(getattr(pool, "_in_maintenance", False))
        if in_maintenance:
            pool._lock.acquire()
        try:
            try:
                conn = pool.pool.get(block=True, timeout=t)
            except Empty:
                raise pool_limit_error(pool) from None
            if conn is None:
                try:
                    conn = pool.make_connection()
                except BaseException:
                    pool.pool.put_nowait(None)
                    raise
        finally:
            if in_maintenance:
                pool._lock.release()
        _record_taken(pool)
        return conn
    if _stock(pool, "ConnectionPool") and hasattr(pool, "_available_connections"):
        pool._checkpid()
        with pool._lock:
            try:
                conn = pool._available_connections.pop()
            except IndexError:
                try:
                    conn = pool.make_connection()
                except ConnectionError as e:  # "Too many connections" (MaxConnectionsError)
                    raise pool_limit_error(pool, e) from e
            pool._in_use_connections.add(conn)
        _record_taken(pool)
        return conn
    # A pool of another make: its own get_connection (which connects, by its own rules).
    try:
        return pool.get_connection(*public_get_connection_args(pool.get_connection))
    except ConnectionError as e:
        if "connection" in str(e).lower() and ("too many" in str(e).lower() or "available" in str(e).lower()):
            raise pool_limit_error(pool, e) from e
        raise


def _release(pool: Any, conn: Any) -> None:
    pool.release(conn)
    if _is_connected(conn):
        return
    idle = getattr(pool, "_available_connections", None)
    if isinstance(idle, list):
        with pool._lock:
            to_the_bottom(idle, conn)
        return
    q: Any = getattr(pool, "pool", None)  # BlockingConnectionPool: a LifoQueue
    if isinstance(getattr(q, "queue", None), list) and hasattr(q, "mutex"):
        with q.mutex:
            to_the_bottom(q.queue, conn)


def to_the_bottom(idle: List[Any], conn: Any) -> None:
    """A connection given back disconnected goes to the bottom of the pool's stack of idle
    connections (the pool hands out the top first): the pool's next commands then use its
    connected ones, not this one, which it would connect again while the others stayed
    connected too."""
    if idle and idle[-1] is conn:
        idle.pop()
        idle.insert(0, conn)


# ----------------------------------------------------------------------------------------------
# Taking and giving back


def gate_to_queue_at(pool: Any, queue: bool) -> Optional[Tuple[_Gate, int]]:
    """The pool's wait gate and its cap for a waiter that may have to queue; None when no
    queueing is needed (``queue`` False and a place was free: taken). Raises
    :class:`ConnectionLimitError` when no place can be had (no wait allowed at all, or none
    free at once without ``queue``)."""
    cap = wait_cap(pool)
    if cap == 0:
        raise wait_limit_error(pool, False)
    gate = gate_of(pool)
    if queue:
        return gate, cap
    if not gate.try_enter(cap):
        raise wait_limit_error(pool, False)
    return None


def _enter_gate(pool: Any, deadline: Optional[float], queue: bool = True) -> None:
    """Waits, first come first served, for a place among the pool's wait connections (with
    ``queue`` False: only a place free at once)."""
    entry = gate_to_queue_at(pool, queue)
    if entry is None:
        return
    gate, cap = entry
    event = threading.Event()
    ticket = _Ticket(event.set)
    if gate.enter(cap, ticket):
        return
    try:
        event.wait(remaining(deadline))
    except BaseException:
        # An interrupt (KeyboardInterrupt at the wait): out of the queue, or out of the place
        # if it was given meanwhile.
        if gate.withdraw(wait_cap(pool), ticket):
            gate.leave(wait_cap(pool))
        raise
    if not gate.withdraw(wait_cap(pool), ticket):
        raise wait_limit_error(pool, True)


def take(pool: Any, deadline: Optional[float] = None, wait: bool = True, queue: bool = True) -> Any:
    """A connection of ``pool`` for a request of ours (counted by the pool), not yet connected
    if it was idle disconnected, with no retries. ``wait=True`` (the default): a connection kept
    beyond one immediate reply (a ``WAIT`` request, a bound hold, a watchdog's), so it first
    passes the pool's wait gate (at most ``max_wait_connections`` at once, first come first
    served; ``queue=False``: only a place free at once, for a try that must not block);
    ``wait=False`` for one short request. ``deadline`` (``time.monotonic()``; None: the pool's
    own timeout, no limit at the gate) bounds both. Raises :class:`ConnectionLimitError` when
    no connection can be had in time. It must end in :func:`give_back` or :func:`abandon`."""
    if wait:
        _enter_gate(pool, deadline, queue)
    try:
        conn = _slot(pool, deadline)
    except BaseException:
        if wait:
            gate_of(pool).leave(wait_cap(pool))
        raise
    _lend(pool, conn, wait)
    return conn


def _after_use(conn: Any, rec: Optional[_Borrowed]) -> None:
    """Returns a taken connection (already restored) to its pool and its wait gate place."""
    if rec is None:
        return
    try:
        _release(rec.pool, conn)
    finally:
        if rec.wait:
            gate_of(rec.pool).leave(wait_cap(rec.pool))


def give_back(pool: Any, conn: Any) -> None:
    """Returns a connection whose last reply was read in full to its pool; disconnected first
    if the pool has its idle limit of connected connections already (or the server closed it).
    A connection not taken with :func:`take` is just closed."""
    rec = _unlend(conn)
    if rec is None:
        conn.disconnect()
        return
    try:
        if _is_connected(conn) and (is_closed(conn) or not keep_connected(rec.pool, conn)):
            conn.disconnect()
        if _is_connected(conn):
            set_read_timeout(conn, rec.socket_timeout)
    finally:
        _after_use(conn, rec)


# ----------------------------------------------------------------------------------------------
# Requests


def set_read_timeout(conn: Any, timeout: Optional[float]) -> None:
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(timeout)


def read(conn: Any) -> Any:
    return conn.read_response(disconnect_on_error=False)


def connect(conn: Any, deadline: Optional[float]) -> None:
    """Connects ``conn`` if it is not: the TCP connect and each handshake read (HELLO, AUTH,
    SELECT, CLIENT SETINFO) bounded by the time left until ``deadline`` (None: the pool's own
    timeouts), no retries. A failure leaves it disconnected."""
    if _is_connected(conn):
        return
    left = remaining(deadline)
    if left is not None and left <= 0:
        raise expired(deadline)
    _set_connect_timeouts(conn, left)
    try:
        conn.connect()
    except BaseException:
        try:
            conn.disconnect()
        except Exception:  # noqa: BLE001 - the connect's failure is the one to report
            pass
        raise


def call(conn: Any, args: List[Any], timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply within ``timeout`` seconds (None: no limit); connects
    first if needed, within ``timeout`` too. An error reply raises ``ResponseError`` and leaves
    the connection usable; any other failure (including an interrupt) leaves it to the caller
    to abandon."""
    if not _is_connected(conn) and conn in _borrowed:
        connect(conn, None if timeout is None else time.monotonic() + timeout)
    conn.send_command(*args)
    set_read_timeout(conn, timeout)
    return read(conn)


def request(
    pool: Any,
    args: List[Any],
    deadline: Optional[float],
    release: Optional[List[Any]] = None,
    wait: bool = False,
    read_timeout: Any = "deadline",
) -> Any:
    """One request on a connection of ``pool``, everything within ``deadline``: getting the
    connection (a ``BlockingConnectionPool``'s own wait included), connecting and the handshake,
    sending and the read; no redis-py retries. The connection goes back to the pool after a
    reply (an error reply too: it raises ``ResponseError``); after anything else it is
    abandoned behind ``release``. ``read_timeout`` (default: the time left) may be given apart
    (None: no limit) for a ``WAIT`` request whose server-side wait ends on its own. Time out:
    redis-py's ``TimeoutError``; no connection in time: :class:`ConnectionLimitError`."""
    conn = take(pool, deadline, wait)
    try:
        connect(conn, deadline)
        t = remaining(deadline) if read_timeout == "deadline" else read_timeout
        if t is not None and t <= 0:
            raise expired(deadline)
        reply = call(conn, args, t)
    except ResponseError:
        give_back(pool, conn)
        raise
    except BaseException:
        abandon(conn, release)
        raise
    give_back(pool, conn)
    return reply


def reconnect(conn: Any, deadline: Optional[float], sleep: Callable[[float], None] = time.sleep) -> None:
    """After a connection error on ``conn`` (the server restarted, say), connects it afresh,
    keeping its place in the pool: tries at once, then after 50 ms, doubling to 1 s between
    tries, until ``deadline``. Connection refused, reset or timed out is tried again; an
    authentication or permission failure, or any error reply in the handshake, is raised at
    once; at the deadline the last failure is raised."""
    delays = reconnect_delays()
    while True:
        try:
            conn.disconnect()
        except Exception:  # noqa: BLE001 - it is being replaced anyway
            pass
        try:
            connect(conn, deadline)
            return
        except Exception as e:  # noqa: BLE001 - sorted by pause_before_retry
            pause, last = pause_before_retry(e, deadline, delays)
            sleep(pause)
            if last:
                raise


def abandon(conn: Any, release: Optional[List[Any]]) -> None:
    """Gives up a connection whose reply was not read: writes ``release`` behind the request
    (the server runs it right after the request, so a grant that comes late is handed back),
    then closes the connection (a request still queued leaves the queue, and a bound hold
    ends), and returns it, disconnected, to its pool. Never raises."""
    try:
        if release is not None and getattr(conn, "_sock", None) is not None:
            conn.send_packed_command(conn.pack_command(*release), check_health=False)
    except BaseException:  # noqa: BLE001 - best effort, the close below is what counts
        pass
    finally:
        try:
            conn.disconnect()
        except BaseException:  # noqa: BLE001
            pass
        try:
            _after_use(conn, _unlend(conn))
        except BaseException:  # noqa: BLE001 - never raises; the slot is the pool's to recover
            pass


def is_closed(conn: Any) -> bool:
    """Whether the server closed the connection, seen without blocking or sending anything
    (the socket is peeked). Data waiting unasked counts as open; an unknown socket type too."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return True
    if type(sock) is not socket.socket:
        return False  # TLS: cannot peek without consuming; assume open
    old = sock.gettimeout()
    try:
        sock.settimeout(0.0)  # with a timeout set, recv would first wait for data
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass
    return data == b""


def server_name(pool: Any) -> str:
    kw: Dict[str, Any] = pool.connection_kwargs
    if kw.get("path"):
        return str(kw["path"])
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def is_connection_trouble(err: BaseException) -> bool:
    return isinstance(err, (ConnectionError, TimeoutError, OSError))


def in_use(pool: Any) -> Tuple[int, int]:
    """(connections of ``pool`` serving waits now, waiters queued for one): for tests and
    diagnostics."""
    gate = gate_of(pool)
    with gate.mutex:
        return gate.in_use, len(gate.queue)


__all__ = [
    "ConnectionLimitError",
    "DEFAULT_MAX_WAIT_CONNECTIONS",
    "MAX_IDLE",
    "ResponseError",
    "abandon",
    "call",
    "configure",
    "configure_connections",
    "connect",
    "default_timeout",
    "give_back",
    "in_use",
    "is_closed",
    "is_connection_trouble",
    "is_retryable_connect_error",
    "pause_before_retry",
    "new_connection",
    "pool_of",
    "read",
    "reconnect",
    "reconnect_delays",
    "remaining",
    "request",
    "server_name",
    "set_read_timeout",
    "take",
    "wait_cap",
]
