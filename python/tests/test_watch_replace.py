"""A ``DEL`` of a held key that meets a replacement of the loss watcher's tracked prefixes.

In ``BCAST`` mode Redis collects the changed keys per prefix and sends them at the end of the
event-loop iteration; the watcher replaces its prefix set with ``MULTI``, ``CLIENT TRACKING
off``, ``CLIENT TRACKING on ...``, ``EXEC``, and ``CLIENT TRACKING off`` frees a prefix left with
no client together with the keys not yet sent. A ``DEL`` the server runs in the same iteration
as the replacement, just before it, is therefore never pushed: the watcher must re-read every
held key after a replacement (as the Rust client does, client/tests/loss_race.rs).

The test makes the server run both in one iteration: ``CLIENT PAUSE ALL`` holds the ``DEL``
(sent first) and the replacement (the one the release of the 65th stale key triggers: more than
``MAX_STALE`` registered prefixes of keys no longer held); when the pause ends the server runs
the held commands in order before sending any invalidation.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, List

import pytest
import redis

import kit
from redis_lock_client import _watch_core as core
from test_watch import FACES, Face, acquire, make_face, watched

TTL_MS = 30000  # long: a loss must be noticed by the watcher, not by the expiry
PAUSE_MS = 600  # the DEL and the replacement both reach the server within it
NOTICE_BOUND = 3.0  # normally a few ms; the ttl is 30 s


@pytest.fixture
def server() -> Iterator[kit.Server]:
    """A server of this test's own: a watcher left from another test (the session's server)
    tracking the same prefix would keep it, and its pending keys, alive."""
    s = kit.Server()
    yield s
    s.close()


@pytest.fixture
def r(server: kit.Server) -> Iterator["redis.Redis[bytes]"]:
    c = server.client()
    yield c
    c.close()


@pytest.fixture(params=FACES)
def face(request: Any, server: kit.Server, r: "redis.Redis[bytes]") -> Iterator[Face]:
    f = make_face(request.param, server.port)
    yield f
    f.close()


def _settle() -> None:
    """Lets the watcher's registrations and re-reads go out and be answered (nothing shows them
    from outside); too short a wait can only hide the bug, never fail the test."""
    time.sleep(0.3)


def test_a_del_met_by_a_replacement_of_the_prefixes_is_noticed(
    face: Face, server: kit.Server, r: "redis.Redis[bytes]"
) -> None:
    acquire(r, "held", TTL_MS)
    held, noticed = watched(face, "held")
    stale = [f"stale-{i:03d}" for i in range(core.MAX_STALE + 1)]
    pipe = r.pipeline(transaction=False)
    for k in stale:
        pipe.execute_command("LOCK.ACQUIRE", k, b"me", TTL_MS)
    assert all(x is not None for x in pipe.execute()), "granted"
    handles = [face.watch(k)[0] for k in stale]
    assert all(h is not None for h in handles)
    _settle()
    # Every stale key but the last: as many stale prefixes as the watcher keeps.
    for h in handles[:-1]:
        face.unwatch(h)
    _settle()
    assert not noticed.event.is_set(), noticed.reasons

    admin = server.client()
    deleter = server.client()
    deleted: List[Any] = []
    try:
        deleter.ping()  # connected (and its handshake done) before the pause
        admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        t = threading.Thread(target=lambda: deleted.append(deleter.delete("held")))
        t.start()
        time.sleep(PAUSE_MS / 6 / 1000)  # the DEL is queued in the server before the replacement
        t0 = time.monotonic()
        face.unwatch(handles[-1])  # more than MAX_STALE stale prefixes: the set is replaced
        t.join(10)
        assert deleted == [1], "the key was held"
        assert noticed.wait(PAUSE_MS / 1000 + NOTICE_BOUND), (
            f"the DEL of a held key was not noticed {time.monotonic() - t0:.1f} s after it (ttl {TTL_MS} ms)"
        )
        assert noticed.reasons == ["deleted"]
    finally:
        face.unwatch(held)
        admin.close()
        deleter.close()


def test_core_a_replacement_rereads_every_held_key() -> None:
    w = core.Watcher()
    w.connected(7)
    held = [core.Registration(k, b"me", print) for k in (b"a1", b"b1")]
    for reg in held:
        w.add(reg)
    w.in_flight.clear()  # (their re-reads answered: still held)
    w.last_read.clear()  # the spacing is over
    stale = [core.Registration(b"s%03d" % i, b"me", print) for i in range(core.MAX_STALE + 1)]
    for reg in stale:
        w.add(reg)
    for reg in stale[:-1]:
        assert not w.remove(reg)
    plan = w.remove(stale[-1])
    assert plan.commands[0] == ("MULTI",) and plan.commands[-1] == ("EXEC",)
    assert sorted(k for k, _ in plan.reads) == [b"a1", b"b1"], "every held key re-read"
    # A key made prefix of registered ones: the replacement re-reads it once, and the others.
    w.last_read.clear()
    w.in_flight.clear()
    plan = w.add(core.Registration(b"a", b"me", print))
    assert plan.commands[0] == ("MULTI",)
    assert sorted(k for k, _ in plan.reads) == [b"a", b"a1", b"b1"]
