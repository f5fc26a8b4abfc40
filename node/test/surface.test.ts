// The redlock v5 surface (and ours beside it), the same scenarios run with ioredis, node-redis v5
// and node-redis v4 clients.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { ExecutionError, Lock, ResourceLockedError } from "../src/index.js";
import { CLIENT_KINDS, sleep, useKit, waitFor, type ClientKind, type Kit, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

interface Ctx {
  kit: Kit;
  kind: ClientKind;
  server: Server;
  /** A fresh Redlock on a fresh client of this kind, quit at teardown. */
  redlock(settings?: ConstructorParameters<typeof Redlock>[1]): Promise<Redlock>;
  /** A key unique to this scenario and client kind. */
  key(name: string): string;
}

type Scenario = [name: string, run: (c: Ctx) => Promise<void>];

const REDLOCK_DEFAULTS = { driftFactor: 0.01, retryCount: 10, retryDelay: 200, retryJitter: 100, automaticExtensionThreshold: 500 };

const scenarios: Scenario[] = [
  ["constructor: clients, redlock's default settings, overrides, scripts accepted, no client refused", async (c) => {
    const client = await c.kit.client(c.kind, c.server);
    const r = new Redlock([client]);
    c.kit.defer(() => r.quit());
    assert.ok(r.clients.has(client));
    assert.equal(r.clients.size, 1);
    for (const [name, v] of Object.entries(REDLOCK_DEFAULTS)) assert.equal(r.settings[name as keyof typeof REDLOCK_DEFAULTS], v, name);
    const r2 = new Redlock([client], { retryCount: 3 }, { acquireScript: (s: string) => s });
    assert.equal(r2.settings.retryCount, 3);
    assert.equal(r2.settings.driftFactor, 0.01);
    assert.throws(() => new Redlock([]), /at least one/);
    assert.equal(typeof r.on, "function", "an EventEmitter");
  }],

  ["acquire: a Lock with redlock's fields and ours; the server holds it for lock.value", async (c) => {
    const r = await c.redlock();
    const key = c.key("acquire");
    const before = Date.now();
    const lock = await r.acquire([key], 5000);
    assert.ok(lock instanceof Lock);
    assert.equal(lock.redlock, r);
    assert.deepEqual(lock.resources, [key]);
    assert.equal(typeof lock.value, "string");
    assert.ok(lock.value.length > 0);
    assert.ok(Array.isArray(lock.attempts) && lock.attempts.length >= 1);
    const stats = await lock.attempts[0]!;
    assert.equal(stats.membershipSize, 1);
    assert.equal(stats.quorumSize, 1);
    assert.equal(stats.votesFor.size, 1);
    assert.ok(lock.expiration > before && lock.expiration <= Date.now() + 5000, `expiration ${lock.expiration}`);
    assert.ok(lock.validity() > 0 && lock.validity() <= 5000);
    assert.equal(lock.lost, null);
    assert.equal(lock.mode, "write");
    assert.equal(typeof lock.fencingToken, "bigint");
    const info = await c.server.lockInfo(key);
    assert.deepEqual(info?.holders.map((h) => h.owner), [lock.value]);
    assert.equal(lock.fencingToken, info?.fence);
    assert.ok(info!.holders[0]!.ttl > 4000n && info!.holders[0]!.ttl <= 5000n);
    await lock.release();
  }],

  ["a duration that is not an integer is refused", async (c) => {
    const r = await c.redlock();
    await assert.rejects(r.acquire([c.key("frac")], 1.5), /integer/);
    assert.equal(await c.server.lockInfo(c.key("frac")), null);
  }],

  ["lock.extend: a new Lock with a later expiration, the TTL reset on the server", async (c) => {
    const r = await c.redlock();
    const key = c.key("extend");
    const lock = await r.acquire([key], 1000);
    await sleep(300);
    const longer = await lock.extend(10_000);
    assert.ok(longer instanceof Lock);
    assert.equal(longer.value, lock.value);
    assert.deepEqual(longer.resources, [key]);
    assert.ok(longer.expiration > Date.now() + 9000);
    assert.equal(lock.expiration, 0, "the extended lock's old object is invalidated, as redlock does");
    assert.ok((await c.server.lockInfo(key))!.holders[0]!.ttl > 9000n);
    assert.equal(longer.fencingToken, lock.fencingToken, "an extension keeps the token");
    await longer.release();
  }],

  ["redlock.extend(lock) and redlock.release(lock): ExecutionResult with attempts", async (c) => {
    const r = await c.redlock();
    const key = c.key("methods");
    const lock = await r.acquire([key], 1000);
    const longer = await r.extend(lock, 8000);
    assert.ok((await c.server.lockInfo(key))!.holders[0]!.ttl > 7000n);
    const result = await r.release(longer);
    assert.ok(Array.isArray(result.attempts) && result.attempts.length >= 1);
    assert.equal((await result.attempts[0]!).votesFor.size, 1);
    assert.equal(longer.expiration, 0);
    assert.equal(await c.server.lockInfo(key), null);
  }],

  ["extending an expired lock: ExecutionError", async (c) => {
    const r = await c.redlock();
    const lock = await r.acquire([c.key("expired")], 100);
    await sleep(250);
    await assert.rejects(lock.extend(1000), (e) => e instanceof ExecutionError && /expired/i.test(e.message));
  }],

  ["a held resource with retryCount 0: ExecutionError, its attempts vote against with ResourceLockedError", async (c) => {
    const holder = await c.redlock();
    const r = await c.redlock({ retryCount: 0 });
    const key = c.key("held");
    const lock = await holder.acquire([key], 10_000);
    const err = await r.acquire([key], 1000).then(
      () => assert.fail("acquired a held lock"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ExecutionError, String(err));
    assert.ok(err.attempts.length >= 1);
    const stats = await err.attempts[err.attempts.length - 1]!;
    assert.equal(stats.votesFor.size, 0);
    assert.ok([...stats.votesAgainst.values()].some((e) => e instanceof ResourceLockedError));
    assert.deepEqual(await c.server.holders(key), [lock.value]);
    await lock.release();
  }],

  ["retryCount / retryDelay: a lock freed within the retry window is acquired", async (c) => {
    const holder = await c.redlock();
    const r = await c.redlock({ retryCount: 10, retryDelay: 100 });
    const key = c.key("retry");
    const lock = await holder.acquire([key], 10_000);
    const waiting = r.acquire([key], 5000);
    await sleep(200);
    await lock.release();
    const got = await waiting;
    assert.ok(got.fencingToken > lock.fencingToken);
    await got.release();
  }],

  ["several resources: held together, released together; a repeated resource is refused", async (c) => {
    const r = await c.redlock();
    const keys = [c.key("m:b"), c.key("m:a"), c.key("m:c")];
    const lock = await r.acquire(keys, 5000);
    assert.deepEqual(lock.resources, keys, "lock.resources as given (redlock's), whatever order they are taken in");
    for (const k of keys) assert.deepEqual(await c.server.holders(k), [lock.value]);
    assert.equal(lock.tokens.size, 3);
    await lock.release();
    for (const k of keys) assert.equal(await c.server.lockInfo(k), null);
    await assert.rejects(r.acquire([c.key("dup"), c.key("dup")], 1000));
    assert.equal(await c.server.lockInfo(c.key("dup")), null);
  }],

  ["using(resources, duration, routine) and using(resources, duration, settings, routine)", async (c) => {
    const r = await c.redlock();
    const key = c.key("using");
    const v = await r.using([key], 2000, async (signal) => {
      assert.equal(signal.aborted, false);
      assert.equal((await c.server.holders(key)).length, 1);
      return "done";
    });
    assert.equal(v, "done");
    assert.equal(await c.server.lockInfo(key), null);
    const w = await r.using([key], 2000, { retryCount: 0 }, async () => 7);
    assert.equal(w, 7);
    await assert.rejects(r.using([key], 2000, { automaticExtensionThreshold: 1950 }, async () => 0));
    const boom = new Error("boom");
    await assert.rejects(r.using([key], 2000, async () => {
      throw boom;
    }), (e) => e === boom);
    assert.equal(await c.server.lockInfo(key), null, "released after the routine threw");
  }],

  ["info(resource), acquireRead and acquireSemaphore (ours)", async (c) => {
    const r = await c.redlock({ retryCount: 0 });
    const key = c.key("info");
    assert.equal(await r.info(key), null);
    const lock = await r.acquire([key], 5000);
    const info = await r.info(key);
    assert.equal(info?.mode, "write");
    assert.equal(info?.fence, lock.fencingToken);
    assert.equal(info?.holders[0]?.owner, lock.value);
    await lock.release();
    const rk = c.key("read");
    const r1 = await r.acquireRead([rk], 5000);
    const r2 = await r.acquireRead([rk], 5000);
    assert.equal(r1.mode, "read");
    assert.equal((await c.server.holders(rk)).length, 2);
    await assert.rejects(r.acquire([rk], 1000));
    await r1.release();
    await r2.release();
    const sk = c.key("sem");
    const s1 = await r.acquireSemaphore(sk, 2, 5000);
    const s2 = await r.acquireSemaphore(sk, 2, 5000);
    assert.equal(s1.mode, "semaphore");
    await assert.rejects(r.acquireSemaphore(sk, 2, 5000));
    await s1.release();
    await s2.release();
    assert.equal(await c.server.lockInfo(sk), null);
  }],

  ["quit() closes the package's connections and the user's client", async (c) => {
    const client = await c.kit.client(c.kind, c.server);
    const r = new Redlock([client]);
    const lock = await r.acquire([c.key("quit")], 5000);
    await lock.release();
    await r.quit();
    // ioredis says "end" once the socket has closed after QUIT's reply.
    if (c.kind === "ioredis") await waitFor(() => (client as { status: string }).status === "end", 5000, { what: "the ioredis client ended" });
    else await waitFor(() => (client as { isOpen: boolean }).isOpen === false, 5000, { what: "the node-redis client closed" });
  }],
];

describe("the redlock v5 surface", () => {
  const kit = useKit();
  let server: Server | undefined;

  for (const kind of CLIENT_KINDS) {
    describe(kind, () => {
      for (const [name, run] of scenarios) {
        test(name, { timeout: TEST_TIMEOUT_MS }, async () => {
          server ??= await kit.server();
          const s = server;
          await run({
            kit,
            kind,
            server: s,
            key: (n) => `surface:${kind}:${n}`,
            redlock: async (settings) => {
              const r = new Redlock([await kit.client(kind, s)], settings);
              kit.defer(() => r.quit());
              return r;
            },
          });
        });
      }
    });
  }
});
