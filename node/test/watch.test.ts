import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Redis } from "ioredis";
import { targetFor, type Endpoint, type Target } from "../src/driver/index.js";
import { watchHold, type LossCause } from "../src/watcher.js";
import { CLIENT_KINDS, commandCalls, scaled, sleep, uniqueKeys, until, useKit, type Server } from "./kit/index.js";

const kit = useKit();


interface Loss { cause: LossCause; detail: string; at: number }

let srv: Server;
let admin: Redis;
before(async () => {
  srv = await kit.server();
  admin = kit.ioredis(srv);
});

const newKey = uniqueKeys("w");

for (const kind of CLIENT_KINDS) {
  describe(`watcher over ${kind}`, () => {
    let target: Target;
    let ep: Endpoint;
    before(async () => {
      target = targetFor(await kit.client(kind, srv));
      ep = await target.endpointFor("w");
    });
    after(async () => {
      await target.close();
    });

    /** Acquires `key` for `owner` over the command connection and watches it. */
    async function hold(key: string, owner: string, ttl = 30000, extra: string[] = []) {
      const conn = await ep.command();
      const tok = await conn.send(["LOCK.ACQUIRE", key, owner, String(ttl), ...extra]);
      assert.equal(typeof tok, "bigint");
      const losses: Loss[] = [];
      const handle = await watchHold(ep, key, owner, {}, (cause, detail) => losses.push({ cause, detail, at: performance.now() }));
      return { losses, handle, conn };
    }

    test("a DEL of a watched key is reported within 50 ms at the median, each within 500 ms (20 repetitions)", async () => {
      const lat: number[] = [];
      for (let i = 0; i < 20; i++) {
        const key = newKey("del");
        const { losses, handle } = await hold(key, "A");
        await sleep(20); // the registration's own re-read is done
        assert.equal(losses.length, 0, "no loss before the DEL");
        const t0 = performance.now();
        await admin.del(key);
        await until("the loss", () => losses.length > 0, 2000);
        const first = losses[0];
        assert.ok(first);
        assert.equal(first.cause, "deleted");
        lat.push(first.at - t0);
        handle.stop();
      }
      const sorted = [...lat].sort((a, b) => a - b);
      const p50 = sorted[Math.floor(sorted.length / 2)] ?? 0;
      const max = sorted[sorted.length - 1] ?? 0;
      console.log(`${kind}: DEL noticed p50 ${p50.toFixed(2)} ms, max ${max.toFixed(2)} ms`);
      // Typically well under a millisecond; on the shared 2-core machine with other suites running
      // one of 20 was seen at 39 ms. The median must be under 50 ms, and every one under 500 ms
      // (a scheduling stall, not a missed invalidation: that one is never noticed at all).
      assert.ok(p50 < scaled(50), `p50 ${p50.toFixed(1)} ms; all: ${lat.map((l) => l.toFixed(1)).join(", ")}`);
      for (const l of lat) assert.ok(l < scaled(500), `noticed in ${l.toFixed(1)} ms`);
    });

    test("SET over the key: overwritten", async () => {
      const key = newKey("set");
      const { losses, handle } = await hold(key, "A");
      await admin.set(key, "x");
      await until("the loss", () => losses.length > 0);
      assert.equal(losses[0]?.cause, "overwritten");
      handle.stop();
    });

    test("another owner holding it: taken; a hold ended with the key kept: ended", async () => {
      const key = newKey("taken");
      const { losses, handle } = await hold(key, "A");
      // one atomic change by another connection: A's hold given up, B granted
      const res = await admin.multi().call("LOCK.RELEASE", key, "A").call("LOCK.ACQUIRE", key, "B", "30000").exec();
      assert.equal(typeof res?.[1]?.[1], "number");
      await until("the loss", () => losses.length > 0);
      assert.equal(losses[0]?.cause, "taken");
      handle.stop();
      // LOCKDELAY keeps the key after the hold's expiry, with no holder: "ended"
      const key2 = newKey("ended");
      const h2 = await hold(key2, "A", 150, ["LOCKDELAY", "5000"]);
      await until("the loss", () => h2.losses.length > 0);
      assert.equal(h2.losses[0]?.cause, "ended");
      h2.handle.stop();
      await admin.del(key2);
    });

    test("a bound hold's connection killed: connection-closed", async () => {
      const key = newKey("bound");
      const w = await ep.acquireWaitConn();
      const id = await w.send(["CLIENT", "ID"]);
      assert.equal(typeof await w.send(["LOCK.ACQUIRE", key, "A", "30000", "BIND"]), "bigint");
      const losses: Loss[] = [];
      const handle = await watchHold(ep, key, "A", { boundConn: w }, (cause, detail) => losses.push({ cause, detail, at: performance.now() }));
      await sleep(20);
      assert.equal(losses.length, 0);
      const t0 = performance.now();
      await admin.call("CLIENT", "KILL", "ID", String(id));
      await until("the loss", () => losses.length > 0, 2000);
      assert.equal(losses[0]?.cause, "connection-closed");
      assert.ok((losses[0]?.at ?? Infinity) - t0 < 50);
      await sleep(50);
      assert.equal(losses.length, 1, "reported once");
      handle.stop();
      assert.equal(await admin.exists(key), 0, "the server ended the bound hold");
    });

    test("our own acquire/extend/release over the command connection cause no re-read", async () => {
      const key = newKey("noloop");
      const { losses, handle, conn } = await hold(key, "A");
      await sleep(30);
      await admin.config("RESETSTAT");
      assert.equal(await conn.send(["LOCK.ACQUIRE", key, "A", "30000"]).then((t) => typeof t), "bigint"); // re-entry
      assert.equal(await conn.send(["LOCK.EXTEND", key, "A", "30000"]), 1n);
      assert.equal(await conn.send(["LOCK.RELEASE", key, "A"]), 1n);
      const other = newKey("noloop-other");
      await conn.send(["LOCK.ACQUIRE", other, "A", "30000"]);
      await conn.send(["LOCK.RELEASE", other, "A"]);
      await sleep(100);
      assert.equal(await commandCalls(srv, "lock.info"), 0, "no LOCK.INFO for our own writes");
      // control: a change by another connection is re-read (and is no loss)
      await admin.call("LOCK.ACQUIRE", key, "B", "1000", "WAIT", "30");
      await until("a re-read", async () => (await commandCalls(srv, "lock.info")) >= 1, 2000);
      await sleep(30);
      assert.equal(losses.length, 0);
      handle.stop();
      await conn.send(["LOCK.RELEASE", key, "A"]);
    });

    test("unwatched keys cost nothing; a stopped watch reports nothing", async () => {
      const key = newKey("cost");
      const { losses, handle } = await hold(key, "A");
      await sleep(30);
      await admin.config("RESETSTAT");
      for (let i = 0; i < 10; i++) {
        const k = `unwatched:${i}`;
        await admin.call("LOCK.ACQUIRE", k, "X", "1000");
        await admin.call("LOCK.RELEASE", k, "X");
        await admin.set(`w:other:${i}`, "v");
      }
      await sleep(100);
      assert.equal(await commandCalls(srv, "lock.info"), 0);
      handle.stop();
      await admin.del(key);
      await sleep(100);
      assert.equal(await commandCalls(srv, "lock.info"), 0, "a stopped watch re-reads nothing");
      assert.equal(losses.length, 0);
    });

    test("the command connection killed: tracking set up again, later losses still noticed", async () => {
      const key = newKey("reconnect");
      const { losses, handle, conn } = await hold(key, "A");
      await sleep(20);
      const id = await conn.send(["CLIENT", "ID"]);
      await admin.call("CLIENT", "KILL", "ID", String(id));
      await until("a new command connection", () => {
        const cur = ep.currentCommand();
        return cur !== null && cur !== conn;
      });
      await sleep(50);
      assert.equal(losses.length, 0, "the kill is no loss of a hold not bound to it");
      await admin.del(key);
      await until("the loss", () => losses.length > 0);
      assert.equal(losses[0]?.cause, "deleted");
      handle.stop();
    });
  });
}
