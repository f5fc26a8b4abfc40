"""The Redlock core without a server: its generators driven with a scripted ``perform`` (each
server's answer written in the test) and a clock of the test's own (the core's only outside
input). This is the sans-IO core's own test, not a stand-in for Redis: what the servers do is
tested in test_redlock.py and test_redlock_backoff.py."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from redis.exceptions import ConnectionError, LockNotOwnedError, ResponseError

from redis_lock_client import _redlock_core as rc
from redis_lock_client import (
    LockHeldError,
    LockLostError,
    LockValidityError,
    QuorumUnreachableError,
    WrongTypeError,
)
from redis_lock_client._drive import drive

SERVERS = [f"s{i}:6379" for i in range(5)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(rc, "time", c)
    return c


Responder = Callable[[rc.Send], rc.Answer]


def granted(token: int = 7) -> rc.Answer:
    return rc.Answer(token)


HELD = rc.Answer(None)
OK = rc.Answer(1)
DOWN = rc.Answer(None, ConnectionError("Connection refused"))
NOTOWNER = rc.Answer(None, ResponseError("NOTOWNER the lock is not held by this owner"))
WRONGTYPE = rc.Answer(None, ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))


def by_server(*answers: rc.Answer) -> Responder:
    return lambda send: answers[send.server]


class Script:
    """A ``perform`` that answers each Scatter with ``respond(round, send)``, advances the
    clock by ``round_time`` per round and by every Sleep, and records every effect."""

    def __init__(self, clock: Clock, respond: Callable[[int, rc.Send], rc.Answer], round_time: float = 0.001) -> None:
        self.clock = clock
        self.respond = respond
        self.round_time = round_time
        self.effects: List[Any] = []
        self.rounds: List[Tuple[rc.Send, ...]] = []
        self.interrupt_round: Optional[int] = None

    def __call__(self, effect: Any) -> Any:
        self.effects.append(effect)
        if isinstance(effect, rc.Scatter):
            n = len(self.rounds)
            self.rounds.append(effect.sends)
            self.clock.now += self.round_time
            if self.interrupt_round == n:
                raise KeyboardInterrupt()
            return [self.respond(n, s) for s in effect.sends]
        if isinstance(effect, rc.Sleep):
            assert effect.seconds >= 0
            self.clock.now += effect.seconds
        if isinstance(effect, rc.Watch):
            return ("handle", effect.server)
        if isinstance(effect, rc.Pause):
            self.clock.now += effect.seconds
        return None

    def commands(self) -> List[List[str]]:
        return [[str(s.args[0]) for s in r] for r in self.rounds]

    def of(self, cls: type) -> List[Any]:
        return [e for e in self.effects if isinstance(e, cls)]


def core(n: int = 5, ttl_ms: int = 10000, bind: bool = False, watchdog: bool = False, closed: Callable[[Any], bool] = lambda c: False) -> rc.RedlockCore:
    c = rc.RedlockCore("job", SERVERS[:n], ttl_ms, bind, 0, (0.001, 0.02), 0.01, watchdog, closed)
    c.random = lambda: 0.5
    return c


# -- arithmetic ------------------------------------------------------------------------------


def test_quorum_is_a_majority() -> None:
    assert [rc.quorum_of(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_validity_is_ttl_minus_elapsed_minus_drift() -> None:
    # drift = 1% of the ttl + 2 ms
    assert rc.validity_left(10.0, 0.5, 0.01) == pytest.approx(10.0 - 0.5 - 0.102)
    assert rc.validity_left(0.3, 0.4, 0.01) < 0


def test_backoff_schedule_doubles_to_the_cap_and_keeps_at_least_half_the_window() -> None:
    rd = (0.001, 0.02)
    lows = [rc.backoff_delay(k, rd, 0.0) for k in range(1, 10)]
    highs = [rc.backoff_delay(k, rd, 0.999999) for k in range(1, 10)]
    assert lows == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5])
    assert highs == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0], rel=1e-5)
    # A steady outage: at most 2 attempts per second (plus the requests' own time).
    assert rc.backoff_delay(1000, rd, 0.0) == 0.5
    # A larger retry_delay maximum starts (and caps) the window there.
    assert rc.backoff_delay(1, (0.0, 3.0), 0.0) == 1.5 and rc.backoff_delay(9, (0.0, 3.0), 1.0) == 3.0
    # The minimum is kept.
    assert rc.backoff_delay(1, (0.2, 0.3), 0.0) == 0.2
    # A lock held elsewhere: the documented retry_delay range, never growing.
    assert rc.contention_delay(rd, 0.0) == 0.001 and rc.contention_delay(rd, 1.0) == 0.02


# -- classification --------------------------------------------------------------------------


def test_classification() -> None:
    def outs(*kinds: str) -> List[rc.Outcome]:
        return [rc.Outcome(k, 1 if k == "granted" else None) for k in kinds]

    assert isinstance(rc.classify(outs("granted", "granted", "granted", "held", "held"), SERVERS, 3, "k"), LockValidityError)
    e = rc.classify(outs("granted", "held", "held", "unreachable", "held"), SERVERS, 3, "k")
    assert isinstance(e, LockHeldError) and len(e.outcomes) == 5
    e = rc.classify(outs("granted", "granted", "unreachable", "unreachable", "unreachable"), SERVERS, 3, "k")
    assert isinstance(e, QuorumUnreachableError)
    wt = rc.plain_outcome(WRONGTYPE)
    e = rc.classify([wt, wt, wt, rc.Outcome("held"), rc.Outcome("held")], SERVERS, 3, "k")
    assert isinstance(e, WrongTypeError)


def test_per_server_outcomes_are_typed() -> None:
    assert rc.acquire_outcome(granted(5)) == rc.Outcome("granted", 5)
    assert rc.acquire_outcome(HELD).kind == "held"
    assert rc.acquire_outcome(DOWN) == rc.Outcome("unreachable", "ConnectionError: Connection refused")
    assert rc.acquire_outcome(NOTOWNER).kind == "notowner"
    assert rc.acquire_outcome(WRONGTYPE).kind == "refused"
    assert rc.acquire_outcome(rc.Answer(b"nonsense")).kind == "refused"
    assert repr(rc.acquire_outcome(granted(5))) == "granted: 5"
    assert rc.info_outcome(rc.Answer(None)).kind == "free"
    info = [b"mode", b"write", b"fence", 3, b"holders", [[b"o", 1, 900]], b"waiting", 0, b"queue", []]
    assert rc.info_outcome(rc.Answer(info)).kind == "held"
    assert rc.info_outcome(rc.Answer(info), b"o").kind == "held"
    assert rc.info_outcome(rc.Answer(info), b"other").kind == "free"


# -- acquire ---------------------------------------------------------------------------------


def test_a_quorum_within_validity_is_a_lock(clock: Clock) -> None:
    c = core(watchdog=True)
    s = Script(clock, lambda r, send: by_server(granted(1), granted(2), granted(3), HELD, DOWN)(send), round_time=0.05)
    t0 = clock.now
    hold = drive(c.acquire(False, None), s)
    assert hold.tokens == {"s0:6379": 1, "s1:6379": 2, "s2:6379": 3}
    assert hold.valid_until == pytest.approx(t0 + 10 - 0.102)  # counted from when the round was sent
    assert s.commands() == [["LOCK.ACQUIRE"] * 5]  # one round, every server at once, no release
    assert [w.server for w in s.of(rc.Watch)] == [0, 1, 2]  # each granting server watched
    assert hold.handles[:3] == [("handle", 0), ("handle", 1), ("handle", 2)] and hold.handles[3:] == [None, None]
    assert len(s.of(rc.StartWatchdog)) == 1
    assert all("WAIT" not in send.args for send in s.rounds[0])


def test_no_quorum_releases_where_granted_or_unanswered(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: by_server(granted(), granted(), HELD, HELD, DOWN)(send) if r == 0 else OK)
    with pytest.raises(LockHeldError) as e:
        drive(c.acquire(False, None), s)
    assert [o for _, o in e.value.outcomes] == ["granted: 7", "granted: 7", "held", "held", "unreachable: ConnectionError: Connection refused"]
    assert s.commands() == [["LOCK.ACQUIRE"] * 5, ["LOCK.RELEASE"] * 3]
    assert [send.server for send in s.rounds[1]] == [0, 1, 4]
    # The acquire carries the release to write behind it if its answer never comes.
    assert all(send.behind is not None and send.behind[0] == "LOCK.RELEASE" for send in s.rounds[0])


def test_a_quorum_that_came_too_late_is_released_and_reported(clock: Clock) -> None:
    c = core(ttl_ms=300)
    s = Script(clock, lambda r, send: granted() if r == 0 else OK, round_time=0.4)
    with pytest.raises(LockValidityError):
        drive(c.acquire(False, None), s)
    assert s.commands() == [["LOCK.ACQUIRE"] * 5, ["LOCK.RELEASE"] * 5]


def test_too_few_answers_is_unreachable(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: by_server(granted(), granted(), DOWN, DOWN, DOWN)(send) if r == 0 else OK)
    with pytest.raises(QuorumUnreachableError):
        drive(c.acquire(False, None), s)


def test_a_refusal_is_not_retried(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: WRONGTYPE)
    with pytest.raises(WrongTypeError):
        drive(c.acquire(True, 30), s)
    assert s.commands() == [["LOCK.ACQUIRE"] * 5]


def test_an_interrupted_round_is_released_everywhere_then_the_interrupt_goes_on(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: OK)
    s.interrupt_round = 0
    with pytest.raises(KeyboardInterrupt):
        drive(c.acquire(False, None), s)
    assert s.commands() == [["LOCK.ACQUIRE"] * 5, ["LOCK.RELEASE"] * 5]
    assert all(send.link is None for send in s.rounds[1])


def test_bound_attempts_keep_their_connections_and_take_a_new_owner(clock: Clock) -> None:
    c = core(bind=True)
    owners: List[bytes] = []

    def respond(r: int, send: rc.Send) -> rc.Answer:
        assert send.keep or send.link is not None or send.args[0] == "LOCK.RELEASE"
        if send.args[0] == "LOCK.ACQUIRE":
            owners.append(send.args[2])
            ans = HELD if r == 0 and send.server < 3 else granted()
            return rc.Answer(ans.reply, ans.error, f"conn{send.server}")
        return rc.Answer(1, None, send.link)

    s = Script(clock, respond)
    hold = drive(c.acquire(True, 5), s)
    assert hold.links == ["conn0", "conn1", "conn2", "conn3", "conn4"]
    assert len(set(owners)) == 2  # a new owner for the second attempt
    assert "BIND" in s.rounds[0][0].args
    # The second attempt went over the connections of the first.
    second = [r for r in s.rounds if r[0].args[0] == "LOCK.ACQUIRE"][1]
    assert [send.link for send in second] == ["conn0", "conn1", "conn2", "conn3", "conn4"]


# -- retrying without a quorum: backoff and warnings -------------------------------------------


def test_no_quorum_backs_off_and_warns_at_a_bounded_rate(clock: Clock) -> None:
    c = core()
    c.random = lambda: 0.0  # the shortest pauses: the most attempts
    s = Script(clock, lambda r, send: DOWN if send.server < 3 else (HELD if send.args[0] == "LOCK.ACQUIRE" else OK))
    with pytest.raises(QuorumUnreachableError):
        drive(c.acquire(True, 60), s)
    attempts = sum(1 for r in s.rounds if r[0].args[0] == "LOCK.ACQUIRE")
    # 60 s: 7 growing pauses (1.27 s together), then at least 0.5 s each: at most
    # 8 + 60 / 0.5 = 128 attempts (75 a second before: 4,500).
    assert 100 <= attempts <= 128, attempts
    logs = s.of(rc.Log)
    # The first retry warns at once; then once per WARN_INTERVAL (10 s): 6 or 7 in 60 s.
    assert 6 <= len(logs) <= 7, [log.message % log.args for log in logs]
    assert all(log.level == logging.WARNING for log in logs)
    first = logs[0].message % logs[0].args
    for name in SERVERS[:3]:
        assert f"[{name}: unreachable: ConnectionError: Connection refused]" in first
    assert SERVERS[3] not in first and "QuorumUnreachableError" in first
    assert "more since the last warning" in logs[1].message % logs[1].args
    # Sleeps never run past blocking_timeout.
    assert clock.now - 1000.0 <= 60 + 0.01 * attempts


def test_a_held_lock_retries_at_retry_delay_without_warning(clock: Clock) -> None:
    c = core()
    c.random = lambda: 1.0
    s = Script(clock, lambda r, send: HELD)
    with pytest.raises(LockHeldError):
        drive(c.acquire(True, 1), s)
    sleeps = [e.seconds for e in s.of(rc.Sleep)]
    assert sleeps and max(sleeps) <= 0.02
    assert s.of(rc.Log) == []


def test_warnings_are_per_redlock_across_acquires(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: DOWN if send.args[0] == "LOCK.ACQUIRE" else OK)
    for _ in range(3):
        with pytest.raises(QuorumUnreachableError):
            drive(c.acquire(True, 1), s)
    assert len(s.of(rc.Log)) == 1  # three acquires within 10 s: one warning


# -- release and extend ----------------------------------------------------------------------


def _held(c: rc.RedlockCore, clock: Clock, granted_on: int = 5) -> Tuple[rc.Hold, Script]:
    s = Script(clock, lambda r, send: granted() if send.server < granted_on else HELD)
    return drive(c.acquire(False, None), s), s


def test_release_stops_watching_then_releases_everywhere(clock: Clock) -> None:
    c = core(watchdog=True)
    hold, _ = _held(c, clock, 3)
    s = Script(clock, lambda r, send: OK)
    drive(c.release(hold), s)
    kinds = [type(e) for e in s.effects]
    assert kinds == [rc.StopWatchdog, rc.Unwatch, rc.Scatter]
    assert s.of(rc.Unwatch)[0].handles == (("handle", 0), ("handle", 1), ("handle", 2))
    assert s.commands() == [["LOCK.RELEASE"] * 5]
    hold2, _ = _held(c, clock)
    with pytest.raises(LockNotOwnedError):
        drive(c.release(hold2), Script(clock, lambda r, send: NOTOWNER if send.server < 3 else OK))


def test_extend_with_a_quorum_moves_the_lease_from_when_it_was_sent(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock)
    s = Script(clock, lambda r, send: OK if send.server < 3 else DOWN, round_time=0.2)
    sent = clock.now
    drive(c.extend(hold, 1000), s)  # shorter than the ttl: the last sent wins
    assert hold.valid_until == pytest.approx(sent + 1.0 - 0.012)
    assert all(send.watcher and send.link is None for send in s.rounds[0])


def test_extend_without_a_quorum(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock)
    with pytest.raises(QuorumUnreachableError):
        drive(c.extend(hold, 10000), Script(clock, lambda r, send: OK if send.server < 2 else DOWN))
    assert c.loss(hold) is None  # unreachable is not lost
    with pytest.raises(LockLostError) as e:
        drive(c.extend(hold, 10000), Script(clock, lambda r, send: NOTOWNER if send.server < 3 else OK))
    assert e.value.reason == "notowner"
    assert c.loss(hold) is e.value


def test_an_extend_confirmed_after_the_validity_is_a_loss(clock: Clock) -> None:
    c = core(ttl_ms=300)
    hold, _ = _held(c, clock)
    with pytest.raises(LockLostError) as e:
        drive(c.extend(hold, 300), Script(clock, lambda r, send: OK, round_time=0.5))
    assert e.value.reason == "expired"


# -- loss judgement --------------------------------------------------------------------------


def test_loss_when_fewer_than_a_quorum_still_hold(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock, 4)  # granted on 4 of 5
    assert c.server_lost(hold, 0, "deleted") is None  # 3 still hold: a quorum
    assert c.loss(hold) is None and c.validity(hold) > 9
    err = c.server_lost(hold, 2, "deleted")  # 2 left
    assert isinstance(err, LockLostError) and err.reason == "deleted"
    assert "s0:6379: deleted" in str(err) and "s2:6379: deleted" in str(err)
    assert c.loss(hold) is err and c.validity(hold) == 0.0
    assert c.server_lost(hold, 1, "expired") is err  # the first loss stays


def test_loss_reason_is_the_most_common_one(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock, 3)
    c.server_lost(hold, 0, "evicted")
    err = c.server_lost(hold, 1, "evicted")
    assert err is not None and err.reason == "evicted"


def test_a_report_after_release_is_ignored(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock, 3)
    drive(c.release(hold), Script(clock, lambda r, send: OK))
    assert c.server_lost(hold, 0, "deleted") is None and c.server_lost(hold, 1, "deleted") is None


def test_loss_when_the_validity_runs_out(clock: Clock) -> None:
    c = core()
    hold, _ = _held(c, clock)
    clock.now = hold.valid_until
    err = c.loss(hold)
    assert err is not None and err.reason == "expired"


def test_bound_hold_is_lost_when_too_few_connections_stay_open(clock: Clock) -> None:
    closed: Dict[Any, bool] = {}
    c = core(bind=True, closed=lambda conn: closed.get(conn, False))
    s = Script(clock, lambda r, send: rc.Answer(7, None, f"conn{send.server}"))
    hold = drive(c.acquire(False, None), s)
    closed["conn0"] = closed["conn1"] = True
    assert c.loss(hold) is None
    closed["conn4"] = True
    err = c.loss(hold)
    assert err is not None and err.reason == "disconnected"


def test_a_watcher_report_wakes_the_watchdog(clock: Clock) -> None:
    class Alarm:
        rung = 0

        def set(self) -> None:
            self.rung += 1

    c = core()
    hold, _ = _held(c, clock)
    hold.alarm = Alarm()
    c.server_lost(hold, 4, "deleted")
    assert hold.alarm.rung == 1


# -- locked() --------------------------------------------------------------------------------


def test_locked_judgement() -> None:
    c = core()
    H, F, U = rc.Outcome("held"), rc.Outcome("free"), rc.Outcome("unreachable", "x")
    assert c.judge_locked(3, [H, H, H, F, F]) is True
    assert c.judge_locked(3, [H, H, H, U, U]) is True
    assert c.judge_locked(2, [H, H, F, F, F]) is False
    assert c.judge_locked(0, [F, F, F, U, U]) is False
    with pytest.raises(QuorumUnreachableError):
        c.judge_locked(2, [H, H, U, F, F])  # the unanswered one may hold it: cannot tell
    with pytest.raises(QuorumUnreachableError):
        c.judge_locked(0, [U, U, U, F, F])
    wt = rc.plain_outcome(WRONGTYPE)
    with pytest.raises(WrongTypeError):
        c.judge_locked(0, [wt, wt, wt, F, F])


def test_locked_asks_every_server_once(clock: Clock) -> None:
    c = core()
    s = Script(clock, lambda r, send: HELD)  # LOCK.INFO nil: the key does not exist
    assert drive(c.locked(), s) is False
    assert s.commands() == [["LOCK.INFO"] * 5]


# -- the watchdog ----------------------------------------------------------------------------


def test_watchdog_renews_every_third_of_the_ttl_and_reports_a_loss_once(clock: Clock) -> None:
    c = core(ttl_ms=3000, watchdog=True)
    hold, _ = _held(c, clock)
    extends: List[float] = []

    def respond(r: int, send: rc.Send) -> rc.Answer:
        if send.server == 0:
            extends.append(clock.now)
        if len(extends) == 3:
            return NOTOWNER if send.server < 3 else OK
        return OK

    s = Script(clock, respond)
    drive(c.watch(hold), s)
    gaps = [b - a for a, b in zip(extends, extends[1:])]
    assert len(extends) == 3 and all(0.99 <= g <= 1.01 for g in gaps), gaps
    notes = s.of(rc.Notify)
    assert len(notes) == 1 and notes[0].error.reason == "notowner"
    # The watches end with the loss (a release later has none left to end).
    assert len(s.of(rc.Unwatch)) == 1 and len(s.of(rc.Unwatch)[0].handles) == 5
    assert all(h is None for h in hold.handles)


def test_watchdog_reports_a_watcher_loss_at_its_next_look(clock: Clock) -> None:
    c = core(ttl_ms=30000, watchdog=True)
    hold, _ = _held(c, clock, 3)
    looks = [0]

    def perform(effect: Any) -> Any:
        if isinstance(effect, rc.Pause):
            assert effect.seconds <= rc.WATCH_STEP
            looks[0] += 1
            if looks[0] == 3:
                c.server_lost(hold, 1, "deleted")  # as the watcher's thread would
            clock.now += effect.seconds
            return None
        if isinstance(effect, (rc.Notify, rc.Unwatch)):
            notes.extend([effect.error] if isinstance(effect, rc.Notify) else [])
            return None
        raise AssertionError(f"unexpected {effect}")

    notes: List[LockLostError] = []
    drive(c.watch(hold), perform)
    assert looks[0] == 3 and len(notes) == 1 and notes[0].reason == "deleted"


def test_watchdog_ends_quietly_when_released_or_gone(clock: Clock) -> None:
    c = core(ttl_ms=3000, watchdog=True)
    hold, _ = _held(c, clock)
    hold.stopped = True
    s = Script(clock, lambda r, send: OK)
    drive(c.watch(hold), s)
    assert s.of(rc.Notify) == [] and s.rounds == []

    hold2, _ = _held(c, clock)

    def gone(effect: Any) -> Any:
        raise rc.Gone()

    drive(c.watch(hold2), gone)  # no exception, no report


def test_interrupted_between_rounds_gives_the_bound_connections_back(clock: Clock) -> None:
    c = core(bind=True)
    s = Script(clock, lambda r, send: rc.Answer(None, None, f"conn{send.server}"))  # held everywhere

    def perform(effect: Any) -> Any:
        if isinstance(effect, rc.Sleep):
            raise KeyboardInterrupt()
        return s(effect)

    with pytest.raises(KeyboardInterrupt):
        drive(c.acquire(True, 10), perform)
    parks = s.of(rc.Park)
    assert len(parks) == 1 and sorted(parks[0].conns) == [(i, f"conn{i}") for i in range(5)]
