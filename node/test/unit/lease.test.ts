import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { Lease, causeFromInfo, confirmedValidUntil, drift, quorumValidUntil, singleServerValidUntil, waitedGrantNeedsCheck, type ServerAnswers } from "../../src/core/lease.js";
import { acquireOutcome, type Outcome } from "../../src/core/protocol.js";
import { ServerReplyError } from "../../src/driver/types.js";
import { parseInfo } from "../../src/core/info.js";
import { rng, SEED } from "./rng.js";

const ok: Outcome = { kind: "granted", token: 1n };
const notOwner = acquireOutcome(new ServerReplyError("NOTOWNER the owner does not hold this lock"));
const wrongType = acquireOutcome(new ServerReplyError("WRONGTYPE Operation against a key"));
const slow: Outcome = { kind: "unreachable", text: "no reply", error: new Error("no reply") };
const one = (o: Outcome): ServerAnswers => [o];

describe("validity", () => {
  it("drift is round(ttl * factor) + 2 (redlock)", () => {
    assert.equal(drift(10000, 0.01), 102);
    assert.equal(drift(150, 0.01), 4);
  });
  it("single server: no wait counts from the send, a waited grant from its reply less a margin", () => {
    assert.equal(singleServerValidUntil(100, false, 1000, 150), 1098);
    assert.equal(singleServerValidUntil(100, true, 1000, 5000), 5000 + 995 - 2);
    assert.equal(singleServerValidUntil(100, false, 1, 500), 500);
  });
  it("quorum: ttl less elapsed less drift, null once spent", () => {
    assert.equal(quorumValidUntil(0, 1000, 100, 0.01), 100 + 1000 - 100 - 12);
    assert.equal(quorumValidUntil(0, 100, 99, 0.01), null);
  });
  it("property: a lock is never valid past its ttl from the send, and never reported when spent", () => {
    const r = rng(SEED);
    for (let i = 0; i < 5000; i++) {
      const ttl = r.int(1, 100000);
      const sent = r.int(0, 1e6);
      const now = sent + r.int(0, 2 * ttl);
      const q = quorumValidUntil(sent, ttl, now, r.pick([0, 0.01, 0.1]));
      if (q !== null) {
        assert.ok(q > now);
        assert.ok(q <= sent + ttl);
      }
      const s = singleServerValidUntil(sent, false, ttl, now);
      assert.ok(s <= Math.max(now, sent + ttl));
    }
  });
  it("a loss reads from LOCK.INFO", () => {
    assert.equal(causeFromInfo(null, "me"), "deleted");
    const held = parseInfo(["mode", "write", "fence", 1n, "holders", [["other", 1n, 100n]]]);
    assert.equal(causeFromInfo(held, "me"), "taken");
    assert.equal(causeFromInfo(held, "other"), null);
    const free = parseInfo(["mode", "free", "fence", 1n, "holders", []]);
    assert.equal(causeFromInfo(free, "me"), "ended");
    // A read of one owner's entry (`LOCK.INFO key OWNER me`) lists nobody else: holders_count
    // tells a hold taken by others from one that ended.
    const othersHold = parseInfo(["mode", "write", "fence", 1n, "holders", [], "holders_count", 1n]);
    assert.equal(causeFromInfo(othersHold, "me"), "taken");
    const nobody = parseInfo(["mode", "free", "fence", 1n, "holders", [], "holders_count", 0n]);
    assert.equal(causeFromInfo(nobody, "me"), "ended");
  });
});

describe("lease", () => {
  it("a confirmed release is a success even after the local validity ran out (own owner)", () => {
    const l = new Lease(["k"], 3000, 1, 10, 0.01);
    assert.equal(l.validity(100), 0);
    assert.equal(l.loss(100)?.cause, "expired");
    assert.equal(l.releasedWith([one(ok)], false, 100).kind, "ok");
  });
  it("a refused release is diagnosed; an overwritten key and a closed bound connection name themselves", () => {
    const l = new Lease(["k"], 3000, 1, 3000, 0.01);
    const v = l.releasedWith([one(notOwner)], false, 0);
    assert.deepEqual(v, { kind: "diagnose", server: 0, resource: 0 });
    const loss = l.diagnosed(parseInfo(["mode", "write", "holders", [["x", 1n, 5n]]]), "me", 0, "");
    assert.equal(loss.cause, "taken");
    const w = new Lease(["k"], 3000, 1, 3000, 0.01).releasedWith([one(wrongType)], false, 0);
    assert.equal(w.kind === "lost" && w.loss.cause, "overwritten");
    const c = new Lease(["k"], 3000, 1, 3000, 0.01).releasedWith([one(slow)], true, 0);
    assert.equal(c.kind === "lost" && c.loss.cause, "connection-closed");
  });
  it("a quorum release needs a majority; unanswered servers are not a loss", () => {
    assert.equal(new Lease(["k"], 3000, 2, 3000, 0.01).releasedWith([one(ok), one(slow), one(ok)], false, 0).kind, "ok");
    assert.equal(new Lease(["k"], 3000, 2, 3000, 0.01).releasedWith([one(ok), one(slow), one(slow)], false, 0).kind, "unreachable");
  });
  it("several resources: a server counts only when every resource was done", () => {
    const l = new Lease(["a", "b"], 3000, 1, 3000, 0.01);
    const v = l.releasedWith([[ok, notOwner]], false, 0);
    assert.deepEqual(v, { kind: "diagnose", server: 0, resource: 1 });
  });
  it("extends move validity forward while valid; a new ttl replaces it; a loss stays", () => {
    const l = new Lease(["k"], 1000, 1, 1000, 0.01);
    const v = l.extended([one(ok)], false, 0, 10000, 0);
    assert.equal(v.kind, "ok");
    assert.ok(l.validUntil > 9000);
    l.extended([one(ok)], false, 0, 2000, 0);
    assert.ok(l.validUntil < 2000);
    assert.equal(l.extended([one(ok)], false, 30000, 10000, 30000).kind, "lost");
    assert.equal(l.validity(0), 0, "a loss is never cleared by a later reading");
    assert.equal(l.lose({ cause: "deleted", resource: "k", detail: "" }), false);
  });
  it("property: whatever the answers, validUntil never moves back with the same ttl, and a verdict is always given", () => {
    const r = rng(SEED);
    const shapes = [ok, notOwner, wrongType, slow];
    for (let i = 0; i < 2000; i++) {
      const n = r.pick([1, 3, 5]);
      const l = new Lease(["k"], 1000, Math.floor(n / 2) + 1, 1000, 0.01);
      let t = 0;
      for (let j = 0; j < 10; j++) {
        t += r.int(0, 400);
        const before = l.validUntil;
        const v = l.extended(Array.from({ length: n }, () => one(r.pick(shapes))), false, t, 1000, t);
        assert.ok(["ok", "lost", "diagnose", "unreachable"].includes(v.kind));
        if (v.kind === "ok") assert.ok(l.validUntil >= before);
      }
    }
  });
});

describe("a waited grant checked against the server", () => {
  it("never ends later than the server's ttl for the hold (less the margin), nor later than counted", () => {
    const r = rng(SEED);
    for (let i = 0; i < 500; i++) {
      const infoSent = r.next() * 1000;
      const now = infoSent + r.next() * 50;
      const counted = now + r.next() * 10_000;
      const ttl = Math.floor(r.next() * 10_000);
      const v = confirmedValidUntil(counted, infoSent, ttl, now);
      if (v === null) {
        assert.ok(Math.min(counted, infoSent + ttl - 2) <= now);
      } else {
        assert.ok(v <= counted && v <= infoSent + ttl - 2 && v > now);
      }
    }
    assert.equal(confirmedValidUntil(5000, 0, null, 1), null, "the owner does not hold it: nothing");
  });
});

describe("a waited grant's lease on one server", () => {
  it("counts from the request while the wait is short; after a long wait it asks for a check", () => {
    const r = rng(SEED);
    for (let i = 0; i < 500; i++) {
      const ttl = 100 + Math.floor(r.next() * 20_000);
      const sent = r.next() * 1000;
      const now = sent + r.next() * ttl * 0.1;
      const v = singleServerValidUntil(sent, true, ttl, now);
      if (!waitedGrantNeedsCheck(sent, ttl, now)) {
        assert.equal(v, Math.max(now, sent + ttl - 2), "short wait: from the request, never later than the server's expiry");
      } else {
        assert.ok(now - sent > ttl * 0.05);
      }
    }
  });
});
