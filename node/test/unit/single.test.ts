import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { OneServerAttempt } from "../../src/core/single.js";
import type { Outcome } from "../../src/core/protocol.js";
import { rng, SEED } from "./rng.js";

const g = (t: bigint): Outcome => ({ kind: "granted", token: t });
const busy: Outcome = { kind: "busy" };

describe("one-server acquire machine", () => {
  it("each resource in order with the wait that is left", () => {
    const m = new OneServerAttempt(["a", "b"], { kind: "write", ttl: 1000 }, "o", 2000, 0);
    const s1 = m.start(0);
    assert.equal(s1.kind === "send" && s1.key, "a");
    if (s1.kind === "send") {
      assert.deepEqual(s1.args, ["LOCK.ACQUIRE", "a", "o", "1000", "WAIT", "2000"]);
      assert.deepEqual(s1.build(700).slice(-1), ["700"]);
    }
    const s2 = m.replied(g(5n), 1500);
    assert.equal(s2.kind === "send" && s2.wait, 500);
    const done = m.replied(g(6n), 1600);
    assert.equal(done.kind, "granted");
    if (done.kind === "granted") {
      assert.deepEqual(done.tokens, [5n, 6n]);
      // The first grant was waited for: from its reply (1500) less the margins.
      assert.equal(done.validUntil, 1500 + 1000 - 5 - 2);
    }
  });
  it("no wait: short commands; a busy resource fails and gives back the earlier ones", () => {
    const m = new OneServerAttempt(["a", "b", "c"], { kind: "read", ttl: 1000 }, "o", undefined, 0);
    const s = m.start(0);
    assert.equal(s.kind === "send" && s.wait, undefined);
    m.replied(g(1n), 1);
    const f = m.replied(busy, 2);
    assert.equal(f.kind, "failed");
    if (f.kind === "failed") {
      assert.deepEqual(f.giveBack, ["a"]);
      assert.equal(f.failure.kind, "held");
    }
  });
  it("never reports a lock whose validity is spent", () => {
    const m = new OneServerAttempt(["a"], { kind: "write", ttl: 10 }, "o", undefined, 0);
    m.start(0);
    const f = m.replied(g(1n), 50);
    assert.equal(f.kind === "failed" && f.failure.kind, "expired");
    if (f.kind === "failed") assert.deepEqual(f.giveBack, ["a"]);
  });
  it("property: a grant is still valid when reported, and a failure gives back exactly what was granted", () => {
    const r = rng(SEED);
    for (let i = 0; i < 3000; i++) {
      const n = r.int(1, 4);
      const keys = Array.from({ length: n }, (_, j) => `k${j}`);
      const ttl = r.int(1, 500);
      const m = new OneServerAttempt(keys, { kind: "write", ttl }, "o", r.pick([undefined, 100, Infinity]), 0);
      let t = 0;
      let step = m.start(t);
      const granted: string[] = [];
      while (step.kind === "send") {
        t += r.int(0, 200);
        const o = r.pick([g(BigInt(r.int(1, 99))), busy, g(1n)]);
        if (o.kind === "granted") granted.push(step.key);
        step = m.replied(o, t);
      }
      if (step.kind === "granted") {
        assert.ok(step.validUntil > t);
        assert.equal(step.tokens.length, n);
      } else {
        assert.deepEqual([...step.giveBack], granted);
      }
    }
  });
});
