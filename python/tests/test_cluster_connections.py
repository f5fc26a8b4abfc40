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
