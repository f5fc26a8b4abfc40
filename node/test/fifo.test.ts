// FIFO: 16 concurrent waiters, each with its own client and Redlock, queued in a known order
// (confirmed with LOCK.INFO's waiting count), are granted in exactly that order.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { type Lock } from "../src/index.js";
import { CLIENT_KINDS, useKit, waitFor } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

const WAITERS = 16;

describe("FIFO hand-over", () => {
  const kit = useKit();

  for (const kind of CLIENT_KINDS) {
    test(`${WAITERS} waiters are granted in their queue order (${kind})`, { timeout: TEST_TIMEOUT_MS }, async () => {
      const server = await kit.server();
      const key = `fifo:${kind}`;
      const make = async (): Promise<Redlock> => {
        const r = new Redlock([await kit.client(kind, server)], { retryCount: 0 });
        kit.defer(() => r.quit());
        return r;
      };
      const holderLock = await (await make()).acquire([key], 30_000);
      assert.equal(typeof holderLock.fencingToken, "bigint");

      const order: number[] = [];
      const tokens: bigint[] = [];
      const done: Promise<void>[] = [];
      for (let i = 0; i < WAITERS; i++) {
        const r = await make();
        done.push(
          r.acquire([key], 30_000, { wait: 60_000 }).then(async (lock: Lock) => {
            order.push(i);
            tokens.push(lock.fencingToken);
            await lock.release();
          }),
        );
        // The next waiter is sent only once this one is queued on the server.
        await waitFor(async () => (await server.waiting(key)) === i + 1, 10_000, { what: `waiter ${i} queued` });
      }
      const info = await server.lockInfo(key);
      assert.deepEqual(info?.holders.map((h) => h.owner), [holderLock.value]);
      assert.equal(info?.waiting, BigInt(WAITERS));

      await holderLock.release();
      await Promise.all(done);
      assert.deepEqual(order, [...Array(WAITERS).keys()], "grants in queue order");
      let previous = holderLock.fencingToken;
      for (const t of tokens) {
        assert.equal(typeof t, "bigint");
        assert.ok(t > previous, `token ${t} after ${previous}`);
        previous = t;
      }
      assert.equal(await server.lockInfo(key), null, "nothing left held or queued");
    });
  }
});
