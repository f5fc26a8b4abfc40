import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Hold, Lock, makeLock } from "../../src/lock.js";
import type Redlock from "../../src/redlock.js";
import type { LockLostError } from "../../src/errors.js";

const redlock = {} as unknown as Redlock;

function hold(servers: string[], validFor = 10_000): Hold {
  return new Hold("owner", ["a", "b"], { kind: "write", ttl: 10_000 }, servers, performance.now() + validFor, 0.01);
}

describe("Lock and its hold", () => {
  it("fencingToken is the largest token of a one-server lock's grants, exact; several servers have none", () => {
    const one = hold(["s1:1"]);
    one.tokens.set("a", new Map([["s1:1", 9007199254740993n]]));
    one.tokens.set("b", new Map([["s1:1", 7n]]));
    assert.equal(makeLock(redlock, one, [], Date.now() + 10_000).fencingToken, 9007199254740993n);
    const h = hold(["s1:1", "s2:2", "s3:3"]);
    h.tokens.set("a", new Map([["s1:1", 9007199254740993n], ["s2:2", 5n]]));
    h.tokens.set("b", new Map([["s1:1", 7n]]));
    const lock = makeLock(redlock, h, [], Date.now() + 10_000);
    assert.throws(() => lock.fencingToken, /several servers has no single fencing token/);
    assert.equal(lock.tokens.get("a")?.get("s2:2"), 5n);
    assert.equal(lock.mode, "write");
    assert.equal(lock.value, "owner");
    assert.deepEqual(lock.resources, ["a", "b"]);
    assert.ok(lock.validity() > 9000);
    assert.equal(lock.lost, null);
  });
  it("a loss on a minority of servers is not a loss; on a majority it is, told once", () => {
    const h = hold(["s1:1", "s2:2", "s3:3"]);
    const lock = makeLock(redlock, h, [], Date.now() + 10_000);
    const seen: LockLostError[] = [];
    h.onLoss((e) => seen.push(e));
    h.serverLost(0, "a", { cause: "deleted", resource: "a", detail: "" });
    assert.equal(lock.lost, null);
    h.serverLost(1, "b", { cause: "taken", resource: "b", detail: "" });
    assert.equal(lock.lost, null, "different resources: each still held by a majority");
    h.serverLost(2, "a", { cause: "overwritten", resource: "a", detail: "x" });
    assert.equal((lock.lost as LockLostError | null)?.cause, "overwritten");
    h.serverLost(1, "a", { cause: "deleted", resource: "a", detail: "" });
    assert.equal(seen.length, 1);
    assert.equal(lock.validity(), 0);
  });
  it("a spent validity reads as expired; a hand-built Lock (redlock's constructor) has no tokens", () => {
    const h = hold(["s1:1"], -1);
    const lock = makeLock(redlock, h, [], Date.now());
    assert.equal(lock.lost?.cause, "expired");
    const bare = new Lock(redlock, ["x"], "v", [], Date.now() + 1000);
    assert.equal(bare.fencingToken, 0n);
    assert.equal(bare.tokens.size, 0);
    assert.equal(bare.lost, null);
    assert.ok(bare.validity() > 0);
  });
});
