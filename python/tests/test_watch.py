"""The loss watcher (``_watch_sync`` / ``_watch_aio``, decisions in ``_watch_core``): a held
lock's loss on the server is noticed within 50 ms, sync and asyncio, for every way the server
can end a hold, and a held lock costs the server its renewals only.

The locks are taken with raw ``LOCK.ACQUIRE`` and ``watch`` is called directly (the Lock classes
call it once they hold). One test body serves both faces: the asyncio face runs in an event
loop on a thread of its own and the test submits to it.

Latency figures are printed (``-s``) and, when ``WATCH_LATENCY_LOG`` names a file, appended
to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
import redis.asyncio as aredis

import kit
from redis_lock_client import _watch_aio as wa
from redis_lock_client import _watch_core as core
from redis_lock_client import _watch_sync as ws
from redis_lock_client._common import parse_info

TRIALS = 20
BOUND = 0.050  # the bound: a loss noticed within 50 ms
NOT_NOTICED = 3.0  # a trial not noticed within this is a miss (the test fails)
OWNER = b"me"


# ----------------------------------------------------------------------------------------------
# Faces: the same test drives the sync and the asyncio watcher


class Noticed:
    """An ``on_loss`` callback that records when and why it was called."""

    def __init__(self) -> None:
        self.reasons: List[str] = []
        self.at: Optional[float] = None
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        if self.at is None:
            self.at = time.monotonic()
        self.reasons.append(reason)
        self.event.set()

    def wait(self, timeout: float = NOT_NOTICED) -> bool:
        return self.event.wait(timeout)

    def after(self, t0: float) -> Optional[float]:
        """Seconds from ``t0`` to the call, None if not called within ``NOT_NOTICED``."""
        if not self.wait():
            return None
        assert self.at is not None
        return max(0.0, self.at - t0)


class SyncFace:
    name = "sync"

    def __init__(self, port: int, **kw: Any) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=port, **kw)

    def watch(self, key: str, owner: bytes = OWNER) -> Tuple[Any, Noticed]:
        n = Noticed()
        return ws.watch(self.client, key, owner, n), n

    def unwatch(self, handle: Any) -> None:
        ws.unwatch(handle)

    def call(self, args: List[Any], timeout: float = 2.0) -> Any:
        return ws.call(self.client, args, timeout)

    def close(self) -> None:
        self.client.close()


class AioFace:
    """The asyncio watcher, in a loop running on its own thread."""

    name = "asyncio"

    def __init__(self, port: int, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> Any:
            return aredis.Redis(host="127.0.0.1", port=port, **kw)

        self.client = self.run(make())

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def watch(self, key: str, owner: bytes = OWNER) -> Tuple[Any, Noticed]:
        n = Noticed()

        async def on_loss(reason: str) -> None:  # a coroutine function: its result is awaited
            await asyncio.sleep(0)
            n(reason)

        async def go() -> Any:
            return wa.watch(self.client, key, owner, on_loss)

        return self.run(go()), n

    def unwatch(self, handle: Any) -> None:
        async def go() -> None:
            wa.unwatch(handle)

        self.run(go())

    def call(self, args: List[Any], timeout: float = 2.0) -> Any:
        return self.run(wa.call(self.client, args, timeout))

    def close(self) -> None:
        async def shut() -> None:
            await (self.client.aclose() if hasattr(self.client, "aclose") else self.client.close())
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(shut())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


Face = Any
FACES = ["sync", "asyncio"]


def make_face(kind: str, port: int, **kw: Any) -> Face:
    return SyncFace(port, **kw) if kind == "sync" else AioFace(port, **kw)


@pytest.fixture(params=FACES)
def face(request: Any, server: kit.Server, r: "redis.Redis[bytes]") -> Iterator[Face]:
    f = make_face(request.param, server.port)
    yield f
    f.close()


def acquire(c: "redis.Redis[bytes]", key: str, ttl_ms: int = 30000, owner: bytes = OWNER, *extra: Any) -> None:
    assert c.execute_command("LOCK.ACQUIRE", key, owner, ttl_ms, *extra) is not None, "granted"


def watched(f: Face, key: str, owner: bytes = OWNER) -> Tuple[Any, Noticed]:
    """Watches ``key`` and waits until the watcher is connected (``watch`` itself never waits
    for I/O): the latency bounds are those of a connected watcher."""
    handle, n = f.watch(key, owner)
    assert handle is not None, "watch() returned no handle: no watcher"
    kit.wait_for(lambda: watcher_up(f), what="the watcher connected")
    return handle, n


def watcher_of(f: Face) -> Any:
    server = core.server_of(f.client)
    assert server is not None
    if f.name == "sync":
        return ws._reg().watchers.get(server[0])
    return wa._watchers(f.loop).get(server[0])


def watcher_up(f: Face) -> bool:
    """Whether the face's watcher is connected now (seen without a command)."""
    w = watcher_of(f)
    return w is not None and w.cmd is not None and not w.broken and w.core.is_up()


def call_when_up(f: Face, args: List[Any], timeout: float = 10.0) -> Any:
    """``f.call(args)`` once the watcher takes calls again (``Unavailable`` while it sets its
    connections up)."""
    out: List[Any] = []

    def attempt() -> bool:
        try:
            out.append(f.call(args))
            return True
        except (ws.Unavailable, wa.Unavailable):
            return False

    kit.wait_for(attempt, timeout, what=f"a call of {args} through the watcher")
    return out[0]


def poll_gone(c: "redis.Redis[bytes]", key: str, timeout: float = 10.0) -> float:
    """Polls (about every ms) until ``key`` is gone; returns when it was seen gone."""
    deadline = time.monotonic() + timeout
    while c.exists(key):
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} still exists after {timeout} s")
        time.sleep(0.001)
    return time.monotonic()


def report(face: str, event: str, took: List[Optional[float]]) -> None:
    ms = sorted(t * 1000 for t in took if t is not None)
    missed = sum(1 for t in took if t is None)
    line = (
        f"loss latency [{face}, {event}]: {len(took)} trials, p50 {ms[len(ms) // 2] if ms else float('nan'):.1f} ms, "
        f"max {ms[-1] if ms else float('nan'):.1f} ms, over 50 ms {sum(1 for m in ms if m > 50)}, missed {missed}"
    )
    print(line)
    path = os.environ.get("WATCH_LATENCY_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{kit.SERVER} redis-py {redis.__version__}: {line}\n")
    assert missed == 0, line
    # Every trial within the bound; on the two cores shared with other jobs a single trial
    # may be descheduled past it, so one in 20 may miss the bound but not by seconds.
    assert sum(1 for m in ms if m > BOUND * 1000) <= 1, line
    assert ms[len(ms) // 2] <= BOUND * 1000, line


# ----------------------------------------------------------------------------------------------
# The decisions, without a server


def test_core_minimal_prefixes_and_judging() -> None:
    assert core.minimal([b"lock:ab", b"lock:a", b"other", b"lock:abc"]) == [b"lock:a", b"other"]
    assert core.judge(None, None, b"me") == (True, "deleted")
    held = [b"mode", b"write", b"fence", 1, b"holders", [[b"me", 1, 900]], b"waiting", 0, b"queue", []]
    assert core.judge(held, None, b"me") == (True, None)
    assert core.judge(held, None, b"you") == (True, "taken")
    free = [b"mode", b"free", b"fence", 1, b"holders", [], b"waiting", 0, b"queue", []]
    assert core.judge(free, None, b"me") == (True, "expired")
    assert core.judge({"mode": "write", "holders": [["me", 1, 5]]}, None, b"me") == (True, None), "RESP3"
    assert core.judge(None, redis.ResponseError("WRONGTYPE Operation against a key"), b"me") == (True, "overwritten")
    assert core.judge(None, redis.ResponseError("ERR something"), b"me") == (False, None)
    assert core.invalidated_keys([b"message", core.INVALIDATE_CHANNEL, [b"k"]]) == (True, [b"k"])
    assert core.invalidated_keys([b"message", core.INVALIDATE_CHANNEL, None]) == (True, None)
    assert core.invalidated_keys([b"subscribe", core.INVALIDATE_CHANNEL, 1]) == (False, None)
    assert core.invalidated_keys([b"message", b"other", [b"k"]]) == (False, None)


def _connected(w: core.Watcher, *keys: bytes) -> List[core.Registration]:
    regs = [core.Registration(k, OWNER, lambda reason: None) for k in keys]
    for g in regs:
        w.add(g)
    w.connected(7)
    return regs


def test_core_registrations_never_overlap_and_rebuild_in_one_transaction() -> None:
    w = core.Watcher()
    w.connected(7)
    a = core.Registration(b"lock:ab", OWNER, print)
    plan = w.add(a)
    assert plan.commands == [core.tracking_on(7, [b"lock:ab"])]
    assert plan.reads and plan.reads[0][0] == b"lock:ab", "a new registration is re-read"
    assert w.add(core.Registration(b"lock:abc", OWNER, print)).commands == [], "covered by lock:ab"
    plan = w.add(core.Registration(b"lock:a", OWNER, print))
    assert plan.commands == [("MULTI",), core.TRACKING_OFF, core.tracking_on(7, [b"lock:a"]), ("EXEC",)]
    assert w.registered == {b"lock:a"}


def test_core_stale_prefixes_kept_until_many_or_noisy() -> None:
    w = core.Watcher()
    w.connected(7)
    kept = core.Registration(b"kept", OWNER, print)
    w.add(kept)
    for i in range(core.MAX_STALE):
        g = core.Registration(b"k%04d" % i, OWNER, print)
        w.add(g)
        assert w.remove(g).commands == []
    g = core.Registration(b"k9999", OWNER, print)
    w.add(g)
    assert w.remove(g).commands[-2:] == [core.tracking_on(7, [b"kept"]), ("EXEC",)]
    # Pushes for keys no longer held: the set shrinks to the held keys'.
    gone = core.Registration(b"gone", OWNER, print)
    w.add(gone)
    w.remove(gone)
    t = time.monotonic()
    msg = [b"message", core.INVALIDATE_CHANNEL, [b"gone"]]
    for _ in range(core.MAX_IGNORED_PUSHES - 1):
        assert not w.message(msg, t)
    assert w.message(msg, t).commands[-2:] == [core.tracking_on(7, [b"kept"]), ("EXEC",)]
    for _ in range(core.MAX_IGNORED_PUSHES * 3):
        assert not w.message(msg, t), "the same set: no rebuild"


def test_core_rereads_coalesced_and_spaced() -> None:
    w = core.Watcher()
    a, b = _connected(w, b"a", b"b")
    t = 1000.0
    msg = lambda *ks: [b"message", core.INVALIDATE_CHANNEL, list(ks)]  # noqa: E731
    w.in_flight.clear()
    w.last_read.clear()
    plan = w.message(msg(b"a", b"zzz"), t)
    assert [k for k, _ in plan.reads] == [b"a"]
    number = plan.reads[0][1]
    assert not w.message(msg(b"a"), t), "a re-read is out: due after it"
    assert w.read_done(b"a", number, [b"mode", b"write", b"holders", [[OWNER, 1, 100]]], None) == []
    assert not w.tick(t + core.RECHECK_SPACING / 2), "spaced"
    assert w.next_due() == pytest.approx(t + core.RECHECK_SPACING)
    plan = w.tick(t + core.RECHECK_SPACING)
    assert [k for k, _ in plan.reads] == [b"a"]
    lost = w.read_done(b"a", plan.reads[0][1], None, None)
    assert lost == [(a, "deleted")] and a.done and b"a" not in w.regs
    # A flush names no key: every key watched.
    assert [k for k, _ in w.message([b"message", core.INVALIDATE_CHANNEL, None], t + 1).reads] == [b"b"]


def test_core_many_holders_spacing_and_failed_reread() -> None:
    w = core.Watcher()
    (g,) = _connected(w, b"readers")
    w.in_flight.clear()
    w.last_read.clear()
    t = 1000.0
    (k, n), = w.message([b"message", core.INVALIDATE_CHANNEL, [b"readers"]], t).reads
    holders = [[b"h%d" % i, 1, 100] for i in range(100000)] + [[OWNER, 1, 100]]
    w.read_done(k, n, [b"mode", b"read", b"holders", holders], None)
    assert not w.message([b"message", core.INVALIDATE_CHANNEL, [b"readers"]], t + 0.1)
    assert not w.tick(t + 0.1), "about 5 s apart for 100,000 holders"
    (k, n), = w.tick(t + 5.1).reads
    assert w.read_done(k, n, None, redis.ResponseError("ERR busy")) == []
    assert w.next_due() is not None, "a re-read that decided nothing is due again"


def test_core_a_reread_sent_before_a_registration_does_not_judge_it() -> None:
    w = core.Watcher()
    (first,) = _connected(w, b"sem")
    w.in_flight.clear()
    w.last_read.clear()
    (k, n), = w.message([b"message", core.INVALIDATE_CHANNEL, [b"sem"]], time.monotonic() + 1).reads
    second = core.Registration(b"sem", b"other-owner", print)
    w.add(second)
    lost = w.read_done(k, n, [b"mode", b"semaphore", b"holders", [[OWNER, 1, 100]]], None)
    assert lost == [], "the read predates the second registration"
    assert b"sem" in w.due, "re-read again for the second one"


def test_core_refusal_and_redirect_errors() -> None:
    w = core.Watcher()
    assert w.registered_reply(None, redis.ResponseError("Prefix 'a' overlaps with an existing prefix")) is False
    assert w.refused is None
    assert w.registered_reply([b"OK", redis.ResponseError("The client ID you want redirect to does not exist")], None)
    assert w.refused is None
    w.registered_reply(None, redis.ResponseError("NOPERM this user has no permissions to run the 'client|tracking' command"))
    assert w.refused is not None and core.should_stop(w, time.monotonic())


# ----------------------------------------------------------------------------------------------
# Against a server: each way the server ends a hold, within 50 ms


def test_del_noticed_within_50ms(face: Face, r: "redis.Redis[bytes]") -> None:
    took: List[Optional[float]] = []
    for i in range(TRIALS):
        key = f"del-{i}"
        acquire(r, key)
        handle, n = watched(face, key)
        time.sleep(0.01)
        assert not n.event.is_set(), n.reasons
        t0 = time.monotonic()  # before the DEL: its round trip is counted (an upper bound)
        r.delete(key)
        took.append(n.after(t0))
        assert n.reasons == ["deleted"]
        face.unwatch(handle)
    report(face.name, "DEL", took)


def test_server_expiry_noticed_within_50ms(face: Face, r: "redis.Redis[bytes]") -> None:
    took: List[Optional[float]] = []
    for i in range(TRIALS):
        key = f"exp-{i}"
        acquire(r, key)
        handle, n = watched(face, key)
        # The server now ends the hold in 100 ms (the watcher was not told a ttl at all).
        assert r.execute_command("LOCK.EXTEND", key, OWNER, 100)
        gone = poll_gone(r, key)
        took.append(n.after(gone))
        assert n.reasons and n.reasons[0] in ("deleted", "expired"), n.reasons
        face.unwatch(handle)
    report(face.name, "expiry", took)


def test_killed_bound_connection_noticed_within_50ms(face: Face, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    took: List[Optional[float]] = []
    for i in range(TRIALS):
        key = f"bound-{i}"
        holder = server.client(single_connection_client=True)
        acquire(holder, key, 30000, OWNER, "BIND")
        cid = holder.client_id()
        handle, n = watched(face, key)
        time.sleep(0.005)
        t0 = time.monotonic()  # before the kill: its round trip is counted
        r.client_kill_filter(_id=cid)
        took.append(n.after(t0))
        assert n.reasons and n.reasons[0] in ("deleted", "expired"), n.reasons
        face.unwatch(handle)
        holder.close()
    report(face.name, "bound connection killed", took)


def test_others_queueing_on_a_held_lock_is_no_loss(face: Face, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    key = "queued"
    acquire(r, key)
    handle, n = watched(face, key)
    waiters = [server.client() for _ in range(5)]
    threads = [
        threading.Thread(target=lambda c=c, i=i: c.execute_command("LOCK.ACQUIRE", key, f"w{i}", 30000, "WAIT", 1500))
        for i, c in enumerate(waiters)
    ]
    for t in threads:
        t.start()
    kit.wait_for(lambda: parse_info(r.execute_command("LOCK.INFO", key)).waiting == 5, what="5 waiters queued")
    for t in threads:
        t.join(10)  # each WAIT runs out (1.5 s), the hold stays ours
    assert not n.event.is_set(), n.reasons
    # Still watched: a DEL now is noticed.
    r.delete(key)
    assert n.wait(), "noticed after the queue came and went"
    assert n.reasons == ["deleted"]
    face.unwatch(handle)
    for c in waiters:
        c.close()


def test_renewals_via_call_are_the_only_server_load(face: Face, r: "redis.Redis[bytes]") -> None:
    key = f"renewed-{face.name}"  # not a key the other face's watcher may still track
    ttl_ms = 300
    acquire(r, key, ttl_ms)
    handle, n = watched(face, key)
    w = handle._watcher
    kit.wait_for(lambda: w.core.is_up() and not w.core.in_flight, what="registered and re-read once")
    time.sleep(0.02)
    r.config_resetstat()
    renewals = 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        assert face.call(["LOCK.EXTEND", key, OWNER, ttl_ms]) == 1
        renewals += 1
        time.sleep(ttl_ms / 3 / 1000)
    time.sleep(0.05)
    stats = r.info("commandstats")
    counts = {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()}
    counts.pop("info", None)
    counts.pop("config|resetstat", None)
    assert counts == {"lock.extend": renewals}, counts
    assert not n.event.is_set(), n.reasons
    face.unwatch(handle)
    r.execute_command("LOCK.RELEASE", key, OWNER)


def test_renewals_over_the_users_connection_would_wake_the_watcher(face: Face, r: "redis.Redis[bytes]") -> None:
    """The contrast for the test above: why renewals go through ``call``."""
    key = "renewed-elsewhere"
    acquire(r, key)
    handle, n = watched(face, key)
    w = handle._watcher
    kit.wait_for(lambda: w.core.is_up() and not w.core.in_flight, what="registered and re-read once")
    time.sleep(0.02)
    r.config_resetstat()
    for _ in range(5):
        r.execute_command("LOCK.EXTEND", key, OWNER, 30000)
        time.sleep(0.02)
    time.sleep(0.05)
    stats = r.info("commandstats")
    assert stats.get("cmdstat_lock.info", {}).get("calls", 0) >= 5, stats
    assert not n.event.is_set()
    face.unwatch(handle)


def test_overwritten_and_taken(face: Face, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    acquire(r, "ow")
    h1, n1 = watched(face, "ow")
    r.set("ow", "x")
    assert n1.wait() and n1.reasons == ["overwritten"]
    face.unwatch(h1)
    acquire(r, "tk")
    h2, n2 = watched(face, "tk")
    thief = threading.Thread(target=lambda: acquire(server.client(), "tk", 30000, b"thief", "WAIT", 5000))
    thief.start()
    kit.wait_for(lambda: parse_info(r.execute_command("LOCK.INFO", "tk")).waiting == 1, what="the thief queued")
    assert not n2.event.is_set(), "a waiter queueing is no loss"
    r.execute_command("LOCK.RELEASE", "tk", OWNER)  # released elsewhere: handed to the thief
    thief.join(10)
    assert n2.wait() and n2.reasons == ["taken"], n2.reasons
    face.unwatch(h2)


def test_a_prefix_of_another_key_is_judged_by_its_own_reread(face: Face, r: "redis.Redis[bytes]") -> None:
    """A prefix also matches longer keys: a change of ``job:10`` re-reads ``job:1`` and finds
    it still held."""
    acquire(r, "job:1")
    h, n = watched(face, "job:1")
    for _ in range(5):
        acquire(r, "job:10", 30000, b"other")
        r.execute_command("LOCK.RELEASE", "job:10", b"other")
        time.sleep(0.01)
    time.sleep(0.05)
    assert not n.event.is_set(), n.reasons
    r.delete("job:1")
    assert n.wait() and n.reasons == ["deleted"]
    face.unwatch(h)


def test_unwatched_is_not_called(face: Face, r: "redis.Redis[bytes]") -> None:
    acquire(r, "unw")
    h, n = watched(face, "unw")
    face.unwatch(h)
    r.delete("unw")
    time.sleep(0.2)
    assert not n.event.is_set()


def test_asyncio_unwatch_from_another_thread(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    f = AioFace(server.port)
    try:
        acquire(r, "cross")
        h, n = watched(f, "cross")
        wa.unwatch(h)  # from the test's thread, not the loop's
        r.delete("cross")
        time.sleep(0.2)
        assert not n.event.is_set()
    finally:
        f.close()


ASYNC_EXIT = r"""
import asyncio, sys, redis.asyncio as aredis
from redis_lock_client import _watch_aio as wa
async def main():
    r = aredis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
    await r.execute_command("LOCK.ACQUIRE", "exit", "me", 30000)
    h = wa.watch(r, "exit", b"me", print)
    assert h is not None
    for _ in range(200):
        if h._watcher.core.is_up():
            break
        await asyncio.sleep(0.01)
    await (r.aclose() if hasattr(r, "aclose") else r.close())
asyncio.run(main())  # the watcher's task is still running here
print("done", flush=True)
"""


def test_asyncio_run_ends_with_a_watch_running(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """``asyncio.run`` cancels the watcher's task at its end: no hang, nothing left open, no
    warning."""
    out = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", ASYNC_EXIT, str(server.port)],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0 and out.stdout.strip() == "done", out
    assert "Warning" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_many_threads_each_told_of_their_own_loss(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    f = SyncFace(server.port)
    results: List[Tuple[str, Noticed]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        key = f"thr-{i}"
        acquire(r, key, 30000, b"t%d" % i)
        h, n = f.watch(key, b"t%d" % i)
        assert h is not None
        with lock:
            results.append((key, n))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 16
    victims = {k for k, _ in results[::2]}
    r.delete(*victims)
    for key, n in results:
        if key in victims:
            assert n.wait() and n.reasons == ["deleted"], key
    time.sleep(0.1)
    for key, n in results:
        if key not in victims:
            assert not n.event.is_set(), key
    f.close()


CHILD = r"""
import sys, time, threading, redis
from redis_lock_client import _watch_sync as ws
from redis_lock_client._common import parse_info
port, key = int(sys.argv[1]), sys.argv[2]
c = redis.Redis(host="127.0.0.1", port=port)
assert c.execute_command("LOCK.ACQUIRE", key, "child", 30000) is not None
ev = threading.Event(); got = []
h = ws.watch(c, key, b"child", lambda reason: (got.append((reason, time.monotonic())), ev.set()))
print("held" if h is not None else "nowatch", flush=True)
assert ev.wait(10), "not noticed"
print(got[0][0], flush=True)
"""


def test_several_processes(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(server.port), f"proc-{i}"], stdout=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "held"
    r.delete(*[f"proc-{i}" for i in range(4)])
    for p in procs:
        out, _ = p.communicate(timeout=20)
        assert out.strip() == "deleted" and p.returncode == 0, out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_uses_its_own_watcher(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    f = SyncFace(server.port)
    acquire(r, "parent")
    h, n = watched(f, "parent")
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a watcher of its own, the parent's left alone
        code = 1
        try:
            c = redis.Redis(host="127.0.0.1", port=server.port)
            assert c.execute_command("LOCK.ACQUIRE", "child", "child", 30000) is not None
            ev = threading.Event()
            hc = ws.watch(c, "child", b"child", lambda reason: ev.set())
            assert hc is not None and hc._watcher is not h._watcher
            ws.unwatch(h)  # the parent's handle: no effect on the parent's watcher
            os.write(wr, b"w")
            code = 0 if ev.wait(10) else 2
        finally:
            os._exit(code)
    assert os.read(rd, 1) == b"w"
    r.delete("child")
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert not n.event.is_set(), "the parent's watch is untouched"
    r.delete("parent")
    assert n.wait() and n.reasons == ["deleted"]
    os.close(rd)
    os.close(wr)
    f.close()


# ----------------------------------------------------------------------------------------------
# Failover, eviction, restart: servers of their own


def test_failover_noticed_within_50ms(face_kind: str) -> None:
    held_on = kit.Server()
    primary = kit.Server("--repl-diskless-sync-delay", "0")
    f = make_face(face_kind, held_on.port)
    c = held_on.client()
    try:
        took: List[Optional[float]] = []
        from_command: List[Optional[float]] = []
        for i in range(TRIALS):
            key = f"fo-{i}"
            acquire(c, key)
            handle, n = watched(f, key)
            time.sleep(0.005)
            c.execute_command("REPLICAOF", "127.0.0.1", primary.port)
            command_at = time.monotonic()
            gone = poll_gone(c, key)
            took.append(n.after(gone))
            from_command.append(n.after(command_at))
            assert n.reasons and n.reasons[0] == "deleted", n.reasons
            c.execute_command("REPLICAOF", "NO", "ONE")
            f.unwatch(handle)
        report(f.name, "failover", took)
        line = "from the REPLICAOF reply (resync included): p50 %.1f ms, max %.1f ms" % (
            sorted(from_command)[TRIALS // 2] * 1000,  # type: ignore[operator]
            max(from_command) * 1000,  # type: ignore[type-var, operator]
        )
        print(f"loss latency [{f.name}, failover] {line}")
    finally:
        f.close()
        c.close()
        held_on.close()
        primary.close()


def test_eviction_noticed_within_50ms(face_kind: str) -> None:
    """The module's keys are evictable: ``allkeys-lru`` under ``maxmemory`` takes the (idle)
    lock key once other keys fill the memory."""
    s = kit.Server("--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
    f = make_face(face_kind, s.port)
    c = s.client()
    try:
        took: List[Optional[float]] = []
        for i in range(TRIALS):
            c.execute_command("FLUSHALL", "SYNC")  # Valkey 8 flushes lazily otherwise
            key = f"ev-{i}"
            acquire(c, key)
            handle, n = watched(f, key)
            time.sleep(0.01)
            j = 0
            t0 = time.monotonic()
            while c.exists(key):
                t0 = time.monotonic()  # before the SET that evicts it
                c.set(f"fill-{j}", b"x" * 10000)
                j += 1
                assert j < 5000, "the lock key was never evicted"
            took.append(n.after(t0))
            assert n.reasons == ["deleted"], n.reasons
            f.unwatch(handle)
        report(f.name, "eviction", took)
    finally:
        f.close()
        c.close()
        s.close()


class SamePortServer(kit.Server):
    """A server that comes back on the same port after a restart (the watcher reconnects to
    the address it knows)."""

    def restart_same_port(self) -> None:
        port = self.port
        self.stop()
        args = [
            kit.SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", self.dir, "--logfile", os.path.join(self.dir, "server.log"), "--loadmodule", kit.MODULE,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    return redis.Redis(port=port, socket_timeout=1).ping()  # type: ignore[no-any-return]
            except (OSError, redis.RedisError):
                return False

        kit.wait_for(up, what="the server back on its port")


def test_restart_reconnects_and_reports_a_hold_lost_in_it(face_kind: str) -> None:
    s = SamePortServer()
    f = make_face(face_kind, s.port)
    c = s.client()
    try:
        acquire(c, "rs")
        handle, n = watched(f, "rs")
        time.sleep(0.01)
        s.restart_same_port()
        back = time.monotonic()
        took = n.after(back)
        assert took is not None and n.reasons == ["deleted"], n.reasons
        print(f"restart [{f.name}]: hold lost in the restart reported {took * 1000:.0f} ms after the server was back")
        f.unwatch(handle)
        # The watcher works on the new server: a new hold, a DEL, noticed at once.
        acquire(c, "rs2")
        handle, n = watched(f, "rs2")
        time.sleep(0.01)
        c.delete("rs2")
        took2 = n.after(time.monotonic())
        assert took2 is not None and took2 < 1.0 and n.reasons == ["deleted"]
        f.unwatch(handle)
    finally:
        f.close()
        c.close()
        s.close()


@pytest.fixture(params=FACES)
def face_kind(request: Any) -> str:
    return str(request.param)


@pytest.mark.parametrize("which", ["command", "push"])
def test_a_watcher_connection_killed_is_set_up_again_and_every_key_reread(face: Face, which: str, r: "redis.Redis[bytes]") -> None:
    """Either of the watcher's connections dropping: it reconnects, registers again and
    re-reads every key, so a hold lost while it was down is reported, and later losses too."""
    for key in ("kept", "lost"):
        acquire(r, f"{key}-{face.name}")
    hk, nk = watched(face, f"kept-{face.name}")
    hl, nl = watched(face, f"lost-{face.name}")
    watcher = hk._watcher
    kit.wait_for(lambda: watcher.core.is_up(), what="the watcher connected")
    cmd_id, push_id = int(face.call(["CLIENT", "ID"])), watcher.core.redirect
    assert push_id is not None
    victim = cmd_id if which == "command" else push_id
    r.client_kill_filter(_id=victim)
    r.delete(f"lost-{face.name}")  # while the watcher may be down: not pushed to it
    assert nl.wait(), "the hold lost while the connection was down is reported after the reconnect"
    assert nl.reasons == ["deleted"]
    kit.wait_for(lambda: victim not in [int(c["id"]) for c in r.client_list()] and watcher.core.is_up(), what="set up again")
    assert not nk.event.is_set(), "the kept one is still held"
    r.delete(f"kept-{face.name}")
    assert nk.wait() and nk.reasons == ["deleted"], "tracking is on again"
    face.unwatch(hk)
    face.unwatch(hl)


def test_a_watcher_with_nothing_to_watch_ends(face: Face, r: "redis.Redis[bytes]", monkeypatch: Any) -> None:
    monkeypatch.setattr(core, "IDLE_STOP", 0.2)
    acquire(r, f"idle-{face.name}")
    h, n = watched(face, f"idle-{face.name}")
    watcher = h._watcher
    kit.wait_for(lambda: watcher.core.is_up(), what="the watcher connected")  # asyncio: a moment after watch()
    assert face.call(["PING"]) == b"PONG"
    face.unwatch(h)
    kit.wait_for(lambda: watcher.cmd is None and watcher.push is None, what="the idle watcher closed")
    with pytest.raises((ws.Unavailable, wa.Unavailable)):
        face.call(["PING"])
    # The next watch starts another.
    h2, n2 = watched(face, f"idle-{face.name}")
    assert h2._watcher is not watcher
    r.delete(f"idle-{face.name}")
    assert n2.wait() and n2.reasons == ["deleted"]
    face.unwatch(h2)


# ----------------------------------------------------------------------------------------------
# No watcher: callers carry on without it


@pytest.mark.parametrize("refused", ["tracking", "channel"])
def test_acl_without_tracking_gives_no_watcher(face_kind: str, refused: str, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """A user the server refuses ``CLIENT TRACKING``, or the invalidation channel: no watcher
    (logged), the caller carries on. The same server with a user allowed both: a watcher."""
    if refused == "tracking":
        r.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-client|tracking"])
    else:
        r.acl_setuser("limited", enabled=True, passwords=["+pw"], keys=["*"], channels=["other"], commands=["+@all"])
    r.acl_setuser("allowed", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all"])
    f = make_face(face_kind, server.port, username="limited", password="pw")
    ok = make_face(face_kind, server.port, username="allowed", password="pw")
    try:
        acquire(r, "acl")
        handle, n = f.watch("acl")
        if handle is not None:
            # ``watch`` never waits for the first connection: that handle is inert, and the
            # refusal is remembered.
            kit.wait_for(lambda: f.watch("acl")[0] is None, what="the refusal remembered")
        with pytest.raises((ws.Unavailable, wa.Unavailable)):
            f.call(["PING"])
        h2, n2 = watched(ok, "acl")
        r.delete("acl")
        assert n2.wait() and n2.reasons == ["deleted"]
        ok.unwatch(h2)
        assert not n.event.is_set()
    finally:
        f.close()
        ok.close()
        r.acl_deluser("limited", "allowed")


def test_a_cluster_gives_no_watcher_a_single_server_one(cluster: kit.Cluster, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    c = cluster.client()
    try:
        assert ws.watch(c, "k", OWNER, print) is None
        with pytest.raises(ws.Unavailable):
            ws.call(c, ["PING"], 1.0)
    finally:
        c.close()
    acquire(r, "single")
    h, n = watched(SyncFace(server.port), "single")
    r.delete("single")
    assert n.wait() and n.reasons == ["deleted"]
    ws.unwatch(h)


# ----------------------------------------------------------------------------------------------
# Calls given up, descriptors, stalls, names (the review of the watcher)


def _give_up_a_call(f: Face, how: str) -> None:
    """A ``call`` whose reply (BLPOP's, after 1 s) comes only after the caller gave up: its
    timeout, an interrupt (sync: KeyboardInterrupt from a signal handler) or a cancellation
    (asyncio: ``wait_for`` around it, as around a Redlock's extend)."""
    args = ["BLPOP", "no-list", "1"]
    if how == "timeout":
        with pytest.raises(redis.exceptions.TimeoutError):
            f.call(args, 0.2)
    elif f.name == "sync":

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        try:
            with pytest.raises(KeyboardInterrupt):
                f.call(args, 2.0)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    else:

        async def cancelled() -> None:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(wa.call(f.client, args, 2.0), 0.1)

        f.run(cancelled())


@pytest.mark.parametrize("how", ["timeout", "interrupted"])
def test_a_call_given_up_leaves_the_watcher_in_step(face: Face, how: str, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """A call given up before its reply came (timeout, KeyboardInterrupt, cancellation) must
    not leave that reply to be read as the next one's: no false loss of a held lock, the next
    call gets its own reply, tracking stays on (a change is still noticed)."""
    acquire(r, "g1", 60000, b"o1")
    acquire(r, "g2", 60000, b"o2")
    h1, n1 = watched(face, "g1", b"o1")
    h2, n2 = watched(face, "g2", b"o2")
    waiters = [redis.Redis(host="127.0.0.1", port=server.port) for _ in range(2)]
    # While the call is out, others queue on both locks: invalidations, re-reads that wait
    # for the call's connection, and no loss.
    threads = [
        threading.Timer(0.05, _try, args=(c.execute_command, "LOCK.ACQUIRE", key, b"w", 60000, "WAIT", 1000))
        for c, key in zip(waiters, ("g1", "g2"))
    ]
    try:
        for t in threads:
            t.start()
        _give_up_a_call(face, how)
        time.sleep(1.5)  # the late BLPOP reply came meanwhile; the waiters gave up
        for t in threads:
            t.join(10)
        assert not n1.event.is_set() and not n2.event.is_set(), (n1.reasons, n2.reasons)
        assert call_when_up(face, ["PING"]) == b"PONG"
        info = call_when_up(face, ["CLIENT", "TRACKINGINFO"])
        assert b"on" in info[1], info
        t0 = time.monotonic()
        r.delete("g2")
        assert n2.after(t0) is not None and n2.reasons == ["deleted"]
        assert not n1.event.is_set()
    finally:
        face.unwatch(h1)
        face.unwatch(h2)
        for c in waiters:
            c.close()


def _try(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except redis.RedisError:
        pass  # a waiter that timed out: nothing to see


def test_a_watcher_in_a_process_with_many_descriptors(server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The watcher's sockets numbered above 1024 (a busy process): ``select.select`` cannot
    wait on them; the watcher must (and a loss is still noticed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit on descriptors is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    hog = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    f = SyncFace(server.port, db=5)  # a watcher of its own (started now: high descriptors)
    c5 = redis.Redis(host="127.0.0.1", port=server.port, db=5)
    try:
        acquire(c5, "fd")
        h, n = watched(f, "fd")
        time.sleep(0.2)
        t0 = time.monotonic()
        c5.delete("fd")
        assert n.after(t0) is not None and n.reasons == ["deleted"]
        f.unwatch(h)
    finally:
        for fd in hog:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        c5.close()
        f.close()


def test_an_unexpected_error_in_the_watcher_reconnects(face: Face, r: "redis.Redis[bytes]", monkeypatch: Any, caplog: Any) -> None:
    """A bug in the watcher's loop (here: one turn raises) is logged, and the watcher sets its
    connections up again and re-reads: a loss is still noticed, never a silent end."""
    acquire(r, "bug")
    h, n = watched(face, "bug")
    real_step = core.Watcher.step
    failures = [1]

    def step(self: core.Watcher, messages: Any, now: float) -> core.Plan:
        if failures:
            failures.pop()
            raise RuntimeError("a bug in the watcher")
        return real_step(self, messages, now)

    with caplog.at_level(logging.ERROR):
        monkeypatch.setattr(core.Watcher, "step", step)
        kit.wait_for(lambda: not failures, what="the injected failure")
        t0 = time.monotonic()
        r.delete("bug")
        assert n.after(t0) is not None and n.reasons == ["deleted"]
    assert any("a bug in the watcher" in (rec.exc_text or "") or rec.exc_info for rec in caplog.records)
    face.unwatch(h)


def test_a_call_waits_for_a_busy_watcher_no_longer_than_its_timeout(face: Face, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """The watcher's connection busy with a re-read out to a stalled server: ``call(timeout)``
    gives up within about its timeout (``Unavailable``: the caller uses its own connections)."""
    acquire(r, "busy1")
    acquire(r, "busy2")
    h1, _ = watched(face, "busy1")
    server.pause()
    try:
        h2, _ = face.watch("busy2")  # a re-read goes out: the watcher waits for the stalled server
        time.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises((ws.Unavailable, wa.Unavailable)):
            face.call(["LOCK.EXTEND", "busy1", OWNER, 60000], 0.1)
        took = time.monotonic() - t0
        assert took < 1.0, f"call(timeout=0.1) gave up after {took:.2f} s"
    finally:
        server.resume()
    face.unwatch(h1)
    face.unwatch(h2)


def test_watch_never_waits_for_the_server(face_kind: str, server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """``watch`` runs right after a grant: it registers and returns, the watcher connects in
    the background (here: to a stalled server, later resumed) and then notices a loss."""
    acquire(r, "nowait")
    f = make_face(face_kind, server.port, db=6)  # a watcher of its own: the first watch
    c6 = redis.Redis(host="127.0.0.1", port=server.port, db=6)
    try:
        acquire(c6, "nowait")
        server.pause()
        try:
            t0 = time.monotonic()
            h, n = f.watch("nowait")
            took = time.monotonic() - t0
        finally:
            server.resume()
        assert h is not None
        assert took < 0.5, f"watch() took {took:.2f} s"
        kit.wait_for(lambda: watcher_up(f), 15, what="the watcher connected")
        c6.delete("nowait")
        assert n.wait() and n.reasons == ["deleted"]
        f.unwatch(h)
    finally:
        c6.close()
        f.close()


@pytest.mark.parametrize("client_name", [None, "shop-api"])
def test_the_watchers_connections_have_their_own_name(face_kind: str, client_name: Optional[str], server: kit.Server, r: "redis.Redis[bytes]") -> None:
    """Two connections per server and process, outside the pool, named apart from the pool's:
    ``<client_name>:lock-watcher``, or ``redis-lock-watcher`` when the pool sets no name."""
    # A database of its own: a watcher of its own (others of this process may be open still).
    kw: Dict[str, Any] = {"db": (7 if client_name else 8) + (2 if face_kind == "asyncio" else 0)}
    if client_name:
        kw["client_name"] = client_name
    f = make_face(face_kind, server.port, **kw)
    try:
        acquire(r, "named")  # (db 0; the watch only needs a key to register)
        h, _ = watched(f, "named")
        want = f"{client_name}:lock-watcher" if client_name else "redis-lock-watcher"
        names = [c["name"] for c in r.client_list() if c["db"] == str(kw["db"])]
        assert names.count(want) == 2, names
        if client_name:
            assert client_name not in names, names  # the pool's own: none open now
        f.unwatch(h)
    finally:
        f.close()


def test_a_loop_shutting_down_right_after_a_loss_is_not_held_up(server: kit.Server) -> None:
    """``asyncio.run`` cancels the watcher's task as it ends. A cancellation landing inside
    redis-py's I/O (the re-read after a FLUSHDB, the reconnect) was lost there, and the task
    ran on to its idle stop: each ``asyncio.run`` took 10 s (redis-py's own asyncio Lock tests
    spent 110 s in such teardowns)."""
    import redis.asyncio as redis_aio

    from redis_lock_client.asyncio import Lock as AioLock

    async def main(i: int) -> None:
        c = redis_aio.Redis(host="127.0.0.1", port=server.port)
        lock = AioLock(c, f"shutdown:{i}", timeout=10)
        assert await lock.acquire(blocking=False)
        await c.delete(f"shutdown:{i}")
        await c.aclose()

    worst = 0.0
    for i in range(20):
        started = time.monotonic()
        asyncio.run(main(i))
        worst = max(worst, time.monotonic() - started)
    assert worst < 3, f"an asyncio.run took {worst:.2f} s to end"
