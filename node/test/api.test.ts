// The public API against real servers (redis-server with the lock module), with ioredis.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import type { Redis } from "ioredis";
import Redlock, {
  CapacityMismatchError,
  ExecutionError,
  InvalidRequestError,
  Lock,
  LockLostError,
  ModuleMissingError,
  RefusedError,
  ResourceLockedError,
  WrongKindError,
  type ExecutionStats,
} from "../src/index.js";
import { uniqueKeys, useKit, waitFor, type Server } from "./kit/index.js";

const kit = useKit();

/** A user client as the tests hand it to the package (ioredis, from the kit: closed at teardown). */
function client(server: Server): Redis {
  return kit.ioredis(server, { maxRetriesPerRequest: 1 });
}

const key = uniqueKeys("api");

describe("one server (ioredis)", () => {
  let server: Server;
  let admin: Redis;
  const opened: Redlock[] = [];
  const make = (settings?: ConstructorParameters<typeof Redlock>[1]): Redlock => {
    const r = new Redlock([client(server)], settings);
    opened.push(r);
    return r;
  };

  before(async () => {
    server = await kit.server();
    admin = client(server);
  });
  after(async () => {
    for (const r of opened) await r.quit().catch(() => undefined);
  });

  it("acquire, tokens, release (redlock's surface)", async () => {
    const redlock = make();
    const k = key("basic");
    const lock = await redlock.acquire([k], 5000);
    assert.ok(lock instanceof Lock);
    assert.equal(lock.mode, "write");
    assert.deepEqual(lock.resources, [k]);
    assert.match(lock.value, /^[0-9a-f]{32}$/);
    assert.equal(typeof lock.fencingToken, "bigint");
    assert.ok(lock.fencingToken > 0n);
    assert.ok(lock.expiration > Date.now() + 4000 && lock.expiration <= Date.now() + 5000);
    assert.ok(lock.validity() > 4000);
    assert.equal(lock.attempts.length, 1);
    const stats = await (lock.attempts[0] as Promise<ExecutionStats>);
    assert.equal(stats.membershipSize, 1);
    assert.equal(stats.quorumSize, 1);
    assert.equal(stats.votesFor.size, 1);
    assert.ok(stats.votesFor.has([...redlock.clients][0]!));
    const info = await redlock.info(k);
    assert.ok(info);
    assert.equal(info.mode, "write");
    assert.equal(info.holders[0]?.owner, lock.value);
    assert.equal(info.fence, lock.fencingToken);
    const res = await lock.release();
    assert.equal(res.attempts.length, 1);
    assert.equal(lock.expiration, 0);
    assert.equal(await redlock.info(k), null);
    const again = await redlock.acquire([k], 5000);
    assert.ok(again.fencingToken > lock.fencingToken, "tokens grow, compared as bigint");
    await again.release();
  });

  it("retryCount 0 fails fast with ExecutionError whose votesAgainst hold ResourceLockedError, and emits error", async () => {
    const redlock = make();
    const k = key("busy");
    const lock = await redlock.acquire([k], 5000);
    const errors: Error[] = [];
    redlock.on("error", (e: Error) => errors.push(e));
    const t0 = Date.now();
    const err = await redlock.acquire([k], 5000, { retryCount: 0 }).then(
      () => assert.fail("acquired a held lock"),
      (e: unknown) => e,
    );
    assert.ok(Date.now() - t0 < 1000);
    assert.ok(err instanceof ExecutionError);
    assert.equal(err.message, "The operation was unable to achieve a quorum during its retry window.");
    assert.equal(err.attempts.length, 1);
    const stats = await (err.attempts[0] as Promise<ExecutionStats>);
    assert.equal(stats.votesFor.size, 0);
    const against = [...stats.votesAgainst.values()];
    assert.equal(against.length, 1);
    assert.ok(against[0] instanceof ResourceLockedError);
    assert.equal(against[0]?.message, "The operation was applied to: 0 of the 1 requested resources.");
    assert.ok(errors.some((e) => e instanceof ResourceLockedError));
    await lock.release();
  });

  it("waits in the server's queue: granted when the holder releases", async () => {
    const redlock = make();
    const k = key("wait");
    const first = await redlock.acquire([k], 10000);
    const t0 = Date.now();
    const pending = redlock.acquire([k], 5000, { wait: 5000 });
    await waitFor(async () => (await redlock.info(k))?.waiting === 1);
    setTimeout(() => void first.release(), 100);
    const second = await pending;
    assert.ok(Date.now() - t0 >= 90);
    assert.ok(second.fencingToken > first.fencingToken);
    await second.release();
  });

  it("a wait that runs out rejects, and leaves no grant and no waiter", async () => {
    const redlock = make();
    const k = key("timeout");
    const first = await redlock.acquire([k], 10000);
    await assert.rejects(redlock.acquire([k], 5000, { wait: 200 }), ExecutionError);
    const info = await redlock.info(k);
    assert.equal(info?.waiting, 0);
    assert.equal(info?.holders.length, 1);
    await first.release();
  });

  it("an AbortSignal'd wait rejects with the signal's reason and leaves no grant behind", async () => {
    const redlock = make();
    const k = key("abort");
    const first = await redlock.acquire([k], 10000);
    const ac = new AbortController();
    const pending = redlock.acquire([k], 5000, { wait: 10000, signal: ac.signal });
    await waitFor(async () => (await redlock.info(k))?.waiting === 1);
    const reason = new Error("stop waiting");
    ac.abort(reason);
    await assert.rejects(pending, (e: unknown) => e === reason);
    await waitFor(async () => (await redlock.info(k))?.waiting === 0);
    await first.release();
    // Nobody holds it now: the cut-short waiter was never granted (or gave it back).
    await waitFor(async () => (await redlock.info(k)) === null);
    // An already-aborted signal: nothing is sent.
    await assert.rejects(redlock.acquire([k], 1000, { signal: AbortSignal.abort(reason) }), (e: unknown) => e === reason);
  });

  it("several resources are taken in one global order: reversed lists never deadlock", async () => {
    const redlock = make();
    const a = key("a");
    const b = key("b");
    const c = key("c");
    const rounds = 20;
    let done = 0;
    const worker = async (list: string[]): Promise<void> => {
      for (let i = 0; i < rounds; i++) {
        const lock = await redlock.acquire(list, 2000, { wait: 10000 });
        assert.equal(lock.tokens.size, 3);
        await lock.release();
        done++;
      }
    };
    await Promise.all([worker([a, b, c]), worker([c, b, a]), worker([b, c, a])]);
    assert.equal(done, rounds * 3);
    await assert.rejects(redlock.acquire([a, a], 1000), InvalidRequestError);
  });

  it("read locks are shared, a writer waits for them", async () => {
    const redlock = make();
    const k = key("rw");
    const r1 = await redlock.acquireRead([k], 5000);
    const r2 = await redlock.acquireRead([k], 5000, { retryCount: 0 });
    assert.equal(r1.mode, "read");
    const info = await redlock.info(k);
    assert.equal(info?.mode, "read");
    assert.equal(info?.holders.length, 2);
    await assert.rejects(redlock.acquire([k], 5000, { retryCount: 0 }), ExecutionError);
    const w = redlock.acquire([k], 5000, { wait: 5000 });
    await waitFor(async () => (await redlock.info(k))?.waiting === 1);
    await r1.release();
    await r2.release();
    const wl = await w;
    assert.equal(wl.mode, "write");
    await wl.release();
  });

  it("a semaphore grants capacity permits, refuses another capacity and the other kind", async () => {
    const redlock = make();
    const k = key("sem");
    const p1 = await redlock.acquireSemaphore(k, 2, 5000);
    const p2 = await redlock.acquireSemaphore(k, 2, 5000);
    assert.equal(p1.mode, "semaphore");
    await assert.rejects(redlock.acquireSemaphore(k, 2, 5000, { retryCount: 0 }), ExecutionError);
    await assert.rejects(redlock.acquireSemaphore(k, 3, 5000, { retryCount: 0 }), CapacityMismatchError);
    await assert.rejects(redlock.acquire([k], 5000, { retryCount: 0 }), WrongKindError);
    const info = await redlock.info(k);
    assert.equal(info?.mode, "semaphore");
    assert.equal(info?.capacity, 2);
    await p1.release();
    const p3 = await redlock.acquireSemaphore(k, 2, 5000, { retryCount: 0 });
    await p2.release();
    await p3.release();
    await assert.rejects(redlock.acquireSemaphore(k, 0, 5000), InvalidRequestError);
  });

  it("extend returns a new lock and the old one's expiration becomes 0", async () => {
    const redlock = make();
    const k = key("extend");
    const lock = await redlock.acquire([k], 1000);
    const longer = await lock.extend(10000);
    assert.equal(lock.expiration, 0);
    assert.ok(longer.expiration > Date.now() + 9000);
    assert.equal(longer.value, lock.value);
    assert.equal(longer.fencingToken, lock.fencingToken);
    const info = await redlock.info(k);
    assert.ok((info?.holders[0]?.ttl ?? 0) > 9000);
    await assert.rejects(lock.extend(1000), (e: unknown) => e instanceof ExecutionError && e.message === "Cannot extend an already-expired lock.");
    await longer.release();
    await assert.rejects(redlock.acquire([k], 1.5), (e: unknown) => e instanceof Error && e.message === "Duration must be an integer value in milliseconds.");
  });

  it("release after a loss rejects with LockLostError naming the cause; onLost is called", async () => {
    const redlock = make();
    const k = key("lost");
    let seen: LockLostError | undefined;
    const lock = await redlock.acquire([k], 10000, { onLost: (e) => (seen = e) });
    await admin.del(k);
    await waitFor(() => seen !== undefined);
    assert.equal(seen?.cause, "deleted");
    assert.equal(lock.lost?.cause, "deleted");
    assert.equal(lock.validity(), 0);
    await assert.rejects(lock.release(), (e: unknown) => e instanceof LockLostError && e.cause === "deleted");
    // Without a watcher: the release finds it (overwritten).
    const k2 = key("lost2");
    const l2 = await redlock.acquire([k2], 10000);
    await admin.set(k2, "x");
    await assert.rejects(l2.release(), (e: unknown) => e instanceof LockLostError && e.cause === "overwritten");
  });

  it("a watched lock that nobody extends is reported lost when its validity runs out", async () => {
    const redlock = make();
    const k = key("expiry");
    const box: { seen?: LockLostError; at?: number } = {};
    const t0 = Date.now();
    const lock = await redlock.acquire([k], 300, { onLost: (e) => ((box.seen = e), (box.at = Date.now())) });
    await waitFor(() => box.seen !== undefined);
    const seen = (box as { seen?: LockLostError }).seen;
    const took = (box as { at?: number }).at! - t0;
    assert.ok(took >= 250 && took < 2000, `reported after ${took} ms`);
    // The client's own clock runs out first (validity = ttl less margins); the server's expiry may race it.
    assert.ok(seen && ["expired", "deleted"].includes(seen.cause), seen?.cause);
    assert.equal(lock.validity(), 0);
  });

  it("using: extends past the duration, releases at the end, returns the routine's value", async () => {
    const redlock = make();
    const k = key("using");
    const out = await redlock.using([k], 600, { automaticExtensionThreshold: 300 }, async (signal) => {
      await new Promise((r) => setTimeout(r, 1200));
      assert.equal(signal.aborted, false);
      const info = await redlock.info(k);
      assert.equal(info?.holders.length, 1);
      return 42;
    });
    assert.equal(out, 42);
    assert.equal(await redlock.info(k), null);
    await assert.rejects(
      redlock.using([k], 500, async () => 1),
      (e: unknown) => e instanceof Error && e.message.startsWith("A lock `duration` must be at least 100ms greater"),
    );
  });

  it("using: the signal aborts with a LockLostError when the key is deleted", async () => {
    const redlock = make();
    const k = key("using-lost");
    const routineError = new Error("routine saw the loss");
    await assert.rejects(
      redlock.using([k], 5000, async (signal) => {
        await admin.del(k);
        await waitFor(() => signal.aborted);
        assert.ok(signal.error instanceof LockLostError);
        assert.equal((signal.error as LockLostError).cause, "deleted");
        throw routineError;
      }),
      (e: unknown) => e === routineError,
    );
  });

  it("bind: the hold ends when its connection closes", async () => {
    const redlock = make();
    const k = key("bind");
    let seen: LockLostError | undefined;
    const lock = await redlock.acquire([k], 30000, { bind: true, onLost: (e) => (seen = e) });
    const info = await redlock.info(k);
    assert.equal(info?.holders[0]?.owner, lock.value);
    // Kill the bound connection from the server side (with the idle wait connections that
    // last ran an acquire: they are not bound to anything).
    const list = String(await admin.call("CLIENT", "LIST"));
    const ids = list
      .split("\n")
      .filter((l) => /cmd=lock\.acquire/.test(l))
      .map((l) => /id=(\d+)/.exec(l)?.[1])
      .filter((x): x is string => !!x);
    assert.ok(ids.length >= 1);
    for (const id of ids) await admin.call("CLIENT", "KILL", "ID", id);
    await waitFor(async () => (await redlock.info(k)) === null);
    await waitFor(() => seen !== undefined);
    // The closed connection, or the key gone with it (whichever the client hears of first).
    assert.ok(seen && ["connection-closed", "deleted"].includes(seen.cause), seen?.cause);
  });

  it("lockDelay: after an expiry nobody gets the lock until the delay passed", async () => {
    const redlock = make();
    const k = key("delay");
    await redlock.acquire([k], 100, { lockDelay: 800 });
    await waitFor(async () => (await redlock.info(k))?.mode === "free");
    const t0 = Date.now();
    const next = await redlock.acquire([k], 1000, { wait: 5000 });
    assert.ok(Date.now() - t0 >= 300, "granted only after the delay");
    await next.release();
    await assert.rejects(redlock.acquireRead([k], 1000, { lockDelay: 10 }), InvalidRequestError);
  });

  it("quit() closes our connections and quits the user's clients", async () => {
    const c = client(server);
    const redlock = new Redlock([c]);
    const lock = await redlock.acquire([key("quit")], 5000, { onLost: () => undefined });
    assert.ok(lock.fencingToken > 0n);
    await redlock.quit();
    await waitFor(() => c.status === "end");
  });

  it("a wait with retryCount -1 has no limit; the default settings wait retryCount * retryDelay", async () => {
    const redlock = make({ retryCount: 2, retryDelay: 100 });
    const k = key("map");
    const first = await redlock.acquire([k], 10000);
    const t0 = Date.now();
    await assert.rejects(redlock.acquire([k], 1000), ExecutionError);
    const took = Date.now() - t0;
    assert.ok(took >= 190 && took < 1500, `waited ${took} ms`);
    const unlimited = redlock.acquire([k], 1000, { retryCount: -1 });
    await waitFor(async () => (await redlock.info(k))?.waiting === 1);
    await first.release();
    await (await unlimited).release();
  });

  it("a wait on a paused server is cut short at wait + 1 s: its connection destroyed, no grant left", async () => {
    const redlock = make();
    const k = key("paused");
    const first = await redlock.acquire([k], 30000);
    const pending = redlock.acquire([k], 5000, { wait: 300 });
    await waitFor(async () => (await redlock.info(k))?.waiting === 1);
    const t0 = Date.now();
    server.pause();
    try {
      const err = await pending.then(
        () => assert.fail("granted while paused"),
        (e: unknown) => e,
      );
      const took = Date.now() - t0;
      assert.ok(took >= 1200 && took < 4000, `cut after ${took} ms`);
      assert.ok(err instanceof ExecutionError);
      assert.match(err.message, /did not answer/);
    } finally {
      server.resume();
    }
    await waitFor(async () => (await redlock.info(k))?.waiting === 0);
    const info = await redlock.info(k);
    assert.deepEqual(info?.holders.map((h) => h.owner), [first.value]);
    await first.release();
    assert.equal(await redlock.info(k), null);
  });

  it("a key of another type is refused (RefusedError)", async () => {
    const redlock = make();
    const k = key("string");
    await admin.set(k, "v");
    await assert.rejects(redlock.acquire([k], 1000), RefusedError);
  });

  it("a server without the module: ModuleMissingError", async () => {
    const bare = await kit.server({ module: null });
    const redlock = new Redlock([client(bare)]);
    try {
      await assert.rejects(redlock.acquire([key("nomodule")], 1000), ModuleMissingError);
    } finally {
      await redlock.quit();
      await bare.close();
    }
  });

  it("extend after a loss rejects with LockLostError; a semaphore waiter gets a freed permit", async () => {
    const redlock = make();
    const k = key("extlost");
    const lock = await redlock.acquire([k], 10000);
    await admin.del(k);
    await assert.rejects(lock.extend(5000), (e: unknown) => e instanceof LockLostError && e.cause === "deleted");
    assert.equal(lock.lost?.cause, "deleted");
    const s = key("semwait");
    const p1 = await redlock.acquireSemaphore(s, 1, 5000);
    const p2 = redlock.acquireSemaphore(s, 1, 5000, { wait: 5000 });
    await waitFor(async () => (await redlock.info(s))?.waiting === 1);
    await p1.release();
    const got = await p2;
    assert.ok(got.fencingToken > p1.fencingToken);
    await got.release();
  });
});

describe("Redlock over three servers (ioredis)", () => {
  const servers: Server[] = [];
  const opened: Redlock[] = [];
  before(async () => {
    servers.push(...(await kit.servers(3)));
  });
  after(async () => {
    for (const r of opened) await r.quit().catch(() => undefined);
  });
  const make = (settings?: ConstructorParameters<typeof Redlock>[1]): Redlock => {
    const r = new Redlock(
      servers.map((s) => client(s)),
      settings,
    );
    opened.push(r);
    return r;
  };

  it("a majority grants; tokens per server; release everywhere", async () => {
    const redlock = make();
    const k = key("q");
    const lock = await redlock.acquire([k], 5000);
    const stats = await (lock.attempts[lock.attempts.length - 1] as Promise<ExecutionStats>);
    assert.equal(stats.membershipSize, 3);
    assert.equal(stats.quorumSize, 2);
    assert.equal(stats.votesFor.size, 3);
    assert.equal(lock.tokens.get(k)?.size, 3);
    const infos = await redlock.infoAll(k);
    assert.equal(infos.size, 3);
    await lock.release();
    for (const v of (await redlock.infoAll(k)).values()) assert.equal(v, null);
    await assert.rejects(redlock.acquireSemaphore(k, 2, 1000), InvalidRequestError);
  });

  it("a held lock: a waiter queues and gets it when released; retryCount 0 fails fast", async () => {
    const redlock = make();
    const other = make();
    const k = key("qwait");
    const first = await redlock.acquire([k], 10000);
    await assert.rejects(other.acquire([k], 5000, { retryCount: 0 }), ExecutionError);
    const pending = other.acquire([k], 5000, { wait: 8000 });
    await new Promise((r) => setTimeout(r, 150));
    await first.release();
    const second = await pending;
    // Per server, the second holder's token is larger than the first's wherever both were granted.
    for (const [server, token] of second.tokens.get(k) ?? new Map<string, bigint>()) {
      const before = first.tokens.get(k)?.get(server);
      if (before !== undefined) assert.ok(token > before, `${server}: ${token} > ${before}`);
    }
    assert.ok((second.tokens.get(k)?.size ?? 0) >= 2, "held on a majority");
    await second.release();
  });

  it("retryCount 0 on a held lock: votesAgainst of a majority hold ResourceLockedError", async () => {
    const redlock = make();
    const k = key("q0");
    const lock = await redlock.acquire([k], 5000);
    const err = await redlock.acquire([k], 5000, { retryCount: 0 }).then(
      () => assert.fail("acquired a held lock"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ExecutionError);
    assert.equal(err.attempts.length, 1);
    const stats = await (err.attempts[0] as Promise<ExecutionStats>);
    assert.equal(stats.votesAgainst.size, 3);
    for (const [c, e] of stats.votesAgainst) {
      assert.ok(redlock.clients.has(c));
      assert.ok(e instanceof ResourceLockedError);
    }
    await lock.release();
  });

  it("several resources over three servers: reversed lists never deadlock", async () => {
    const redlock = make();
    const a = key("qa");
    const b = key("qb");
    let done = 0;
    const worker = async (list: string[]): Promise<void> => {
      for (let i = 0; i < 8; i++) {
        const lock = await redlock.acquire(list, 3000, { wait: 15000 });
        assert.equal(lock.tokens.get(a)?.size !== undefined && lock.tokens.get(b) !== undefined, true);
        await lock.release();
        done++;
      }
    };
    await Promise.all([worker([a, b]), worker([b, a])]);
    assert.equal(done, 16);
  });

  it("an aborted wait over three servers leaves no grant on any", async () => {
    const redlock = make();
    const k = key("qabort");
    const first = await redlock.acquire([k], 10000);
    const ac = new AbortController();
    const pending = redlock.acquire([k], 5000, { wait: 10000, signal: ac.signal });
    await new Promise((r) => setTimeout(r, 100));
    ac.abort(new Error("enough"));
    await assert.rejects(pending, /enough/);
    await first.release();
    await new Promise((r) => setTimeout(r, 50));
    for (const v of (await redlock.infoAll(k)).values()) assert.equal(v, null);
  });

  it("a loss on one server of three is not a loss; on two it is", async () => {
    const redlock = make();
    const k = key("qlost");
    const box: { seen?: LockLostError } = {};
    const lock = await redlock.acquire([k], 10000, { onLost: (e) => (box.seen = e) });
    const admins = servers.map((sv) => client(sv));
    try {
      await admins[0]!.del(k);
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(box.seen, undefined);
      assert.equal(lock.lost, null);
      await admins[1]!.set(k, "x");
      await waitFor(() => box.seen !== undefined);
      const seen = (box as { seen?: LockLostError }).seen;
      assert.ok(seen instanceof LockLostError);
      assert.ok(["deleted", "overwritten"].includes(seen.cause));
      await assert.rejects(lock.release(), LockLostError);
    } finally {
      for (const a of admins) a.disconnect();
    }
  });

  it("bind over three servers: a held lock is waited for (polling), the holds end with their connections", async () => {
    const redlock = make();
    const k = key("qbind");
    const first = await redlock.acquire([k], 10000, { bind: true });
    const pending = redlock.acquire([k], 10000, { bind: true, wait: 5000 });
    await new Promise((r) => setTimeout(r, 100));
    await first.release();
    const box: { seen?: LockLostError } = {};
    const second = await pending;
    assert.notEqual(second.value, first.value);
    assert.ok((second.tokens.get(k)?.size ?? 0) >= 2);
    await second.release();
    const third = await redlock.acquire([k], 30000, { bind: true, onLost: (e) => (box.seen = e) });
    const admins = servers.map((sv) => client(sv));
    try {
      // Kill the bound connections on two servers: the lock is lost (connection-closed).
      for (const a of admins.slice(0, 2)) {
        const list = String(await a.call("CLIENT", "LIST"));
        for (const line of list.split("\n").filter((l) => /cmd=lock\.(acquire|release)/.test(l))) {
          const id = /id=(\d+)/.exec(line)?.[1];
          if (id) await a.call("CLIENT", "KILL", "ID", id);
        }
      }
      await waitFor(() => box.seen !== undefined);
      const seen = (box as { seen?: LockLostError }).seen;
      // The closed connection, or the key gone with it (whichever the client hears of first).
    assert.ok(seen && ["connection-closed", "deleted"].includes(seen.cause), seen?.cause);
      const infos = [...(await redlock.infoAll(k)).values()];
      assert.ok(infos.filter((i) => i === null).length >= 2);
      await assert.rejects(third.release(), LockLostError);
    } finally {
      for (const a of admins) a.disconnect();
    }
  });

  it("with one server stopped the quorum still grants; with two it fails naming them", async () => {
    const redlock = make();
    const k = key("down");
    await servers[2]!.kill();
    const lock = await redlock.acquire([k], 5000, { retryCount: 0 });
    const stats = await (lock.attempts[0] as Promise<ExecutionStats>);
    assert.equal(stats.votesFor.size, 2);
    assert.equal(stats.votesAgainst.size, 1);
    await lock.release();
    await servers[1]!.kill();
    const err = await redlock.acquire([key("down2")], 5000, { retryCount: 0 }).then(
      () => assert.fail("acquired without a quorum"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ExecutionError);
    assert.match(err.message, /quorum could not be reached/);
    assert.ok(err.message.includes(`127.0.0.1:${servers[1]!.port}`));
  });
});
