import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { QUEUE_SLICE, RedlockAttempts, designatedServer, type Step } from "../../src/core/redlock.js";
import { acquireOutcome, type Outcome } from "../../src/core/protocol.js";
import { ServerReplyError } from "../../src/driver/types.js";
import { rng, SEED } from "./rng.js";

const g = (t: bigint): Outcome => ({ kind: "granted", token: t });
const busy: Outcome = { kind: "busy" };
const gone: Outcome = { kind: "unreachable", text: "no reply", error: new Error("no reply") };
const refused = (text: string): Outcome => acquireOutcome(new ServerReplyError(text));

function machine(n: number, ttl: number, wait: number | undefined, resources = ["k"], seed = 1): RedlockAttempts {
  const r = rng(seed);
  return new RedlockAttempts({ resources, spec: { kind: "write", ttl }, owner: "o", n, wait, driftFactor: 0.01, random: r.next }, 0);
}

function sentTo(step: Step): number[] {
  assert.equal(step.kind, "send");
  return step.kind === "send" ? step.to.map((s) => s.server) : [];
}

describe("Redlock machine", () => {
  it("a majority in time is a grant", () => {
    const m = machine(3, 10000, undefined);
    const s = m.start(0);
    assert.deepEqual(sentTo(s), [0, 1, 2]);
    const out = m.replied([[g(5n)], [busy], [g(7n)]], 10);
    assert.equal(out.kind, "granted");
    if (out.kind === "granted") {
      assert.deepEqual([...out.tokens.entries()], [[0, [5n]], [2, [7n]]]);
      assert.ok(out.validUntil > 10 && out.validUntil <= 10000);
    }
    const round = m.takeRound();
    assert.equal(round?.filter((v) => v.kind === "for").length, 2);
    assert.equal(m.takeRound(), null);
  });
  it("too few: released where it may hold (granted or no answer), then fails as held", () => {
    const m = machine(3, 10000, undefined);
    m.start(0);
    const rel = m.replied([[g(5n)], [busy], [gone]], 1);
    assert.equal(rel.kind === "send" && rel.what, "release");
    assert.deepEqual(sentTo(rel), [0, 2]);
    if (rel.kind === "send") assert.deepEqual(rel.to[0]?.commands, [["LOCK.RELEASE", "k", "o", "ALL"]]);
    const f = m.replied([[g(0n)], undefined, [gone]], 2);
    assert.equal(f.kind, "failed");
    if (f.kind === "failed") assert.equal(f.failure.kind, "held");
  });
  it("a majority too late is expired and released", () => {
    const m = machine(3, 100, undefined);
    m.start(0);
    const rel = m.replied([[g(1n)], [g(1n)], [g(1n)]], 200);
    assert.equal(rel.kind === "send" && rel.what, "release");
    const f = m.replied([[g(0n)], [g(0n)], [g(0n)]], 200);
    assert.equal(f.kind === "failed" && f.failure.kind, "expired");
  });
  it("a refusal is final: no queue", () => {
    const m = machine(3, 10000, 30000);
    m.start(0);
    const f = m.replied([[refused("WRONGTYPE x")], [refused("WRONGTYPE x")], [busy]], 1);
    assert.equal(f.kind === "failed" && f.failure.kind, "refused");
  });
  it("a waiter queues on the designated server in slices, then asks the others", () => {
    const m = machine(3, 10000, 30000);
    m.start(0);
    const q = m.replied([[busy], [busy], [busy]], 1);
    const d = designatedServer("k", [true, true, true], 3);
    assert.equal(q.kind === "send" && q.what, "queue");
    assert.deepEqual(sentTo(q), [d]);
    if (q.kind === "send") {
      assert.equal(q.to[0]?.wait, QUEUE_SLICE);
      assert.deepEqual(q.to[0]?.commands[0]?.slice(-2), ["WAIT", String(QUEUE_SLICE)]);
    }
    const replies: (Outcome[] | undefined)[] = [undefined, undefined, undefined];
    replies[d] = [g(11n)];
    const others = m.replied(replies, 500);
    assert.equal(others.kind === "send" && others.what, "others");
    assert.ok(!sentTo(others).includes(d));
    const all = [[g(12n)], [g(12n)], [g(12n)]];
    const done = m.replied(all, 501);
    assert.equal(done.kind, "granted");
    if (done.kind === "granted") {
      assert.equal(done.tokens.get(d)?.[0], 11n);
      // Counted from the slice's start (1), not from the grant.
      assert.ok(done.validUntil <= 1 + 10000);
    }
  });
  it("a bound request polls (never queues) with a new owner per attempt", () => {
    let i = 0;
    const m = new RedlockAttempts(
      { resources: ["k"], spec: { kind: "write", ttl: 1000, bind: true }, owner: "o0", n: 3, wait: 5000, driftFactor: 0.01, newOwner: () => `o${++i}` },
      0,
    );
    const s = m.start(0);
    if (s.kind === "send") assert.ok(s.to[0]?.commands[0]?.includes("BIND"));
    assert.equal(m.owner, "o0");
    const sleep = m.replied([[busy], [busy], [busy]], 1);
    assert.equal(sleep.kind, "sleep");
    const again = m.woke(20);
    assert.equal(again.kind === "send" && again.what, "attempt");
    assert.equal(m.owner, "o1");
    if (again.kind === "send") assert.equal(again.to[0]?.commands[0]?.[2], "o1");
    const done = m.replied([[g(3n)], [g(3n)], [busy]], 21);
    assert.equal(done.kind === "granted" && done.owner, "o1");
  });
  it("the slice is at most a quarter of the ttl", () => {
    const m = machine(3, 400, 30000);
    m.start(0);
    const q = m.replied([[busy], [busy], [busy]], 1);
    if (q.kind === "send") assert.equal(q.to[0]?.wait, 100);
  });
  it("several resources: a server that granted only some is a vote against, and is given them back", () => {
    const m = machine(3, 10000, undefined, ["a", "b"]);
    const s = m.start(0);
    if (s.kind === "send") assert.equal(s.to[0]?.commands.length, 2);
    const rel = m.replied([[g(1n), g(2n)], [g(1n), busy], [busy, busy]], 1);
    assert.equal(rel.kind === "send" && rel.what, "release");
    assert.deepEqual(sentTo(rel), [0, 1]);
  });
  it("designated server: deterministic by the key, skips servers that did not answer", () => {
    const d = designatedServer("resource", [true, true, true, true, true], 5);
    assert.equal(designatedServer("resource", [true, true, true, true, true], 5), d);
    const skip = [true, true, true, true, true];
    skip[d] = false;
    assert.equal(designatedServer("resource", skip, 5), (d + 1) % 5);
    // h = h * 31 + byte: "ab" = 97 * 31 + 98 = 3105
    assert.equal(designatedServer("ab", [], 7), 3105 % 7);
  });
  it("property: the machine always ends, a grant has a majority still valid, a failure gives back", () => {
    const r = rng(SEED);
    const shapes: Outcome[] = [g(1n), g(2n), busy, busy, gone, refused("MAXWAITERS q"), refused("WRONGTYPE w")];
    for (let i = 0; i < 2000; i++) {
      const n = r.int(1, 5);
      const ttl = r.int(10, 5000);
      const wait = r.pick([undefined, 0, r.int(1, 3000), Infinity]);
      const resources = r.pick([["k"], ["a", "b"], ["a", "b", "c"]]);
      const m = new RedlockAttempts({ resources, spec: { kind: "write", ttl }, owner: "o", n, wait, driftFactor: 0.01, random: r.next }, 0);
      let t = 0;
      let step = m.start(t);
      let steps = 0;
      const holds = new Set<number>();
      for (; steps < 500; steps++) {
        if (step.kind === "send") {
          t += r.int(0, 300);
          const replies: (Outcome[] | undefined)[] = Array.from({ length: n }, () => undefined);
          for (const sc of step.to) {
            const os = sc.commands.map(() => r.pick(shapes));
            replies[sc.server] = os;
            if (step.what === "release") holds.delete(sc.server);
            else if (os.some((o) => o.kind === "granted" || o.kind === "unreachable")) holds.add(sc.server);
          }
          step = m.replied(replies, t);
        } else if (step.kind === "sleep") {
          assert.ok(step.ms >= 0);
          t += step.ms;
          step = m.woke(t);
        } else break;
      }
      if (wait !== Infinity) assert.ok(steps < 500, "ends");
      if (step.kind === "granted") {
        assert.ok(step.tokens.size >= Math.floor(n / 2) + 1);
        assert.ok(step.validUntil > t);
        for (const toks of step.tokens.values()) assert.equal(toks.length, resources.length);
      } else if (step.kind === "failed") {
        // Every grant the attempt may still hold (granted, or no answer) was given back.
        assert.deepEqual([...holds], [], `holds left after ${step.failure.kind}`);
      }
    }
  });
});
