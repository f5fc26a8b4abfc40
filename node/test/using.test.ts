// `using` aborts its signal within 50 ms of a DEL of the lock's key (20 repetitions: the median
// under 50 ms, each under 500 ms), with the loss as signal.error; the routine's own error is what using() rejects with.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { LockLostError, type RedlockAbortSignal } from "../src/index.js";
import { now, scaled, useKit, waitFor, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

const REPETITIONS = 20;
/** The median's bound (ms). Measured p50 about 6 ms, with other suites running on 2 cores. */
const BOUND_MS = scaled(50);
/** Each repetition's bound (ms): a scheduling stall under load, not a missed invalidation
 *  (which is never noticed: the 2 s check below). */
const EACH_MS = scaled(500);

/** The package's watcher is set up once the server has a tracking connection (CLIENT LIST flag
 *  t) and a Pub/Sub one (flag P). */
async function watcherReady(server: Server): Promise<boolean> {
  const list = String(await server.call(["CLIENT", "LIST"]));
  const flags = list.split("\n").map((l) => / flags=(\S+)/.exec(l)?.[1] ?? "");
  return flags.some((f) => f.includes("t")) && flags.some((f) => f.includes("P"));
}

function aborted(signal: AbortSignal): Promise<number> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve(now());
    else signal.addEventListener("abort", () => resolve(now()), { once: true });
  });
}

describe("using: loss noticed", () => {
  const kit = useKit();

  test(`the signal aborts within ${BOUND_MS} ms of a DEL at the median, each within ${EACH_MS} ms (${REPETITIONS} repetitions)`, { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => redlock.quit());
    const latencies: number[] = [];
    for (let i = 0; i < REPETITIONS; i++) {
      const key = `using:del:${i}`;
      const sentinel = new Error("routine saw the loss");
      let seen: Error | undefined;
      const result = redlock.using([key], 10_000, async (signal: RedlockAbortSignal) => {
        await waitFor(() => watcherReady(server), 5000, { what: "the loss watcher's connections" });
        assert.equal(signal.aborted, false);
        const gone = aborted(signal);
        const t0 = now();
        await server.call(["DEL", key]);
        // A loss not noticed in 2 s fails at once (the extension would notice it only near the TTL).
        const t1 = await Promise.race([gone, new Promise<number>((r) => setTimeout(() => r(Number.NaN), 2000))]);
        assert.ok(!Number.isNaN(t1), `repetition ${i}: the signal was not aborted within 2 s of the DEL`);
        latencies.push(t1 - t0);
        seen = signal.error;
        throw sentinel;
      });
      // using() rejects with the routine's own error (an assertion failing inside it included).
      await assert.rejects(result, (e) => {
        if (e !== sentinel) throw e;
        return true;
      });
      assert.ok(seen instanceof LockLostError, `signal.error is a LockLostError: ${String(seen)}`);
      assert.equal(seen.cause, "deleted");
    }
    const sorted = [...latencies].sort((a, b) => a - b);
    console.log(`using: DEL to signal p50 ${(sorted[Math.floor(sorted.length / 2)] ?? NaN).toFixed(2)} ms, max ${(sorted[sorted.length - 1] ?? NaN).toFixed(2)} ms`);
    const p50 = sorted[Math.floor(sorted.length / 2)] ?? Number.NaN;
    assert.ok(p50 < BOUND_MS, `the median loss noticed within ${BOUND_MS} ms: ${latencies.map((x) => x.toFixed(1)).join(", ")}`);
    const slow = latencies.filter((ms) => ms >= EACH_MS);
    assert.deepEqual(slow, [], `every loss noticed within ${EACH_MS} ms: ${latencies.map((x) => x.toFixed(1)).join(", ")}`);
  });

  test("a routine that finishes normally gets its value and the lock is released", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = new Redlock([kit.ioredis(server)]);
    kit.defer(() => redlock.quit());
    const v = await redlock.using(["using:ok"], 2000, async (signal) => {
      assert.equal(signal.aborted, false);
      assert.equal((await server.holders("using:ok")).length, 1);
      return 42;
    });
    assert.equal(v, 42);
    assert.equal(await server.lockInfo("using:ok"), null);
  });

  test("the lock is extended while the routine runs past its duration (redlock's threshold)", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = new Redlock([kit.ioredis(server)], { automaticExtensionThreshold: 400 });
    kit.defer(() => redlock.quit());
    await redlock.using(["using:extend"], 600, {}, async (signal) => {
      const start = now();
      while (now() - start < 1800) {
        assert.equal(signal.aborted, false, `aborted: ${String(signal.error)}`);
        assert.equal((await server.holders("using:extend")).length, 1, "still held");
        await new Promise((r) => setTimeout(r, 100));
      }
    });
    assert.equal(await server.lockInfo("using:extend"), null);
  });
});
