// A holder process killed with SIGKILL frees its lock at its TTL (not before; a waiter gets it
// within ~TTL + 200 ms), and at once when it held the lock with `bind: true`.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock from "../src/index.js";
import { now, parseHeld, sleep, useKit, waitFor } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

/** How early the server may end a hold by this process's clock (ms wall clock truncation). */
const CLOCK_MARGIN_MS = 2;

describe("a holder killed with SIGKILL", () => {
  const kit = useKit();

  test("frees its lock at its TTL, not before; the waiter gets it within TTL + 200 ms", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const key = "crash:ttl";
    const ttl = 2000;
    const child = await kit.holder({ port: server.port, key, ttl });
    const held = parseHeld(child.readyLine);
    assert.equal(typeof held.token, "bigint");

    // When the hold ends, by the server's own report of its remaining ttl.
    const sent = now();
    const info = await server.lockInfo(key);
    const received = now();
    const holder = info?.holders.find((h) => h.owner === held.owner);
    assert.ok(holder, `the child holds ${key}: ${String(info?.holders.map((h) => h.owner))}`);
    const endsEarliest = sent + Number(holder.ttl) - CLOCK_MARGIN_MS;
    const endsLatest = received + Number(holder.ttl) + 1;

    await child.kill("SIGKILL");
    const r = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => r.quit());
    const waiting = r.acquire([key], 5000, { wait: 10_000 });
    await waitFor(async () => (await server.waiting(key)) === 1, 5000, { what: "the waiter queued" });

    // Still held shortly before its TTL: the dead holder's hold is not cut short.
    const check = endsEarliest - 150 - now();
    if (check > 0) await sleep(check);
    if (now() < endsEarliest - 20) {
      assert.deepEqual(await server.holders(key), [held.owner], "held until its TTL");
    }

    const lock = await waiting;
    const granted = now();
    assert.ok(granted >= endsEarliest, `granted ${(endsEarliest - granted).toFixed(1)} ms before the TTL`);
    assert.ok(granted <= endsLatest + 200, `granted ${(granted - endsLatest).toFixed(1)} ms after the TTL`);
    assert.ok(lock.fencingToken > held.token);
    await lock.release();
  });

  test("with bind: true the lock is free at once", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const key = "crash:bind";
    const child = await kit.holder({ port: server.port, key, ttl: 60_000, bind: true });
    const held = parseHeld(child.readyLine);
    assert.deepEqual(await server.holders(key), [held.owner]);

    const r = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => r.quit());
    const waiting = r.acquire([key], 5000, { wait: 30_000 });
    await waitFor(async () => (await server.waiting(key)) === 1, 5000, { what: "the waiter queued" });

    const killed = now();
    await child.kill("SIGKILL");
    const lock = await waiting;
    const took = now() - killed;
    // The TTL is 60 s: anything near it means the binding did nothing.
    assert.ok(took < 1000, `the waiter got the lock ${took.toFixed(1)} ms after the kill`);
    assert.ok(lock.fencingToken > held.token);
    await lock.release();
  });
});
