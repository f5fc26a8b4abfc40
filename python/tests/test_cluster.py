"""A Redis Cluster of three masters on loopback, the module loaded on each: locks on keys of
every node through redis-py's RedisCluster (sync and asyncio), waits on the owning node."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Dict, List

import redis.asyncio.cluster

import kit
from kit import wait_for
from redis_lock_client import Lock, ReadLock, Semaphore
from redis_lock_client import asyncio as alock


def keys_on_every_node(rc: Any) -> List[str]:
    """One key per master."""
    found: Dict[str, str] = {}
    i = 0
    while len(found) < 3:
        key = f"lock:{i}"
        node = rc.get_node_from_key(key)
        found.setdefault(node.name, key)
        i += 1
    return list(found.values())


def flush(cluster: kit.Cluster) -> None:
    for n in cluster.nodes:
        c = n.client()
        c.flushall()
        c.close()


def test_cluster_locks_sync(cluster: kit.Cluster) -> None:
    flush(cluster)
    rc = cluster.client()
    keys = keys_on_every_node(rc)
    for key in keys:
        lock = rc.lock(key, timeout=10, lock_class=Lock)
        assert lock.acquire()
        assert lock.owned() and lock.locked()
        assert lock.extend(5) and lock.reacquire()
        other = Lock(rc, key, timeout=10, blocking_timeout=10, thread_local=False)
        out: Dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.setdefault("got", other.acquire()))
        t.start()
        wait_for(lambda: lock.info().waiting == 1, 10, what=f"a waiter on {key}")  # type: ignore[union-attr]
        t0 = time.monotonic()
        lock.release()
        t.join(10)
        assert out["got"] is True
        assert time.monotonic() - t0 < 5
        assert other.owned()
        other.release()
        # The key really lives on its slot's node.
        node = rc.get_node_from_key(key)
        direct = redis.Redis(host=node.host, port=node.port)
        assert direct.exists(key) == 0
        r2 = Lock(rc, key, timeout=10)
        r2.acquire()
        assert direct.exists(key) == 1
        r2.release()
        direct.close()
    # Read-write and semaphores, and a bound (timeout=None) lock.
    rw = ReadLock(rc, keys[0], timeout=10)
    assert rw.acquire() and ReadLock(rc, keys[0], timeout=10).acquire()
    sem = Semaphore(rc, keys[1], 1, timeout=10)
    assert sem.acquire() and not Semaphore(rc, keys[1], 1, timeout=10).acquire(blocking=False)
    bound = Lock(rc, keys[2])
    assert bound.acquire()
    bound.local.hold.conn.disconnect()
    wait_for(lambda: not bound.locked(), 10, what="the bound hold to end")
    rc.close()


def test_cluster_locks_asyncio(cluster: kit.Cluster) -> None:
    flush(cluster)

    async def main() -> None:
        rc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        await rc.initialize()
        keys = keys_on_every_node(rc)
        for key in keys:
            lock = alock.Lock(rc, key, timeout=10)
            assert await lock.acquire()
            assert await lock.owned()
            assert await lock.extend(5)
            other = alock.Lock(rc, key, timeout=10, blocking_timeout=10, thread_local=False)
            task = asyncio.ensure_future(other.acquire())
            deadline = time.monotonic() + 10
            while ((await lock.info()) or lock).waiting != 1:  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await lock.release()
            assert await task is True
            await other.release()
        bound = alock.Lock(rc, keys[0])
        assert await bound.acquire()
        await bound.release()
        assert not await bound.locked()
        await rc.aclose() if hasattr(rc, "aclose") else await rc.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def _waiting_on(cluster: kit.Cluster, port: int, key: str, asking: bool) -> int:
    """LOCK.INFO's ``waiting`` on one node (after ASKING while the slot is importing there)."""
    c = cluster.node_on(port).client()
    try:
        pipe = c.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        pipe.execute_command("LOCK.INFO", key)
        info = pipe.execute()[-1]
        if info is None:
            return 0
        fields = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))
        return int(fields.get(b"waiting", fields.get("waiting", 0)))
    finally:
        c.close()


def _reshard_under_a_waiter(cluster: kit.Cluster, key: str, start_waiter: Callable[[], Any], done: Callable[[], bool]) -> int:
    """Holds ``key`` as ``holder`` on its node, starts a waiter there, moves the key's slot to
    another node as ``redis-cli --cluster reshard`` does, checks that the waiter is queued
    again on the new node (and not granted while the holder holds), then releases the holder
    there. Returns the holder's token. The slot is moved back afterwards."""
    rc = cluster.client()
    slot = rc.keyslot(key)
    src = rc.get_node_from_key(key).port
    dst = next(n.port for n in cluster.nodes if n.port != src)
    direct = cluster.node_on(src).client()
    held = direct.execute_command("LOCK.ACQUIRE", key, "holder", 60000)
    start_waiter()
    wait_for(lambda: _waiting_on(cluster, src, key, False) == 1, 10, what="the waiter queued")
    cluster.start_slot_move(slot, src, dst)
    wait_for(lambda: _waiting_on(cluster, dst, key, True) == 1, 10, what="the waiter queued on the new node")
    assert not done(), "the wait ended on the old node"
    cluster.finish_slot_move(slot, dst)
    time.sleep(0.1)
    assert not done(), "granted while the holder still holds"
    new = cluster.node_on(dst).client()
    assert new.execute_command("LOCK.RELEASE", key, "holder") == 0
    wait_for(done, 10, what="the waiter granted on the new node")
    # Put the slot back where it was for the other tests (the waiter has released by then).
    wait_for(lambda: new.exists(key) == 0, 10, what="the waiter's release")
    cluster.start_slot_move(slot, dst, src)
    cluster.finish_slot_move(slot, src)
    new.close()
    direct.close()
    rc.close()
    return int(held)


def test_cluster_wait_follows_a_resharded_key_sync(cluster: kit.Cluster) -> None:
    flush(cluster)
    rc = cluster.client()
    key = "moving:{sync}"
    lock = Lock(rc, key, timeout=30, blocking_timeout=20, thread_local=False)
    out: Dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        out["got"] = lock.acquire()
        out["token"] = lock.fencing_token
        out["waited"] = time.monotonic() - t0
        lock.release()
        out["done"] = True

    t = threading.Thread(target=run)
    held = _reshard_under_a_waiter(cluster, key, t.start, lambda: "got" in out)
    t.join(10)
    assert out["got"] is True and out.get("done")
    assert out["token"] > held
    assert out["waited"] < 20
    rc.close()


def test_cluster_wait_follows_a_resharded_key_asyncio(cluster: kit.Cluster) -> None:
    flush(cluster)
    key = "moving:{async}"
    out: Dict[str, Any] = {}
    ready = threading.Event()

    async def run() -> None:
        rc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        lock = alock.Lock(rc, key, timeout=30, blocking_timeout=20)
        ready.set()
        t0 = time.monotonic()
        out["got"] = await lock.acquire()
        out["token"] = lock.fencing_token
        out["waited"] = time.monotonic() - t0
        await lock.release()
        out["done"] = True
        await rc.aclose()

    t = threading.Thread(target=lambda: asyncio.run(run()))
    held = _reshard_under_a_waiter(cluster, key, t.start, lambda: "got" in out)
    t.join(10)
    assert out["got"] is True and out.get("done")
    assert out["token"] > held
    assert out["waited"] < 20


def test_cluster_moved_wait_ends_in_time_without_the_lock(cluster: kit.Cluster) -> None:
    """The key moves while its holder keeps it: the wait queues again on the new node with
    what is left of its time, and ends then, not granted (as any wait that runs out)."""
    flush(cluster)
    rc = cluster.client()
    key = "moving:{bounded}"
    slot = rc.keyslot(key)
    src = rc.get_node_from_key(key).port
    dst = next(n.port for n in cluster.nodes if n.port != src)
    direct = cluster.node_on(src).client()
    direct.execute_command("LOCK.ACQUIRE", key, "holder", 60000)
    lock = Lock(rc, key, timeout=30, blocking_timeout=3, thread_local=False)
    out: Dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["got"] = lock.acquire()
        except Exception as e:  # noqa: BLE001 - the test reports it
            out["got"] = e
        out["waited"] = time.monotonic() - t0

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: _waiting_on(cluster, src, key, False) == 1, 10, what="the waiter queued")
    time.sleep(1.5)
    cluster.start_slot_move(slot, src, dst)
    t.join(10)
    assert out["got"] is False, out
    assert out["waited"] < 3.5, out
    wait_for(lambda: _waiting_on(cluster, dst, key, True) == 0, 10, what="nothing queued on the new node")
    # Put the slot back for the other tests.
    cluster.finish_slot_move(slot, dst)
    new = cluster.node_on(dst).client()
    assert new.execute_command("LOCK.RELEASE", key, "holder") == 0
    cluster.start_slot_move(slot, dst, src)
    cluster.finish_slot_move(slot, src)
    new.close()
    direct.close()
    rc.close()
