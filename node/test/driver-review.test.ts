// Driver defects a review found (issue 26):
//  1. routing on an ioredis Cluster that has not connected yet, every node paused, was unbounded
//     (27 s): Target.endpointFor / rerouted now take the caller's deadline and never take more
//     than CONNECT_DEADLINE_MS;
//  2. waits started in the same tick reached the server's queue out of call order (each opened
//     its own connection and the connects raced): acquireWaitConn resolves in call order; and
//     since waits written a moment apart on two connections can still arrive in either order
//     (seen once under load: granted 0, 1, 4, 2, 3, …), the Redlock writes a wait on a key only
//     once the previous wait of the process on that key is in the server's queue (WaitLines).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import type { Redis } from "ioredis";

import Redlock from "../src/index.js";
import { CONNECT_DEADLINE_MS } from "../src/driver/common.js";
import { ReplyTimeoutError, ServerReplyError, targetFor, type Target } from "../src/driver/index.js";
import { CLIENT_KINDS, HoldBackProxy, uniqueKeys, until, useKit, type Cluster, type HoldBackOptions, type Server } from "./kit/index.js";

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
  /** How long the proxy holds back one connection (or one wait): far longer than the rest take. */
  const HOLD_BACK_MS = 400;
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

  async function proxy(opts: HoldBackOptions): Promise<HoldBackProxy> {
    const p = await HoldBackProxy.start(srv, opts);
    kit.defer(() => p.close());
    return p;
  }

  // What the driver promises is the hand-over: wait connections resolve in call order, even when
  // a later request's connection is ready first. Whether waits written to several connections
  // reach the server in that order is not the driver's to promise (two connections' bytes may
  // arrive in either order); the Redlock makes sure of it (the public-API tests below).
  for (const kind of CLIENT_KINDS) {
    test(`through the driver over ${kind}: ${WAITERS} wait connections, the 3rd one ready ${HOLD_BACK_MS} ms late, are handed over in call order`, { timeout: TEST_TIMEOUT_MS }, async () => {
      // Connection 0 is the user's client, 1 the driver's first wait connection: 3 is the third.
      const p = await proxy({ connectionDelay: (n) => (n === 3 ? HOLD_BACK_MS : 0) });
      const target = targetFor(await kit.client(kind, p));
      kit.defer(() => target.close());
      const ep = await target.endpointFor(newKey(`handover-${kind}`));
      const handed: number[] = [];
      const conns = await Promise.all(
        callOrder.map((i) =>
          ep.acquireWaitConn().then((conn) => {
            handed.push(i);
            return conn;
          }),
        ),
      );
      assert.deepEqual(handed, callOrder, "hand-over order");
      for (const c of conns) ep.releaseWaitConn(c);
    });
  }

  /** `WAITERS` acquires with a wait, started in one loop on a held key: their grant order. */
  async function grantsOf(r: Redlock, key: string): Promise<number[]> {
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
    return grantOrder(tokens);
  }

  for (const kind of CLIENT_KINDS) {
    test(`the public API over ${kind}: ${WAITERS} acquires with a wait started in one loop are granted in call order (${ROUNDS} rounds)`, { timeout: TEST_TIMEOUT_MS }, async () => {
      const r = new Redlock([await kit.client(kind, srv)], { retryCount: 0 });
      kit.defer(() => r.quit());
      for (let round = 0; round < ROUNDS; round++) {
        assert.deepEqual(await grantsOf(r, newKey(`order-api-${kind}`)), callOrder, `round ${round}: grant order`);
      }
    });

    // The case a loaded machine made once (granted 0, 1, 4, 2, 3, …): a wait written earlier
    // reaches the server after later ones. Here the proxy holds the third wait's bytes back.
    test(`the public API over ${kind}: the 3rd of ${WAITERS} waits reaching the server ${HOLD_BACK_MS} ms late is still granted 3rd`, { timeout: TEST_TIMEOUT_MS }, async () => {
      const p = await proxy({ waitDelay: (n) => (n === 2 ? HOLD_BACK_MS : 0) });
      const r = new Redlock([await kit.client(kind, p)], { retryCount: 0 });
      kit.defer(() => r.quit());
      assert.deepEqual(await grantsOf(r, newKey(`order-late-${kind}`)), callOrder, "grant order");
      assert.ok(p.waitsSeen >= WAITERS, `the proxy saw ${p.waitsSeen} waits`);
    });
  }
});
