"""The asyncio Redlock (moved out of asyncio.py; being rewritten on the shared core)."""



from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import random
import threading
import time
import weakref
from types import TracebackType
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
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

from ._common import (
    EXTEND_SCRIPT,
    MAX_KEY_MOVES,
    SINGLE_SERVER_MARGIN,
    UNLIMITED_TTL_MS,
    WAIT_READ_MARGIN,
    WAITED_GRANT_MARGIN,
    LockArgumentError,
    LockHeldError,
    LockInfo,
    LockLostError,
    LockRefusedError,
    LockValidityError,
    QuorumUnreachableError,
    Request,
    check_blocking_timeout,
    check_capacity,
    dedicated_kwargs,
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

from .asyncio import OnLost, _Local, _Shared, _abandon, _call, _notify, _stop_watchdog  # noqa: F401 (transitional)
from .asyncio import _take, _give_back, _new_connection, _is_closed, _trouble, _source_of, _default_timeout  # noqa: F401

logger = logging.getLogger(__name__)



class _Outcome:
    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any = None) -> None:
        self.kind = kind
        self.value = value

    def __repr__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}: {self.value}"


class _Instance:
    def __init__(self, client: Any, timeout: float) -> None:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            raise TypeError(f"Redlock takes independent redis.asyncio.Redis clients, not {type(client).__name__}")
        self.pool = pool
        kw = pool.connection_kwargs
        self.name = str(kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}")
        self.timeout = timeout
        self._idle: List[Tuple[int, Any, Any]] = []  # (pid, event loop, connection)

    def take(self) -> Any:
        loop = asyncio.get_running_loop()
        pid = os.getpid()
        while self._idle:
            owner_pid, owner_loop, conn = self._idle.pop()
            # Another process's (fork) or event loop's streams are unusable here.
            if owner_pid == pid and owner_loop is loop and not _is_closed(conn):
                return conn
        return _new_connection(self.pool)

    def put(self, conn: Any) -> None:
        if len(self._idle) < 8:
            self._idle.append((os.getpid(), asyncio.get_running_loop(), conn))
        else:
            asyncio.ensure_future(conn.disconnect())

    async def request(self, args: List[Any], link: Any = None, on_timeout: Optional[List[Any]] = None, keep: bool = False) -> Tuple[_Outcome, Any]:
        conn = link if link is not None else self.take()
        try:
            reply = await _call(conn, args, self.timeout, self.timeout)
        except ResponseError as e:
            out = _Outcome("notowner") if is_notowner(e) else _Outcome("refused", e)
        except BaseException as e:  # noqa: BLE001
            await _abandon(conn, on_timeout)
            if not isinstance(e, Exception):
                raise
            return _Outcome("unreachable", f"{type(e).__name__}: {e}"), None
        else:
            out = _Outcome("ok", reply)
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
        self.links = links
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stopped = False
        self.watchdog: Optional["asyncio.Task[None]"] = None


class Redlock:
    """Redlock over N independent ``redis.asyncio.Redis`` clients: see the sync
    ``redis_lock_client.Redlock`` (same rules, same errors)."""

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
            raise LockArgumentError("Redlock needs a timeout: the lease is what makes a quorum lock safe")
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

    async def __aenter__(self) -> "Redlock":
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning("Redlock was no longer held when exiting context manager.")

    async def _scatter(self, make: Callable[[int], Awaitable[Tuple[_Outcome, Any]]]) -> List[Tuple[_Outcome, Any]]:
        return list(await asyncio.gather(*(make(i) for i in range(len(self.instances)))))

    async def acquire(self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None) -> Literal[True]:
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
            owner = new_token() if self.bind else same_owner
            started = time.monotonic()
            args = req.args(self.name, owner, None)
            rel = release_args(self.name, owner)
            results = await self._scatter(lambda i: self.instances[i].request(args, links[i] if links else None, rel, links is not None))
            elapsed = time.monotonic() - started
            outcomes: List[_Outcome] = []
            for i, (out, conn) in enumerate(results):
                if out.kind == "ok":
                    try:
                        token = grant_token(out.value)
                    except LockError as e:
                        out = _Outcome("refused", e)
                    else:
                        out = _Outcome("held") if token is None else _Outcome("granted", token)
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
                            self.instances[i].put(conn)
                hold = _RedHold(owner, ttl, started + ttl - drift(ttl, self.drift_factor), tokens, kept)
                self.local.token = owner
                self.local.hold = hold
                if self.watchdog:
                    hold.watchdog = asyncio.ensure_future(_redlock_watch(weakref.ref(self), hold))
                return True
            if granted or any(o.kind == "unreachable" for o in outcomes):
                await self._release_everywhere(owner, links, outcomes)
            error = self._classify(outcomes, len(granted))
            if time.monotonic() >= give_up or isinstance(error, LockRefusedError):
                if links is not None:
                    for i, conn in enumerate(links):
                        if conn is not None:
                            self.instances[i].put(conn)
                raise error
            lo, hi = self.retry_delay
            await asyncio.sleep(max(0.0, min(random.uniform(lo, hi), give_up - time.monotonic())))

    async def release(self) -> None:
        owner = self.local.token
        hold: Optional[_RedHold] = getattr(self.local, "hold", None)
        if owner is None or hold is None:
            raise make_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        self.local.token = None
        self.local.hold = None
        await _stop_watchdog(hold)
        outcomes = await self._release_everywhere(owner, hold.links, None)
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

    async def extend(self, additional_time: Optional[float] = None) -> Literal[True]:
        hold: Optional[_RedHold] = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "Cannot extend an unlocked lock", self.name)
        ms = self._ttl_ms if additional_time is None else ttl_ms(additional_time, "additional_time")
        await self._extend(hold, ms)
        return True

    async def reacquire(self) -> Literal[True]:
        return await self.extend(None)

    @property
    def fencing_tokens(self) -> Dict[str, int]:
        hold = getattr(self.local, "hold", None)
        return {} if hold is None else dict(hold.tokens)

    @property
    def validity(self) -> float:
        hold = getattr(self.local, "hold", None)
        if hold is None or self._lost_error(hold) is not None:
            return 0.0
        return max(0.0, float(hold.valid_until) - time.monotonic())

    @property
    def lost(self) -> bool:
        hold = getattr(self.local, "hold", None)
        return hold is not None and self._lost_error(hold) is not None

    def check(self) -> float:
        hold = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = self._lost_error(hold)
        if err is not None:
            raise err
        return max(0.0, float(hold.valid_until) - time.monotonic())

    async def owned(self) -> bool:
        owner = self.local.token
        if owner is None:
            return False
        results = await self._scatter(lambda i: self.instances[i].request(["LOCK.INFO", self.name]))
        n = 0
        for out, _ in results:
            if out.kind == "ok":
                info = parse_info(out.value)
                if info is not None and info.holds(owner):
                    n += 1
        return n >= self.quorum

    async def _release_everywhere(self, owner: bytes, links: Optional[List[Any]], outcomes: Optional[List[_Outcome]]) -> List[_Outcome]:
        args = release_args(self.name, owner)

        async def one(i: int) -> Tuple[_Outcome, Any]:
            link = links[i] if links is not None else None
            if links is not None and link is None:
                if outcomes is not None and outcomes[i].kind not in ("granted", "unreachable"):
                    return _Outcome("notowner"), None
            return await self.instances[i].request(args, link, None)

        results = await self._scatter(one)
        if links is not None:
            for i, (_, conn) in enumerate(results):
                links[i] = conn
        return [o for o, _ in results]

    def _classify(self, outcomes: List[_Outcome], granted: int) -> LockError:
        named = [(self.instances[i].name, repr(o)) for i, o in enumerate(outcomes)]
        if granted >= self.quorum:
            return LockValidityError("Redlock: a quorum granted the lock but no validity was left", self.name, named)
        reachable = sum(1 for o in outcomes if o.kind != "unreachable")
        if reachable < self.quorum:
            return QuorumUnreachableError(
                f"Redlock: only {reachable} of {len(outcomes)} servers answered, {self.quorum} needed", self.name, named
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
            alive = sum(1 for c in hold.links if c is not None and not _is_closed(c))
            if alive < self.quorum:
                hold.loss = LockLostError(
                    f"the connections the hold was bound to closed ({alive} open, {self.quorum} needed)", self.name, "disconnected"
                )
        if hold.loss is not None:
            return hold.loss
        if time.monotonic() >= hold.valid_until:
            return LockLostError("the lock's validity ran out without a confirmed extend", self.name, "expired")
        return None

    async def _extend(self, hold: _RedHold, ms: int) -> None:
        err = self._lost_error(hold)
        if err is not None:
            raise err
        sent = time.monotonic()
        args = ["LOCK.EXTEND", self.name, hold.owner, ms]
        links = hold.links
        # Over pooled connections, never the bound ones (a late reply would be left on them).
        results = await self._scatter(lambda i: self.instances[i].request(args))
        outcomes = [o for o, _ in results]
        ok = sum(1 for o in outcomes if o.kind == "ok")
        gone = sum(
            1
            for i, o in enumerate(outcomes)
            if o.kind in ("notowner", "refused") or (links is not None and (links[i] is None or _is_closed(links[i])))
        )
        named = [(self.instances[i].name, repr(o)) for i, o in enumerate(outcomes)]
        ttl = ms / 1000
        if hold.loss is not None:
            raise hold.loss
        if ok >= self.quorum:
            if time.monotonic() >= hold.valid_until:
                hold.loss = LockLostError("an extend was confirmed only after the validity ran out", self.name, "expired")
                raise hold.loss
            # The last extend sent wins, also one that shortened the lease (extend(t) replaces
            # the ttl on the servers).
            if sent >= hold.lease_sent:
                hold.lease_sent = sent
                hold.valid_until = sent + ttl - drift(ttl, self.drift_factor)
            return
        if len(outcomes) - gone < self.quorum:
            hold.loss = LockLostError(
                "a majority of the servers no longer hold the lock for this owner: " + ", ".join(f"[{s}: {o}]" for s, o in named),
                self.name,
                "notowner",
            )
            raise hold.loss
        raise QuorumUnreachableError("Redlock: too few servers confirmed the extend", self.name, named)


async def _redlock_watch(ref: "weakref.ref[Redlock]", hold: _RedHold) -> None:
    """The Redlock watchdog task; holds its Redlock weakly (stops when it is collected)."""
    interval = hold.ttl / 3
    next_extend = time.monotonic() + interval
    while True:
        rl = None  # no strong reference while sleeping
        await asyncio.sleep(min(0.1, max(0.0, next_extend - time.monotonic())))
        rl = ref()
        if hold.stopped or rl is None:
            return
        if rl._lost_error(hold) is not None:
            break
        if time.monotonic() < next_extend:
            continue
        try:
            await rl._extend(hold, rl._ttl_ms)
            next_extend = time.monotonic() + interval
        except LockLostError:
            break
        except LockError as e:
            logger.warning("redlock watchdog: extend of %r not confirmed: %s", rl.name, e)
            next_extend = time.monotonic() + min(interval, 0.5)
    rl = ref()
    if not hold.stopped and rl is not None:
        err = rl._lost_error(hold)
        if err is not None:
            await _notify(rl.on_lost, err, rl.name)
