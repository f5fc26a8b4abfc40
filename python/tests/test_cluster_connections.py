"""Connections of our own on a cluster (issue 25, point 3): the pool of the node that owns
the key (sync) and the asyncio ``ClusterNode`` (which has its own ``max_connections``) serve
waits within their limits, and give their connections back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio.cluster

import kit
from redis_lock_client import _aio_connections as aconns
from redis_lock_client import _connections as conns


def test_sync_cluster_requests_use_the_pool_of_the_keys_node(cluster: kit.Cluster) -> None:
    rc = cluster.client()
    try:
        for key in ("a", "b", "c", "d"):
            pool = conns.pool_of(rc, key)
            port = pool.connection_kwargs["port"]
            assert rc.get_node_from_key(key).port == port
            reply = conns.request(pool, ["LOCK.ACQUIRE", key, "me", 1000], time.monotonic() + 5)
            assert isinstance(reply, int)
            conn = conns.take(pool, time.monotonic() + 5)
            assert conn in pool._in_use_connections
            conns.call(conn, ["LOCK.RELEASE", key, "me", "ALL"], 5)
            conns.give_back(pool, conn)
            assert conns.in_use(pool) == (0, 0)
            assert conn not in pool._in_use_connections
    finally:
        rc.close()


def test_asyncio_cluster_waits_count_against_the_nodes_max_connections(cluster: kit.Cluster) -> None:
    async def main() -> None:
        rc: Any = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, max_connections=3)
        await rc.initialize()
        try:
            node = aconns.pool_of(rc, "k")
            assert aconns.wait_cap(node) == 2
            held = await aconns.request(node, ["LOCK.ACQUIRE", "k", "holder", 30000], time.monotonic() + 5)
            assert isinstance(held, int)
            first = await aconns.take(node, time.monotonic() + 5)
            second = await aconns.take(node, time.monotonic() + 5)
            assert len(node._connections) <= 3
            try:
                await aconns.take(node, time.monotonic() + 0.2)
                raise AssertionError("a third wait got a connection")
            except aconns.ConnectionLimitError as e:
                assert e.limit == "max_wait_connections"
            for c in (first, second):
                await aconns.give_back(node, c)
            assert aconns.in_use(node) == (0, 0)
            assert len(node._free) == len(node._connections)
            await aconns.request(node, ["LOCK.RELEASE", "k", "holder", "ALL"], time.monotonic() + 5)
        finally:
            await rc.aclose() if hasattr(rc, "aclose") else await rc.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_watchdog_renewals_without_a_watcher_hold_no_connection_between_them(cluster: kit.Cluster) -> None:
    """A cluster has no loss watcher, so the watchdog renews over connections of the pool:
    one request each, given back at once, never one connection kept for the whole hold."""
    from redis_lock_client import Lock

    rc = cluster.client()
    try:
        lock = Lock(rc, "wd", timeout=0.6, watchdog=True)
        assert lock.acquire()
        pool = conns.pool_of(rc, "wd")
        end = time.monotonic() + 1.5  # several renewals (every 0.2 s)
        samples = 0
        while time.monotonic() < end:
            # Between renewals (each takes well under a millisecond) nothing is taken.
            if conns.in_use(pool) == (0, 0) and not pool._in_use_connections:
                samples += 1
            time.sleep(0.01)
        assert samples > 100, samples
        assert conns.in_use(pool) == (0, 0)
        assert lock.owned() and not lock.lost  # the renewals went through
        lock.release()
        assert not pool._in_use_connections
    finally:
        rc.close()


def test_asyncio_watchdog_renewals_without_a_watcher_hold_no_connection(cluster: kit.Cluster) -> None:
    from redis_lock_client.asyncio import Lock

    async def main() -> None:
        rc: Any = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, client_name="awd")
        await rc.initialize()
        try:
            node = aconns.pool_of(rc, "awd")
            server = next(n for n in cluster.nodes if n.port == node.port)
            admin = server.client()

            def outside() -> int:
                seen = sum(1 for c in admin.client_list() if c.get("name") == "awd")
                return seen - len(node._connections)

            # The cluster client's own start-up connection, say: there before the lock.
            before = outside()
            lock = Lock(rc, "awd", timeout=0.6, watchdog=True)
            assert await lock.acquire()
            end = time.monotonic() + 1.5
            samples = 0
            most_outside = 0
            while time.monotonic() < end:
                if aconns.in_use(node) == (0, 0) and len(node._free) == len(node._connections):
                    samples += 1
                # No connection of this client beyond the node's pool's (and those before).
                most_outside = max(most_outside, outside() - before)
                await asyncio.sleep(0.01)
            admin.close()
            assert samples > 100, samples
            assert most_outside <= 0, f"{most_outside} connection(s) outside the node's pool"
            assert await lock.owned() and not lock.lost
            await lock.release()
            assert aconns.in_use(node) == (0, 0)
        finally:
            await rc.aclose() if hasattr(rc, "aclose") else await rc.close()

    asyncio.run(asyncio.wait_for(main(), 60))
