// Tests for the second review's findings: a watched acquire never hands out a lock whose
// validity its watch set-up spent; a lock over several servers has no single fencing token; a
// one-server acquire whose reply never came gives its possible grant back; using() does not
// report success after its signal fired; an extend racing a release reports no loss.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock, { ExecutionError, InvalidRequestError, LockLostError, type RedisClientLike } from "../src/index.js";
import { now, sleep, uniqueKeys, until, useKit, type Kit, type Server } from "./kit/index.js";

const TEST_TIMEOUT_MS = 60_000;
const key = uniqueKeys("review2");

function redlockOn(kit: Kit, servers: Server[], settings?: ConstructorParameters<typeof Redlock>[1]): Redlock {
  const clients: RedisClientLike[] = servers.map((s) => kit.ioredis(s));
  const r = new Redlock(clients, settings);
  r.on("error", () => undefined);
  kit.defer(() => r.quit());
  return r;
}

/** Blocks the event loop (a CPU-bound step of the caller's work). */
function busy(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // spin
  }
}

describe("second review", () => {
  test("5 servers, 2 paused: a watched acquire (onLost) comes back valid and unlost, in well under its duration", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const servers = await kit.servers(5);
    const redlock = redlockOn(kit, servers, { retryCount: 0 });
    // The command connections are open before the pause (a vote is due within a tenth of the
    // duration: with 1500 ms, 150 ms, which a new connection's connect and ready check missed on
    // the shared 2-core machine under load, in the matrix's ioredis 6 run). The watch's connections
    // (subscribers) to the paused servers are still new: what this test is about.
    await (await redlock.acquire([key("warm")], 5000)).release();
    await servers[3]!.pause();
    await servers[4]!.pause();
    kit.defer(async () => {
      await servers[3]!.resume();
      await servers[4]!.resume();
    });
    const losses: LockLostError[] = [];
    const t0 = now();
    // Under the 2 s a connection to a paused server may take (so a watch set-up that waited for
    // it would spend the whole validity), over 1500 for a vote due within 190 ms.
    const duration = 1900;
    const lock = await redlock.acquire([key("paused")], duration, { onLost: (e) => losses.push(e) });
    const took = now() - t0;
    assert.equal(lock.lost, null, `not lost: ${String(lock.lost)}`);
    // The watch set-up on the paused servers may take a quarter of the validity, no more.
    assert.ok(lock.validity() > 500, `validity left ${lock.validity()} ms after ${took.toFixed(0)} ms`);
    assert.ok(lock.expiration > Date.now() + 500);
    assert.ok(Number.isInteger(lock.expiration), "expiration is an integer, as redlock's");
    assert.deepEqual(losses, []);
    await lock.release();
  });

  test("a lock over several servers has no single fencing token; per-server tokens grow", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const servers = await kit.servers(3);
    const redlock = redlockOn(kit, servers, { retryCount: 0 });
    const k = key("fence");
    const a = await redlock.acquire([k], 5000);
    assert.throws(() => a.fencingToken, InvalidRequestError);
    await a.release();
    const b = await redlock.acquire([k], 5000);
    for (const [server, token] of b.tokens.get(k) ?? new Map<string, bigint>()) {
      assert.ok(token > (a.tokens.get(k)?.get(server) ?? 0n), server);
    }
    await b.release();
    const one = redlockOn(kit, [servers[0]!], { retryCount: 0 });
    const c = await one.acquire([k], 5000);
    assert.equal(typeof c.fencingToken, "bigint");
    await c.release();
  });

  test("one server paused past the acquire's deadline: the late grant is given back, not left for its ttl", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const server = await kit.server();
    const redlock = redlockOn(kit, [server], { retryCount: 0 });
    const k = key("late");
    // The command connection is open before the pause.
    await (await redlock.acquire([key("warm")], 5000)).release();
    await server.pause();
    const failed = redlock.acquire([k], 5000).then(
      () => assert.fail("acquired on a paused server"),
      (e: unknown) => e,
    );
    await sleep(700);
    await server.resume();
    assert.ok((await failed) instanceof ExecutionError);
    // The grant the server made when it woke up is given back at once, not after 5 s.
    await until("the late grant given back", async () => (await server.lockInfo(k)) === null, 2000);
  });

  test("using(): a signal fired (validity spent while the servers still held) makes using reject", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const servers = await kit.servers(3);
    // driftFactor 0.3: the client's validity (about 838 ms) ends well before the servers' ttl (1200 ms).
    const redlock = redlockOn(kit, servers, { retryCount: 0, driftFactor: 0.3, automaticExtensionThreshold: 500 });
    const out = redlock.using([key("cpu")], 1200, async (signal) => {
      busy(1000); // past the validity, short of the servers' ttl: no timer can run meanwhile
      await sleep(20);
      assert.equal(signal.aborted, true, "the signal fired");
      return "done";
    });
    const e = await out.then(
      (v) => assert.fail(`using resolved with ${String(v)}`),
      (err: unknown) => err,
    );
    assert.ok(e instanceof LockLostError, String(e));
    assert.equal(e.cause, "expired");
  });

  test("a grant that waited while the event loop was busy: validity() is no more than the server's ttl for the hold", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const server = await kit.server();
    const redlock = redlockOn(kit, [server]);
    const k = key("busy");
    // Another owner holds the key for 300 ms; the server grants the waiter when that ends (at
    // most one expiry cycle, 100 ms, later), while this process is busy until 1000 ms.
    assert.equal(typeof (await server.call(["LOCK.ACQUIRE", k, "someone-else", "300"])), "bigint");
    const pending = redlock.acquire([k], 5000, { wait: 5000 });
    await sleep(100);
    busy(900);
    const lock = await pending;
    const info = await server.lockInfo(k);
    const serverTtl = info?.holders.find((h) => h.owner === lock.value)?.ttl;
    assert.ok(serverTtl !== undefined, "held");
    // The server's ttl was read after validity's end was fixed: the validity may not exceed it.
    assert.ok(lock.validity() <= Number(serverTtl) + 5, `validity ${lock.validity()} ms, server ttl ${serverTtl} ms`);
    assert.ok(lock.validity() < 4800, `the busy time is not counted as held time: ${lock.validity()}`);
    await lock.release();
  });

  test("an extend racing a release: no loss is reported, the extend rejects as released", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const server = await kit.server();
    const redlock = redlockOn(kit, [server], { retryCount: 0 });
    const losses: LockLostError[] = [];
    const lock = await redlock.acquire([key("race")], 5000, { onLost: (e) => losses.push(e) });
    const released = lock.release();
    const extended = lock.extend(5000).then(
      () => null,
      (e: unknown) => e,
    );
    await released;
    const e = await extended;
    assert.ok(e === null || (e instanceof ExecutionError && !(e instanceof LockLostError)), `extend after release: ${String(e)}`);
    await sleep(100);
    assert.deepEqual(losses.map((l) => l.message), []);
  });
});
