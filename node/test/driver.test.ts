import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Cluster as IORedisCluster, Redis } from "ioredis";
import {
  ConnectionLostError,
  ReplyTimeoutError,
  ServerReplyError,
  UnsafeIntegerReplyError,
  isRedirect,
  sendRouted,
  sendWaitRouted,
  targetFor,
  type Conn,
  type Reply,
  type Target,
} from "../src/driver/index.js";
import { slotOf } from "../src/driver/slot.js";
import { watchHold, type LossCause } from "../src/watcher.js";
import { CLIENT_KINDS, SERVER_BINARY, closeClient, commandCalls, sleep, uniqueKeys, until, useKit, type Cluster, type Server, type TlsServer } from "./kit/index.js";

const kit = useKit();


function infoField(reply: Reply, field: string): Reply | undefined {
  if (!Array.isArray(reply)) return undefined;
  for (let i = 0; i + 1 < reply.length; i += 2) if (reply[i] === field) return reply[i + 1];
  return undefined;
}

let srv: Server;
let admin: Redis;
before(async () => {
  srv = await kit.server();
  admin = kit.ioredis(srv);
});

const newKey = uniqueKeys("drv");

for (const kind of CLIENT_KINDS) {
  describe(`driver over ${kind}`, () => {
    let target: Target;
    before(async () => {
      target = targetFor(await kit.client(kind, srv), { maxWaitConnections: 2 });
    });
    after(async () => {
      await target.close();
    });

    test("LOCK.* commands give exact bigint tokens and normalised replies", async () => {
      assert.equal(target.isCluster, false);
      assert.equal(target.name, `127.0.0.1:${srv.port}`);
      const ep = await target.endpointFor("x");
      const conn = await ep.command();
      const key = newKey("tok");
      const t1 = await conn.send(["LOCK.ACQUIRE", key, "A", "10000"]);
      assert.equal(typeof t1, "bigint");
      assert.ok((t1 as bigint) >= 1n);
      assert.equal(await conn.send(["LOCK.ACQUIRE", key, "B", "10000"]), null);
      const info = await conn.send(["LOCK.INFO", key]);
      assert.equal(infoField(info, "mode"), "write");
      assert.equal(infoField(info, "fence"), t1);
      const holders = infoField(info, "holders");
      assert.ok(Array.isArray(holders) && Array.isArray(holders[0]));
      assert.equal((holders as Reply[][])[0]?.[0], "A");
      assert.equal((holders as Reply[][])[0]?.[1], 1n);
      assert.equal(await conn.send(["LOCK.RELEASE", key, "A"]), 0n);
      const t2 = await conn.send(["LOCK.ACQUIRE", key, Buffer.from("B"), "10000"]);
      assert.equal(typeof t2, "bigint");
      assert.ok((t2 as bigint) > (t1 as bigint));
      assert.equal(await conn.send(["PING"]), "PONG");
      assert.equal(await conn.send(["GET", newKey("none")]), null);
      // a string that looks like a number stays a string; an integer is a bigint
      const sk = newKey("str");
      await conn.send(["SET", sk, "12345"]);
      assert.equal(await conn.send(["GET", sk]), "12345");
      assert.equal(await conn.send(["STRLEN", sk]), 5n);
    });

    test("integers above 2^53 are exact (or refused by node-redis v4, never rounded)", async () => {
      const conn = await (await target.endpointFor("x")).command();
      const k = newKey("big");
      const p = conn.send(["INCRBY", k, "9007199254740993"]);
      if (kind === "node-redis4") await assert.rejects(p, UnsafeIntegerReplyError);
      else assert.equal(await p, 9007199254740993n);
    });

    test("error replies are ServerReplyError with their code", async () => {
      const conn = await (await target.endpointFor("x")).command();
      const key = newKey("err");
      await assert.rejects(conn.send(["LOCK.RELEASE", key, "nobody"]), (e: unknown) => e instanceof ServerReplyError && e.code === "NOTOWNER");
      await conn.send(["SET", key, "v"]);
      await assert.rejects(conn.send(["LOCK.ACQUIRE", key, "A", "1000"]), (e: unknown) => e instanceof ServerReplyError && e.code === "WRONGTYPE");
      await assert.rejects(conn.send(["LOCK.ACQUIRE", key, "A", "0"]), (e: unknown) => e instanceof ServerReplyError && e.code === "ERR");
      // errors inside an EXEC reply are ServerReplyError elements
      const nk = newKey("exec");
      await conn.send(["MULTI"]);
      await conn.send(["LOCK.RELEASE", nk, "nobody"]);
      await conn.send(["PING"]);
      const exec = await conn.send(["EXEC"]);
      assert.ok(Array.isArray(exec));
      assert.ok(exec[0] instanceof ServerReplyError && exec[0].code === "NOTOWNER");
      assert.equal(exec[1], "PONG");
      // the connection is still usable
      assert.equal(await conn.send(["PING"]), "PONG");
    });

    test("a deadline gives ReplyTimeoutError", async () => {
      const ep = await target.endpointFor("x");
      const key = newKey("deadline");
      await admin.call("LOCK.ACQUIRE", key, "holder", "10000");
      const conn = await ep.acquireWaitConn();
      const t0 = Date.now();
      await assert.rejects(conn.send(["LOCK.ACQUIRE", key, "W", "10000", "WAIT", "0"], 100), ReplyTimeoutError);
      assert.ok(Date.now() - t0 < 2000);
      conn.destroy();
      await until("the waiter leaves", async () => (await srv.waiting(key)) === 0);
    });

    test("wait pool: at most maxWaitConnections busy, FIFO queue, abort leaves the queue, at most 2 idle", async () => {
      const ep = await target.endpointFor("x");
      const key = newKey("pool");
      await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
      const c1 = await ep.acquireWaitConn();
      const c2 = await ep.acquireWaitConn();
      assert.notEqual(c1, c2);
      const w1 = c1.send(["LOCK.ACQUIRE", key, "w1", "30000", "WAIT", "0"]);
      await until("w1 queues first", async () => (await srv.waiting(key)) === 1);
      const w2 = c2.send(["LOCK.ACQUIRE", key, "w2", "30000", "WAIT", "0"]);
      const order: string[] = [];
      const ac = new AbortController();
      const q3 = ep.acquireWaitConn().then((c) => { order.push("q3"); return c; });
      const q4 = ep.acquireWaitConn(ac.signal).then((c) => { order.push("q4"); return c; });
      const q5 = ep.acquireWaitConn().then((c) => { order.push("q5"); return c; });
      await sleep(50);
      assert.deepEqual(ep.poolStats(), { busy: 2, idle: 0, queued: 3 });
      assert.deepEqual(order, []);
      ac.abort();
      await assert.rejects(q4);
      assert.equal(ep.poolStats().queued, 2);
      // the server sees two waiters, not more
      assert.equal(await srv.waiting(key), 2);
      await admin.call("LOCK.RELEASE", key, "holder");
      assert.equal(typeof (await w1), "bigint");
      ep.releaseWaitConn(c1);
      const c3 = await q3;
      assert.deepEqual(order, ["q3"]);
      await admin.call("LOCK.RELEASE", key, "w1");
      assert.equal(typeof (await w2), "bigint");
      ep.releaseWaitConn(c2);
      const c5 = await q5;
      assert.deepEqual(order, ["q3", "q5"]);
      ep.releaseWaitConn(c3);
      ep.releaseWaitConn(c5);
      assert.deepEqual(ep.poolStats(), { busy: 0, idle: 2, queued: 0 });
      // an idle one is reused
      const again = await ep.acquireWaitConn();
      assert.ok(again === c3 || again === c5);
      ep.releaseWaitConn(again);
      await admin.call("LOCK.RELEASE", key, "w2");
    });

    test("destroy during a wait rejects with ConnectionLostError and the server drops the waiter", async () => {
      const ep = await target.endpointFor("x");
      const key = newKey("destroy");
      await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
      const conn = await ep.acquireWaitConn();
      const p = conn.send(["LOCK.ACQUIRE", key, "W", "30000", "WAIT", "0"]);
      await until("the waiter queues", async () => (await srv.waiting(key)) === 1);
      let why = "";
      conn.onClose((w) => { why = w; });
      conn.destroy();
      await assert.rejects(p, ConnectionLostError);
      assert.equal(conn.closed, true);
      assert.equal(why, "destroyed");
      await until("the server drops the waiter", async () => (await srv.waiting(key)) === 0);
      ep.releaseWaitConn(conn); // frees nothing twice
      assert.equal(ep.poolStats().busy, 0);
      await assert.rejects(conn.send(["PING"]), ConnectionLostError);
    });

    test("a wait is never re-sent after its connection is killed", async () => {
      const ep = await target.endpointFor("x");
      const key = newKey("kill");
      await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
      const conn = await ep.acquireWaitConn();
      const id = await conn.send(["CLIENT", "ID"]);
      assert.equal(typeof id, "bigint");
      await admin.config("RESETSTAT");
      const p = conn.send(["LOCK.ACQUIRE", key, "W", "30000", "WAIT", "0"]);
      await until("the waiter queues", async () => (await srv.waiting(key)) === 1);
      const closed = new Promise<string>((r) => conn.onClose(r));
      const rejected = assert.rejects(p, ConnectionLostError); // attached before the kill
      await admin.call("CLIENT", "KILL", "ID", String(id));
      await rejected;
      assert.equal(await closed, "connection closed");
      assert.equal(conn.closed, true);
      await sleep(300);
      // Redis counts the killed blocked call (1); Valkey counts a blocked call only once it
      // completes (0). A re-sent wait would be a second call, and queued again (WAIT 0).
      const calls = await commandCalls(srv, "lock.acquire");
      assert.ok(calls <= 1, `at most one LOCK.ACQUIRE reached the server, saw ${calls}`);
      if (!SERVER_BINARY.includes("valkey")) assert.equal(calls, 1, "exactly one LOCK.ACQUIRE reached the server");
      assert.equal(await srv.waiting(key), 0, "nothing queued again");
      assert.equal(ep.poolStats().busy, 0, "a closed connection frees its place");
      // the command connection is re-opened after it is killed
      const cmd = await ep.command();
      const cid = await cmd.send(["CLIENT", "ID"]);
      await admin.call("CLIENT", "KILL", "ID", String(cid));
      await until("the command connection is seen closed", () => cmd.closed);
      const cmd2 = await ep.command();
      assert.notEqual(cmd2, cmd);
      assert.equal(await cmd2.send(["PING"]), "PONG");
    });

    test("user connections are never touched; quitUserClient closes the user's client", async () => {
      const other = await kit.client(kind, srv);
      const t = targetFor(other);
      const ep = await t.endpointFor("k");
      await (await ep.command()).send(["PING"]);
      const before = (await admin.call("CLIENT", "LIST")) as string;
      await t.close();
      await until("our connection closes", async () => ((await admin.call("CLIENT", "LIST")) as string).split("\n").length < before.split("\n").length);
      await t.quitUserClient();
      await closeClient(other);
    });
  });
}


test("the user's timeouts, legacy mode and RESP3 do not reach our connections", async () => {
  const key = newKey("opts");
  await admin.call("LOCK.ACQUIRE", key, "holder", "400");
  const io = kit.ioredis(srv, { commandTimeout: 100, socketTimeout: 150, keyPrefix: "pfx:" });
  const v5 = await kit.nodeRedis(srv, { socket: { socketTimeout: 150 }, RESP: 3 });
  const v4 = await kit.nodeRedis4(srv, { legacyMode: true });
  const targets = [targetFor(io), targetFor(v5), targetFor(v4)];
  try {
    const waits = targets.map(async (t, i) => {
      const ep = await t.endpointFor(key);
      const c = await ep.acquireWaitConn();
      const r = await c.send(["LOCK.ACQUIRE", key, `w${i}`, "100", "WAIT", "3000"]);
      ep.releaseWaitConn(c);
      return r;
    });
    const got = await Promise.all(waits);
    for (const r of got) assert.equal(typeof r, "bigint", "each waited past the user's timeouts and was granted in turn");
    // a key prefix of the user's is not applied by us (documented)
    const cmd = await (await targets[0]!.endpointFor(key)).command();
    const plain = newKey("plain");
    await cmd.send(["SET", plain, "v"]);
    assert.equal(await admin.get(plain), "v");
  } finally {
    for (const t of targets) await t.close();
    await Promise.all([io, v5, v4].map((c) => closeClient(c)));
  }
});

test("close() rejects in-flight waits and queued acquisitions with ConnectionLostError", async () => {
  const uc = kit.ioredis(srv);
  const t = targetFor(uc, { maxWaitConnections: 1 });
  try {
    const key = newKey("close");
    await admin.call("LOCK.ACQUIRE", key, "holder", "30000");
    const ep = await t.endpointFor(key);
    const c = await ep.acquireWaitConn();
    const w = c.send(["LOCK.ACQUIRE", key, "W", "30000", "WAIT", "0"]);
    const wChecked = assert.rejects(w, ConnectionLostError);
    const queued = assert.rejects(ep.acquireWaitConn(), ConnectionLostError);
    await until("the waiter queues", async () => (await srv.waiting(key)) === 1);
    await t.close();
    await wChecked;
    await queued;
    await assert.rejects(ep.command(), ConnectionLostError);
    await until("the server drops the waiter", async () => (await srv.waiting(key)) === 0);
    await admin.call("LOCK.RELEASE", key, "holder");
  } finally {
    await closeClient(uc);
  }
});

test("targetFor refuses what it cannot drive", () => {
  assert.throws(() => targetFor({}), TypeError);
  assert.throws(() => targetFor(null), TypeError);
  assert.throws(() => targetFor(admin, { maxWaitConnections: 0 }), RangeError);
});

describe("TLS through the user's client options", () => {
  let tsrv: TlsServer;
  before(async () => {
    tsrv = await kit.tlsServer();
  });
  for (const kind of CLIENT_KINDS) {
    test(`${kind}: command, wait and subscriber connections use TLS`, async () => {
      const uc = await kit.clientTls(kind, tsrv);
      const t = targetFor(uc);
      try {
        const ep = await t.endpointFor("k");
        const cmd = await ep.command();
        const tok = await cmd.send(["LOCK.ACQUIRE", "tls:k", `o-${kind}`, "10000"]);
        assert.equal(typeof tok, "bigint");
        const w = await ep.acquireWaitConn();
        const tok2 = await w.send(["LOCK.ACQUIRE", "tls:k2", `o-${kind}`, "10000", "WAIT", "100"]);
        assert.equal(typeof tok2, "bigint");
        ep.releaseWaitConn(w);
        const sub = await ep.subscribeInvalidations(() => undefined);
        assert.equal(typeof sub.id, "bigint");
        sub.destroy();
        await cmd.send(["LOCK.RELEASE", "tls:k", `o-${kind}`]);
        await cmd.send(["LOCK.RELEASE", "tls:k2", `o-${kind}`]);
      } finally {
        await t.close();
        await closeClient(uc);
      }
    });
  }
});

describe("ioredis Cluster", () => {
  let nodes: Server[] = [];
  let cluster: IORedisCluster;
  let target: Target;
  before(async () => {
    const c: Cluster = await kit.cluster(3);
    nodes = c.nodes;
    cluster = kit.ioredisCluster(c);
    await until("ioredis cluster ready", () => cluster.status === "ready", 10_000);
    target = targetFor(cluster);
  });
  after(async () => {
    await target?.close();
  });

  test("slotOf is Redis Cluster's key slot", async () => {
    const conn = kit.ioredis(nodes[0]!);
    try {
      for (const k of ["", "a", "foo", "{user1000}.following", "lock:x", "ünïcode", "{}x", "a{b}c{d}"]) {
          assert.equal(slotOf(k), Number(await conn.call("CLUSTER", "KEYSLOT", k)), k);
      }
    } finally {
      conn.disconnect();
    }
  });

  test("routes by slot; tokens exact; waits on the key's node", async () => {
    assert.equal(target.isCluster, true);
    const names = new Set<string>();
    for (const key of ["c:a", "c:b", "c:c", "c:d", "c:e", "c:f"]) {
      const ep = await target.endpointFor(key);
      names.add(ep.name);
      const tok = await sendRouted(target, key, ["LOCK.ACQUIRE", key, "A", "10000"]);
      assert.equal(typeof tok, "bigint");
      const w = await ep.acquireWaitConn();
      assert.equal(await w.send(["LOCK.ACQUIRE", key, "B", "10000", "WAIT", "20"]), null);
      ep.releaseWaitConn(w);
      assert.equal(await sendRouted(target, key, ["LOCK.RELEASE", key, "A"]), 0n);
    }
    assert.ok(names.size >= 2, `keys spread over nodes: ${[...names].join(",")}`);
  });

  test("the watcher works on a cluster node's endpoint", async () => {
    const key = "c:watched";
    const ep = await target.endpointFor(key);
    assert.equal(typeof (await sendRouted(target, key, ["LOCK.ACQUIRE", key, "A", "30000"])), "bigint");
    const losses: LossCause[] = [];
    const h = await watchHold(ep, key, "A", {}, (c) => losses.push(c));
    const node = kit.ioredis({ host: "127.0.0.1", port: Number(ep.name.split(":")[1]) });
    try {
      await node.del(key);
      await until("the loss", () => losses.length > 0);
      assert.deepEqual(losses, ["deleted"]);
    } finally {
      h.stop();
      node.disconnect();
    }
  });

  test("MOVED is followed (slot moved to another node)", async () => {
    const key = "c:moving";
    const slot = slotOf(key);
    const from = await target.endpointFor(key);
    const fromPort = Number(from.name.split(":")[1]);
    const toSrv = nodes.find((n) => n.port !== fromPort);
    assert.ok(toSrv);
    const srcSrv = nodes.find((n) => n.port === fromPort);
    assert.ok(srcSrv);
    const src = kit.ioredis(srcSrv);
    const dst = kit.ioredis(toSrv);
    try {
      const tok = await sendRouted(target, key, ["LOCK.ACQUIRE", key, "A", "30000"]);
      const dstId = (await dst.call("CLUSTER", "MYID")) as string;
      const srcId = (await src.call("CLUSTER", "MYID")) as string;
      await dst.call("CLUSTER", "SETSLOT", String(slot), "IMPORTING", srcId);
      await src.call("CLUSTER", "SETSLOT", String(slot), "MIGRATING", dstId);
      await src.call("MIGRATE", "127.0.0.1", String(toSrv.port), key, "0", "5000");
      for (const c of [dst, src]) await c.call("CLUSTER", "SETSLOT", String(slot), "NODE", dstId);
      // the stale route answers MOVED: the driver follows it
      const conn = await from.command();
      await assert.rejects(conn.send(["LOCK.INFO", key]), (e: unknown) => isRedirect(e) && e.code === "MOVED");
      assert.equal(await sendRouted(target, key, ["LOCK.EXTEND", key, "A", "30000"]), 1n);
      const info = await sendRouted(target, key, ["LOCK.INFO", key]);
      assert.equal(infoField(info, "fence"), tok, "the lock moved with its token");
      assert.equal((await target.endpointFor(key)).name, `127.0.0.1:${toSrv.port}`);
      await sendRouted(target, key, ["LOCK.RELEASE", key, "A"]);
    } finally {
      src.disconnect();
      dst.disconnect();
    }
  });

  test("a wait whose key moves away is answered by the source and sent again where the key lives", async () => {
    const key = "c:wait-moving";
    const slot = slotOf(key);
    const from = await target.endpointFor(key);
    const fromPort = Number(from.name.split(":")[1]);
    const toSrv = nodes.find((n) => n.port !== fromPort);
    assert.ok(toSrv);
    const srcSrv = nodes.find((n) => n.port === fromPort);
    assert.ok(srcSrv);
    const src = kit.ioredis(srcSrv);
    const dst = kit.ioredis(toSrv);
    try {
      const tokA = await sendRouted(target, key, ["LOCK.ACQUIRE", key, "A", "30000"]);
      await src.config("RESETSTAT");
      let sends = 0;
      const waiting = sendWaitRouted(target, key, () => { sends++; return ["LOCK.ACQUIRE", key, "B", "30000", "WAIT", "20000"]; });
      await until("B queues on the source", async () => (await srcSrv.waiting(key)) === 1);
      const dstId = (await dst.call("CLUSTER", "MYID")) as string;
      const srcId = (await src.call("CLUSTER", "MYID")) as string;
      await dst.call("CLUSTER", "SETSLOT", String(slot), "IMPORTING", srcId);
      await src.call("CLUSTER", "SETSLOT", String(slot), "MIGRATING", dstId);
      await src.call("MIGRATE", "127.0.0.1", String(toSrv.port), key, "0", "5000");
      for (const c of [dst, src]) await c.call("CLUSTER", "SETSLOT", String(slot), "NODE", dstId);
      await until("B queues on the target", async () => (await toSrv.waiting(key)) === 1);
      assert.equal(await sendRouted(target, key, ["LOCK.RELEASE", key, "A"]), 0n);
      const res = await waiting;
      assert.equal(typeof res.reply, "bigint");
      assert.ok((res.reply as bigint) > (tokA as bigint), "the token goes on from the moved lock's");
      assert.equal(res.endpoint.name, `127.0.0.1:${toSrv.port}`);
      assert.ok(sends >= 2);
      assert.equal(await commandCalls(srcSrv, "lock.acquire"), 1, "the source saw the wait once");
      res.endpoint.releaseWaitConn(res.conn);
      await sendRouted(target, key, ["LOCK.RELEASE", key, "B"]);
    } finally {
      src.disconnect();
      dst.disconnect();
    }
  });
});

export type { Conn };
