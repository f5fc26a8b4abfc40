"""The asyncio face of the loss watcher (the decisions are in ``_watch_core.py``).

``watch`` registers a held lock so that its loss on the server (DEL, expiry, eviction,
failover, bound connection killed) is noticed within milliseconds; ``on_loss(reason)`` is
called once, from the watcher's task (a coroutine function's result is awaited), with a short
reason ("deleted", "expired", "taken", "overwritten"). ``call`` runs one command over the
watcher's own connection to the server, so that the watchdog's renewals do not wake the watcher
(the server does not tell a tracking client about its own writes). ``watch`` returns None and
``call`` raises ``Unavailable`` when there is no watcher for this client (a cluster, a server
known to refuse tracking or the invalidation channel, no running event loop); ``call`` also
raises it while the watcher is not connected, or when its connection stays busy beyond the
call's timeout: callers carry on without it.

One watcher per server and event loop: a task with two connections of its own (not taken from
the user's pool nor counted in its limit; made from the pool's connection arguments, so TLS,
auth, db and username are the user's; named ``<client_name>:lock-watcher``, or
``redis-lock-watcher`` when the pool sets no name): a RESP2 connection subscribed to
``__redis__:invalidate`` (read by a second task) and a command connection with ``CLIENT
TRACKING on REDIRECT ... BCAST NOLOOP``. It starts at the first ``watch`` and ends once nothing
was watched for ``IDLE_STOP`` seconds, or with its loop. ``watch`` never waits for the first
connection: a server found to refuse tracking afterwards leaves the handles made before inert
(logged once), and later ``watch`` calls return None. A ``call`` given up before its reply came
(timeout, cancellation) drops the command connection: the task sets both up again, registers
and re-reads every key; so does an unexpected error in the task (logged, with a backoff).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple, TypeVar

from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from . import _watch_core as core
from ._common import to_bytes

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: The same classes for both faces (an ``except Unavailable`` of either catches both).
Unavailable = core.Unavailable
Handle = core.Handle
_server_of = core.server_of


#: Per event loop: its watchers by server. Servers found to refuse tracking (per process).
_loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[Any, _Watcher]]" = weakref.WeakKeyDictionary()
_refused: Set[Any] = set()
_pid = os.getpid()


def _watchers(loop: asyncio.AbstractEventLoop) -> Dict[Any, "_Watcher"]:
    global _loops, _refused, _pid
    if _pid != os.getpid():  # a forked child: the parent's watchers are not ours
        _loops, _refused, _pid = weakref.WeakKeyDictionary(), set(), os.getpid()
    return _loops.setdefault(loop, {})


class _Watcher:
    def __init__(self, ident: Any, cls: type, kwargs: Dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.ident = ident
        self.pid = os.getpid()
        self.cls = cls
        self.kwargs = core.watcher_kwargs(kwargs, aio=True)
        self.loop = loop
        self.core = core.Watcher()
        self.io = asyncio.Lock()
        self.cmd: Any = None
        self.push: Any = None
        self.messages: List[Any] = []
        self.broken = False
        self.wakeup = asyncio.Event()
        self.reader: Optional["asyncio.Task[None]"] = None
        self.task: "asyncio.Task[None]" = loop.create_task(self._run())

    def queue(self, plan: core.Plan) -> None:
        if self.core.queue(plan):
            self.wakeup.set()

    def _mark_broken(self) -> None:
        self.broken = True
        self.wakeup.set()

    async def call(self, args: List[Any], timeout: Optional[float]) -> Any:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        # The connection may be busy with a re-read out to a slow server: wait for it no longer
        # than the caller's timeout (then the caller uses its own connections).
        if not await _acquire(self.io, timeout):
            raise Unavailable()
        try:
            if self.cmd is None or self.broken or not self.core.is_up():
                raise Unavailable()
            conn = self.cmd
            if not _is_open(conn):
                self._mark_broken()  # redis-py closed it: never let it connect again untracked
                raise Unavailable()
            try:
                await conn.send_command(*args)
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return await asyncio.wait_for(conn.read_response(), left)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"no reply from the watcher's connection within {timeout} s") from None
            except ResponseError:
                raise  # a whole reply was read: the connection is in step
            except BaseException:
                # A timeout, a cancellation (``wait_for`` around an extend, a release stopping
                # its watchdog), a failure: the reply may still come, and redis-py (which closed
                # the connection) would connect it again without tracking. The task sets both
                # connections up again and re-reads every key.
                self._mark_broken()
                raise
        finally:
            self.io.release()

    # -- the task -----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                try:
                    await self._loop()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - logged; keys are watched: connect again
                    logger.exception(
                        "redis-lock loss watcher for %s: unexpected error; setting its connections up again",
                        self.ident[1:3],
                    )
                    await self._close()
                    await self._sleep(self.core.disconnected())
        except asyncio.CancelledError:
            raise
        except BaseException:  # noqa: BLE001 - logged, never silent; the watcher is dropped
            logger.exception("redis-lock loss watcher for %s ended by an error", self.ident[1:3])
        finally:
            watchers = _watchers(self.loop)
            if watchers.get(self.ident) is self:
                del watchers[self.ident]
            await self._close()

    async def _loop(self) -> None:
        while True:
            if core.should_stop(self.core, time.monotonic()):
                if self.core.refused is not None:
                    _refused.add(self.ident)
                    logger.warning(
                        "redis-lock: the server at %s refuses client tracking (%s): a lost lock "
                        "is noticed at its next renewal only",
                        self.ident[1:3],
                        self.core.refused,
                    )
                return
            if self.push is None or self.broken:
                await self._close()
                try:
                    await self._connect()
                except (RedisError, OSError) as e:
                    if isinstance(e, ResponseError):
                        self.core.refused = str(e)
                    delay = self.core.disconnected()
                    await self._close()
                    logger.debug("redis-lock watcher: cannot connect to %s: %s", self.ident[1:3], e)
                    await self._sleep(delay)
                    continue
            await self._sleep(core.wait_timeout(self.core, time.monotonic()))
            messages, self.messages = self.messages, []
            plan = self.core.step(messages, time.monotonic())
            if plan:
                await self._execute(plan)
            else:
                self._check_alive()

    async def _sleep(self, timeout: float) -> None:
        if not self.wakeup.is_set():
            # Not ``wait_for``: before Python 3.12 it can swallow a cancellation that lands
            # as the wake-up comes (a loop closing right after a DEL or FLUSHDB), and this
            # task would then run on until its idle stop, holding up the loop's shutdown.
            waiter = asyncio.ensure_future(self.wakeup.wait())
            try:
                await asyncio.wait({waiter}, timeout=timeout)
            finally:
                waiter.cancel()
        self.wakeup.clear()

    async def _connect(self) -> None:
        cid, cmd = await _isolated(self._open())
        async with self.io:
            self.cmd = cmd
            self.broken = False
        plan = self.core.connected(cid)
        self.reader = self.loop.create_task(self._read_pushes(self.push))
        await self._execute(plan)

    async def _open(self) -> Tuple[int, Any]:
        """The two connections: the push connection subscribed (kept in ``self.push``), and
        the command connection (returned with the push connection's client id)."""
        push = self.cls(**dict(self.kwargs, socket_timeout=None))
        self.push = push
        await push.connect()
        await push.send_command("CLIENT", "ID")
        cid = int(await asyncio.wait_for(push.read_response(), core.IO_TIMEOUT))
        await push.send_command("SUBSCRIBE", core.INVALIDATE_CHANNEL)
        core.check_subscribed(await asyncio.wait_for(push.read_response(), core.IO_TIMEOUT))
        cmd = self.cls(**self.kwargs)
        try:
            await cmd.connect()
        except BaseException:
            await cmd.disconnect()
            raise
        return cid, cmd

    async def _read_pushes(self, push: Any) -> None:
        try:
            while True:
                message = await push.read_response()  # before looking up self.messages
                self.messages.append(message)
                self.wakeup.set()
        except (RedisError, OSError) as e:
            logger.debug("redis-lock watcher: push connection to %s lost: %s", self.ident[1:3], e)
        except Exception:  # noqa: BLE001 - logged; the connections are set up again
            logger.exception("redis-lock watcher: reading the push connection to %s", self.ident[1:3])
        self._mark_broken()

    async def _close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            # Waits for it without taking its cancellation for ours (a cancellation of this
            # task still comes through).
            await asyncio.wait([reader])
        cmd, self.cmd = self.cmd, None
        push, self.push = self.push, None
        for c in (cmd, push):
            if c is not None:
                try:
                    await c.disconnect()
                except Exception as e:  # noqa: BLE001 - closing: what failed is dropped anyway
                    logger.debug("redis-lock watcher: closing a connection: %s", e)

    def _check_alive(self) -> None:
        """An idle command connection closed by the server (a kill, a restart) is noticed from
        its stream reader's end-of-file, without reading or sending anything."""
        if self.cmd is None or self.io.locked():
            return
        reader = getattr(self.cmd, "_reader", None)
        if reader is None or reader.at_eof():
            logger.debug("redis-lock watcher: command connection to %s closed by the server", self.ident[1:3])
            self.broken = True

    async def _execute(self, plan: core.Plan) -> None:
        requests = list(plan.commands) + self.core.read_requests(plan)
        replies: List[Tuple[Any, Optional[BaseException]]] = []
        failed = False
        unexpected: Optional[BaseException] = None
        async with self.io:
            conn = self.cmd
            if conn is None or self.broken or not _is_open(conn):
                # Given up by a cancelled ``call`` (or closed by redis-py): redis-py would
                # connect it again, without tracking. The loop sets both connections up again.
                failed = True
            else:
                try:
                    await _isolated(_exchange(conn, requests, replies))
                except BaseException as e:
                    logger.debug("redis-lock watcher: command connection to %s lost: %r", self.ident[1:3], e)
                    failed = True
                    self._mark_broken()
                    if not isinstance(e, (ConnectionError, TimeoutError, OSError)):
                        unexpected = e  # a cancellation of this task, or a bug: raised below
        reconnect, lost = self.core.answered(plan, replies, failed)
        if reconnect:
            self.broken = True
        if unexpected is not None:
            raise unexpected
        for reg, reason in lost:
            await _report(reg, reason)


async def _exchange(conn: Any, requests: List[Any], replies: List[Tuple[Any, Optional[BaseException]]]) -> None:
    """Sends ``requests`` in one write and reads their replies into ``replies``."""
    await conn.send_packed_command(conn.pack_commands(requests))
    for _ in requests:
        try:
            replies.append((await conn.read_response(), None))
        except ResponseError as e:
            replies.append((None, e))


async def _isolated(aw: Awaitable[T]) -> T:
    """Awaits ``aw`` in a task of its own. redis-py's I/O can turn a cancellation that lands
    inside it into a connection error, or lose it (a ``wait_for`` or a timeout inside it,
    before Python 3.12); the watcher's task would then run on to its idle stop, holding up its
    loop's shutdown (seen at pytest-asyncio's loop teardown: 10 s). Awaited through
    ``asyncio.wait``, a cancellation always reaches the caller; ``aw`` is cancelled with it
    and given a bounded time to stop."""
    inner = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({inner})
    except BaseException:
        inner.cancel()
        await asyncio.wait({inner}, timeout=core.IO_TIMEOUT)
        raise
    return inner.result()


def _is_open(conn: Any) -> bool:
    """Whether redis-py's connection ``conn`` is connected (redis-py connects a closed one
    again by itself at the next command: for the watcher, without tracking)."""
    return getattr(conn, "_reader", None) is not None and getattr(conn, "_writer", None) is not None


async def _acquire(lock: asyncio.Lock, timeout: Optional[float]) -> bool:
    """Takes ``lock`` within ``timeout`` seconds (None: no bound); False when it did not."""
    if timeout is None:
        await lock.acquire()
        return True
    try:
        # (Not 0: ``wait_for`` with 0 gives up even on a free lock before Python 3.12.)
        await asyncio.wait_for(lock.acquire(), max(0.001, timeout))
    except asyncio.TimeoutError:
        return False
    return True


async def _report(reg: core.Registration, reason: str) -> None:
    if reg.cancelled:
        return
    try:
        result = reg.on_loss(reason)
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001 - a callback's failure must not end the watcher
        logger.exception("redis-lock: the on_loss callback for %r raised", reg.key)


def watch(client: Any, name: Any, owner: bytes, on_loss: Callable[[str], Any]) -> Optional[Handle]:
    """Watches a lock ``client`` holds on ``name`` for ``owner``: ``on_loss(reason)`` is
    called once, from the watcher's task in the running loop, when the server no longer has
    ``owner`` holding it. None when there is no watcher for this client or no running loop."""
    server = _server_of(client)
    if server is None:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    ident, cls, kwargs = server
    watchers = _watchers(loop)
    if ident in _refused:
        return None
    w = watchers.get(ident)
    if w is None or w.task.done():
        w = watchers[ident] = _Watcher(ident, cls, kwargs, loop)
    reg = core.Registration(to_bytes(name), to_bytes(owner), on_loss)
    w.queue(w.core.add(reg))
    return Handle(w, reg)


def unwatch(handle: Optional[Handle]) -> None:
    """Ends a ``watch`` (no callback after this returns, unless one is running now). From
    another thread than the watcher's loop, the registration ends soon after (in the loop)."""
    if handle is None:
        return
    w = handle._watcher
    if w.pid != os.getpid():
        return  # a forked child: the parent's watcher is not ours
    handle._reg.cancelled = True  # no callback from now on
    try:
        running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is w.loop:
        w.queue(w.core.cancel(handle._reg))
    elif not w.loop.is_closed():
        try:
            w.loop.call_soon_threadsafe(lambda: w.queue(w.core.cancel(handle._reg)))
        except RuntimeError:
            pass  # the loop closed meanwhile: its watcher is gone with it


async def call(client: Any, args: List[Any], timeout: Optional[float]) -> Any:
    """Runs one command over the watcher's command connection to ``client``'s server in this
    loop and returns its reply as redis-py's ``read_response`` does (RESP2, bytes, not decoded;
    an error reply raised as ``ResponseError``). Raises ``Unavailable`` when there is no
    watcher for this client or it is not connected now; a connection failure or no reply
    within ``timeout`` seconds raises redis-py's ``ConnectionError`` / ``TimeoutError`` (the
    command may have run)."""
    server = _server_of(client)
    if server is None:
        raise Unavailable()
    w = _watchers(asyncio.get_running_loop()).get(server[0])
    if w is None:
        raise Unavailable()
    return await w.call(args, timeout)
