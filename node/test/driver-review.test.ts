// Driver defects a review found (issue 26):
//  1. routing on an ioredis Cluster that has not connected yet, every node paused, was unbounded
//     (27 s): Target.endpointFor / rerouted now take the caller's deadline and never take more
//     than CONNECT_DEADLINE_MS;
//  2. waits started in the same tick reached the server's queue out of call order (each opened
//     its own connection and the connects raced): acquireWaitConn resolves in call order.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import type { Redis } from "ioredis";

import Redlock from "../src/index.js";
import { CONNECT_DEADLINE_MS } from "../src/driver/common.js";
import { ReplyTimeoutError, ServerReplyError, targetFor, type Target } from "../src/driver/index.js";
import { CLIENT_KINDS, uniqueKeys, until, useKit, type Cluster, type Server } from "./kit/index.js";

const kit = useKit();
const newKey = uniqueKeys("drvrev");

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

/** How long `p` takes to reject; fails if it resolves. */
async function rejectionTime(p: Promise<unknown>, check: (e: unknown) => boolean): Promise<number> {
  const t0 = performance.now();
  await assert.rejects(p, (e: unknown) => {
    assert.ok(check(e), `unexpected error: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
    return true;
  });
  return performance.now() - t0;
}

describe("an ioredis Cluster not connected yet (lazyConnect), every node paused", () => {
  let c: Cluster;
  before(async () => {
    c = await kit.cluster(3);
  });

  test("endpointFor / rerouted end by the caller's deadline, and by CONNECT_DEADLINE_MS without one", { timeout: TEST_TIMEOUT_MS }, async (ctx) => {
    // The review's scenario: default options.
    const t = targetFor(kit.ioredisCluster(c, { lazyConnect: true }));
    // A cluster whose slot refresh on a paused node takes 20 s: rerouted's refresh is stuck.
    const slow = targetFor(kit.ioredisCluster(c, { lazyConnect: true, slotsRefreshTimeout: 20_000 }));
    const key = newKey("paused");
    const names = c.nodes.map((n) => n.name);
    const namesCluster = (e: unknown): boolean =>
      e instanceof ReplyTimeoutError && /cluster/i.test(e.message) && names.some((n) => e.message.includes(n));
    const tryAgain = new ServerReplyError("TRYAGAIN Multiple keys request during rehashing of slot");
    for (const n of c.nodes) n.pause();
    try {
      const withDeadline = await rejectionTime(t.endpointFor(key, 300), namesCluster);
      assert.ok(withDeadline >= 250 && withDeadline < 1000, `endpointFor(key, 300) rejected after ${withDeadline.toFixed(0)} ms`);

      const byDefault = await rejectionTime(t.endpointFor(key), namesCluster);
      assert.ok(byDefault < CONNECT_DEADLINE_MS + 1500, `endpointFor(key) rejected after ${byDefault.toFixed(0)} ms`);

      // a deadline above the default is capped by it
      const capped = await rejectionTime(t.endpointFor(key, 60_000), namesCluster);
      assert.ok(capped < CONNECT_DEADLINE_MS + 1500, `endpointFor(key, 60000) rejected after ${capped.toFixed(0)} ms`);

      // starts the slow cluster's connect (its first slot refresh then runs for a minute)
      const slowFirst = await rejectionTime(slow.endpointFor(key, 300), namesCluster);
      assert.ok(slowFirst < 1000, `endpointFor(key, 300) on the slow cluster rejected after ${slowFirst.toFixed(0)} ms`);
      const rerouted = await rejectionTime(slow.rerouted(key, tryAgain, 300), namesCluster);
      assert.ok(rerouted >= 250 && rerouted < 1000, `rerouted(key, err, 300) rejected after ${rerouted.toFixed(0)} ms`);
      const reroutedDefault = await rejectionTime(slow.rerouted(key, tryAgain), namesCluster);
      assert.ok(reroutedDefault < CONNECT_DEADLINE_MS + 1500, `rerouted(key, err) rejected after ${reroutedDefault.toFixed(0)} ms`);
      ctx.diagnostic(
        `rejected after (ms): endpointFor(key, 300) ${withDeadline.toFixed(0)}, endpointFor(key) ${byDefault.toFixed(0)}, ` +
          `endpointFor(key, 60000) ${capped.toFixed(0)}, rerouted(key, err, 300) ${rerouted.toFixed(0)}, rerouted(key, err) ${reroutedDefault.toFixed(0)}`,
      );
    } finally {
      for (const n of c.nodes) n.resume();
    }
    try {
      // resumed: the same targets find the key's node once their cluster client has connected
      for (const target of [t, slow]) {
        await until(
          "the key's endpoint once the nodes are resumed",
          async () => {
            try {
              await target.endpointFor(key, 1000);
              return true;
            } catch {
              return false;
            }
          },
          60_000,
        );
      }
      const ep = await t.endpointFor(key);
      const conn = await ep.command();
      assert.equal(typeof (await conn.send(["LOCK.ACQUIRE", key, "A", "10000"])), "bigint");
      assert.equal(await conn.send(["LOCK.RELEASE", key, "A"]), 0n);
    } finally {
      await t.close();
      await slow.close();
    }
  });
});

describe("waits started in one tick reach the server's queue in call order", () => {
  const WAITERS = 16;
  const ROUNDS = 5;
  let srv: Server;
  let admin: Redis;
  before(async () => {
    srv = await kit.server();
    admin = kit.ioredis(srv);
  });

  /** Indices of `tokens` sorted by token (the fencing token grows with each grant). */
  function grantOrder(tokens: readonly bigint[]): number[] {
    return tokens.map((tok, i) => ({ tok, i })).sort((a, b) => (a.tok < b.tok ? -1 : a.tok > b.tok ? 1 : 0)).map((x) => x.i);
  }
  const callOrder = Array.from({ length: WAITERS }, (_, i) => i);

  // node-redis v4 writes a command on a later turn of the event loop than the one it is sent
  // on, and how much later varies: the package's one-hand-out-per-turn pacing keeps its waits in
  // order most of the time but not always (a CI run on Valkey and Node 18 saw one out of 16
  // misplaced). Call order is promised for ioredis and node-redis v5 only (docs/node.md).
  for (const kind of CLIENT_KINDS.filter((k) => k !== "node-redis4")) {
    describe(`through the driver over ${kind}`, () => {
      let target: Target;
      before(async () => {
        target = targetFor(await kit.client(kind, srv));
      });
      after(async () => {
        await target?.close();
      });

      test(`${WAITERS} waits on a held key, ${ROUNDS} rounds: granted 0..${WAITERS - 1}`, { timeout: TEST_TIMEOUT_MS }, async () => {
        for (let round = 0; round < ROUNDS; round++) {
          const key = newKey(`order-${kind}`);
          await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
          const ep = await target.endpointFor(key);
          const tokens: bigint[] = new Array<bigint>(WAITERS);
          // started back to back, no await between: each sends as soon as it has its connection
          const waits = callOrder.map((i) =>
            ep.acquireWaitConn().then(async (conn) => {
              const reply = await conn.send(["LOCK.ACQUIRE", key, `w${i}`, "10000", "WAIT", "10000"]);
              ep.releaseWaitConn(conn);
              assert.equal(typeof reply, "bigint", `waiter ${i} granted`);
              tokens[i] = reply as bigint;
              await admin.call("LOCK.RELEASE", key, `w${i}`); // the next in the queue is granted
            }),
          );
          await until(`${WAITERS} waiters queued`, async () => (await srv.waiting(key)) === WAITERS);
          await admin.call("LOCK.RELEASE", key, "holder");
          await Promise.all(waits);
          assert.deepEqual(grantOrder(tokens), callOrder, `round ${round}: grant order`);
        }
      });
    });
  }

  test(`the public API: ${WAITERS} acquires with a wait started in one loop are granted in call order (${ROUNDS} rounds)`, { timeout: TEST_TIMEOUT_MS }, async () => {
    const r = new Redlock([kit.ioredis(srv)], { retryCount: 0 });
    kit.defer(() => r.quit());
    for (let round = 0; round < ROUNDS; round++) {
      const key = newKey("order-api");
      await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
      const tokens: bigint[] = new Array<bigint>(WAITERS);
      const acquires: Promise<void>[] = [];
      for (let i = 0; i < WAITERS; i++) {
        acquires.push(
          r.acquire([key], 10_000, { wait: 10_000 }).then(async (lock) => {
            tokens[i] = lock.fencingToken;
            await lock.release();
          }),
        );
      }
      await until(`${WAITERS} waiters queued`, async () => (await srv.waiting(key)) === WAITERS);
      await admin.call("LOCK.RELEASE", key, "holder");
      await Promise.all(acquires);
      assert.deepEqual(grantOrder(tokens), callOrder, `round ${round}: grant order`);
    }
  });
});
