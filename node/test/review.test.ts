// Review tests for the integration fixes of 8c67fde: a server paused before its first use, the
// caller's resource order, using()'s context, LockLostError's message, the exported error
// classes, ConnectionLimitError, and the API scenarios over every client kind.
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import Redlock, {
  ConnectionLimitError,
  ConnectionLostError,
  ExecutionError,
  Lock,
  LockLostError,
  ReplyTimeoutError,
  TokenPrecisionError,
  UnsafeIntegerReplyError,
  UnsupportedClientError,
  type RedisClientLike,
} from "../src/index.js";
import { CLIENT_KINDS, sleep, uniqueKeys, until, useKit, type ClientKind, type Kit, type Server } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 60_000;

const key = uniqueKeys("review");

/** `p`, or a rejection naming `what` after `ms` (the timer is cleared; `p`'s late outcome is
 *  swallowed, so a hung operation cannot become an unhandled rejection). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  p.catch(() => undefined);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no outcome within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** The rejection of `p` (fails when it resolves). */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => assert.fail("expected a rejection"),
    (e: unknown) => e,
  );
}

/** A Redlock over clients of `kind` to `servers`, quit at teardown. */
async function redlockOf(kit: Kit, kind: ClientKind, servers: Server[], settings?: ConstructorParameters<typeof Redlock>[1]): Promise<Redlock> {
  const clients: RedisClientLike[] = [];
  for (const s of servers) clients.push(await kit.client(kind, s));
  const r = new Redlock(clients, settings);
  kit.defer(() => r.quit());
  return r;
}

/** The user client is connected (ioredis connects in the background). */
async function connected(c: unknown): Promise<void> {
  const io = c as { status?: string };
  if (typeof io.status === "string") await until("the user's ioredis client is ready", () => io.status === "ready");
}

describe("a server paused (SIGSTOP) before the Redlock first uses it", () => {
  for (const kind of CLIENT_KINDS) {
    test(`one server (${kind}): acquire with wait 500 rejects within 5 s with an ExecutionError naming the server`, { timeout: TEST_TIMEOUT_MS }, async (t) => {
      const kit = useKit(t);
      const server = await kit.server();
      const client = await kit.client(kind, server);
      await connected(client);
      const redlock = new Redlock([client]);
      kit.defer(() => redlock.quit());
      const k = key("paused-one");
      server.pause();
      try {
        const t0 = performance.now();
        const err = await within(rejection(redlock.acquire([k], 5000, { wait: 500 })), 5000, "acquire on a paused server");
        const took = performance.now() - t0;
        assert.ok(took < 5000, `rejected after ${took.toFixed(0)} ms`);
        assert.ok(err instanceof ExecutionError, `an ExecutionError, got ${String(err)}`);
        assert.ok(err.message.includes(server.name), `the message names ${server.name}: ${err.message}`);
      } finally {
        server.resume();
      }
      // Nothing was granted (or it was given back) once the server runs again.
      await until("nothing held after the resume", async () => (await server.lockInfo(k)) === null || (await server.holders(k)).length === 0);
    });
  }

  test(
    "one server, a free wait pool, wait 500: the paused server is not reported as a ConnectionLimitError",
    {
      timeout: TEST_TIMEOUT_MS,
    },
    async (t) => {
      const kit = useKit(t);
      const server = await kit.server();
      const client = kit.ioredis(server);
      await connected(client);
      const redlock = new Redlock([client]);
      kit.defer(() => redlock.quit());
      server.pause();
      try {
        const err = await within(rejection(redlock.acquire([key("paused-kind")], 5000, { wait: 500 })), 5000, "acquire on a paused server");
        assert.ok(err instanceof ExecutionError);
        assert.ok(!(err instanceof ConnectionLimitError), `no wait connection was busy: ${String(err)}`);
      } finally {
        server.resume();
      }
    },
  );

  test("three servers, one paused before first use, retryCount 0: acquire succeeds within 5 s", { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const kit = useKit(t);
    const servers = await kit.servers(3);
    const clients = servers.map((s) => kit.ioredis(s));
    for (const c of clients) await connected(c);
    const redlock = new Redlock(clients, { retryCount: 0 });
    kit.defer(() => redlock.quit());
    const k = key("paused-three");
    const paused = servers[1]!;
    paused.pause();
    try {
      const t0 = performance.now();
      const lock = await within(redlock.acquire([k], 5000), 5000, "acquire with one of three servers paused");
      const took = performance.now() - t0;
      assert.ok(took < 5000, `granted after ${took.toFixed(0)} ms`);
      assert.equal(lock.tokens.get(k)?.size, 2, "granted by the two running servers");
      for (const s of [servers[0]!, servers[2]!]) assert.deepEqual(await s.holders(k), [lock.value]);
      await within(lock.release(), 5000, "release with one server paused");
    } finally {
      paused.resume();
    }
  });
});

describe("lock.resources keeps the caller's order", () => {
  const kit = useKit();
  test("[b, a] stays [b, a] after acquire and after extend", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = await redlockOf(kit, "ioredis", [server]);
    const p = key("order");
    const resources = [`${p}:b`, `${p}:a`];
    const lock = await redlock.acquire(resources, 5000);
    assert.deepEqual(lock.resources, resources);
    assert.deepEqual(resources, [`${p}:b`, `${p}:a`], "the caller's array is not reordered either");
    const longer = await lock.extend(8000);
    assert.deepEqual(longer.resources, resources);
    for (const r of resources) assert.deepEqual(await server.holders(r), [lock.value]);
    await longer.release();
    for (const r of resources) assert.equal(await server.lockInfo(r), null);
  });
});

describe("using() passes { lock, extensions } (sesamecare's context)", () => {
  const kit = useKit();
  test("extensions grows with each automatic extension; context.lock is the current lock", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = await redlockOf(kit, "ioredis", [server]);
    const k = key("context");
    const seen: { first?: Lock; startExtensions?: number } = {};
    const out = await redlock.using([k], 1200, { automaticExtensionThreshold: 1000 }, async (signal, context) => {
      assert.ok(context, "the routine gets a second argument");
      assert.ok(context.lock instanceof Lock);
      seen.first = context.lock;
      seen.startExtensions = context.extensions;
      assert.deepEqual(await server.holders(k), [context.lock.value]);
      await sleep(1500);
      assert.equal(signal.aborted, false);
      assert.ok(context.extensions >= 1, `extended ${context.extensions} times`);
      assert.notEqual(context.lock, seen.first, "each extension gives a new lock");
      assert.equal(seen.first.expiration, 0, "the first lock was replaced");
      assert.ok(context.lock.expiration > Date.now(), "the context's lock is the live one");
      assert.equal(context.lock.value, seen.first.value);
      assert.deepEqual(context.lock.resources, [k]);
      const info = await server.lockInfo(k);
      assert.deepEqual(info?.holders.map((h) => h.owner), [context.lock.value]);
      return context.extensions;
    });
    assert.equal(seen.startExtensions, 0);
    assert.ok(out >= 1);
    assert.equal(await server.lockInfo(k), null, "released at the end");
  });
});

describe("LockLostError names its cause once", () => {
  const kit = useKit();
  test("a DEL under onLost: the description of 'deleted' appears exactly once", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const redlock = await redlockOf(kit, "ioredis", [server]);
    const k = key("gone"); // no "deleted" in the key itself
    const box: { seen?: LockLostError } = {};
    const lock = await redlock.acquire([k], 10_000, { onLost: (e) => (box.seen = e) });
    await server.call(["DEL", k]);
    await until("onLost", () => box.seen !== undefined);
    const seen = box.seen as LockLostError;
    assert.equal(seen.cause, "deleted");
    const count = (m: string): number => m.split("deleted").length - 1;
    assert.equal(count(seen.message), 1, `named once: ${seen.message}`);
    const onRelease = await rejection(lock.release());
    assert.ok(onRelease instanceof LockLostError);
    assert.equal(count(onRelease.message), 1, `named once: ${onRelease.message}`);
  });
});

describe("error classes are exported", () => {
  test("the connection and client error classes exist; a non-client is refused; TokenPrecisionError is an ExecutionError", () => {
    const made: [Function, Error][] = [
      [ConnectionLostError, new ConnectionLostError("x")],
      [ReplyTimeoutError, new ReplyTimeoutError("x")],
      [UnsupportedClientError, new UnsupportedClientError("x")],
      [UnsafeIntegerReplyError, new UnsafeIntegerReplyError(2 ** 53 + 2)],
      [TokenPrecisionError, new TokenPrecisionError("x")],
      [ExecutionError, new ExecutionError("x", [])],
    ];
    for (const [cls, e] of made) {
      assert.equal(typeof cls, "function");
      assert.ok(e instanceof Error);
      assert.equal(e.name, cls.name, "each class names itself");
    }
    assert.throws(() => new Redlock([{} as unknown as RedisClientLike]), UnsupportedClientError);
    const e = new TokenPrecisionError("9007199254740993 is not a safe integer");
    assert.ok(e instanceof ExecutionError);
    assert.equal(e.name, "TokenPrecisionError");
    assert.deepEqual(e.attempts, []);
  });
});

describe("ConnectionLimitError", () => {
  const kit = useKit();
  test("maxWaitConnections 1: a second wait that gets no connection before its wait runs out", { timeout: TEST_TIMEOUT_MS }, async () => {
    const server = await kit.server();
    const k = key("limit");
    const holder = await redlockOf(kit, "ioredis", [server]);
    const held = await holder.acquire([k], 30_000);
    const redlock = await redlockOf(kit, "ioredis", [server], { maxWaitConnections: 1 });
    // The first waiter takes the only wait connection and stays queued on the server for
    // longer than the second may wait (with equal waits, which one ends first is a race).
    const first = redlock.acquire([k], 5000, { wait: 3000 });
    first.catch(() => undefined);
    await until("the first waiter queues", async () => (await server.waiting(k)) === 1);
    const t0 = performance.now();
    const err = await rejection(redlock.acquire([k], 5000, { wait: 300 }));
    const took = performance.now() - t0;
    assert.ok(err instanceof ConnectionLimitError, `ConnectionLimitError, got ${String(err)}`);
    assert.ok(err instanceof ExecutionError);
    assert.equal(err.name, "ConnectionLimitError");
    assert.ok(err.message.includes(server.name), err.message);
    assert.ok(took >= 250 && took < 2500, `rejected after ${took.toFixed(0)} ms`);
    // Nothing of the second: the holder holds, the first alone waits.
    const info = await server.lockInfo(k);
    assert.deepEqual(info?.holders.map((h) => h.owner), [held.value]);
    assert.equal(info?.waiting, 1n);
    await held.release();
    const got = await first;
    assert.deepEqual(await server.holders(k), [got.value]);
    await got.release();
    assert.equal(await server.lockInfo(k), null, "nothing left held or queued");
  });
});

/** One API scenario run with each client kind. */
interface Scenario {
  name: string;
  run(redlock: Redlock, server: Server, kit: Kit, kind: ClientKind): Promise<void>;
}

const SCENARIOS: Scenario[] = [
  {
    name: "acquire, extend, release",
    async run(redlock, server) {
      const k = key("basic");
      const lock = await redlock.acquire([k], 5000);
      assert.equal(typeof lock.fencingToken, "bigint");
      assert.ok(lock.fencingToken > 0n);
      assert.deepEqual(await server.holders(k), [lock.value]);
      const longer = await lock.extend(20_000);
      assert.equal(lock.expiration, 0);
      assert.equal(longer.fencingToken, lock.fencingToken);
      const info = await server.lockInfo(k);
      assert.ok((info?.holders[0]?.ttl ?? 0n) > 15_000n, `ttl ${info?.holders[0]?.ttl}`);
      await longer.release();
      assert.equal(await server.lockInfo(k), null);
      const again = await redlock.acquire([k], 5000);
      assert.ok(again.fencingToken > lock.fencingToken, "tokens grow (bigint)");
      await again.release();
    },
  },
  {
    name: "using returns the routine's value and releases",
    async run(redlock, server) {
      const k = key("using");
      const out = await redlock.using([k], 5000, async (signal, context) => {
        assert.equal(signal.aborted, false);
        assert.deepEqual(await server.holders(k), [context.lock.value]);
        return 7;
      });
      assert.equal(out, 7);
      assert.equal(await server.lockInfo(k), null);
    },
  },
  {
    name: "FIFO: two waiters are granted in their queue order",
    async run(redlock, server, kit, kind) {
      const k = key("fifo");
      const other = await redlockOf(kit, kind, [server]);
      const held = await redlock.acquire([k], 30_000);
      const order: string[] = [];
      const w1 = redlock.acquire([k], 30_000, { wait: 20_000 }).then((l) => (order.push("w1"), l));
      await until("w1 queues", async () => (await server.waiting(k)) === 1);
      const w2 = other.acquire([k], 30_000, { wait: 20_000 }).then((l) => (order.push("w2"), l));
      await until("w2 queues", async () => (await server.waiting(k)) === 2);
      await held.release();
      const l1 = await w1;
      assert.deepEqual(order, ["w1"]);
      assert.deepEqual(await server.holders(k), [l1.value]);
      assert.ok(l1.fencingToken > held.fencingToken);
      await l1.release();
      const l2 = await w2;
      assert.deepEqual(order, ["w1", "w2"]);
      assert.ok(l2.fencingToken > l1.fencingToken);
      await l2.release();
      assert.equal(await server.lockInfo(k), null);
    },
  },
  {
    name: "an aborted wait leaves no grant and no waiter",
    async run(redlock, server) {
      const k = key("abort");
      const held = await redlock.acquire([k], 30_000);
      const ac = new AbortController();
      const pending = redlock.acquire([k], 5000, { wait: 20_000, signal: ac.signal });
      await until("the waiter queues", async () => (await server.waiting(k)) === 1);
      const reason = new Error("stop waiting");
      ac.abort(reason);
      await assert.rejects(pending, (e: unknown) => e === reason);
      await until("the waiter leaves", async () => (await server.waiting(k)) === 0);
      await held.release();
      // Nobody was granted it: the cut-short waiter never got (or gave back) the lock.
      await sleep(50);
      assert.equal(await server.lockInfo(k), null);
    },
  },
];

describe("API scenarios per client kind", () => {
  const kit = useKit();
  let server: Server;
  before(async () => {
    server = await kit.server();
  });
  for (const kind of CLIENT_KINDS) {
    for (const sc of SCENARIOS) {
      test(`${sc.name} (${kind})`, { timeout: TEST_TIMEOUT_MS }, async () => {
        const redlock = await redlockOf(kit, kind, [server]);
        await sc.run(redlock, server, kit, kind);
      });
    }
  }
});
