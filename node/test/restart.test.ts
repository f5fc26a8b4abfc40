// Fencing tokens are bigint and compare exactly across a server restart: every token after a
// restart is strictly greater than every token before it (appendonly yes, clean stop and
// SIGKILL; and without persistence).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { type Lock } from "../src/index.js";
import { useKit, waitFor, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

/** Acquires `key`, retrying while the client reconnects after a restart. */
async function acquireAfterRestart(r: Redlock, key: string): Promise<Lock> {
  return waitFor(() => r.acquire([key], 10_000), 15_000, { intervalMs: 100, what: `acquire ${key} after the restart` });
}

async function tokensBeforeAndAfter(server: Server, r: Redlock, restart: () => Promise<void>): Promise<void> {
  const key = "restart:fence";
  const before: bigint[] = [];
  for (let i = 0; i < 5; i++) {
    const lock = await r.acquire([key], 10_000);
    assert.equal(typeof lock.fencingToken, "bigint");
    // The package's token is the server's, exactly.
    assert.equal(lock.fencingToken, (await server.lockInfo(key))?.fence);
    before.push(lock.fencingToken);
    await lock.release();
  }
  for (let i = 1; i < before.length; i++) assert.ok(before[i]! > before[i - 1]!);
  const held = await r.acquire(["restart:held"], 60_000);
  await restart();
  const after = await acquireAfterRestart(r, key);
  assert.equal(typeof after.fencingToken, "bigint");
  const last = before[before.length - 1]!;
  assert.ok(after.fencingToken > last, `token after the restart ${after.fencingToken} > ${last}`);
  assert.ok(after.fencingToken > held.fencingToken);
  assert.equal(after.fencingToken, (await server.lockInfo(key))?.fence);
  await after.release();
}

describe("tokens across a restart", () => {
  const kit = useKit();

  test("appendonly yes, clean stop: tokens after are strictly greater (bigint)", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server({ appendonly: true });
    const r = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => r.quit());
    await tokensBeforeAndAfter(server, r, () => server.restart());
    // The held lock survived in the AOF.
    assert.equal((await server.holders("restart:held")).length, 1);
  });

  test("appendonly yes, SIGKILL: tokens after are strictly greater", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server({ appendonly: true });
    const r = new Redlock([kit.ioredis(server)], { retryCount: 0 });
    kit.defer(() => r.quit());
    await tokensBeforeAndAfter(server, r, () => server.restart({ kill: true }));
  });

  test("no persistence, SIGKILL: tokens after are still strictly greater", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const r = new Redlock([await kit.nodeRedis(server)], { retryCount: 0 });
    kit.defer(() => r.quit());
    await tokensBeforeAndAfter(server, r, () => server.restart({ kill: true }));
  });
});
