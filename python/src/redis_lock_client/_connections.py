"""Connections of our own (sync): for waits, bound holds, the watchdog and Redlock.

redis-py's client retries a command after a timeout or a dropped connection (redis-py 8 by
default: a 5 s read timeout and 3 retries). For ``LOCK.ACQUIRE ... WAIT`` that is wrong: the
re-sent command joins the *back* of the FIFO queue. So every command that may wait goes over a
connection made from the client's own connection arguments with no retries and a read timeout
of our choosing (none for an unlimited wait), sent and read directly, never through
``execute_command``. Such connections are kept idle per connection pool for reuse.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from ._common import dedicated_kwargs

#: Idle connections kept per connection pool.
MAX_IDLE = 16

_idle: "weakref.WeakKeyDictionary[Any, List[Tuple[int, Any]]]" = weakref.WeakKeyDictionary()
_idle_lock = threading.Lock()


def pool_of(client: Any, name: Any) -> Any:
    """The connection pool that serves ``name``: the client's, or for a ``RedisCluster`` the
    pool of the master that owns the key's slot."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return pool
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:
        node = get_node(name)
        node_client = getattr(node, "redis_connection", None)
        if node_client is None:
            # Not connected yet: any command makes the cluster client create them.
            client.execute_command("LOCK.INFO", name)
            node = get_node(name)
            node_client = node.redis_connection
        return node_client.connection_pool
    raise TypeError(
        f"expected a redis.Redis or redis.cluster.RedisCluster client, not {type(client).__name__}"
    )


def default_timeout(pool: Any) -> Optional[float]:
    """The pool's own read timeout: for requests that the server answers at once."""
    t = pool.connection_kwargs.get("socket_timeout")
    return None if t is None else float(t)


def new_connection(pool: Any, socket_timeout: Optional[float] = None) -> Any:
    """A connection with no retries; ``socket_timeout`` bounds connecting and its handshake
    (default: the pool's own), and every request sets its own read timeout."""
    if socket_timeout is None:
        socket_timeout = default_timeout(pool)
    return pool.connection_class(**dedicated_kwargs(pool.connection_kwargs, socket_timeout))


def take(pool: Any) -> Any:
    """An idle connection of ours for ``pool``, or a new one (connected when first used)."""
    pid = os.getpid()
    while True:
        with _idle_lock:
            try:
                stack = _idle.get(pool)
            except TypeError:
                stack = None
            item = stack.pop() if stack else None
        if item is None:
            return new_connection(pool)
        owner_pid, conn = item
        if owner_pid != pid:
            continue  # inherited through fork: its socket belongs to the parent
        if is_closed(conn):
            conn.disconnect()
        return conn


def give_back(pool: Any, conn: Any) -> None:
    """Keeps a connection whose last reply was read in full, for the next wait."""
    with _idle_lock:
        try:
            stack = _idle.setdefault(pool, [])
        except TypeError:
            stack = None
        if stack is not None and len(stack) < MAX_IDLE:
            stack.append((os.getpid(), conn))
            return
    conn.disconnect()


def set_read_timeout(conn: Any, timeout: Optional[float]) -> None:
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(timeout)


def read(conn: Any) -> Any:
    return conn.read_response(disconnect_on_error=False)


def call(conn: Any, args: List[Any], timeout: Optional[float]) -> Any:
    """Sends ``args`` and reads the reply within ``timeout`` seconds (None: no limit). An error
    reply raises ``ResponseError`` and leaves the connection usable; any other failure
    (including an interrupt) leaves it to the caller to abandon."""
    conn.send_command(*args)
    set_read_timeout(conn, timeout)
    return read(conn)


def abandon(conn: Any, release: Optional[List[Any]]) -> None:
    """Gives up a connection whose reply was not read: writes ``release`` behind the request
    (the server runs it right after the request, so a grant that comes late is handed back),
    then closes the connection (a request still queued leaves the queue, and a bound hold
    ends). Never raises."""
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


__all__ = [
    "ResponseError",
    "abandon",
    "call",
    "default_timeout",
    "give_back",
    "is_closed",
    "new_connection",
    "pool_of",
    "read",
    "server_name",
    "set_read_timeout",
    "take",
]
