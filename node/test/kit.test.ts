// Tests of the test kit itself: servers, restart, signals, clusters, TLS, clients, children,
// parsers and teardown.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { describe, test } from "node:test";

import {
  Kit,
  commandstats,
  encode,
  keySlot,
  parseCommandstats,
  parseHeld,
  parseInfo,
  parseLockInfo,
  parseReply,
  percentile,
  RespConn,
  useKit,
  waitFor,
  type RespValue,
} from "./kit/index.js";

describe("parsers (no server)", () => {
  test("parseInfo skips headers and keeps the first of a repeated name", () => {
    const m = parseInfo("# Server\r\nredis_version:7.0.15\r\n\r\n# Lock\r\nlock_waiters:3\r\nredis_version:9\r\n");
    assert.equal(m.get("redis_version"), "7.0.15");
    assert.equal(m.get("lock_waiters"), "3");
    assert.equal(m.size, 2);
  });

  test("parseCommandstats reads every field by lower-case command name", () => {
    const s = parseCommandstats(
      "# Commandstats\r\ncmdstat_LOCK.ACQUIRE:calls=12,usec=34,usec_per_call=2.83,rejected_calls=1,failed_calls=2\r\ncmdstat_client|tracking:calls=1,usec=3,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n",
    );
    assert.deepEqual(s.get("lock.acquire"), { calls: 12, usec: 34, usecPerCall: 2.83, rejectedCalls: 1, failedCalls: 2 });
    assert.equal(s.get("client|tracking")?.calls, 1);
  });

  test("RESP replies parse exactly (integers above 2^53 stay exact)", () => {
    const buf = Buffer.from(":9007199254740993\r\n*3\r\n$4\r\nmode\r\n$-1\r\n*1\r\n+OK\r\n-ERR boom\r\n");
    const a = parseReply(buf, 0);
    assert.equal(a?.value, 9007199254740993n);
    const b = parseReply(buf, a!.next);
    assert.deepEqual(b?.value, ["mode", null, ["OK"]]);
    const c = parseReply(buf, b!.next);
    assert.ok(c?.value instanceof Error);
    assert.equal(parseReply(Buffer.from("$5\r\nab"), 0), null);
    assert.equal(encode(["GET", "k"]).toString(), "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
  });

  test("parseLockInfo reads holders, waiting and the extra fields", () => {
    const reply: RespValue = ["mode", "write", "fence", 42n, "holders", [["me", 1n, 900n, "x"]], "waiting", 2n, "queue", ["write", "read"], "delay", 0n];
    const i = parseLockInfo(reply);
    assert.ok(i);
    assert.equal(i.mode, "write");
    assert.equal(i.fence, 42n);
    assert.deepEqual(i.holders, [{ owner: "me", count: 1n, ttl: 900n }]);
    assert.equal(i.waiting, 2n);
    assert.deepEqual(i.queue, ["write", "read"]);
    assert.equal(i.capacity, null);
    assert.equal(parseLockInfo(null), null);
  });

  test("keySlot matches known slots and honours hash tags", () => {
    assert.equal(keySlot("foo"), 12182);
    assert.equal(keySlot("123456789"), 12739);
    assert.equal(keySlot("{user1000}.following"), keySlot("user1000"));
    assert.equal(keySlot("foo{}{bar}"), keySlot("foo{}{bar}"));
  });

  test("percentile is nearest-rank", () => {
    assert.equal(percentile([5, 1, 3, 2, 4], 50), 3);
    assert.equal(percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99), 10);
    assert.ok(Number.isNaN(percentile([], 50)));
  });

  test("waitFor returns the value, and fails naming what it waited for", async () => {
    let n = 0;
    assert.equal(await waitFor(() => (++n >= 3 ? n : 0), 1000, { intervalMs: 1 }), 3);
    await assert.rejects(waitFor(() => false, 50, { what: "never" }), /timed out after 50 ms waiting for never/);
    await assert.rejects(
      waitFor(async () => {
        throw new Error("boom");
      }, 30),
      /last error boom/,
    );
  });
});

describe("one server", () => {
  const kit = useKit();

  test("starts with the module on a free loopback port; LOCK.INFO and waiting counts read exactly", async () => {
    const s = await kit.server();
    assert.ok(s.port > 0 && s.alive);
    const t = await s.call(["LOCK.ACQUIRE", "k", "me", 10000]);
    assert.equal(typeof t, "bigint");
    // Two raw waiters, queued in order.
    const w1 = new RespConn(s.port);
    const w2 = new RespConn(s.port);
    try {
      const r1 = w1.send(["LOCK.ACQUIRE", "k", "w1", 10000, "WAIT", 10000]);
      await waitFor(async () => (await s.waiting("k")) === 1, 5000);
      const r2 = w2.send(["LOCK.ACQUIRE", "k", "w2", 10000, "WAIT", 10000]);
      await waitFor(async () => (await s.waiting("k")) === 2, 5000);
      const info = await s.lockInfo("k");
      assert.equal(info?.mode, "write");
      assert.equal(info?.fence, t);
      assert.deepEqual(await s.holders("k"), ["me"]);
      await s.call(["LOCK.RELEASE", "k", "me"]);
      assert.ok(((await r1) as bigint) > (t as bigint));
      await s.call(["LOCK.RELEASE", "k", "w1"]);
      assert.ok(((await r2) as bigint) > (t as bigint));
    } finally {
      w1.close();
      w2.close();
    }
    const stats = await commandstats(s);
    assert.ok((stats.get("lock.acquire")?.calls ?? 0) >= 3);
    assert.ok((stats.get("lock.info")?.calls ?? 0) >= 1);
  });

  test("restart keeps the port and directory; with appendonly the hold and the token survive", async () => {
    const s = await kit.server({ appendonly: true });
    const port = s.port;
    const t1 = (await s.call(["LOCK.ACQUIRE", "p", "me", 60000])) as bigint;
    await s.restart();
    assert.equal(s.port, port);
    assert.deepEqual(await s.holders("p"), ["me"]);
    await s.restart({ kill: true });
    assert.equal(s.port, port);
    await s.call(["LOCK.RELEASE", "p", "me"]);
    const t2 = (await s.call(["LOCK.ACQUIRE", "p", "me", 60000])) as bigint;
    assert.ok(t2 > t1);
    const aof = await s.info("persistence");
    assert.equal(aof.get("aof_enabled"), "1");
  });

  test("extra config arguments reach the server", async () => {
    const s = await kit.server({ args: ["--hz", "50", "--lock.max-waiters", "12345"] });
    const hz = (await s.call(["CONFIG", "GET", "hz"])) as string[];
    assert.equal(hz[1], "50");
    const mw = (await s.call(["CONFIG", "GET", "lock.max-waiters"])) as string[];
    assert.equal(mw[1], "12345");
  });

  test("pause (SIGSTOP) stops replies until resume (SIGCONT); kill and start again", async () => {
    const s = await kit.server();
    s.pause();
    assert.ok(s.paused);
    await assert.rejects(s.call(["PING"], 300), /no reply/);
    s.resume();
    assert.equal(await s.call(["PING"]), "PONG");
    const port = s.port;
    await s.kill();
    assert.equal(s.alive, false);
    await assert.rejects(s.call(["PING"], 500));
    await s.start();
    assert.equal(s.port, port);
    assert.equal(await s.call(["PING"]), "PONG");
  });

  test("servers(n) are independent", async () => {
    const ss = await kit.servers(3);
    assert.equal(new Set(ss.map((s) => s.port)).size, 3);
    await ss[0]!.call(["SET", "only-here", "1"]);
    assert.equal(await ss[1]!.call(["GET", "only-here"]), null);
  });
});

describe("clients and children", () => {
  const kit = useKit();

  test("ioredis, node-redis v5 and v4 clients reach the server", async () => {
    const s = await kit.server();
    const io = kit.ioredis(s);
    assert.equal(await io.ping(), "PONG");
    const v5 = await kit.nodeRedis(s);
    assert.equal(await v5.ping(), "PONG");
    const v4 = await kit.nodeRedis4(s);
    assert.equal(await v4.ping(), "PONG");
    for (const kind of ["ioredis", "node-redis", "node-redis4"] as const) {
      const c = await kit.client(kind, s);
      assert.ok(c);
    }
  });

  test("a holder child holds until SIGKILL; with BIND the hold ends at once, without at its TTL", async () => {
    const s = await kit.server();
    const bound = await kit.holder({ port: s.port, key: "b", ttl: 60000, bind: true, via: "raw" });
    const held = parseHeld(bound.readyLine);
    assert.equal(typeof held.token, "bigint");
    assert.deepEqual(await s.holders("b"), [held.owner]);
    await bound.kill();
    await waitFor(async () => (await s.lockInfo("b")) === null, 5000, { what: "the bound hold's end" });

    const plain = await kit.holder({ port: s.port, key: "u", ttl: 1500, via: "raw" });
    const killedAt = performance.now();
    await plain.kill();
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(await s.holders("u"), [parseHeld(plain.readyLine).owner], "held until its TTL");
    await waitFor(async () => (await s.lockInfo("u")) === null, 5000);
    assert.ok(performance.now() - killedAt >= 1000);
  });
});

describe("teardown", () => {
  test("close() kills servers, children and clients, even twice", async () => {
    const k = new Kit();
    const s = await k.server();
    const other = await new Kit().server(); // an observer outside k, closed below
    const child = await k.holder({ port: s.port, key: "x", ttl: 60000, via: "raw" });
    const io = k.ioredis(other);
    await io.ping();
    const v5 = await k.nodeRedis(other);
    const v4 = await k.nodeRedis4(other);
    await v5.ping();
    await v4.ping();
    const before = String(await other.call(["CLIENT", "LIST"])).trim().split("\n").length;
    assert.ok(before >= 4);
    let deferred = 0;
    k.defer(() => deferred++);
    const pid = s.pid!;
    await k.close();
    await k.close();
    assert.equal(deferred, 1);
    assert.equal(s.alive, false);
    assert.throws(() => process.kill(pid, 0));
    assert.notEqual(child.proc.exitCode ?? child.proc.signalCode, null);
    assert.equal(existsSync(s.dir), false);
    await waitFor(async () => String(await other.call(["CLIENT", "LIST"])).trim().split("\n").length === 1, 5000, {
      what: "only the kit's admin connection left",
    });
    await other.close();
    await assert.rejects(k.server(), /closed/);
  });
});

describe("cluster", () => {
  const kit = useKit();

  test("three masters, every node ok; keys on each node; an ioredis Cluster client routes", async () => {
    const c = await kit.cluster();
    assert.equal(c.nodes.length, 3);
    const keys = c.keysOnEachNode("lk");
    assert.equal(new Set(keys.map((k) => keySlot(k))).size, 3);
    for (const [i, k] of keys.entries()) {
      const node = c.nodes[i]!;
      assert.equal(c.nodeFor(k), node);
      assert.equal(await node.call(["CLUSTER", "KEYSLOT", k]), BigInt(keySlot(k)));
      assert.equal(typeof (await node.call(["LOCK.ACQUIRE", k, "me", 10000])), "bigint");
      const other = c.nodes[(i + 1) % 3]!;
      await assert.rejects(other.call(["LOCK.INFO", k]), /MOVED/);
    }
    const client = kit.ioredisCluster(c);
    for (const k of keys) assert.ok(await client.call("LOCK.INFO", k));
  });
});

describe("tls", () => {
  const kit = useKit();

  test("a TLS listener with a throwaway CA: ioredis and node-redis verify and connect", async () => {
    const s = await kit.tlsServer();
    assert.notEqual(s.tlsPort, s.port);
    const io = kit.ioredisTls(s);
    assert.equal(await io.call("LOCK.INFO", "t"), null);
    const v5 = await kit.nodeRedis({ host: s.host, port: s.tlsPort }, { socket: { tls: true, ca: s.certs.ca, host: s.host, port: s.tlsPort } });
    assert.equal(await v5.ping(), "PONG");
    const clients = String(await s.call(["CLIENT", "LIST"]));
    assert.ok(clients.split("\n").length >= 3);
  });
});
