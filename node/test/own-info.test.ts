// Issue 35 item 5: the client checks its own holds with `LOCK.INFO key OWNER owner` (that entry
// alone, O(1) on the server whatever the number of holders), never with the plain
// `LOCK.INFO key` (O(holders)): the watcher's re-reads (one per owner among a key's holds), the
// check of a grant that waited, and the look at a server after a refused extend. MONITOR on the
// server shows what the client sent.
//
// A server with an older module (0.3.0) refuses the owner form ("wrong number of arguments"):
// the client then sends that server the plain form and keeps working. Those tests load the old
// build from REDIS_LOCK_OLD_MODULE (default /tmp/base-module/libredis_lock.so), and are skipped
// when there is none.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { connect, type Socket } from "node:net";
import type { Redis } from "ioredis";
import Redlock from "../src/index.js";
import { targetFor, type Target } from "../src/driver/index.js";
import { watchHold, type LossCause } from "../src/watcher.js";
import { CLIENT_KINDS, until, useKit, type Server } from "./kit/index.js";

const kit = useKit();
const OLD_MODULE = process.env["REDIS_LOCK_OLD_MODULE"] || "/tmp/base-module/libredis_lock.so";
// Named but missing is a broken set-up (`make test` builds it), not a reason to skip.
if (process.env["REDIS_LOCK_OLD_MODULE"] && !existsSync(OLD_MODULE)) {
  throw new Error(`REDIS_LOCK_OLD_MODULE=${OLD_MODULE} does not exist (make old-module builds it)`);
}

/** The commands a server runs, as MONITOR prints them. */
class Monitor {
  readonly lines: string[] = [];
  private readonly sock: Socket;
  private rest = "";
  constructor(port: number) {
    this.sock = connect(port, "127.0.0.1");
    this.sock.write("MONITOR\r\n");
    this.sock.on("data", (d) => {
      const text = this.rest + d.toString("utf8");
      const parts = text.split("\r\n");
      this.rest = parts.pop() ?? "";
      this.lines.push(...parts);
    });
    this.sock.on("error", () => undefined);
  }
  close(): void {
    this.sock.destroy();
  }
  /** The LOCK.INFO commands run, each as its quoted arguments. */
  infos(): string[] {
    return this.lines
      .map((l) => {
        const at = l.indexOf("] ");
        return at < 0 ? "" : l.slice(at + 2);
      })
      .filter((a) => a.toLowerCase().startsWith('"lock.info"'));
  }
  ownerReads(key: string, owner: string): number {
    return this.infos().filter((l) => l === `"LOCK.INFO" "${key}" "OWNER" "${owner}"`).length;
  }
  plain(): string[] {
    return this.infos().filter((l) => !l.includes('"OWNER"') && !l.includes('"marker"'));
  }
  async settle(admin: Redis): Promise<void> {
    await admin.call("LOCK.INFO", "marker");
    await until("the marker", () => this.infos().some((l) => l.includes('"marker"')));
  }
}

/** LOCK.INFO refused before it ran (MONITOR does not show those): the command stats count them. */
async function refusedInfoCalls(admin: Redis): Promise<number> {
  const stats = String(await admin.info("commandstats"));
  const line = stats.split("\r\n").find((l) => l.startsWith("cmdstat_lock.info:")) ?? "";
  const m = /rejected_calls=(\d+)/.exec(line);
  return m ? Number(m[1]) : 0;
}

interface Loss {
  cause: LossCause;
}

/** The checks every face makes of its own holds; returns nothing, asserts the outcomes. */
async function ownChecks(kind: (typeof CLIENT_KINDS)[number], srv: Server, admin: Redis, tag: string): Promise<{ waited: string; owner: string }> {
  const client = await kit.client(kind, srv);
  const target: Target = targetFor(client);
  try {
    const ep = await target.endpointFor("rk");
    const conn = await ep.command();
    // Two holds of a read lock (owners A and B), watched; someone else's read and a DEL.
    const rk = `rk:${tag}`;
    await conn.send(["LOCK.RWREAD", rk, "A", "30000"]);
    await conn.send(["LOCK.RWREAD", rk, "B", "30000"]);
    const losses: Loss[] = [];
    const ha = await watchHold(ep, rk, "A", {}, (cause) => losses.push({ cause }));
    const hb = await watchHold(ep, rk, "B", {}, (cause) => losses.push({ cause }));
    await admin.call("LOCK.RWREAD", rk, "other", "30000");
    await admin.del(rk);
    await until("both losses", () => losses.length === 2);
    assert.deepEqual(losses.map((l) => l.cause), ["deleted", "deleted"]);
    ha.stop();
    hb.stop();

    // Taken by another owner in one step: `holders_count` says someone else holds it.
    const t = `t:${tag}`;
    await conn.send(["LOCK.ACQUIRE", t, "mine", "30000"]);
    const taken: Loss[] = [];
    await watchHold(ep, t, "mine", {}, (cause) => taken.push({ cause }));
    await admin.multi().call("LOCK.RELEASE", t, "mine", "ALL").call("LOCK.ACQUIRE", t, "theirs", "30000").exec();
    await until("the loss", () => taken.length === 1);
    assert.equal(taken[0]?.cause, "taken");
  } finally {
    await target.close();
  }

  // A grant that waited is checked against the server; a refused extend looks at the server.
  const redlock = new Redlock([client as never]);
  const w = `w:${tag}`;
  await admin.call("LOCK.ACQUIRE", w, "other", "200");
  // A wait of about 200 ms on a ttl of 2 s: over the share a grant that waited is checked past.
  const lock = await redlock.acquire([w], 2000, { retryCount: 100, retryDelay: 50 });
  await admin.del(w);
  await assert.rejects(lock.extend(30000));
  await redlock.quit().catch(() => undefined);
  return { waited: w, owner: lock.value };
}

for (const kind of CLIENT_KINDS) {
  describe(`own checks over ${kind}`, () => {
    let srv: Server;
    let admin: Redis;
    before(async () => {
      srv = await kit.server();
      admin = kit.ioredis(srv);
    });

    test("read the owner's own entry (LOCK.INFO key OWNER owner), never the whole list", async () => {
      const mon = new Monitor(srv.port);
      after(() => mon.close());
      await until("MONITOR on", () => mon.lines.some((l) => l.startsWith("+OK")));
      const { waited, owner } = await ownChecks(kind, srv, admin, "new");
      await mon.settle(admin);
      assert.ok(mon.ownerReads("rk:new", "A") >= 1 && mon.ownerReads("rk:new", "B") >= 1, mon.infos().join("\n"));
      assert.ok(mon.ownerReads("t:new", "mine") >= 1);
      assert.ok(mon.ownerReads(waited, owner) >= 2, mon.infos().filter((l) => l.includes(waited)).join("\n"));
      assert.deepEqual(mon.plain(), []);
    });

    test("work on a server with an older module (plain form, learnt once)", { skip: !existsSync(OLD_MODULE) && `no module 0.3.0 build at ${OLD_MODULE}` }, async () => {
      const old = await kit.server({ module: OLD_MODULE });
      const oldAdmin = kit.ioredis(old);
      await ownChecks(kind, old, oldAdmin, "old");
      // Once for the watcher (and a re-read already on its way), once for the Redlock.
      const tried = await refusedInfoCalls(oldAdmin);
      assert.ok(tried >= 1 && tried <= 4, `owner form tried ${tried} times`);
    });
  });
}
