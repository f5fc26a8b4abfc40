"""Redlock over five independent servers: quorum, servers down or paused (SIGSTOP), held
versus unreachable, release everywhere on failure, validity, bound holds, the watchdog."""

from __future__ import annotations

import threading
import time
from typing import Any, List

import pytest
import redis

import kit
from kit import wait_for
from redis_lock_client import (
    LockArgumentError,
    LockHeldError,
    LockLostError,
    LockNotOwnedError,
    LockValidityError,
    QuorumUnreachableError,
    Redlock,
    WrongTypeError,
)


def clients(servers: List[kit.Server]) -> List["redis.Redis[bytes]"]:
    return [s.client() for s in servers]


def holders_on(servers: List[kit.Server], key: str) -> List[List[bytes]]:
    out = []
    for s in servers:
        if s.paused or s.proc is None:
            out.append([])
            continue
        c = s.client(socket_timeout=2)
        reply = c.execute_command("LOCK.INFO", key)
        c.close()
        from redis_lock_client._common import parse_info

        info = parse_info(reply)
        out.append([] if info is None else [h.owner for h in info.holders])
    return out


def test_quorum_acquire_and_release(redlock_servers: List[kit.Server]) -> None:
    rl = Redlock(clients(redlock_servers), "job", timeout=10)
    assert rl.quorum == 3
    assert rl.acquire() is True
    tokens = rl.fencing_tokens
    assert len(tokens) == 5 and all(t > 0 for t in tokens.values())
    assert 9 < rl.validity <= 10
    assert rl.owned()
    assert all(h == [rl.local.token] for h in holders_on(redlock_servers, "job"))
    other = Redlock(clients(redlock_servers), "job", timeout=10, blocking=False)
    with pytest.raises(LockHeldError) as e:
        other.acquire()
    assert len(e.value.outcomes) == 5
    assert all(o == "held" for _, o in e.value.outcomes)
    assert rl.extend() is True
    rl.release()
    assert all(h == [] for h in holders_on(redlock_servers, "job"))
    with Redlock(clients(redlock_servers), "job", timeout=10) as held:
        assert held.owned()


def test_two_of_five_down_still_locks_three_down_is_unreachable(redlock_servers: List[kit.Server]) -> None:
    cs = clients(redlock_servers)
    redlock_servers[0].stop()
    redlock_servers[1].stop()
    rl = Redlock(cs, "job", timeout=10, blocking=False)
    assert rl.acquire()
    assert len(rl.fencing_tokens) == 3
    rl.release()
    redlock_servers[2].stop()
    with pytest.raises(QuorumUnreachableError) as e:
        Redlock(cs, "job", timeout=10, blocking=False).acquire()
    assert sum(1 for _, o in e.value.outcomes if o.startswith("unreachable")) == 3
    assert not isinstance(e.value, LockHeldError)


def test_two_of_five_paused_still_locks_quickly(redlock_servers: List[kit.Server]) -> None:
    cs = clients(redlock_servers)
    for c in cs:
        c.ping()
    redlock_servers[3].pause()
    redlock_servers[4].pause()
    rl = Redlock(cs, "job", timeout=10, blocking=False, instance_timeout=0.2)
    t0 = time.monotonic()
    assert rl.acquire()
    # Bounded by the instance timeout (asked in parallel), not redis-py's 5 s default.
    assert time.monotonic() - t0 < 3
    assert len(rl.fencing_tokens) == 3
    assert rl.validity > 5
    rl.extend()
    rl.release()
    # A third paused server: too few answer.
    redlock_servers[2].pause()
    with pytest.raises(QuorumUnreachableError):
        Redlock(cs, "job2", timeout=10, blocking=False, instance_timeout=0.2).acquire()
    for s in redlock_servers:
        s.resume()
    # The servers that were paused never keep a hold of the failed attempts: a late grant
    # was released behind it (the release written after the request on the same connection).
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers, "job2")), 10, what="job2 to be free everywhere")
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers, "job")), 10, what="job to be free everywhere")


def test_a_failed_attempt_is_released_everywhere(redlock_servers: List[kit.Server]) -> None:
    # Someone else holds the key on 3 of 5: we get 2 grants, not a quorum.
    for s in redlock_servers[:3]:
        c = s.client()
        c.execute_command("LOCK.ACQUIRE", "job", "other", 30000)
        c.close()
    rl = Redlock(clients(redlock_servers), "job", timeout=10, blocking_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(LockHeldError) as e:
        rl.acquire()
    assert time.monotonic() - t0 >= 0.29  # retried until blocking_timeout
    kinds = [o.split(":")[0] for _, o in e.value.outcomes]
    assert kinds.count("held") == 3 and kinds.count("granted") == 2
    assert holders_on(redlock_servers, "job") == [[b"other"]] * 3 + [[], []]


def test_validity_left_after_a_slow_acquire(redlock_servers: List[kit.Server]) -> None:
    """A quorum that answers only after the lease (minus drift) has passed is no lock."""
    cs = clients(redlock_servers)
    for c in cs:
        c.ping()
    for s in redlock_servers[2:]:
        s.pause()
    threading.Timer(0.4, lambda: [s.resume() for s in redlock_servers[2:]]).start()
    # ttl 0.3 s; three servers answer after 0.4 s: granted by a quorum, but too late.
    rl = Redlock(cs, "job", timeout=0.3, blocking=False, instance_timeout=3)
    with pytest.raises(LockValidityError):
        rl.acquire()
    wait_for(lambda: all(h == [] for h in holders_on(redlock_servers, "job")), 10, what="everything released")


def test_refusals_are_not_retried(redlock_servers: List[kit.Server]) -> None:
    for s in redlock_servers:
        c = s.client()
        c.set("str", "x")
        c.close()
    rl = Redlock(clients(redlock_servers), "str", timeout=10, blocking_timeout=30)
    t0 = time.monotonic()
    with pytest.raises(WrongTypeError):
        rl.acquire()
    assert time.monotonic() - t0 < 10


def test_bad_arguments(redlock_servers: List[kit.Server]) -> None:
    cs = clients(redlock_servers)
    with pytest.raises(LockArgumentError, match="timeout"):
        Redlock(cs, "k", None)  # type: ignore[arg-type]
    with pytest.raises(LockArgumentError, match="at least one"):
        Redlock([], "k", 10)
    with pytest.raises(LockArgumentError):
        Redlock(cs, "k", 10, instance_timeout=0)
    with pytest.raises(LockArgumentError):
        Redlock(cs, "k", 0)
    from redis.cluster import RedisCluster  # noqa: F401

    with pytest.raises(TypeError, match="independent"):
        Redlock([object()], "k", 10)


def test_bound_redlock_frees_on_connection_loss(redlock_servers: List[kit.Server]) -> None:
    lost: List[Any] = []
    rl = Redlock(clients(redlock_servers), "job", timeout=30, bind=True, on_lost=lost.append)
    assert rl.acquire()
    hold = rl.local.hold
    for conn in hold.links[:3]:
        conn.disconnect()  # three of five bound connections gone: the majority hold ended
    wait_for(lambda: lost, 10, what="the loss report")
    assert lost[0].reason == "disconnected"
    assert rl.lost
    free = sum(1 for h in holders_on(redlock_servers, "job") if h == [])
    assert free >= 3
    with pytest.raises(LockLostError):
        rl.check()
    try:
        rl.release()
    except LockNotOwnedError:
        pass
    assert all(h == [] for h in holders_on(redlock_servers, "job"))


def test_redlock_watchdog_and_del_on_a_majority(redlock_servers: List[kit.Server]) -> None:
    lost: List[Any] = []
    rl = Redlock(clients(redlock_servers), "job", timeout=0.6, on_lost=lost.append)
    assert rl.acquire()
    time.sleep(2.0)  # > 3 ttls
    assert rl.owned() and not rl.lost and not lost
    for s in redlock_servers[:3]:
        c = s.client()
        c.delete("job")
        c.close()
    wait_for(lambda: lost, 5, what="the loss report")
    # "notowner": found by a renewal; "deleted": reported at once by the loss watcher (issue 25).
    assert lost[0].reason in ("notowner", "deleted")
    with pytest.raises(LockNotOwnedError):
        rl.release()


def test_lock_delay_on_redlock(redlock_servers: List[kit.Server]) -> None:
    rl = Redlock(clients(redlock_servers), "job", timeout=0.2, lock_delay=2)
    rl.acquire()
    time.sleep(0.5)  # the lease ran out; the delay runs
    with pytest.raises(LockHeldError):
        Redlock(clients(redlock_servers), "job", timeout=5, blocking=False).acquire()
    other = Redlock(clients(redlock_servers), "job", timeout=5, blocking_timeout=10)
    assert other.acquire()
    other.release()
