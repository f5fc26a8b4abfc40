// An aborted wait (AbortSignal) and a timed-out wait leave no grant behind: LOCK.INFO shows no
// holder of that owner, also when the abort races a grant (50 rounds of releasing the holder at
// the same moment as the abort).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { type Lock } from "../src/index.js";
import { now, sleep, useKit, waitFor, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

describe("a wait cut short leaves no grant", () => {
  const kit = useKit();
  let server: Server;
  let holder: Redlock;
  let waiter: Redlock;

  async function setup(): Promise<void> {
    if (server) return;
    server = await kit.server();
    holder = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    waiter = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => holder.quit());
    kit.defer(() => waiter.quit());
  }

  /** After the holder's release, only the waiter could hold `key`: nothing held means its
   *  possible grant was given back. */
  async function nothingHeld(key: string): Promise<void> {
    await waitFor(async () => (await server.lockInfo(key)) === null, 5000, { what: `${key} free` });
    await sleep(50);
    assert.equal(await server.lockInfo(key), null, `${key} stays free`);
  }

  test("an aborted wait rejects, leaves the queue, and is never granted", { timeout: TEST_TIMEOUT_MS }, async () => {
    await setup();
    const key = "abort:signal";
    const held = await holder.acquire([key], 30_000);
    const controller = new AbortController();
    const p = waiter.acquire([key], 5000, { wait: 30_000, signal: controller.signal });
    await waitFor(async () => (await server.waiting(key)) === 1, 5000, { what: "the waiter queued" });
    const t0 = now();
    controller.abort();
    await assert.rejects(p);
    assert.ok(now() - t0 < 1000, "the abort ends the wait at once");
    await waitFor(async () => (await server.waiting(key)) === 0, 5000, { what: "the waiter gone from the queue" });
    assert.deepEqual(await server.holders(key), [held.value]);
    await held.release();
    await nothingHeld(key);
  });

  test("an already aborted signal does not queue at all", { timeout: TEST_TIMEOUT_MS }, async () => {
    await setup();
    const key = "abort:before";
    const held = await holder.acquire([key], 30_000);
    await assert.rejects(waiter.acquire([key], 5000, { wait: 30_000, signal: AbortSignal.abort() }));
    assert.equal(await server.waiting(key), 0);
    await held.release();
    await nothingHeld(key);
  });

  test("a timed-out wait rejects after its wait and leaves no grant", { timeout: TEST_TIMEOUT_MS }, async () => {
    await setup();
    const key = "abort:timeout";
    const held = await holder.acquire([key], 30_000);
    const t0 = now();
    await assert.rejects(waiter.acquire([key], 5000, { wait: 300 }));
    const took = now() - t0;
    assert.ok(took >= 290 && took < 3000, `the wait lasted ${took.toFixed(0)} ms`);
    assert.equal(await server.waiting(key), 0);
    await held.release();
    await nothingHeld(key);
  });

  test("an abort racing the grant: 50 rounds, the waiter holds only when acquire resolved", { timeout: TEST_TIMEOUT_MS }, async () => {
    await setup();
    let granted = 0;
    let abortedRounds = 0;
    for (let i = 0; i < 50; i++) {
      const key = `abort:race:${i}`;
      const held = await holder.acquire([key], 30_000);
      const controller = new AbortController();
      const p = waiter.acquire([key], 30_000, { wait: 30_000, signal: controller.signal });
      await waitFor(async () => (await server.waiting(key)) === 1, 5000, { what: "the waiter queued" });
      // Release and abort in the same tick, in alternating order.
      let release: Promise<unknown>;
      if (i % 2 === 0) {
        release = server.call(["LOCK.RELEASE", key, held.value]);
        controller.abort();
      } else {
        controller.abort();
        release = server.call(["LOCK.RELEASE", key, held.value]);
      }
      await release;
      const outcome = await p.then(
        (lock: Lock) => lock,
        () => null,
      );
      if (outcome !== null) {
        granted++;
        assert.deepEqual(await server.holders(key), [outcome.value], "a resolved acquire holds the lock");
        await outcome.release();
      } else {
        abortedRounds++;
      }
      await nothingHeld(key);
    }
    assert.equal(granted + abortedRounds, 50);
  });
});
