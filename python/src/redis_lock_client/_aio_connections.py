"""Connections for waits, bound holds and other requests of our own (asyncio): the twin of
``_connections`` with the same names and meanings, awaitable where they do I/O. The limits, the
wait gate, :class:`ConnectionLimitError` and the pure helpers are ``_connections``' own (one
limit per pool, whichever face uses it); see there for the rules.

Differences that asyncio brings: the pool is a ``redis.asyncio`` pool (or, for a
``redis.asyncio.cluster.RedisCluster``, the ``ClusterNode`` that owns the key: it has its own
``max_connections``); every step is bounded with ``asyncio.wait_for`` (connecting and the
handshake as one step), and a step cut short by a time-out or a cancellation leaves the
connection closed, never half-connected. ``give_back`` and ``abandon`` finish even when the
calling task is cancelled meanwhile.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from . import _connections as _sync
from ._common import dedicated_kwargs
from ._connections import (
    DEFAULT_MAX_WAIT_CONNECTIONS,
    MAX_IDLE,
    RECONNECT_FIRST_DELAY,
    RECONNECT_MAX_DELAY,
    ConnectionLimitError,
    _Borrowed,
    _borrowed,
    _lend,
    _shorter,
    _Ticket,
    _unlend,
    _set_connect_timeouts,
    configure,
    configure_connections,
    expired,
    gate_of,
    gate_to_queue_at,
    in_use,
    inherit_settings,
    is_retryable_connect_error,
    pause_before_retry,
    default_timeout as default_timeout,
    keep_connected,
    pool_limit_error,
    public_get_connection_args,
    reconnect_delays,
    remaining,
    server_name,
    to_the_bottom,
    wait_cap,
    wait_limit_error,
)

# ----------------------------------------------------------------------------------------------
# Where connections come from


def pool_of(client: Any, name: Any, address: Optional[Tuple[str, int]] = None) -> Any:
    """What serves ``name``: the client's pool, or for a ``RedisCluster`` the node that owns the
    key's slot (of the node at ``address`` when given: a key that moved); both have
    ``connection_class``, ``connection_kwargs`` and ``max_connections``. A cluster client must
    know its slots (``await client.initialize()``)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:
        node = None
        if address is not None:
            node = client.get_node(host=address[0], port=address[1])
        return inherit_settings(client, node if node is not None else get_node(name))
    raise TypeError(
        "expected a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster client, "
        f"not {type(client).__name__}"
    )


def new_connection(pool: Any, socket_timeout: Optional[float] = None) -> Any:
    """A connection made from the pool's arguments but NOT counted by the pool, with no
    retries (Redlock's instances); waits and bound holds use :func:`take`."""
    return pool.connection_class(**dedicated_kwargs(pool.connection_kwargs, socket_timeout, True))


def _stock(pool: Any, class_name: str) -> bool:
    import redis.asyncio

    cls = getattr(redis.asyncio, class_name, None)
    return cls is not None and isinstance(pool, cls) and type(pool).get_connection is cls.get_connection


async def _record_taken(pool: Any, created: bool) -> None:
    """redis-py 8 counts idle and used connections for its metrics in ``get_connection``."""
    try:
        from redis.asyncio.observability.recorder import record_connection_count
        from redis.observability.attributes import ConnectionState, get_pool_name
    except ImportError:
        return
    try:
        name = get_pool_name(pool)
        if not created:
            await record_connection_count(pool_name=name, connection_state=ConnectionState.IDLE, counter=-1)
        await record_connection_count(pool_name=name, connection_state=ConnectionState.USED, counter=1)
    except Exception:  # noqa: BLE001 - metrics must never fail a lock operation
        pass


def _count(pool: Any) -> int:
    return len(pool._available_connections) + len(pool._in_use_connections)


def _available(pool: Any) -> Tuple[Any, bool]:
    """``pool.get_available_connection()`` and whether it made a new connection."""
    before = _count(pool)
    try:
        conn = pool.get_available_connection()
    except ConnectionError as e:  # "Too many connections" (MaxConnectionsError)
        raise pool_limit_error(pool, e) from e
    return conn, _count(pool) > before


async def _slot(pool: Any, deadline: Optional[float]) -> Any:
    """A connection of ``pool``, counted as in use by it, not necessarily connected; waits for
    one (a ``BlockingConnectionPool``) at most until ``deadline``."""
    if hasattr(pool, "acquire_connection"):  # a cluster node
        try:
            return pool.acquire_connection()
        except ConnectionError as e:  # MaxConnectionsError
            raise pool_limit_error(pool, e) from e
    if _stock(pool, "BlockingConnectionPool") and hasattr(pool, "get_available_connection") and hasattr(pool, "_condition"):
        t = _shorter(getattr(pool, "timeout", None), remaining(deadline))
        try:
            async with pool._condition:
                await asyncio.wait_for(pool._condition.wait_for(pool.can_get_connection), t)
                before = _count(pool)
                conn = pool.get_available_connection()
                created = _count(pool) > before
        except asyncio.TimeoutError:
            raise pool_limit_error(pool) from None
        await _record_taken(pool, created)
        return conn
    if _stock(pool, "ConnectionPool") and hasattr(pool, "get_available_connection"):
        # redis-py 5.3+ guards the pool with an asyncio.Lock (``_lock``) where it awaits while
        # changing it; 5.0 to 5.2 have none. get_available_connection itself never awaits, so
        # nothing can come between; where the lock exists we take it, to keep out of redis-py's
        # own sections under it.
        guard = getattr(pool, "_lock", None)
        if isinstance(guard, asyncio.Lock):
            async with guard:
                conn, created = _available(pool)
        else:
            conn, created = _available(pool)
        await _record_taken(pool, created)
        return conn
    # A pool of another make: its own get_connection (which connects), cut to the time left.
    try:
        return await asyncio.wait_for(pool.get_connection(*public_get_connection_args(pool.get_connection)), remaining(deadline))
    except asyncio.TimeoutError:
        raise TimeoutError("no connection ready within the time left (waiting for the pool or connecting)") from None
    except ConnectionError as e:
        text = str(e).lower()
        if "too many" in text or "no connection available" in text:
            raise pool_limit_error(pool, e) from e
        raise


async def _release(pool: Any, conn: Any) -> None:
    if hasattr(pool, "acquire_connection") and not hasattr(pool, "get_connection"):  # a cluster node
        release = getattr(pool, "release", None)
        if release is None:
            pool._free.append(conn)  # redis-py 5: the node has no release()
            return
        result = release(conn)
    else:
        result = pool.release(conn)
    if inspect.isawaitable(result):
        await result
    idle = getattr(pool, "_available_connections", None)
    if isinstance(idle, list) and not _is_connected(conn):
        to_the_bottom(idle, conn)  # no await in between: nothing else runs meanwhile


# ----------------------------------------------------------------------------------------------
# Taking and giving back


async def _enter_gate(pool: Any, deadline: Optional[float], queue: bool = True) -> None:
    entry = gate_to_queue_at(pool, queue)
    if entry is None:
        return
    gate, cap = entry
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[None]" = loop.create_future()

    def admitted() -> None:
        if not fut.done():
            fut.set_result(None)

    def wake() -> None:
        loop.call_soon_threadsafe(admitted)

    ticket = _Ticket(wake)
    if gate.enter(cap, ticket):
        return
    try:
        try:
            await asyncio.wait_for(fut, remaining(deadline))
        except asyncio.TimeoutError:
            pass
    except BaseException:
        # Cancelled: out of the queue, or out of the place if it was given meanwhile.
        if gate.withdraw(wait_cap(pool), ticket):
            gate.leave(wait_cap(pool))
        raise
    if not gate.withdraw(wait_cap(pool), ticket):
        raise wait_limit_error(pool, True)


async def take(pool: Any, deadline: Optional[float] = None, wait: bool = True, queue: bool = True) -> Any:
    """A connection of ``pool`` (counted by it) for a request of ours: as
    ``_connections.take``. It must end in :func:`give_back` or :func:`abandon`."""
    if wait:
        await _enter_gate(pool, deadline, queue)
    try:
        conn = await _slot(pool, deadline)
    except BaseException:
        if wait:
            gate_of(pool).leave(wait_cap(pool))
        raise
    _lend(pool, conn, wait, aio=True)
    return conn


async def _after_use(conn: Any, rec: Optional[_Borrowed]) -> None:
    if rec is None:
        return
    try:
        await _release(rec.pool, conn)
    finally:
        if rec.wait:
            gate_of(rec.pool).leave(wait_cap(rec.pool))


async def _disconnect(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except TypeError:
        await conn.disconnect()


async def _finish(work: Callable[[], Awaitable[None]]) -> None:
    """Runs ``work`` to its end even if the calling task is cancelled meanwhile (the
    cancellation then propagates)."""
    await asyncio.shield(asyncio.ensure_future(work()))


async def give_back(pool: Any, conn: Any) -> None:
    """Returns a connection whose last reply was read in full to its pool; disconnected first
    if the pool has its idle limit of connected connections already (or the server closed it).
    A connection not taken with :func:`take` is just closed."""

    async def work() -> None:
        rec = _unlend(conn)
        if rec is None:
            await _disconnect(conn)
            return
        try:
            if _is_connected(conn) and (is_closed(conn) or not keep_connected(rec.pool, conn)):
                await _disconnect(conn)
        finally:
            await _after_use(conn, rec)

    await _finish(work)


async def abandon(conn: Any, release: Optional[List[Any]]) -> None:
    """Gives up a connection whose reply was not read: writes ``release`` behind the request,
    closes the connection and returns it, disconnected, to its pool; completes even while the
    calling task is being cancelled. Never raises (but a cancellation propagates)."""

    async def work() -> None:
        try:
            if release is not None and _is_connected(conn):
                await conn.send_packed_command(conn.pack_command(*release), check_health=False)
        except BaseException:  # noqa: BLE001 - best effort, the close below is what counts
            pass
        finally:
            try:
                await _disconnect(conn)
            except BaseException:  # noqa: BLE001
                pass
            try:
                await _after_use(conn, _unlend(conn))
            except BaseException:  # noqa: BLE001 - never raises
                pass

    await _finish(work)


# ----------------------------------------------------------------------------------------------
# Requests


def _is_connected(conn: Any) -> bool:
    return bool(getattr(conn, "is_connected", False))


def set_read_timeout(conn: Any, timeout: Optional[float]) -> None:
    """The read timeout of the connection's next replies (redis.asyncio reads with its
    ``socket_timeout``)."""
    if hasattr(conn, "socket_timeout"):
        conn.socket_timeout = timeout


async def read(conn: Any) -> Any:
    return await conn.read_response(disconnect_on_error=False)


async def connect(conn: Any, deadline: Optional[float]) -> None:
    """Connects ``conn`` if it is not: connecting and the handshake together within the time
    left until ``deadline`` (None: the pool's own timeouts), no retries. A failure (a
    cancellation too) leaves it disconnected."""
    if _is_connected(conn):
        return
    left = remaining(deadline)
    if left is not None and left <= 0:
        raise expired(deadline)
    _set_connect_timeouts(conn, left)
    try:
        if left is None:
            await conn.connect()
        else:
            await asyncio.wait_for(conn.connect(), left)
    except BaseException as e:
        await _finish(lambda: _disconnect_quietly(conn))
        if isinstance(e, asyncio.TimeoutError) and not isinstance(e, TimeoutError):
            raise TimeoutError("Timeout connecting to server") from None
        raise


async def _disconnect_quietly(conn: Any) -> None:
    try:
        await _disconnect(conn)
    except Exception:  # noqa: BLE001 - the connect's failure is the one to report
        pass


async def call(conn: Any, args: List[Any], timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply within ``timeout`` seconds (None: no limit); connects
    first if needed, within ``timeout`` too. A time-out raises redis-py's ``TimeoutError`` (as
    the sync ``call``). An error reply raises ``ResponseError`` and leaves the connection
    usable; any other failure (a cancellation too) leaves it to the caller to abandon."""
    if not _is_connected(conn):
        if conn in _borrowed:
            await connect(conn, None if timeout is None else time.monotonic() + timeout)
        elif timeout is None:
            await conn.connect()
        else:
            await asyncio.wait_for(conn.connect(), timeout)
    if conn in _borrowed:
        # redis.asyncio would cut a read at the pool's socket_timeout; ours is bounded here
        # (``give_back`` puts the pool's back).
        conn.socket_timeout = None
    await conn.send_command(*args)
    reply = conn.read_response(disconnect_on_error=False)
    if timeout is None:
        return await reply
    try:
        return await asyncio.wait_for(reply, timeout)
    except asyncio.TimeoutError as e:
        if isinstance(e, TimeoutError):
            raise
        raise TimeoutError(f"Timeout reading from {server_name_of(conn)}") from None


def server_name_of(conn: Any) -> str:
    host = getattr(conn, "host", None)
    return f"{host}:{getattr(conn, 'port', '')}" if host else str(getattr(conn, "path", "the server"))


async def request(
    pool: Any,
    args: List[Any],
    deadline: Optional[float],
    release: Optional[List[Any]] = None,
    wait: bool = False,
    read_timeout: Any = "deadline",
) -> Any:
    """One request on a connection of ``pool``, everything within ``deadline``: as
    ``_connections.request``."""
    conn = await take(pool, deadline, wait)
    try:
        await connect(conn, deadline)
        t = remaining(deadline) if read_timeout == "deadline" else read_timeout
        if t is not None and t <= 0:
            raise expired(deadline)
        reply = await call(conn, args, t)
    except ResponseError:
        await give_back(pool, conn)
        raise
    except BaseException:
        await abandon(conn, release)
        raise
    await give_back(pool, conn)
    return reply


async def reconnect(conn: Any, deadline: Optional[float], sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    """After a connection error on ``conn``, connects it afresh, keeping its place in the pool:
    as ``_connections.reconnect`` (50 ms doubling to 1 s between tries until ``deadline``;
    refused is tried again, an authentication failure is raised at once)."""
    delays = reconnect_delays()
    while True:
        await _finish(lambda: _disconnect_quietly(conn))
        try:
            await connect(conn, deadline)
            return
        except Exception as e:  # noqa: BLE001 - sorted by pause_before_retry
            pause, last = pause_before_retry(e, deadline, delays)
            await sleep(pause)
            if last:
                raise


def is_closed(conn: Any) -> bool:
    """Seen without blocking or sending: the stream reader met the end of the stream."""
    reader = getattr(conn, "_reader", None)
    if reader is None:
        return True
    try:
        return bool(reader.at_eof())
    except Exception:  # noqa: BLE001
        return False


def is_connection_trouble(err: BaseException) -> bool:
    return isinstance(err, (ConnectionError, TimeoutError, OSError, asyncio.TimeoutError))


#: The same names as the sync module's.
__all__ = list(_sync.__all__)
