import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { holdCount, parseInfo } from "../../src/core/info.js";
import type { Reply } from "../../src/driver/types.js";

describe("LOCK.INFO", () => {
  it("reads the RESP2 flat array, keeps unknown fields and extra holder elements", () => {
    const reply: Reply = [
      "mode", "write",
      "fence", "9007199254740993",
      "holders", [["me", 2n, 1500n, 620n, "future"], ["old", 1n, 10n, -1n], ["older", 1n, 10n]],
      "waiting", 1n,
      "queue", ["read"],
      "delay", 0n,
      "newfield", ["x"],
    ];
    const info = parseInfo(reply);
    assert.ok(info);
    assert.equal(info.mode, "write");
    assert.equal(info.fence, 9007199254740993n);
    // The fourth element is the hold age (-1: unknown, absent before module 0.3.0).
    assert.deepEqual(info.holders, [
      { owner: "me", count: 2, ttl: 1500, held: 620, extra: [620n, "future"] },
      { owner: "old", count: 1, ttl: 10, extra: [-1n] },
      { owner: "older", count: 1, ttl: 10, extra: [] },
    ]);
    assert.equal(info.waiting, 1);
    assert.deepEqual(info.queue, ["read"]);
    assert.equal(info.capacity, undefined);
    assert.deepEqual(info.raw.get("newfield"), ["x"]);
    assert.equal(holdCount(info, "me"), 2);
    assert.equal(holdCount(info, "other"), 0);
  });
  it("a semaphore has a capacity; nil is null; a free key with a delay", () => {
    const sem = parseInfo(["mode", "semaphore", "fence", 3n, "holders", [], "waiting", 0n, "queue", [], "delay", 0n, "capacity", 4n]);
    assert.equal(sem?.capacity, 4);
    assert.equal(parseInfo(null), null);
    const free = parseInfo(["mode", "free", "fence", 3n, "holders", [], "waiting", 0n, "queue", [], "delay", 250n]);
    assert.equal(free?.mode, "free");
    assert.equal(free?.delay, 250);
    assert.equal(holdCount(null, "x"), 0);
  });
  it("refuses other shapes", () => {
    assert.throws(() => parseInfo("OK"), TypeError);
    assert.throws(() => parseInfo(["holders", [["short", 1n]]]), TypeError);
  });
});
