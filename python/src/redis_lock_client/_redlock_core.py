"""Redlock's protocol, written once for the sync and the asyncio face (sans-IO).

Every routine here is a generator driven by ``_drive.drive`` (sync) or ``_drive.drive_async``
(asyncio): it ``yield``s an effect and gets its result back (or its exception thrown in). The
one effect that talks to the servers is :class:`Scatter`: "send these requests to these servers
at once and give me every answer" (the sync face runs it in a thread pool, the asyncio face with
``gather``). Everything about lock semantics lives here: the rounds of an acquire, validity =
ttl - elapsed - drift, quorum = N/2+1, releasing everywhere on failure, the typed per-server
outcomes and their classification into ``LockHeldError`` / ``QuorumUnreachableError`` /
``LockValidityError``, extend with a quorum, the watchdog's loop, the backoff and its warnings,
and the judgement of a loss. The only thing read from the outside world is ``time.monotonic()``
(and the random source of the backoff's jitter, replaceable for tests).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Set, Tuple, Union

from redis.exceptions import LockError, LockNotOwnedError, ResponseError

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
    info_args,
    owner_form_refused,
    parse_info,
    release_args,
    ttl_ms,
)
from ._drive import Steps

__all__ = ["Outcome", "RedlockCore", "RedlockBase", "InstanceBase", "Hold", "backoff_delay"]

#: Called once when a held lock is found lost (the asyncio face also takes a coroutine function).
OnLost = Callable[[LockLostError], Any]

#: The longest pause between two attempts that failed for want of a quorum of answers
#: (seconds; a larger ``retry_delay`` maximum raises it to that).
BACKOFF_CAP = 1.0
#: The first such pause is drawn from a window of ``max(retry_delay max, BACKOFF_BASE)``
#: seconds; the window doubles with every further failure, up to :data:`BACKOFF_CAP`.
BACKOFF_BASE = 0.02
#: A retrying acquire without a quorum logs a WARNING at once, then at most once per this many
#: seconds (per Redlock object).
WARN_INTERVAL = 10.0
#: How often the watchdog looks at the hold between renewals (seconds; local checks only).
WATCH_STEP = 0.1


# ----------------------------------------------------------------------------------------------
# Effects (what a face carries out)


@dataclass(frozen=True)
class Send:
    """One request to server number ``server``: over ``link`` (a bound hold's connection) or a
    pooled connection, kept afterwards when ``keep`` (a bound acquire); ``behind`` is written
    after a request whose answer never came (a late grant is then handed back); ``watcher``:
    over the loss watcher's connection when there is one (renewals)."""

    server: int
    args: Tuple[Any, ...]
    link: Any = None
    behind: Optional[Tuple[Any, ...]] = None
    keep: bool = False
    watcher: bool = False


@dataclass(frozen=True)
class Answer:
    """What came back for one :class:`Send`: the ``reply``, or the ``error`` raised (a
    ``ResponseError`` is the server's error reply, anything else means no answer), and the
    connection still usable when the request went over a link or asked to ``keep`` it."""

    reply: Any = None
    error: Optional[BaseException] = None
    conn: Any = None


@dataclass(frozen=True)
class Scatter:
    """Send every request at once; the result is one :class:`Answer` per send, in order."""

    sends: Tuple[Send, ...]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Park:
    """Give these ``(server, connection)`` back to the servers' idle connections."""

    conns: Tuple[Tuple[int, Any], ...]


@dataclass(frozen=True)
class Log:
    level: int
    message: str
    args: Tuple[Any, ...] = ()


@dataclass(frozen=True)
class Watch:
    """Register server ``server``'s hold with the loss watcher; the result is its handle.
    The face routes the watcher's report to :meth:`RedlockCore.server_lost`."""

    server: int
    hold: "Hold"


@dataclass(frozen=True)
class Unwatch:
    handles: Tuple[Any, ...]


@dataclass(frozen=True)
class StartWatchdog:
    hold: "Hold"


@dataclass(frozen=True)
class StopWatchdog:
    hold: "Hold"


@dataclass(frozen=True)
class Pause:
    """The watchdog waits ``seconds``, or less when the hold's alarm goes (a loss reported, a
    release)."""

    hold: "Hold"
    seconds: float


@dataclass(frozen=True)
class Notify:
    """Hand ``error`` to the user's ``on_lost``."""

    error: LockLostError


class Gone(Exception):
    """Thrown into the watchdog by a face whose Redlock object was garbage-collected."""


# ----------------------------------------------------------------------------------------------
# Outcomes


@dataclass(frozen=True)
class Outcome:
    """What one server answered: ``kind`` is ``granted`` (``value``: the fencing token),
    ``held``, ``free``, ``ok``, ``notowner``, ``refused`` (``value``: the error) or
    ``unreachable`` (``value``: why)."""

    kind: str
    value: Any = None

    def __repr__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}: {self.value}"


def plain_outcome(answer: Answer) -> Outcome:
    """``ok`` with the reply, ``notowner``, ``refused`` or ``unreachable``."""
    err = answer.error
    if err is None:
        return Outcome("ok", answer.reply)
    if isinstance(err, ResponseError):
        return Outcome("notowner") if is_notowner(err) else Outcome("refused", err)
    return Outcome("unreachable", f"{type(err).__name__}: {err}")


def acquire_outcome(answer: Answer) -> Outcome:
    """An acquire's answer: ``granted`` with its token, ``held``, or as :func:`plain_outcome`."""
    out = plain_outcome(answer)
    if out.kind != "ok":
        return out
    try:
        token = grant_token(out.value)
    except LockError as e:
        return Outcome("refused", e)
    return Outcome("held") if token is None else Outcome("granted", token)


def info_outcome(answer: Answer, owner: Optional[bytes] = None) -> Outcome:
    """A LOCK.INFO answer: ``held`` when someone holds the lock there (with ``owner``: when
    that owner does), else ``free``; or as :func:`plain_outcome`."""
    out = plain_outcome(answer)
    if out.kind != "ok":
        return out
    try:
        info = parse_info(out.value)
    except (LockError, TypeError, ValueError) as e:
        return Outcome("refused", e)
    if info is None:
        return Outcome("free")
    held = info.holds(owner) if owner is not None else bool(info.holders)
    return Outcome("held" if held else "free")


# ----------------------------------------------------------------------------------------------
# Pure arithmetic


def quorum_of(n: int) -> int:
    return n // 2 + 1


def validity_left(ttl: float, elapsed: float, drift_factor: float) -> float:
    """Seconds a lease of ``ttl`` granted over ``elapsed`` seconds is certainly held."""
    return ttl - elapsed - drift(ttl, drift_factor)


def backoff_delay(failures: int, retry_delay: Tuple[float, float], u: float) -> float:
    """The pause after ``failures`` (>= 1) attempts in a row that got no quorum of answers,
    for a random ``u`` in [0, 1): the window starts at ``max(retry_delay max, BACKOFF_BASE)``
    and doubles each time up to ``BACKOFF_CAP``; the pause is in the upper half of the window
    (at least ``retry_delay`` min), so a steady outage costs at most 2 attempts a second."""
    lo, hi = retry_delay
    cap = max(BACKOFF_CAP, hi)
    window = min(cap, max(hi, BACKOFF_BASE) * 2.0 ** min(max(failures, 1) - 1, 60))
    return max(lo, window / 2 + u * window / 2)


def contention_delay(retry_delay: Tuple[float, float], u: float) -> float:
    """The pause after an attempt that found the lock held elsewhere: ``retry_delay``'s
    range, as documented (the holder may release at any moment)."""
    lo, hi = retry_delay
    return lo + u * (hi - lo)


def classify(outcomes: Sequence[Outcome], names: Sequence[str], quorum: int, lock_name: Any) -> LockError:
    """Why an attempt that did not make a lock failed."""
    named = [(names[i], repr(o)) for i, o in enumerate(outcomes)]
    granted = sum(1 for o in outcomes if o.kind == "granted")
    if granted >= quorum:
        return LockValidityError("Redlock: a quorum granted the lock but no validity was left", lock_name, named)
    reachable = sum(1 for o in outcomes if o.kind != "unreachable")
    if reachable < quorum:
        return QuorumUnreachableError(
            f"Redlock: only {reachable} of {len(outcomes)} servers answered, {quorum} needed", lock_name, named
        )
    refusals = [o.value for o in outcomes if o.kind == "refused"]
    if refusals:
        err = refusals[0]
        return map_response_error(err, lock_name) if isinstance(err, ResponseError) else err
    return LockHeldError(
        f"Redlock: the lock is held by someone else ({granted} of {len(outcomes)} granted, {quorum} needed)",
        lock_name,
        named,
    )


def failed_servers(outcomes: Sequence[Outcome], names: Sequence[str]) -> str:
    """``[server: why]`` for every server that did not answer or refused."""
    return ", ".join(f"[{names[i]}: {o!r}]" for i, o in enumerate(outcomes) if o.kind in ("unreachable", "refused"))


# ----------------------------------------------------------------------------------------------
# A hold


class Hold:
    """One acquired Redlock: which servers granted it (``tokens``, ``granted``), the bound
    connections (``links``, one per server, None where there is none), the watcher's handles,
    the servers the watcher reported lost (``down``: their reasons) and the local lease
    (``valid_until``, monotonic). ``alarm`` (an event with ``set()``: wakes the watchdog) and
    ``task`` (the watchdog's thread or task) belong to the face."""

    def __init__(
        self,
        owner: bytes,
        ttl: float,
        valid_until: float,
        granted: Sequence[bool],
        tokens: Dict[str, int],
        links: Optional[List[Any]],
    ) -> None:
        self.owner = owner
        self.ttl = ttl
        self.valid_until = valid_until
        self.granted = tuple(granted)
        self.tokens = tokens
        self.links = links
        self.down: List[Optional[str]] = [None] * len(self.granted)
        self.handles: List[Any] = [None] * len(self.granted)
        self.loss: Optional[LockLostError] = None
        self.lease_sent = -math.inf  # when the extend that set valid_until was sent
        self.stopped = False
        self.mutex = threading.Lock()  # the watcher reports from its own thread
        self.alarm: Any = None
        self.task: Any = None

    def set_loss(self, err: LockLostError) -> LockLostError:
        with self.mutex:
            if self.loss is None:
                self.loss = err
            return self.loss


# ----------------------------------------------------------------------------------------------
# The routines


class RedlockCore:
    """The protocol of one Redlock object (its settings; no connection, no face)."""

    def __init__(
        self,
        name: Union[str, bytes],
        servers: Sequence[str],
        ttl_ms_: int,
        bind: bool,
        delay_ms_: int,
        retry_delay: Tuple[float, float],
        drift_factor: float,
        watchdog: bool,
        closed: Callable[[Any], bool],
    ) -> None:
        self.name = name
        self.servers = list(servers)
        self.n = len(self.servers)
        self.quorum = quorum_of(self.n)
        self.ttl_ms = ttl_ms_
        self.ttl = ttl_ms_ / 1000
        self.bind = bind
        self.request = Request("LOCK.ACQUIRE", ttl_ms_, None, bind, delay_ms_)
        self.retry_delay = retry_delay
        self.drift_factor = drift_factor
        self.watchdog = watchdog
        self.closed = closed
        #: The jitter's random source (tests replace it).
        self.random: Callable[[], float] = random.random
        self._warned_at = -math.inf
        #: The servers that refused ``LOCK.INFO key OWNER owner`` (a module before 0.4.0):
        #: they get the plain form from then on.
        self.plain_info: Set[int] = set()
        self._unwarned = 0

    # -- acquire ------------------------------------------------------------------------------

    def acquire(self, blocking: bool, blocking_timeout: Optional[float]) -> "Steps[Hold]":
        """Rounds until a quorum grants within its validity, or the error. Every round asks all
        servers at once, without WAIT (waiting on one server while holding another could
        deadlock); a failed round is released where it may have been granted."""
        bt = check_blocking_timeout(blocking_timeout)
        give_up = time.monotonic() + (0 if not blocking else (bt if bt is not None else math.inf))
        same_owner = new_token()
        links: Optional[List[Any]] = [None] * self.n if self.bind else None
        failures = 0  # attempts in a row without a quorum of answers
        while True:
            # A bound attempt takes a new owner: a hold of an earlier attempt still bound to a
            # connection given up on is then never re-entered.
            owner = new_token() if self.bind else same_owner
            rel = tuple(release_args(self.name, owner))
            args = tuple(self.request.args(self.name, owner, None))
            sends = tuple(
                Send(i, args, links[i] if links is not None else None, rel, links is not None) for i in range(self.n)
            )
            started = time.monotonic()
            try:
                answers: List[Answer] = yield Scatter(sends)
            except BaseException:
                # Interrupted while the requests were out (the face waited for them and closed
                # what they kept): release everywhere over fresh connections, then go on.
                yield from self._release(owner, None, None)
                raise
            elapsed = time.monotonic() - started
            outcomes = [acquire_outcome(a) for a in answers]
            if links is not None:
                links = [a.conn for a in answers]
            granted = [o.kind == "granted" for o in outcomes]
            if sum(granted) >= self.quorum and validity_left(self.ttl, elapsed, self.drift_factor) > 0:
                return (yield from self._granted(owner, started, outcomes, links))
            if any(granted) or any(o.kind == "unreachable" for o in outcomes):
                yield from self._release(owner, links, outcomes)
            error = classify(outcomes, self.servers, self.quorum, self.name)
            now = time.monotonic()
            if now >= give_up or isinstance(error, LockRefusedError):
                yield from self._park(links)
                raise error
            if isinstance(error, LockHeldError):
                failures = 0
                delay = min(contention_delay(self.retry_delay, self.random()), give_up - now)
            else:
                failures += 1
                delay = min(backoff_delay(failures, self.retry_delay, self.random()), give_up - now)
                yield from self._warn(outcomes, error, failures, delay, now)
            try:
                yield Sleep(max(0.0, delay))
            except BaseException:
                yield from self._park(links)  # interrupted between rounds: nothing is held
                raise

    def _granted(self, owner: bytes, started: float, outcomes: List[Outcome], links: Optional[List[Any]]) -> "Steps[Hold]":
        granted = [o.kind == "granted" for o in outcomes]
        tokens = {self.servers[i]: int(o.value) for i, o in enumerate(outcomes) if granted[i]}
        kept: Optional[List[Any]] = None
        if links is not None:
            kept = [c if granted[i] else None for i, c in enumerate(links)]
            yield from self._park([c if not granted[i] else None for i, c in enumerate(links)])
        hold = Hold(owner, self.ttl, started + self.ttl - drift(self.ttl, self.drift_factor), granted, tokens, kept)
        try:
            for i in range(self.n):
                if granted[i] and self.watchdog:  # as for Lock: only a hold with a watchdog
                    hold.handles[i] = yield Watch(i, hold)
            if time.monotonic() >= hold.valid_until:
                # The validity ran out while the watches were set up (a stalled process or
                # server): never hand out a hold that is not one.
                raise LockValidityError(
                    "Redlock: a quorum granted the lock but its validity ran out before the acquire returned",
                    self.name,
                    [(self.servers[i], repr(o)) for i, o in enumerate(outcomes)],
                )
            if self.watchdog:
                yield StartWatchdog(hold)
        except BaseException:
            try:
                yield from self.release(hold)
            except LockError:
                pass  # the interrupt is what the caller must see
            raise
        return hold

    def _warn(self, outcomes: List[Outcome], error: LockError, failures: int, delay: float, now: float) -> "Steps[None]":
        """A WARNING at the first retry without a quorum, then at most every WARN_INTERVAL."""
        if now - self._warned_at < WARN_INTERVAL:
            self._unwarned += 1
            return
        since = self._unwarned
        self._warned_at, self._unwarned = now, 0
        yield Log(
            logging.WARNING,
            "Redlock %r: no quorum (%s); retrying in %.3f s (attempt %d without a quorum%s): %s",
            (
                self.name,
                type(error).__name__,
                delay,
                failures,
                f", {since} more since the last warning" if since else "",
                failed_servers(outcomes, self.servers) or str(error),
            ),
        )

    # -- release ------------------------------------------------------------------------------

    def _release(self, owner: bytes, links: Optional[List[Any]], outcomes: Optional[List[Outcome]]) -> "Steps[List[Outcome]]":
        """LOCK.RELEASE ... ALL on every server (after a failed round: only where it was granted
        or did not answer); over a link where there is one. Updates ``links``."""
        rel = tuple(release_args(self.name, owner))
        targets = [
            i for i in range(self.n) if outcomes is None or outcomes[i].kind in ("granted", "unreachable")
        ]
        sends = tuple(Send(i, rel, links[i] if links is not None else None) for i in targets)
        answers: List[Answer] = (yield Scatter(sends)) if sends else []
        result = [Outcome("notowner")] * self.n
        for i, a in zip(targets, answers):
            result[i] = plain_outcome(a)
            if links is not None and links[i] is not None:
                links[i] = a.conn
        return result

    def _unwatch(self, hold: Hold) -> "Steps[None]":
        with hold.mutex:
            handles = tuple(h for h in hold.handles if h is not None)
            hold.handles = [None] * self.n
        if handles:
            yield Unwatch(handles)

    def _park(self, links: Optional[List[Any]]) -> "Steps[None]":
        if links is not None and any(c is not None for c in links):
            yield Park(tuple((i, c) for i, c in enumerate(links) if c is not None))

    def release(self, hold: Hold) -> "Steps[None]":
        """Stops the watchdog and the watches, releases everywhere; ``LockNotOwnedError`` when a
        quorum says this owner no longer held it."""
        hold.stopped = True
        yield StopWatchdog(hold)
        yield from self._unwatch(hold)
        links = hold.links
        outcomes = yield from self._release(hold.owner, links, None)
        yield from self._park(links)
        gone = sum(1 for o in outcomes if o.kind == "notowner")
        if gone >= self.quorum:
            raise make_error(
                LockNotOwnedError,
                f"Cannot release a lock that's no longer owned (on {gone} of {self.n} servers)",
                self.name,
            )

    # -- extend -------------------------------------------------------------------------------

    def extend(self, hold: Hold, ms: int) -> "Steps[None]":
        """LOCK.EXTEND on every server (over pooled or the watcher's connections, never the
        bound ones: a late reply would be left on them). Confirmed by a quorum within the
        validity: the lease is now ``ms`` from when it was sent (the last extend sent wins,
        also a shorter one). Too few still holding: lost. Else ``QuorumUnreachableError``."""
        err = self.loss(hold)
        if err is not None:
            raise err
        sent = time.monotonic()
        args = ("LOCK.EXTEND", self.name, hold.owner, ms)
        answers: List[Answer] = yield Scatter(tuple(Send(i, args, watcher=True) for i in range(self.n)))
        outcomes = [plain_outcome(a) for a in answers]
        named = [(self.servers[i], repr(o)) for i, o in enumerate(outcomes)]
        ok = sum(1 for o in outcomes if o.kind == "ok")
        gone = sum(
            1
            for i, o in enumerate(outcomes)
            if o.kind in ("notowner", "refused") or not self._server_holds(hold, i)
        )
        ttl = ms / 1000
        with hold.mutex:
            if hold.loss is not None:
                raise hold.loss
            if ok >= self.quorum:
                if time.monotonic() >= hold.valid_until:
                    hold.loss = LockLostError("an extend was confirmed only after the validity ran out", self.name, "expired")
                    raise hold.loss
                if sent >= hold.lease_sent:
                    hold.lease_sent = sent
                    hold.valid_until = sent + ttl - drift(ttl, self.drift_factor)
                return
        if self.n - gone < self.quorum:
            raise hold.set_loss(
                LockLostError(
                    "a majority of the servers no longer hold the lock for this owner: "
                    + ", ".join(f"[{s}: {o}]" for s, o in named),
                    self.name,
                    "notowner",
                )
            )
        raise QuorumUnreachableError("Redlock: too few servers confirmed the extend", self.name, named)

    # -- questions ----------------------------------------------------------------------------

    def count_held(self, owner: Optional[bytes]) -> "Steps[Tuple[int, List[Outcome]]]":
        """LOCK.INFO everywhere: how many servers show the lock held (by ``owner``, or by
        anyone), and every server's outcome."""
        # With ``owner``: that owner's entry alone (``OWNER``, O(1) on the server), except on
        # the servers known to refuse the option (a module before 0.4.0), which get the plain
        # form, as does a server that refuses it now.
        sends = tuple(
            Send(i, info_args(self.name, owner, i in self.plain_info)) for i in range(self.n)
        )
        answers: List[Answer] = list((yield Scatter(sends)))
        if owner is not None:
            again = [
                i for i, a in enumerate(answers)
                if i not in self.plain_info and a.error is not None and owner_form_refused(a.error)
            ]
            if again:
                self.plain_info.update(again)
                retried: List[Answer] = yield Scatter(
                    tuple(Send(i, info_args(self.name, None, True)) for i in again)
                )
                for i, a in zip(again, retried):
                    answers[i] = a
        outcomes = [info_outcome(a, owner) for a in answers]
        return sum(1 for o in outcomes if o.kind == "held"), outcomes

    def owned(self, owner: Optional[bytes]) -> "Steps[bool]":
        """Whether ``owner`` holds the lock on a quorum right now."""
        if owner is None:
            return False
        held, _ = yield from self.count_held(owner)
        return held >= self.quorum

    def locked(self) -> "Steps[bool]":
        """True when a quorum of servers show the lock held by anyone, False when too few can
        (the servers that did not answer counted as holding it); when the answers cannot tell,
        the refusal or ``QuorumUnreachableError``."""
        held, outcomes = yield from self.count_held(None)
        return self.judge_locked(held, outcomes)

    def judge_locked(self, held: int, outcomes: Sequence[Outcome]) -> bool:
        if held >= self.quorum:
            return True
        unknown = [o for o in outcomes if o.kind not in ("held", "free")]
        if held + len(unknown) < self.quorum:
            return False
        for o in unknown:
            if o.kind == "refused":
                err = o.value
                raise map_response_error(err, self.name) if isinstance(err, ResponseError) else err
        raise QuorumUnreachableError(
            f"Redlock: cannot tell whether the lock is held ({held} hold it, {len(unknown)} did not answer, "
            f"{self.quorum} needed)",
            self.name,
            [(self.servers[i], repr(o)) for i, o in enumerate(outcomes)],
        )

    # -- loss ---------------------------------------------------------------------------------

    def _server_holds(self, hold: Hold, i: int) -> bool:
        """Whether server ``i`` still holds it as far as this client knows: it granted, the
        watcher reported no loss there, and (bound) its connection is open."""
        if not hold.granted[i] or hold.down[i] is not None:
            return False
        if hold.links is None:
            return True
        link = hold.links[i]
        return link is not None and not self.closed(link)

    def _why_not(self, hold: Hold, i: int) -> str:
        """Why server ``i`` no longer holds it: a bound connection seen closed is the cause
        (the watcher's report of the same release, "deleted" or "expired", only follows it),
        else the watcher's reason."""
        if hold.links is not None:
            link = hold.links[i]
            if link is None or self.closed(link):
                return "disconnected"
        return hold.down[i] or "disconnected"

    def loss(self, hold: Hold) -> Optional[LockLostError]:
        """The hold's loss, judged now: fewer than a quorum of servers still hold it (the
        watcher's reports, bound connections closed), or the validity ran out."""
        if hold.loss is not None:
            return hold.loss
        holding = [self._server_holds(hold, i) for i in range(self.n)]
        if sum(holding) < self.quorum:
            why: List[str] = []
            for i in range(self.n):
                if hold.granted[i] and not holding[i]:
                    why.append(self._why_not(hold, i))
            reason = max(why, key=why.count) if why else "notowner"
            detail = ", ".join(
                f"[{self.servers[i]}: {self._why_not(hold, i)}]"
                for i in range(self.n)
                if hold.granted[i] and not holding[i]
            )
            text = (
                f"the connections the hold was bound to closed ({sum(holding)} still hold it, {self.quorum} needed)"
                if reason == "disconnected"
                else f"fewer than a quorum of servers still hold the lock ({sum(holding)} of {self.n}, {self.quorum} needed)"
            )
            return hold.set_loss(LockLostError(f"{text}: {detail}", self.name, reason))
        if time.monotonic() >= hold.valid_until:
            return LockLostError("the lock's validity ran out without a confirmed extend", self.name, "expired")
        return None

    def server_lost(self, hold: Hold, server: int, reason: str) -> Optional[LockLostError]:
        """The watcher says server ``server`` no longer holds it (``reason``: "deleted",
        "expired", ...). Returns the hold's loss when that leaves too few servers holding."""
        if hold.stopped:
            return None
        with hold.mutex:
            if hold.down[server] is None:
                hold.down[server] = reason or "lost"
        err = self.loss(hold)
        alarm = hold.alarm
        if alarm is not None:
            alarm.set()  # the watchdog looks at once (and reports the loss, if any)
        return err

    def validity(self, hold: Optional[Hold]) -> float:
        if hold is None or self.loss(hold) is not None:
            return 0.0
        return max(0.0, float(hold.valid_until) - time.monotonic())

    # -- the watchdog -------------------------------------------------------------------------

    def watch(self, hold: Hold) -> "Steps[None]":
        """Renews every ttl/3 until released; on a loss (found at a renewal, reported by the
        watcher, a bound connection closed, the validity out) hands it to ``on_lost`` once."""
        interval = hold.ttl / 3
        next_extend = time.monotonic() + interval
        try:
            while True:
                yield Pause(hold, min(WATCH_STEP, max(0.0, next_extend - time.monotonic())))
                if hold.stopped:
                    return
                if self.loss(hold) is not None:
                    break
                if time.monotonic() < next_extend:
                    continue
                try:
                    yield from self.extend(hold, self.ttl_ms)
                    next_extend = time.monotonic() + interval
                except LockLostError:
                    break
                except LockError as e:
                    yield Log(logging.WARNING, "redlock watchdog: extend of %r not confirmed: %s", (self.name, e))
                    next_extend = time.monotonic() + min(interval, 0.5)
        except Gone:
            return
        err = self.loss(hold)
        if err is not None and not hold.stopped:
            yield from self._unwatch(hold)  # nothing more to hear about this hold
            yield Notify(err)


# ----------------------------------------------------------------------------------------------
# What the two faces share beyond the routines: arguments, per-thread state, answers read from
# the local hold, the steps of each public method


def watchdog_steps(ref: Callable[[], Optional["RedlockBase"]], hold: Hold) -> "Steps[None]":
    """The watchdog of ``hold`` for the Redlock that ``ref`` (a weak reference) names."""
    rl = ref()
    if rl is None:
        return
    core = rl._core
    del rl
    yield from core.watch(hold)


class InstanceBase:
    """The face-independent part of one server's connections: the face adds ``take`` and
    ``put`` (idle connections) and ``request``."""

    def __init__(self, client: Any, timeout: float, what: str) -> None:
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            raise TypeError(f"Redlock takes independent {what} clients (one per server), not {type(client).__name__}")
        self.client = client
        self.pool = pool
        kw = pool.connection_kwargs
        self.name = str(kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}")
        self.timeout = timeout

    def put(self, conn: Any) -> None:
        raise NotImplementedError

    def settle(self, send: Send, answer: Answer, conn: Any) -> Answer:
        """After a read reply: the connection goes back to the idle ones, or (a link, a kept
        one) with the answer."""
        if send.link is None and not send.keep:
            self.put(conn)
            return answer
        return Answer(answer.reply, answer.error, conn)


class Local(threading.local):
    """Per-thread token and hold, None in every thread until that thread acquires."""

    token: Optional[bytes] = None
    hold: Optional[Hold] = None


class Shared:
    token: Optional[bytes] = None
    hold: Optional[Hold] = None


class RedlockBase:
    """The face-independent part of ``Redlock``: a face sets ``_instance`` (its per-server
    connections), ``_closed`` (is a connection closed, seen without I/O), ``_watcher`` (its
    loss-watcher module) and adds its methods."""

    _public_name = "Redlock"
    _instance: Callable[[Any, float], Any]
    _closed: Callable[[Any], bool]
    _watcher: Any

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
        ms = ttl_ms(timeout, "timeout")
        check_blocking_timeout(blocking_timeout)
        if isinstance(instance_timeout, bool) or not (isinstance(instance_timeout, (int, float)) and instance_timeout > 0):
            raise LockArgumentError("instance_timeout must be more than 0 seconds")
        lo, hi = retry_delay
        if not 0 <= lo <= hi:
            raise LockArgumentError("retry_delay must be (min, max) with 0 <= min <= max")
        if not 0 <= drift_factor < 1:
            raise LockArgumentError("drift_factor must be in [0, 1)")
        self.name = name
        self.timeout = timeout
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.raise_on_release_error = raise_on_release_error
        self.bind = bool(bind)
        self.watchdog = bool(watchdog) or on_lost is not None
        self.on_lost = on_lost
        self.retry_delay = (float(lo), float(hi))
        self.drift_factor = float(drift_factor)
        self.instances = [self._instance(c, float(instance_timeout)) for c in clients]
        self.quorum = quorum_of(len(self.instances))
        self.local: Any = Local() if thread_local else Shared()
        self._core = RedlockCore(
            name,
            [i.name for i in self.instances],
            ms,
            self.bind,
            0 if lock_delay is None else delay_ms(lock_delay),
            self.retry_delay,
            self.drift_factor,
            self.watchdog,
            type(self)._closed,
        )

    def _logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    def _perform_local(self, effect: Any) -> Any:
        """The effects both faces carry out alike (none of them waits)."""
        kind = type(effect)
        if kind is Park:
            for i, conn in effect.conns:
                self.instances[i].put(conn)
        elif kind is Log:
            self._logger().log(effect.level, effect.message, *effect.args)
        elif kind is Watch:
            i, hold = effect.server, effect.hold
            on_loss = functools.partial(self._core.server_lost, hold, i)
            return self._watcher.watch(self.instances[i].client, self.name, hold.owner, on_loss)
        elif kind is Unwatch:
            for handle in effect.handles:
                self._watcher.unwatch(handle)
        else:
            raise TypeError(f"unknown effect {effect!r}")
        return None

    def _callback(self, err: LockLostError) -> Any:
        """Calls ``on_lost``; returns what it returned (a coroutine, maybe), None when it
        raised (logged)."""
        if self.on_lost is None:
            return None
        try:
            return self.on_lost(err)
        except Exception:  # noqa: BLE001 - the user's callback: logged, not lost
            self._logger().exception("redlock watchdog: on_lost callback of %r raised", self.name)
            return None

    # -- the steps of the public methods ------------------------------------------------------

    def _acquire_steps(self, blocking: Optional[bool], blocking_timeout: Optional[float]) -> "Steps[Literal[True]]":
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        hold = yield from self._core.acquire(bool(blocking), blocking_timeout)
        self.local.token = hold.owner
        self.local.hold = hold
        return True

    def _release_steps(self) -> "Steps[None]":
        owner = self.local.token
        hold: Optional[Hold] = getattr(self.local, "hold", None)
        if owner is None or hold is None:
            raise make_error(LockError, "Cannot release a lock that's not owned or is already unlocked.", self.name)
        self.local.token = None
        self.local.hold = None
        yield from self._core.release(hold)

    def _extend_steps(self, additional_time: Optional[float]) -> "Steps[Literal[True]]":
        hold: Optional[Hold] = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "Cannot extend an unlocked lock", self.name)
        ms = self._core.ttl_ms if additional_time is None else ttl_ms(additional_time, "additional_time")
        yield from self._core.extend(hold, ms)
        return True

    def _owned_steps(self) -> "Steps[bool]":
        return self._core.owned(self.local.token)

    def _locked_steps(self) -> "Steps[bool]":
        return self._core.locked()

    def _exit_error(self, err: LockError) -> None:
        """What the context manager's exit does with a release error."""
        if self.raise_on_release_error:
            raise err
        self._logger().warning("Redlock was no longer held when exiting context manager.")

    # -- state, read locally ------------------------------------------------------------------

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
        return self._core.validity(getattr(self.local, "hold", None))

    @property
    def lost(self) -> bool:
        hold = getattr(self.local, "hold", None)
        return hold is not None and self._core.loss(hold) is not None

    def check(self) -> float:
        """Raises ``LockLostError`` when lost, else returns the validity left (seconds)."""
        hold = getattr(self.local, "hold", None)
        if hold is None:
            raise make_error(LockError, "the lock is not held", self.name)
        err = self._core.loss(hold)
        if err is not None:
            raise err
        return self._core.validity(hold)

    def __repr__(self) -> str:
        hold = getattr(self.local, "hold", None)
        if hold is None:
            state = "not held"
        elif self._core.loss(hold) is not None:
            state = f"lost ({self._core.loss(hold).reason})"  # type: ignore[union-attr]
        else:
            state = f"held on {len(hold.tokens)}, {self._core.validity(hold):.3f} s valid"
        servers = ", ".join(i.name for i in self.instances)
        return (
            f"<{self._public_name} {self.name!r} timeout={self.timeout} quorum {self.quorum} of "
            f"{len(self.instances)} [{servers}]: {state}>"
        )

