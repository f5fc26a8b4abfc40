// An ioredis Cluster: one lock over keys in different slots (on different nodes), and a wait
// on a key whose slot is on another node than the client's first startup node.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { ExecutionError } from "../src/index.js";
import { useKit, waitFor, type Cluster } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

describe("Redis Cluster (ioredis Cluster)", () => {
  const kit = useKit();
  let cluster: Cluster;

  async function setup(): Promise<Cluster> {
    cluster ??= await kit.cluster(3);
    return cluster;
  }

  test("one lock over keys in 3 slots on 3 nodes, released together", { timeout: TEST_TIMEOUT_MS }, async () => {
    const c = await setup();
    const keys = c.keysOnEachNode("multi:");
    const r = new Redlock([kit.ioredisCluster(c)], { retryCount: 0 });
    kit.defer(() => r.quit());
    const lock = await r.acquire(keys, 10_000);
    for (const [i, k] of keys.entries()) {
      assert.deepEqual(await c.nodes[i]!.holders(k), [lock.value], `${k} held on its node`);
      const perServer = lock.tokens.get(k);
      assert.equal(perServer?.size, 1);
      assert.equal([...perServer!.values()][0], (await c.nodes[i]!.lockInfo(k))?.fence);
    }
    assert.equal(typeof lock.fencingToken, "bigint");
    await lock.release();
    for (const [i, k] of keys.entries()) assert.equal(await c.nodes[i]!.lockInfo(k), null);
  });

  test("a wait on a key served by another node than the first startup node", { timeout: TEST_TIMEOUT_MS }, async () => {
    const c = await setup();
    const node = c.nodes[2]!;
    const key = c.keyOn(node, "wait:");
    const a = new Redlock([kit.ioredisCluster(c)], { retryCount: 0 });
    const b = new Redlock([kit.ioredisCluster(c)], { retryCount: 0 });
    kit.defer(() => a.quit());
    kit.defer(() => b.quit());
    const held = await a.acquire([key], 30_000);
    const waiting = b.acquire([key], 10_000, { wait: 20_000 });
    await waitFor(async () => (await node.waiting(key)) === 1, 10_000, { what: `the wait queued on ${node.name}` });
    await held.release();
    const lock = await waiting;
    assert.ok(lock.fencingToken > held.fencingToken);
    assert.deepEqual(await node.holders(key), [lock.value]);
    await lock.release();
  });

  test("a held key in another slot: no wait → refused, nothing left behind", { timeout: TEST_TIMEOUT_MS }, async () => {
    const c = await setup();
    const keys = c.keysOnEachNode("refuse:");
    const a = new Redlock([kit.ioredisCluster(c)], { retryCount: 0 });
    const b = new Redlock([kit.ioredisCluster(c)], { retryCount: 0 });
    kit.defer(() => a.quit());
    kit.defer(() => b.quit());
    const held = await a.acquire([keys[1]!], 30_000);
    await assert.rejects(b.acquire(keys, 10_000, { wait: 0 }), ExecutionError);
    // b took keys[0] first (global order) and gave it back.
    for (const [i, k] of keys.entries()) {
      if (i === 1) assert.deepEqual(await c.nodes[i]!.holders(k), [held.value]);
      else assert.equal(await c.nodes[i]!.lockInfo(k), null);
    }
    await held.release();
  });
});
