"""Issue 35 item 5: the client checks its own holds with ``LOCK.INFO key OWNER owner`` (its
entry alone, O(1) on the server whatever the number of holders), never with the plain
``LOCK.INFO key`` (O(holders)): ``owned()``, the loss watcher's re-reads (one per owner among a
key's locks), ``extend(additional_time)``'s script, a Redlock's ``owned()``. ``MONITOR`` on the
server shows what the client sent (a script's commands too).

A server with an older module (0.3.0) refuses the owner form ("wrong number of arguments"):
the client then sends the plain form to that server and keeps working. Those tests load the
old build from ``REDIS_LOCK_OLD_MODULE`` (default ``/tmp/base-module/libredis_lock.so``) and
are skipped when there is none."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any, Iterator, List

import pytest
import redis
import redis.asyncio as aredis

import kit
from redis_lock_client import Lock, ReadLock, Redlock
from redis_lock_client import asyncio as alock
from redis_lock_client._common import parse_info

OLD_MODULE = os.environ.get("REDIS_LOCK_OLD_MODULE", "/tmp/base-module/libredis_lock.so")


class Monitor:
    """The commands a server runs, as ``MONITOR`` prints them, collected by a thread."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.file = self.sock.makefile("rb")
        first = self.file.readline()
        assert first.startswith(b"+OK"), first
        self.lines: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.file:
                self.lines.append(line.decode(errors="replace").rstrip())
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.sock.close()

    def infos(self) -> List[str]:
        """The ``LOCK.INFO`` commands run, each as its quoted arguments."""
        out = []
        for line in list(self.lines):
            at = line.find("] ")
            args = line[at + 2 :] if at >= 0 else ""
            if args.lower().startswith('"lock.info"'):
                out.append(args)
        return out

    def owner_reads(self, key: str, owner: Any) -> int:
        owner = owner.decode() if isinstance(owner, bytes) else owner
        want = f'"LOCK.INFO" "{key}" "OWNER" "{owner}"'
        return sum(1 for line in self.infos() if line.lower() == want.lower())

    def plain(self) -> List[str]:
        return [line for line in self.infos() if '"OWNER"' not in line.upper() and '"marker"' not in line]

    def settle(self, client: "redis.Redis[bytes]") -> None:
        """Everything sent before is in the lines once a marker sent now is."""
        client.execute_command("LOCK.INFO", "marker")
        kit.wait_for(lambda: any('"marker"' in line for line in self.infos()), what="the marker")


@pytest.fixture
def monitor(server: kit.Server, r: "redis.Redis[bytes]") -> Iterator[Monitor]:
    m = Monitor(server.port)
    yield m
    m.close()


@pytest.fixture
def old_server() -> Iterator[kit.Server]:
    if not os.path.exists(OLD_MODULE):
        # Named but missing is a broken set-up (`make test` builds it), not a reason to skip.
        assert "REDIS_LOCK_OLD_MODULE" not in os.environ, f"REDIS_LOCK_OLD_MODULE={OLD_MODULE} does not exist (make old-module builds it)"
        pytest.skip(f"no module 0.3.0 build at {OLD_MODULE} (set REDIS_LOCK_OLD_MODULE)")
    s = kit.Server("--loadmodule", os.path.abspath(OLD_MODULE), module=False)
    yield s
    s.close()


def refused_info_calls(c: "redis.Redis[bytes]") -> int:
    """``LOCK.INFO`` refused before it ran (an older module's arity error for the owner form):
    ``MONITOR`` does not show those, the command stats count them."""
    stats = c.info("commandstats").get("cmdstat_lock.info", {})
    return int(stats.get("rejected_calls", 0))


def taken_in_one_step(c: "redis.Redis[bytes]", key: str, owner: str) -> None:
    p = c.pipeline(transaction=True)
    p.execute_command("LOCK.RELEASE", key, owner, "ALL")
    p.execute_command("LOCK.ACQUIRE", key, "theirs", 30000)
    p.execute()


def test_sync_checks_read_the_owners_own_entry(server: kit.Server, r: "redis.Redis[bytes]", monitor: Monitor) -> None:
    c = server.client()
    a, b = ReadLock(c, "rk", timeout=30, watchdog=True), ReadLock(c, "rk", timeout=30, watchdog=True)
    assert a.acquire() and b.acquire()
    r.execute_command("LOCK.RWREAD", "rk", "other", 30000)
    assert a.owned() and b.owned()
    ta, tb = a.local.token, b.local.token
    kit.wait_for(lambda: monitor.owner_reads("rk", ta) >= 2 and monitor.owner_reads("rk", tb) >= 2,
                 what="owned() and a re-read for each owner")
    assert not a.lost and not b.lost, "another's read takes nothing"
    r.delete("rk")
    kit.wait_for(lambda: a.lost and b.lost, what="both losses")

    t = Lock(c, "t", timeout=30, watchdog=True)
    assert t.acquire(token="mine")
    taken_in_one_step(r, "t", "mine")
    kit.wait_for(lambda: t.lost, what="the loss")
    reasons: List[str] = []
    with pytest.raises(Exception) as e:
        t.check()
    reasons.append(getattr(e.value, "reason", ""))
    assert reasons == ["taken"], reasons

    d = Lock(c, "e", timeout=30, watchdog=True)
    assert d.acquire()
    assert d.extend(5)
    monitor.settle(r)
    assert monitor.owner_reads("e", d.local.token) >= 1, "extend's script"
    assert monitor.owner_reads("t", "mine") >= 1
    assert monitor.plain() == []
    d.release()  # its watchdog ends with it


def test_asyncio_checks_read_the_owners_own_entry(server: kit.Server, r: "redis.Redis[bytes]", monitor: Monitor) -> None:
    async def main() -> None:
        c = aredis.Redis(host="127.0.0.1", port=server.port)
        a, b = alock.ReadLock(c, "rk", timeout=30, watchdog=True), alock.ReadLock(c, "rk", timeout=30, watchdog=True)
        assert await a.acquire() and await b.acquire()
        r.execute_command("LOCK.RWREAD", "rk", "other", 30000)
        assert await a.owned() and await b.owned()
        ta, tb = a.local.token, b.local.token
        await until(lambda: monitor.owner_reads("rk", ta) >= 2 and monitor.owner_reads("rk", tb) >= 2)
        assert not a.lost and not b.lost
        r.delete("rk")
        await until(lambda: a.lost and b.lost)

        t = alock.Lock(c, "t", timeout=30, watchdog=True)
        assert await t.acquire(token="mine")
        taken_in_one_step(r, "t", "mine")
        await until(lambda: t.lost)
        with pytest.raises(Exception) as e:
            t.check()
        assert getattr(e.value, "reason", "") == "taken"

        d = alock.Lock(c, "e", timeout=30, watchdog=True)
        assert await d.acquire()
        assert await d.extend(5)
        monitor.settle(r)
        assert monitor.owner_reads("e", d.local.token) >= 1
        await d.release()
        await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())
    assert monitor.plain() == []


def test_redlock_owned_reads_the_owners_own_entry(server: kit.Server, r: "redis.Redis[bytes]", monitor: Monitor) -> None:
    rl = Redlock([server.client()], "res", timeout=30, watchdog=True)
    assert rl.acquire()
    assert rl.owned()
    r.delete("res")
    kit.wait_for(lambda: rl.lost, what="the loss")
    assert not rl.owned()
    monitor.settle(r)
    assert monitor.owner_reads("res", rl.local.token) >= 2
    assert monitor.plain() == []


async def until(cond: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout * kit.SLACK
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


def test_sync_checks_work_on_an_older_module(old_server: kit.Server) -> None:
    admin = old_server.client()
    mon = Monitor(old_server.port)
    try:
        c = old_server.client()
        a, b = ReadLock(c, "rk", timeout=30, watchdog=True), ReadLock(c, "rk", timeout=30, watchdog=True)
        assert a.acquire() and b.acquire()
        assert a.owned() and b.owned()
        admin.execute_command("LOCK.RWREAD", "rk", "other", 30000)
        admin.delete("rk")
        kit.wait_for(lambda: a.lost and b.lost, what="both losses")
        assert not a.owned()

        t = Lock(c, "t", timeout=30, watchdog=True)
        assert t.acquire(token="mine")
        assert t.owned()
        taken_in_one_step(admin, "t", "mine")
        kit.wait_for(lambda: t.lost, what="the loss")
        with pytest.raises(Exception) as e:
            t.check()
        assert getattr(e.value, "reason", "") == "taken"

        rl = Redlock([old_server.client()], "res", timeout=30, watchdog=True)
        assert rl.acquire() and rl.owned() and rl.owned()
        mon.settle(admin)
        # Tried and refused once for the client, once for its watcher (and a re-read already
        # on its way), once for the Redlock: never on every check.
        tried = refused_info_calls(admin)
        assert 1 <= tried <= 4, tried
        assert len([x for x in mon.infos() if x == '"LOCK.INFO" "t"']) >= 2, mon.infos()

        d = Lock(c, "e", timeout=30, watchdog=True)
        assert d.acquire()
        assert d.extend(5)
        info = parse_info(admin.execute_command("LOCK.INFO", "e"))
        assert info is not None and info.holders[0].ttl_ms > 30000, info
        # Their watchdogs end with them (none may outlive this server).
        d.release()
        rl.release()
    finally:
        mon.close()


def test_asyncio_checks_work_on_an_older_module(old_server: kit.Server) -> None:
    admin = old_server.client()

    async def main() -> None:
        c = aredis.Redis(host="127.0.0.1", port=old_server.port)
        a, b = alock.ReadLock(c, "rk", timeout=30, watchdog=True), alock.ReadLock(c, "rk", timeout=30, watchdog=True)
        assert await a.acquire() and await b.acquire()
        assert await a.owned() and await b.owned()
        admin.execute_command("LOCK.RWREAD", "rk", "other", 30000)
        admin.delete("rk")
        await until(lambda: a.lost and b.lost)
        assert not await a.owned()
        t = alock.Lock(c, "t", timeout=30, watchdog=True)
        assert await t.acquire(token="mine")
        assert await t.owned()
        taken_in_one_step(admin, "t", "mine")
        await until(lambda: t.lost)
        with pytest.raises(Exception) as e:
            t.check()
        assert getattr(e.value, "reason", "") == "taken"
        await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())
    tried = refused_info_calls(admin)
    assert 1 <= tried <= 3, tried
