import { describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  MAX_MS,
  acquireArgs,
  acquireOutcome,
  checkSpec,
  checkTtl,
  checkOwner,
  checkWait,
  classify,
  doneOutcome,
  extendArgs,
  failureError,
  infoArgs,
  refusalOf,
  releaseArgs,
  vote,
  voteError,
  waitArg,
  type Outcome,
} from "../../src/core/protocol.js";
import { ConnectionLostError, ServerReplyError } from "../../src/driver/types.js";
import {
  CapacityMismatchError,
  DeadlockError,
  ExecutionError,
  InvalidRequestError,
  MaxWaitersError,
  ModuleMissingError,
  RefusedError,
  ResourceLockedError,
  WrongKindError,
} from "../../src/errors.js";
import { rng, SEED } from "./rng.js";

const err = (m: string): ServerReplyError => new ServerReplyError(m);

describe("requests", () => {
  it("builds each command with its options", () => {
    assert.deepEqual(acquireArgs("k", "o", { kind: "write", ttl: 1000 }), ["LOCK.ACQUIRE", "k", "o", "1000"]);
    assert.deepEqual(acquireArgs("k", "o", { kind: "write", ttl: 1000, bind: true, lockDelay: 50 }, 2500.2), [
      "LOCK.ACQUIRE", "k", "o", "1000", "WAIT", "2501", "BIND", "LOCKDELAY", "50",
    ]);
    assert.deepEqual(acquireArgs("k", "o", { kind: "read", ttl: 10 }, Infinity), ["LOCK.RWREAD", "k", "o", "10", "WAIT", "0"]);
    assert.deepEqual(acquireArgs("k", "o", { kind: "semaphore", ttl: 10, capacity: 3 }, 0), ["LOCK.SEMACQUIRE", "k", "o", "3", "10"]);
    assert.deepEqual(releaseArgs("k", "o"), ["LOCK.RELEASE", "k", "o", "ALL"]);
    assert.deepEqual(releaseArgs("k", "o", false), ["LOCK.RELEASE", "k", "o"]);
    assert.deepEqual(extendArgs("k", "o", 5), ["LOCK.EXTEND", "k", "o", "5"]);
    assert.deepEqual(infoArgs("k"), ["LOCK.INFO", "k"]);
    assert.equal(waitArg(0.2), "1");
    assert.equal(waitArg(2 ** 50), String(MAX_MS));
  });
  it("refuses what the server would refuse, before anything is sent", () => {
    assert.throws(() => checkTtl(1.5), /Duration must be an integer value in milliseconds\./);
    assert.throws(() => checkTtl(0), InvalidRequestError);
    assert.throws(() => checkTtl(MAX_MS + 1), InvalidRequestError);
    checkTtl(1);
    checkTtl(MAX_MS);
    assert.throws(() => checkOwner(""), InvalidRequestError);
    assert.throws(() => checkOwner("é".repeat(513)), InvalidRequestError);
    checkOwner("x".repeat(1024));
    assert.throws(() => checkWait(-1), InvalidRequestError);
    assert.throws(() => checkWait(MAX_MS + 1), InvalidRequestError);
    checkWait(Infinity);
    assert.throws(() => checkSpec({ kind: "semaphore", ttl: 10, capacity: 0 }), InvalidRequestError);
    assert.throws(() => checkSpec({ kind: "semaphore", ttl: 10, capacity: 2 ** 31 }), InvalidRequestError);
    assert.throws(() => checkSpec({ kind: "semaphore", ttl: 10, capacity: 1.5 }), InvalidRequestError);
    checkSpec({ kind: "semaphore", ttl: 10, capacity: 2 ** 31 - 1 });
    assert.throws(() => checkSpec({ kind: "read", ttl: 10, lockDelay: 5 }), /write locks only/);
    assert.throws(() => checkSpec({ kind: "semaphore", ttl: 10, capacity: 1, lockDelay: 5 }), /write locks only/);
    assert.throws(() => checkSpec({ kind: "write", ttl: 10, capacity: 1 }), InvalidRequestError);
    checkSpec({ kind: "read", ttl: 10, lockDelay: 0 });
  });
});

describe("replies", () => {
  it("types each reply", () => {
    assert.deepEqual(acquireOutcome(7n), { kind: "granted", token: 7n });
    assert.deepEqual(acquireOutcome(null), { kind: "busy" });
    assert.equal(acquireOutcome("OK").kind, "refused");
    assert.deepEqual(doneOutcome(0n), { kind: "granted", token: 0n });
    const table: [string, string][] = [
      ["NOTOWNER the owner does not hold this lock", "notowner"],
      ["DEADLOCK an upgrade", "deadlock"],
      ["WRONGKIND the key is a semaphore", "wrongkind"],
      ["ERR the semaphore has another capacity (2)", "capacity"],
      ["MAXWAITERS the queue is full", "maxwaiters"],
      ["WRONGTYPE Operation against a key holding the wrong kind of value", "wrongtype"],
      ["ERR unknown command 'LOCK.ACQUIRE', with args beginning with: 'k'", "module-missing"],
      ["ERR syntax error", "other"],
    ];
    for (const [text, refusal] of table) {
      assert.equal(refusalOf(text), refusal, text);
      const o = acquireOutcome(err(text));
      assert.equal(o.kind, "refused");
      if (o.kind === "refused") assert.equal(o.refusal, refusal);
    }
    for (const m of ["MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381", "TRYAGAIN moved", "CLUSTERDOWN"]) {
      assert.equal(acquireOutcome(err(m)).kind, "redirect");
    }
    const lost = acquireOutcome(new ConnectionLostError("reset"));
    assert.equal(lost.kind, "unreachable");
  });
  it("a server votes for only when every resource was granted", () => {
    assert.deepEqual(vote([{ kind: "granted", token: 1n }, { kind: "granted", token: 2n }], 2), { kind: "for", tokens: [1n, 2n] });
    const v = vote([{ kind: "granted", token: 1n }, { kind: "busy" }], 2);
    assert.equal(v.kind, "against");
    if (v.kind === "against") {
      assert.equal(v.granted, 1);
      const e = voteError(v, 2);
      assert.ok(e instanceof ResourceLockedError);
      assert.equal(e.message, "The operation was applied to: 1 of the 2 requested resources.");
    }
    const u = vote([{ kind: "granted", token: 1n }, undefined], 2);
    assert.equal(u.kind, "against");
  });
  it("classifies a failed round: unreachable, then the most specific refusal, then held", () => {
    const busy: Outcome = { kind: "busy" };
    const gone: Outcome = { kind: "unreachable", text: "reset", error: new Error("reset") };
    const ref = (t: string): Outcome => acquireOutcome(err(t));
    assert.deepEqual(classify([busy, busy, gone], 2), { kind: "held" });
    assert.equal(classify([busy, gone, gone], 2).kind, "unreachable");
    const f = classify([ref("WRONGTYPE x"), ref("DEADLOCK y"), busy], 2);
    assert.equal(f.kind === "refused" && f.refusal, "deadlock");
    const errs: [string, new (...a: never[]) => Error][] = [
      ["DEADLOCK y", DeadlockError],
      ["WRONGKIND y", WrongKindError],
      ["ERR the semaphore has another capacity", CapacityMismatchError],
      ["MAXWAITERS q", MaxWaitersError],
      ["WRONGTYPE t", RefusedError],
      ["ERR unknown command 'LOCK.INFO'", ModuleMissingError],
    ];
    for (const [t, cls] of errs) {
      const e = failureError(classify([ref(t)], 1), [], ["a:1"]);
      assert.ok(e instanceof cls, t);
      assert.ok(e instanceof ExecutionError);
    }
    const e = failureError(classify([busy, gone, gone], 2), [], ["a:1", "b:2", "c:3"], [busy, gone, gone]);
    assert.match(e.message, /quorum could not be reached: 2 of 3 servers did not answer: b:2 \(reset\), c:3 \(reset\)/);
  });
  it("property: classify never throws and is unreachable exactly when fewer than a quorum answered", () => {
    const r = rng(SEED);
    const shapes: Outcome[] = [
      { kind: "busy" },
      { kind: "granted", token: 1n },
      { kind: "unreachable", text: "x", error: new Error("x") },
      acquireOutcome(err("DEADLOCK d")),
      acquireOutcome(err("WRONGTYPE w")),
      acquireOutcome(err("MAXWAITERS m")),
    ];
    for (let i = 0; i < 3000; i++) {
      const n = r.int(1, 7);
      const q = Math.floor(n / 2) + 1;
      const os = Array.from({ length: n }, () => r.pick(shapes));
      const f = classify(os, q);
      const answered = os.filter((o) => o.kind !== "unreachable").length;
      assert.equal(f.kind === "unreachable", answered < q);
      if (f.kind === "refused") assert.ok(os.some((o) => o.kind === "refused"));
    }
  });
});
