// Redlock over 5 independent servers: 2 down → acquire works; 2 paused (SIGSTOP) → acquire works
// within a bounded time; 3 down → ExecutionError with a clear message naming the unreachable.
import assert from "node:assert/strict";
import { after, beforeEach, describe, test } from "node:test";

import Redlock, { ExecutionError, InvalidRequestError, type Lock } from "../src/index.js";
import { now, useKit, waitFor, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

describe("quorum over 5 servers", () => {
  const kit = useKit();
  let servers: Server[] = [];
  let redlock: Redlock;
  const errors: Error[] = [];

  beforeEach(async () => {
    if (servers.length === 0) {
      servers = await kit.servers(5);
      redlock = new Redlock(
        servers.map((s) => kit.ioredis(s, { maxRetriesPerRequest: 1 })),
        { retryCount: 0 },
      );
      redlock.on("error", (e: Error) => errors.push(e));
      kit.defer(() => redlock.quit());
    }
    for (const s of servers) {
      if (s.paused) s.resume();
      if (!s.alive) await s.start();
      await s.call(["FLUSHALL"]);
    }
    errors.length = 0;
  });
  after(() => {
    for (const s of servers) if (s.paused) s.resume();
  });

  async function holdersOn(key: string, lock: Lock): Promise<number> {
    let n = 0;
    for (const s of servers) {
      if (!s.alive || s.paused) continue;
      if ((await s.holders(key)).includes(lock.value)) n++;
    }
    return n;
  }

  test("all 5 up: held on all 5, one token per server, released everywhere", { timeout: TEST_TIMEOUT_MS }, async () => {
    const lock = await redlock.acquire(["q:all"], 5000);
    assert.equal(await holdersOn("q:all", lock), 5);
    const perServer = lock.tokens.get("q:all");
    assert.equal(perServer?.size, 5);
    for (const t of perServer?.values() ?? []) assert.equal(typeof t, "bigint");
    // Each server counts on its own: no single token stands for the lock (it could go backwards).
    assert.throws(() => lock.fencingToken, (e: unknown) => e instanceof InvalidRequestError && /per server/.test(e.message));
    await lock.release();
    for (const s of servers) assert.equal(await s.lockInfo("q:all"), null);
  });

  test("2 of 5 down: acquire works (held on the 3 others), the error event reports them", { timeout: TEST_TIMEOUT_MS }, async () => {
    await servers[0]!.kill();
    await servers[3]!.kill();
    const lock = await redlock.acquire(["q:down2"], 5000);
    assert.equal(await holdersOn("q:down2", lock), 3);
    assert.ok(lock.validity() > 0);
    assert.ok(errors.length >= 1, "the error event fired for the servers that are down");
    await lock.release().catch(() => undefined); // 2 of 5 cannot release: a quorum still did
    for (const s of servers) if (s.alive) assert.equal(await s.lockInfo("q:down2"), null);
  });

  test("2 of 5 paused (SIGSTOP): acquire works within a bounded time", { timeout: TEST_TIMEOUT_MS }, async () => {
    servers[1]!.pause();
    servers[4]!.pause();
    const t0 = now();
    const lock = await redlock.acquire(["q:paused2"], 5000);
    const took = now() - t0;
    // The design's per-server deadline is min(duration / 10, 1000) ms = 500 ms here.
    assert.ok(took < 2500, `acquire took ${took.toFixed(0)} ms with 2 servers paused`);
    assert.ok(lock.validity() > 0 && lock.validity() <= 5000);
    assert.equal(await holdersOn("q:paused2", lock), 3);
    const t1 = now();
    await lock.release().catch(() => undefined);
    assert.ok(now() - t1 < 2500, "release does not wait for the paused servers either");
  });

  test("3 of 5 down: ExecutionError saying the quorum was not reached, naming the servers", { timeout: TEST_TIMEOUT_MS }, async () => {
    const down = [servers[0]!, servers[2]!, servers[4]!];
    for (const s of down) await s.kill();
    const t0 = now();
    const err = await redlock.acquire(["q:down3"], 5000).then(
      () => assert.fail("acquired without a quorum"),
      (e: unknown) => e,
    );
    assert.ok(now() - t0 < 5000, "fails in bounded time");
    assert.ok(err instanceof ExecutionError, `an ExecutionError: ${String(err)}`);
    assert.match(err.message, /quorum/i);
    for (const s of down) assert.ok(err.message.includes(String(s.port)), `the message names ${s.name}: ${err.message}`);
    assert.ok(Array.isArray(err.attempts) && err.attempts.length >= 1);
    const stats = await err.attempts[0]!;
    assert.equal(stats.membershipSize, 5);
    assert.equal(stats.quorumSize, 3);
    assert.ok(stats.votesAgainst.size >= 3);
    // What was granted on the 2 live servers was given back.
    for (const s of servers) if (s.alive) assert.equal(await s.lockInfo("q:down3"), null);
  });

  test("3 of 5 paused: ExecutionError in bounded time, nothing left held", { timeout: TEST_TIMEOUT_MS }, async () => {
    const paused = [servers[1]!, servers[2]!, servers[3]!];
    for (const s of paused) s.pause();
    const t0 = now();
    await assert.rejects(redlock.acquire(["q:paused3"], 20_000), ExecutionError);
    assert.ok(now() - t0 < 5000);
    for (const s of paused) s.resume();
    // A paused server grants when it wakes: the give-back must reach it then (well before the
    // 20 s TTL would end the hold anyway).
    for (const s of servers) {
      await waitFor(async () => (await s.lockInfo("q:paused3")) === null, 5000, { what: `nothing held on ${s.name}` });
    }
  });
});
