// The host libraries, release by release (the matrix: `make test-matrix-node` runs this file with
// REDIS_LOCK_NODE_HOST set to each of ioredis 5 and 6, node-redis 4, 5 and 6; see
// test/kit/clients.ts). For each client kind, and for each protocol its release lets a user pick:
//  - connections: the package's own connections speak RESP2 whatever the user's client speaks,
//    and the user's client keeps its protocol and its own reply shapes;
//  - loss notice: a DEL or an overwrite of a held key aborts using()'s signal and calls onLost
//    (ioredis 6 speaks RESP3 by default: its invalidations arrive as push frames, and a watcher
//    reading RESP2 messages never heard of them);
//  - waits: a wait longer than a client's default command timeout (node-redis 6: 5 s) is granted;
//  - errors: every package error prints as `Name: Sentence.`
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import Redlock, {
  CapacityMismatchError,
  ExecutionError,
  InvalidRequestError,
  LockLostError,
  ModuleMissingError,
  RefusedError,
  UnsupportedClientError,
  WrongKindError,
  type Lock,
  type RedlockAbortSignal,
} from "../src/index.js";
import { CLIENT_KINDS, hostDescription, hostModule, moduleVersion, now, sleep, uniqueKeys, useKit, waitFor, type ClientKind, type Kit, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;
/** How long a loss may take to be noticed here: generous (the watcher's own bound, 50 ms, is
 *  tested by using.test.ts and watch.test.ts); without the watcher it is never noticed within
 *  the lock's 30 s. */
const NOTICE_MS = 3000;

const key = uniqueKeys("hosts");

/** A protocol set-up of the user's client. */
interface UserSetup {
  label: string;
  /** The RESP version the user's client should speak with these options. */
  resp: 2 | 3;
  make(kit: Kit, at: Server): Promise<unknown>;
}

function major(kind: ClientKind): number {
  return Number(moduleVersion(hostModule(kind)).split(".")[0]);
}

/** The user set-ups a release allows: its defaults, and each protocol it can be asked for. */
function setups(kind: ClientKind): UserSetup[] {
  const m = major(kind);
  switch (kind) {
    case "ioredis": {
      const out: UserSetup[] = [{ label: "defaults", resp: m >= 6 ? 3 : 2, make: async (k, at) => k.ioredis(at) }];
      if (m >= 6) {
        // Options ioredis 5's types do not know (the kit's types are ioredis 5's).
        const opts = (o: Record<string, unknown>) => o as Parameters<Kit["ioredis"]>[1];
        out.push({ label: "protocol 3, replyMapping resp3", resp: 3, make: async (k, at) => k.ioredis(at, opts({ protocol: 3, replyMapping: "resp3" })) });
        out.push({ label: "protocol 2", resp: 2, make: async (k, at) => k.ioredis(at, opts({ protocol: 2 })) });
      }
      return out;
    }
    case "node-redis": {
      const out: UserSetup[] = [{ label: "defaults", resp: m >= 6 ? 3 : 2, make: (k, at) => k.nodeRedis(at) }];
      const opts = (o: Record<string, unknown>) => o as Parameters<Kit["nodeRedis"]>[1];
      out.push({ label: "RESP 3", resp: 3, make: (k, at) => k.nodeRedis(at, { RESP: 3 }) });
      // RESP3-only options that a RESP2 duplicate of the client would refuse to start with.
      out.push({ label: "RESP 3, clientSideCache", resp: 3, make: (k, at) => k.nodeRedis(at, opts({ RESP: 3, clientSideCache: { ttl: 0, maxEntries: 0 } })) });
      if (m >= 6) {
        out.push({ label: "RESP 3, emitInvalidate", resp: 3, make: (k, at) => k.nodeRedis(at, opts({ RESP: 3, emitInvalidate: true })) });
        out.push({ label: "RESP 2", resp: 2, make: (k, at) => k.nodeRedis(at, opts({ RESP: 2 })) });
      }
      return out;
    }
    case "node-redis4":
      return [{ label: "defaults", resp: 2, make: (k, at) => k.nodeRedis4(at) }];
  }
}

/** Sends a command on the user's own client, whatever its kind. */
function userCall(kind: ClientKind, client: unknown, args: string[]): Promise<unknown> {
  if (kind === "ioredis") {
    const c = client as { call(cmd: string, ...a: string[]): Promise<unknown> };
    const [cmd, ...rest] = args;
    return c.call(cmd as string, ...rest);
  }
  return (client as { sendCommand(a: string[]): Promise<unknown> }).sendCommand(args);
}

/** CLIENT LIST as id → its fields. */
async function clientList(server: Server): Promise<Map<string, Map<string, string>>> {
  const out = new Map<string, Map<string, string>>();
  for (const line of String(await server.call(["CLIENT", "LIST"])).split("\n")) {
    if (!line.trim()) continue;
    const fields = new Map(line.trim().split(" ").map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)] as [string, string]));
    const id = fields.get("id");
    if (id !== undefined) out.set(id, fields);
  }
  return out;
}

/** The watcher is set up: a tracking connection (flag t) and a Pub/Sub one (flag P). */
async function watcherReady(server: Server): Promise<boolean> {
  const flags = [...(await clientList(server)).values()].map((f) => f.get("flags") ?? "");
  return flags.some((f) => f.includes("t")) && flags.some((f) => f.includes("P"));
}

function abortedWithin(signal: AbortSignal, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(true);
    const t = setTimeout(() => resolve(false), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve(true);
    }, { once: true });
  });
}

/** `Name: Sentence.`: what an error of the package prints, on every host release. */
function assertSentence(e: unknown, what: string): void {
  assert.ok(e instanceof Error, `${what}: an Error`);
  const msg = e.message;
  assert.equal(String(e), `${e.name}: ${msg}`, `${what}: String(err) is "Name: message"`);
  assert.equal(e.name, e.constructor.name, `${what}: name is the class name`);
  assert.match(msg, /^([A-Z0-9`"'(]|[a-z]+[A-Z(.])/, `${what}: begins with a capital (or a code name such as info()): ${JSON.stringify(msg)}`);
  assert.match(msg, /[.!?]$/, `${what}: ends a sentence: ${JSON.stringify(msg)}`);
  assert.doesNotMatch(msg, /undefined|\[object |\s$|: \.$|\.\.$/, `${what}: reads as a sentence: ${JSON.stringify(msg)}`);
}

/** Whether `version` (x.y.z) satisfies `range`: space-separated comparators (>=, >, <=, <, =),
 *  all of which must hold (the only form package.json's peer ranges use). */
function satisfies(version: string, range: string): boolean {
  const parse = (v: string): number[] => v.split(/[.-]/).slice(0, 3).map((x) => Number(x));
  const cmp = (a: number[], b: number[]): number => {
    for (let i = 0; i < 3; i++) if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) - (b[i] ?? 0);
    return 0;
  };
  const v = parse(version);
  return range.trim().split(/\s+/).every((c) => {
    const m = /^(>=|<=|>|<|=)?\s*(\d+(?:\.\d+){0,2})$/.exec(c);
    if (!m) throw new Error(`a comparator this test does not read: ${c} (in ${range})`);
    const d = cmp(v, parse(m[2] as string));
    switch (m[1]) {
      case ">=":
        return d >= 0;
      case ">":
        return d > 0;
      case "<=":
        return d <= 0;
      case "<":
        return d < 0;
      default:
        return d === 0;
    }
  });
}

describe("peer ranges claim the tested majors only", () => {
  const pkg = require("../../package.json") as { peerDependencies: Record<string, string> };
  // The majors the matrix runs (make test-matrix-node), and the modules installed for each peer:
  // the pinned aliases, and the plain name (in a `make test-latest-node` copy: the newest).
  const matrix: Record<string, { majors: number[]; modules: string[] }> = {
    ioredis: { majors: [5, 6], modules: ["ioredis", "ioredis6"] },
    redis: { majors: [4, 5, 6], modules: ["redis4", "redis", "redis6"] },
  };
  for (const [peer, { majors, modules }] of Object.entries(matrix)) {
    test(`${peer}: the range is majors ${majors.join(", ")} (the matrix), and what is installed is in it`, () => {
      const range = pkg.peerDependencies[peer];
      assert.ok(range, `a peer range for ${peer}`);
      for (const m of majors) {
        assert.ok(satisfies(`${m}.0.0`, range) && satisfies(`${m}.99.99`, range), `${peer} ${m}.x (tested) is in ${range}`);
      }
      const next = Math.max(...majors) + 1;
      const before = Math.min(...majors) - 1;
      assert.ok(!satisfies(`${next}.0.0`, range), `${peer} ${next}.0.0 (untested) is outside ${range}`);
      assert.ok(!satisfies(`${before}.99.99`, range), `${peer} ${before}.x (untested) is outside ${range}`);
      for (const m of modules) {
        const v = moduleVersion(m);
        assert.ok(satisfies(v, range), `${peer} ${v} (installed as ${m}) is in ${range}: a newer major needs the matrix, the docs and the range updated`);
      }
    });
  }
});

for (const kind of CLIENT_KINDS) {
  describe(`host library ${hostDescription(kind)} (${kind})`, () => {
    const kit = useKit();
    let server: Server;
    before(async () => {
      server = await kit.server();
    });

    for (const setup of setups(kind)) {
      test(`connections (user's client: ${setup.label}): the package's speak RESP2, the user's keeps RESP${setup.resp} and its own replies`, { timeout: TEST_TIMEOUT_MS }, async () => {
        // A server of its own: CLIENT LIST shows this test's connections only.
        const server = await kit.server();
        const client = await setup.make(kit, server);
        const redlock = new Redlock([client as never], { retryCount: 0 });
        kit.defer(() => redlock.quit());
        const k = key("conn");
        const lock = await redlock.acquire([k], 30_000, { onLost: () => undefined });
        await waitFor(() => watcherReady(server), 5000, { what: "the loss watcher's connections" });
        // The package's LOCK.INFO, over its own connections, is typed whatever the user speaks.
        const info = await redlock.info(k);
        assert.equal(info?.mode, "write");
        assert.equal(info?.holders[0]?.owner, lock.value);
        const userId = String(await userCall(kind, client, ["CLIENT", "ID"]));
        const list = await clientList(server);
        const user = list.get(userId);
        assert.ok(user, `the user's connection ${userId} is listed`);
        assert.equal(user.get("resp"), String(setup.resp), "the user's client keeps its protocol");
        // Everything else but the kit's own admin connection (RESP2, the one asking CLIENT LIST).
        const ours = [...list.entries()].filter(([id, f]) => id !== userId && f.get("cmd") !== "client|list");
        assert.ok(ours.length >= 2, `the package's command connection (tracking on) and its subscriber: ${ours.length}`);
        for (const [id, f] of ours) assert.equal(f.get("resp"), "2", `the package's connection ${id} (flags ${f.get("flags")}) speaks RESP2`);
        // The user's own commands, in the user's protocol: a map reply stays what the client makes of it.
        const hello = await userCall(kind, client, ["HELLO"]);
        const proto = hello instanceof Map ? hello.get("proto") : Array.isArray(hello) ? hello[hello.indexOf("proto") + 1] : (hello as Record<string, unknown>)["proto"];
        assert.equal(Number(proto), setup.resp, `HELLO on the user's client: ${JSON.stringify(hello, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v instanceof Map ? Object.fromEntries(v) : v))}`);
        assert.ok(await userCall(kind, client, ["LOCK.INFO", k]), "LOCK.INFO on the user's client answers");
        assert.equal(String(await userCall(kind, client, ["SET", key("plain"), "v"])), "OK");
        await lock.release();
        assert.equal(await redlock.info(k), null);
      });

      test(`loss notice (user's client: ${setup.label}): a DEL and an overwrite abort using()'s signal and call onLost`, { timeout: TEST_TIMEOUT_MS }, async () => {
        const client = await setup.make(kit, server);
        const redlock = new Redlock([client as never], { retryCount: 0 });
        kit.defer(() => redlock.quit());
        for (const how of ["DEL", "SET"] as const) {
          // using(): the signal aborts with the loss.
          const k1 = key(`using-${how}`);
          const sentinel = new Error("routine saw the loss");
          let seen: Error | undefined;
          const run = redlock.using([k1], 30_000, async (signal: RedlockAbortSignal) => {
            await waitFor(() => watcherReady(server), 5000, { what: "the loss watcher's connections" });
            assert.equal(signal.aborted, false);
            const t0 = now();
            await server.call(how === "DEL" ? ["DEL", k1] : ["SET", k1, "x"]);
            assert.ok(await abortedWithin(signal, NOTICE_MS), `using(): the signal was not aborted within ${NOTICE_MS} ms of the ${how} (${(now() - t0).toFixed(0)} ms)`);
            seen = signal.error;
            throw sentinel;
          });
          await assert.rejects(run, (e) => {
            if (e !== sentinel) throw e;
            return true;
          });
          assert.ok(seen instanceof LockLostError, `signal.error is a LockLostError: ${String(seen)}`);
          assert.equal(seen.cause, how === "DEL" ? "deleted" : "overwritten");

          // acquire() with onLost: the callback, lock.lost, validity 0.
          const k2 = key(`onlost-${how}`);
          let lost: LockLostError | null = null;
          const lock: Lock = await redlock.acquire([k2], 30_000, { onLost: (e: LockLostError) => (lost = e) });
          await waitFor(() => watcherReady(server), 5000, { what: "the loss watcher's connections" });
          await sleep(20);
          await server.call(how === "DEL" ? ["DEL", k2] : ["SET", k2, "x"]);
          await waitFor(() => lost !== null, NOTICE_MS, { what: `onLost after the ${how}` });
          assert.equal(lock.lost?.cause, how === "DEL" ? "deleted" : "overwritten");
          assert.equal(lock.validity(), 0);
          await assert.rejects(lock.release(), LockLostError);
        }
      });
    }

    test("waits: a wait longer than 5 s (node-redis 6's default command timeout) is granted", { timeout: TEST_TIMEOUT_MS }, async () => {
      const redlock = new Redlock([(await kit.client(kind, server)) as never], { retryCount: 0 });
      kit.defer(() => redlock.quit());
      const k = key("long");
      const held = await redlock.acquire([k], 30_000);
      const t0 = now();
      const waiter = redlock.acquire([k], 5000, { wait: 20_000 });
      await waitFor(async () => (await server.waiting(k)) === 1, 5000, { what: "the waiter queued" });
      await sleep(5600 - (now() - t0));
      await held.release();
      const lock = await waiter;
      assert.ok(now() - t0 >= 5500, "granted after the release");
      assert.equal((await server.holders(k))[0], lock.value);
      await lock.release();
    });

    test("errors print as sentences (String(err) is `Name: Sentence.`), through this release", { timeout: TEST_TIMEOUT_MS }, async () => {
      const client = await kit.client(kind, server);
      const redlock = new Redlock([client as never], { retryCount: 0 });
      kit.defer(() => redlock.quit());
      const caught: Array<[string, unknown]> = [];
      async function expectError<E extends Error>(what: string, cls: abstract new (...a: never[]) => E, f: () => Promise<unknown>): Promise<E> {
        try {
          await f();
        } catch (e) {
          assert.ok(e instanceof cls, `${what}: ${String(e)}`);
          caught.push([what, e]);
          for (const a of e instanceof ExecutionError ? e.attempts : []) {
            for (const [, v] of (await a).votesAgainst) caught.push([`${what} (a vote against)`, v]);
          }
          return e;
        }
        assert.fail(`${what}: no error`);
      }
      const k = key("err");
      const held = await redlock.acquire([k], 30_000);
      await expectError("held elsewhere", ExecutionError, () => redlock.acquire([k], 1000));
      const str = key("str");
      await server.call(["SET", str, "x"]);
      await expectError("WRONGTYPE", RefusedError, () => redlock.acquire([str], 1000));
      await expectError("a permit of a lock key", WrongKindError, () => redlock.acquireSemaphore(k, 2, 1000));
      const sem = key("sem");
      const permit = await redlock.acquireSemaphore(sem, 2, 30_000);
      await expectError("another capacity", CapacityMismatchError, () => redlock.acquireSemaphore(sem, 3, 1000));
      await expectError("a bad duration", InvalidRequestError, () => redlock.acquire([key("x")], -1));
      await expectError("no resources", InvalidRequestError, () => redlock.acquire([], 1000));
      await expectError("a bad wait", InvalidRequestError, () => redlock.acquire([key("x")], 1000, { wait: -5 }));
      await expectError("not a client", UnsupportedClientError, async () => new Redlock([{} as never]));
      await server.call(["DEL", k]);
      await expectError("a release after a DEL", LockLostError, () => held.release());
      await permit.release();

      const bare = await kit.server({ module: null });
      const noModule = new Redlock([(await kit.client(kind, bare)) as never], { retryCount: 0 });
      kit.defer(() => noModule.quit());
      await expectError("no module", ModuleMissingError, () => noModule.acquire([key("m")], 1000));

      const gone = await kit.server();
      const goneLock = new Redlock([(await kit.client(kind, gone)) as never], { retryCount: 0 });
      kit.defer(() => goneLock.quit());
      await gone.close();
      await expectError("a server down", ExecutionError, () => goneLock.acquire([key("d")], 1000));

      const paused = await kit.server();
      const pausedLock = new Redlock([(await kit.client(kind, paused)) as never], { retryCount: 0 });
      kit.defer(() => pausedLock.quit());
      paused.pause();
      try {
        await expectError("a server paused", ExecutionError, () => pausedLock.acquire([key("p")], 1000));
      } finally {
        paused.resume();
      }
      const names = new Set(caught.map(([, e]) => (e as Error).name));
      for (const n of ["ExecutionError", "ResourceLockedError", "RefusedError", "WrongKindError", "CapacityMismatchError", "InvalidRequestError", "UnsupportedClientError", "LockLostError", "NotOwnerError", "ModuleMissingError", "ConnectionLostError", "ReplyTimeoutError"]) {
        assert.ok(names.has(n), `a ${n} was seen: ${[...names].join(", ")}`);
      }
      for (const [what, e] of caught) assertSentence(e, what);
    });
  });
}
