"""The sync face of the loss watcher (the decisions are in ``_watch_core.py``).

``watch`` registers a held lock so that its loss on the server (DEL, expiry, eviction,
failover, bound connection killed) is noticed within milliseconds; ``on_loss(reason)`` is
called once, from the watcher's thread, with a short reason ("deleted", "expired", "taken",
"overwritten"). ``call`` runs one command over the watcher's own connection to the server, so
that the watchdog's renewals do not wake the watcher (the server does not tell a tracking
client about its own writes). ``watch`` returns None and ``call`` raises ``Unavailable`` when
there is no watcher for this client (a cluster, a server known to refuse tracking or the
invalidation channel); ``call`` also raises it while the watcher is not connected, or when its
connection stays busy beyond the call's timeout: callers carry on without it.

``watch`` never waits for I/O (it runs right after a grant): it registers and returns, and the
watcher connects in the background. A server found then to refuse tracking is logged once;
the handles made before are inert and later ``watch`` calls return None.

One watcher per server and process: a daemon thread with two connections of its own (not taken
from the user's pool nor counted in its limit; made from the pool's connection arguments, so
TLS, auth, db and username are the user's; named ``<client_name>:lock-watcher``, or
``redis-lock-watcher`` when the pool sets no name): a RESP2 connection subscribed to
``__redis__:invalidate`` and a command connection with ``CLIENT TRACKING on REDIRECT ... BCAST
NOLOOP``. It starts at the first ``watch`` and ends once nothing was watched for ``IDLE_STOP``
seconds. A ``call`` given up before its reply came (timeout, interrupt) drops the command
connection: the thread sets both connections up again, registers and re-reads every key. An
unexpected error in the thread is logged and handled the same way (with a backoff). A forked
child starts its own.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from . import _watch_core as core
from ._common import to_bytes

logger = logging.getLogger(__name__)

#: The same classes for both faces (an ``except Unavailable`` of either catches both).
Unavailable = core.Unavailable
Handle = core.Handle
_server_of = core.server_of


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers: Dict[Any, "_Watcher"] = {}
        self.refused: Set[Any] = set()
        self.pid = os.getpid()


_registry = _Registry()


def _after_fork() -> None:
    global _registry
    _registry = _Registry()  # the parent's watchers (threads, sockets) are not ours


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _reg() -> _Registry:
    if _registry.pid != os.getpid():
        _after_fork()
    return _registry


class _Watcher:
    def __init__(self, ident: Any, cls: type, kwargs: Dict[str, Any]) -> None:
        self.ident = ident
        self.pid = os.getpid()
        self.cls = cls
        self.kwargs = core.watcher_kwargs(kwargs, aio=False)
        self.core = core.Watcher()
        self.mu = threading.Lock()  # the core, the queued plans
        self.io = threading.Lock()  # the command connection
        self.cmd: Any = None
        self.push: Any = None
        self.broken = False
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.pipe_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"redis-lock-watch {ident[1:3]}", daemon=True)

    # -- called from other threads ------------------------------------------------------------

    def wake(self) -> None:
        with self.pipe_lock:  # never a write to a closed (maybe reused) descriptor
            if self.wake_w < 0:
                return  # the thread ended
            try:
                os.write(self.wake_w, b"x")
            except BlockingIOError:
                pass  # already awake

    def queue(self, plan: core.Plan) -> None:
        if self.core.queue(plan):
            self.wake()

    def call(self, args: List[Any], timeout: Optional[float]) -> Any:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        # The connection may be busy with a re-read out to a slow server: wait for it no longer
        # than the caller's timeout (then the caller uses its own connections).
        if not self.io.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            raise Unavailable()
        try:
            if self.cmd is None or self.broken or not self.core.is_up():
                raise Unavailable()
            conn = self.cmd
            if not _is_open(conn):
                self._break(conn)  # redis-py closed it: never let it connect again untracked
                raise Unavailable()
            try:
                conn.send_command(*args)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not conn.can_read(left):
                    raise TimeoutError(f"no reply from the watcher's connection within {timeout} s")
                return conn.read_response()
            except ResponseError:
                raise  # a whole reply was read: the connection is in step
            except BaseException:
                # A timeout, an interrupt (KeyboardInterrupt from a signal handler), a failure:
                # the reply may still come and would be taken for the next request's. The
                # connection is dropped; the watcher sets both up again and re-reads every key.
                self._break(conn)
                raise
        finally:
            self.io.release()

    def _break(self, conn: Any) -> None:
        """Drops the command connection ``conn`` (the io lock is held)."""
        try:
            conn.disconnect()
        except Exception as e:  # noqa: BLE001 - closing a connection that failed anyway
            logger.debug("redis-lock watcher: closing a connection: %s", e)
        self._mark_broken()

    def _mark_broken(self) -> None:
        self.broken = True
        self.wake()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                try:
                    self._loop()
                    return
                except Exception:  # noqa: BLE001 - logged; keys are watched: connect again
                    logger.exception(
                        "redis-lock loss watcher for %s: unexpected error; setting its connections up again",
                        self.ident[1:3],
                    )
                    self._close()
                    with self.mu:
                        delay = self.core.disconnected()
                    self._sleep(delay)
        except BaseException:  # noqa: BLE001 - logged, never silent; the watcher is dropped
            logger.exception("redis-lock loss watcher for %s ended by an error", self.ident[1:3])
        finally:
            self._close()
            with _reg().lock:
                if _reg().watchers.get(self.ident) is self:
                    del _reg().watchers[self.ident]
            with self.pipe_lock:
                os.close(self.wake_r)
                os.close(self.wake_w)
                self.wake_w = -1

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            reg = _reg()
            with reg.lock, self.mu:
                if core.should_stop(self.core, now):
                    if self.core.refused is not None:
                        reg.refused.add(self.ident)
                        logger.warning(
                            "redis-lock: the server at %s refuses client tracking (%s): a lost lock "
                            "is noticed at its next renewal only",
                            self.ident[1:3],
                            self.core.refused,
                        )
                    if reg.watchers.get(self.ident) is self:
                        del reg.watchers[self.ident]
                    return
            if self.push is None or self.broken:
                self._close()
                try:
                    self._connect()
                except (RedisError, OSError) as e:
                    refused = isinstance(e, ResponseError)
                    with self.mu:
                        if refused:
                            self.core.refused = str(e)
                        delay = self.core.disconnected()
                    self._close()
                    logger.debug("redis-lock watcher: cannot connect to %s: %s", self.ident[1:3], e)
                    if not refused:
                        self._sleep(delay)
                    continue
            with self.mu:
                timeout = core.wait_timeout(self.core, time.monotonic())
            messages = self._wait(timeout)
            with self.mu:
                plan = self.core.step(messages, time.monotonic())
            if plan:
                self._execute(plan)
            else:
                self._check_alive()

    def _sleep(self, delay: float) -> None:
        _wait_readable([self.wake_r], delay)
        self._drain_wake()

    def _drain_wake(self) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass

    def _connect(self) -> None:
        push = self.cls(**self.kwargs)
        self.push = push
        push.connect()
        push.send_command("CLIENT", "ID")
        cid = int(push.read_response())
        push.send_command("SUBSCRIBE", core.INVALIDATE_CHANNEL)
        confirmation = push.read_response()
        core.check_subscribed(confirmation)
        cmd = self.cls(**self.kwargs)
        cmd.connect()
        with self.io:
            self.cmd = cmd
            self.broken = False
        with self.mu:
            plan = self.core.connected(cid)
        self._execute(plan)

    def _close(self) -> None:
        with self.io:
            cmd, self.cmd = self.cmd, None
        push, self.push = self.push, None
        for c in (cmd, push):
            if c is not None:
                try:
                    c.disconnect()
                except Exception as e:  # noqa: BLE001 - closing: what failed is dropped anyway
                    logger.debug("redis-lock watcher: closing a connection: %s", e)

    def _wait(self, timeout: float) -> List[Any]:
        """Waits up to ``timeout`` for invalidations (or a wake-up); returns those read."""
        push = self.push
        out: List[Any] = []
        try:
            sock = getattr(push, "_sock", None)
            if sock is None:  # (``can_read`` would connect it again, unsubscribed)
                raise ConnectionError("the watcher's push connection is closed")
            if not push.can_read(0):
                _wait_readable([sock, self.wake_r], timeout)
                self._drain_wake()
            while push.can_read(0):
                out.append(push.read_response())
        except (RedisError, OSError) as e:
            logger.debug("redis-lock watcher: push connection to %s lost: %s", self.ident[1:3], e)
            self._mark_broken()
        return out

    def _check_alive(self) -> None:
        """An idle command connection closed by the server (a kill, a restart) is noticed by
        polling its socket, without sending anything."""
        if not self.io.acquire(blocking=False):
            return
        try:
            if self.cmd is not None and not _is_open(self.cmd):
                raise ConnectionError("the watcher's command connection is closed")
            if self.cmd is not None and self.cmd.can_read(0):
                raise ConnectionError("unexpected data on the watcher's command connection")
        except (RedisError, OSError) as e:
            logger.debug("redis-lock watcher: command connection to %s lost: %s", self.ident[1:3], e)
            self.broken = True
        finally:
            self.io.release()

    def _execute(self, plan: core.Plan) -> None:
        """Sends the plan's commands and re-reads as one pipeline, hands the replies to the
        core, then calls the callbacks of the locks found lost."""
        requests = list(plan.commands) + self.core.read_requests(plan)
        replies: List[Tuple[Any, Optional[BaseException]]] = []
        failed = False
        unexpected: Optional[BaseException] = None
        with self.io:
            conn = self.cmd
            if conn is None or self.broken or not _is_open(conn):
                # Dropped by ``call`` (or closed by redis-py): redis-py would connect it again,
                # without tracking. The loop sets both connections up again.
                failed = True
            else:
                try:
                    conn.send_packed_command(conn.pack_commands(requests))
                    for _ in requests:
                        try:
                            replies.append((conn.read_response(), None))
                        except ResponseError as e:
                            replies.append((None, e))
                except BaseException as e:
                    logger.debug("redis-lock watcher: command connection to %s lost: %s", self.ident[1:3], e)
                    failed = True
                    self._break(conn)
                    if not isinstance(e, (ConnectionError, TimeoutError, OSError)):
                        unexpected = e
        with self.mu:
            reconnect, lost = self.core.answered(plan, replies, failed)
        if reconnect:
            self.broken = True
        if unexpected is not None:
            raise unexpected
        for reg, reason in lost:
            _report(reg, reason)


def _is_open(conn: Any) -> bool:
    """Whether redis-py's connection ``conn`` has its socket (redis-py connects a closed one
    again by itself at the next command: for the watcher, without tracking)."""
    return getattr(conn, "_sock", None) is not None


def _wait_readable(fds: List[Any], timeout: Optional[float]) -> None:
    """Waits up to ``timeout`` for one of ``fds`` (sockets or descriptors) to be readable
    (``selectors``: no limit on descriptor numbers, unlike ``select.select``)."""
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout)


def _report(reg: core.Registration, reason: str) -> None:
    if reg.cancelled:
        return
    try:
        reg.on_loss(reason)
    except Exception:  # noqa: BLE001 - a callback's failure must not end the watcher
        logger.exception("redis-lock: the on_loss callback for %r raised", reg.key)


def watch(client: Any, name: Any, owner: bytes, on_loss: Callable[[str], None]) -> Optional[Handle]:
    """Watches a lock ``client`` holds on ``name`` for ``owner``: ``on_loss(reason)`` is
    called once, from the watcher's thread, when the server no longer has ``owner`` holding it.
    None when there is no watcher for this client (nothing is called then)."""
    server = _server_of(client)
    if server is None:
        return None
    ident, cls, kwargs = server
    reg_ = _reg()
    reg = core.Registration(to_bytes(name), to_bytes(owner), on_loss)
    with reg_.lock:
        if ident in reg_.refused:
            return None
        w = reg_.watchers.get(ident)
        started = w is None
        if w is None:
            w = _Watcher(ident, cls, kwargs)
            reg_.watchers[ident] = w
        with w.mu:
            w.queue(w.core.add(reg))
        if started:
            w.thread.start()
    # No waiting for I/O here (this runs right after a grant): the watcher connects in the
    # background. A server found to refuse tracking then leaves this handle inert (logged
    # once; ``call`` raises ``Unavailable``), and later ``watch`` calls return None.
    return Handle(w, reg)


def unwatch(handle: Optional[Handle]) -> None:
    """Ends a ``watch`` (no callback after this returns, unless one is running now)."""
    if handle is None:
        return
    w = handle._watcher
    if w.pid != os.getpid():
        return  # a forked child: the parent's watcher (its locks may be held) is not ours
    with w.mu:
        w.queue(w.core.cancel(handle._reg))


def call(client: Any, args: List[Any], timeout: Optional[float]) -> Any:
    """Runs one command over the watcher's command connection to ``client``'s server and
    returns its reply as redis-py's ``Connection.read_response`` does (RESP2, bytes, not
    decoded; an error reply raised as ``ResponseError``). Raises ``Unavailable`` when there is
    no watcher for this client or it is not connected now; a connection failure or no reply
    within ``timeout`` seconds raises redis-py's ``ConnectionError`` / ``TimeoutError`` (the
    command may have run)."""
    server = _server_of(client)
    if server is None:
        raise Unavailable()
    reg_ = _reg()
    with reg_.lock:
        w = reg_.watchers.get(server[0])
    if w is None:
        raise Unavailable()
    return w.call(args, timeout)

