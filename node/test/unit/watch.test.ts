import { test } from "node:test";
import assert from "node:assert/strict";
import {
  MAX_IGNORED_PUSHES,
  MAX_STALE,
  RECHECK_SPACING_MS,
  Registration,
  WatchCore,
  infoHolders,
  judge,
  minimal,
  trackingOn,
  trackingRefused,
} from "../../src/core/watch.js";
import { ServerReplyError, type Reply } from "../../src/driver/types.js";

const info = (...owners: string[]): Reply => [
  "mode", owners.length ? "write" : "free", "fence", 7n,
  "holders", owners.map((o) => [o, 1n, 1000n]), "waiting", 0n, "queue", [],
];

function connected(): WatchCore {
  const w = new WatchCore();
  w.connected(42n, 0);
  return w;
}

test("trackingOn / minimal / trackingRefused", () => {
  assert.deepEqual(trackingOn(5n, ["a", "b"]), ["CLIENT", "TRACKING", "on", "REDIRECT", "5", "BCAST", "NOLOOP", "PREFIX", "a", "PREFIX", "b"]);
  assert.deepEqual(minimal(["lock:ab", "lock:a", "other", "lock:abc", "lock:b"]), ["lock:a", "lock:b", "other"]);
  assert.deepEqual(minimal([]), []);
  assert.equal(trackingRefused("ERR Prefix 'a' overlaps with an existing prefix 'ab'"), false);
  assert.equal(trackingRefused("NOPERM this user has no permissions to run the 'client|tracking' command"), true);
});

test("judge: deleted, overwritten, taken, ended, held, undecided", () => {
  assert.deepEqual(judge(null, undefined, "A"), { decided: true, cause: "deleted" });
  assert.deepEqual(judge(undefined, new ServerReplyError("WRONGTYPE Operation against a key"), "A"), { decided: true, cause: "overwritten" });
  assert.deepEqual(judge(info("B"), undefined, "A"), { decided: true, cause: "taken" });
  assert.deepEqual(judge(info(), undefined, "A"), { decided: true, cause: "ended" });
  assert.deepEqual(judge(info("B", "A"), undefined, "A"), { decided: true, cause: null });
  assert.deepEqual(judge(undefined, new Error("connection lost"), "A"), { decided: false, cause: null });
  assert.deepEqual(judge(undefined, new ServerReplyError("ERR unknown command"), "A"), { decided: false, cause: null });
  assert.deepEqual(judge("garbage", undefined, "A"), { decided: false, cause: null });
  assert.deepEqual(infoHolders(info("x", "y")), ["x", "y"]);
  assert.equal(infoHolders(["odd"]), undefined);
});

test("registration: a key is registered once, covered keys need nothing, a shorter key rebuilds", () => {
  const w = connected();
  const p1 = w.add(new Registration("lock:ab", "A"), 0);
  assert.deepEqual(p1.commands, [trackingOn(42n, ["lock:ab"])]);
  assert.deepEqual(p1.reads, [["lock:ab", 1]]);
  const p2 = w.add(new Registration("lock:abc", "A"), 0);
  assert.deepEqual(p2.commands, [], "covered by lock:ab");
  const p3 = w.add(new Registration("lock:a", "A"), 0);
  assert.deepEqual(p3.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["lock:a"]), ["EXEC"]]);
  assert.deepEqual([...w.registered], ["lock:a"]);
});

test("not connected: nothing sent; connected registers every key and re-reads each", () => {
  const w = new WatchCore();
  const plan = w.add(new Registration("k1", "A"), 0);
  assert.deepEqual(plan, { commands: [], reads: [] });
  w.add(new Registration("k2", "A"), 0);
  const up = w.connected(9n, 0);
  assert.deepEqual(up.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(9n, ["k1", "k2"]), ["EXEC"]]);
  assert.deepEqual(up.reads.map(([k]) => k).sort(), ["k1", "k2"]);
  w.disconnected();
  assert.equal(w.redirect, null);
  assert.deepEqual(w.message(["k1"], 100), { commands: [], reads: [] }, "reads are due while down");
  assert.deepEqual(w.tick(1000), { commands: [], reads: [] }, "nothing goes out while down");
});

test("re-reads are one at a time and spaced; a change meanwhile is due afterwards", () => {
  const w = connected();
  const reg = new Registration("k", "A");
  const [, n1] = w.add(reg, 0).reads[0] ?? ["", 0];
  assert.equal(w.readDone("k", n1, info("A"), undefined).length, 0);
  const p = w.message(["k"], 1);
  assert.deepEqual(p.reads, [], "within the spacing: due");
  assert.equal(w.nextDue(), RECHECK_SPACING_MS);
  assert.deepEqual(w.tick(2).reads, []);
  const t = w.tick(RECHECK_SPACING_MS);
  assert.equal(t.reads.length, 1);
  const [[key, n2] = ["", 0]] = t.reads;
  assert.equal(key, "k");
  assert.deepEqual(w.message(["k"], 100).reads, [], "in flight: due");
  const lost = w.readDone("k", n2, null, undefined);
  assert.deepEqual(lost.map(([r, c]) => [r.key, c]), [["k", "deleted"]]);
  assert.equal(reg.done, true);
  assert.equal(w.watched(), false);
  assert.equal(w.nextDue(), null, "a key no longer watched is not due");
});

test("a re-read sent before a registration does not judge it", () => {
  const w = connected();
  const a = new Registration("k", "A");
  w.add(a, 0); // read 1
  const b = new Registration("k", "B"); // granted later: first = 2
  const p = w.add(b, 0);
  assert.deepEqual(p.reads, [], "read 1 in flight: due");
  const lost = w.readDone("k", 1, info("A"), undefined);
  assert.deepEqual(lost, [], "read 1 shows A only, but B was granted after it was sent");
  assert.equal(b.done, false);
  const t = w.tick(100);
  const [[, n2] = ["", 0]] = t.reads;
  assert.equal(n2, 2);
  assert.deepEqual(w.readDone("k", n2, info("A", "B"), undefined), []);
});

test("a failed re-read decides nothing and is due again", () => {
  const w = connected();
  const reg = new Registration("k", "A");
  w.add(reg, 0);
  assert.deepEqual(w.readDone("k", 1, undefined, new Error("timeout")), []);
  assert.equal(reg.done, false);
  assert.notEqual(w.nextDue(), null);
  assert.equal(w.tick(100).reads.length, 1);
});

test("a flush re-reads every watched key", () => {
  const w = connected();
  w.add(new Registration("a", "A"), 0);
  w.add(new Registration("b", "A"), 0);
  w.readDone("a", 1, info("A"), undefined);
  w.readDone("b", 2, info("A"), undefined);
  assert.deepEqual(w.message(null, 100).reads.map(([k]) => k).sort(), ["a", "b"]);
});

test("pushes for keys no longer watched shrink the registered set, once", () => {
  const w = connected();
  const held = new Registration("held", "A");
  const gone = new Registration("gone", "A");
  w.add(held, 0);
  w.add(gone, 0);
  w.cancel(gone, 0);
  assert.equal(gone.cancelled, true);
  for (let i = 0; i < MAX_IGNORED_PUSHES - 1; i++) assert.deepEqual(w.message(["gone"], 10 + i), { commands: [], reads: [] });
  const p = w.message(["gone"], 20);
  assert.deepEqual(p.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["held"]), ["EXEC"]]);
  for (let i = 0; i < MAX_IGNORED_PUSHES * 2; i++) assert.deepEqual(w.message(["other"], 30).commands, [], "the same set: no rebuild");
});

test("stale prefixes are dropped once more than MAX_STALE pile up", () => {
  const w = connected();
  w.add(new Registration("kept", "A"), 0);
  let rebuilt = null as null | unknown[];
  for (let i = 0; i <= MAX_STALE; i++) {
    const r = new Registration(`k${String(i).padStart(4, "0")}`, "A");
    w.add(r, 0);
    const p = w.cancel(r, 0);
    if (p.commands.length > 0) rebuilt = p.commands;
  }
  assert.deepEqual(rebuilt, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["kept"]), ["EXEC"]]);
});

test("every replacement of the registered set is followed by a re-read of every watched key", () => {
  // CLIENT TRACKING off drops the broadcast invalidations the server had not sent yet: a change
  // just before the replacement is never pushed, so the keys are read again after it.
  const w = connected();
  const readOf = (p: { reads: Array<[string, number]> }, key: string): number => {
    const r = p.reads.find(([k]) => k === key);
    assert.ok(r, `a re-read of ${key}`);
    return r[1];
  };
  w.readDone("held", readOf(w.add(new Registration("held", "A"), 0), "held"), info("A"), undefined);
  const outRead = readOf(w.add(new Registration("out", "A"), 0), "out"); // not answered yet
  let replaced = null as null | { commands: unknown[]; reads: Array<[string, number]> };
  for (let i = 0; i <= MAX_STALE; i++) {
    const r = new Registration(`k${String(i).padStart(4, "0")}`, "A");
    w.add(r, 0);
    const p = w.cancel(r, 100);
    if (i < MAX_STALE) assert.deepEqual(p, { commands: [], reads: [] });
    else replaced = p;
  }
  assert.ok(replaced);
  assert.deepEqual(replaced.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["held", "out"]), ["EXEC"]]);
  // "held" is re-read now; the re-read of "out" still out went before the replacement: "out" is
  // due again once it is answered.
  assert.deepEqual(replaced.reads.map(([k]) => k), ["held"]);
  w.readDone("held", readOf(replaced, "held"), info("A"), undefined);
  assert.deepEqual(w.readDone("out", outRead, info("A"), undefined), []);
  const again = w.tick(200);
  assert.deepEqual(again.reads.map(([k]) => k), ["out"]);
  w.readDone("out", readOf(again, "out"), info("A"), undefined);

  // A replacement after pushes for keys no longer watched re-reads too (a pushed key once).
  const gone = new Registration("gone", "A");
  w.add(gone, 300);
  w.cancel(gone, 300);
  for (let i = 0; i < MAX_IGNORED_PUSHES - 1; i++) w.message(["gone"], 400);
  const p = w.message(["gone", "held"], 500);
  assert.deepEqual(p.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["held", "out"]), ["EXEC"]]);
  assert.deepEqual(p.reads.map(([k]) => k).sort(), ["held", "out"]);

  // A replacement that a shorter key brings re-reads the others and the new key.
  const w2 = connected();
  w2.readDone("lock:ab", readOf(w2.add(new Registration("lock:ab", "A"), 0), "lock:ab"), info("A"), undefined);
  const p3 = w2.add(new Registration("lock:a", "A"), 100);
  assert.deepEqual(p3.commands, [["MULTI"], ["CLIENT", "TRACKING", "off"], trackingOn(42n, ["lock:a"]), ["EXEC"]]);
  assert.deepEqual(p3.reads.map(([k]) => k).sort(), ["lock:a", "lock:ab"]);
});

test("a key with many holders is re-read less often", () => {
  const w = connected();
  w.add(new Registration("r", "A"), 0);
  const many = info(...Array.from({ length: 100_000 }, (_, i) => (i === 0 ? "A" : `o${i}`)));
  w.readDone("r", 1, many, undefined);
  assert.deepEqual(w.message(["r"], 100).reads, [], "5 s apart for 100,000 holders");
  assert.deepEqual(w.tick(4000).reads, []);
  assert.equal(w.tick(5000).reads.length, 1);
});

test("registration replies: a refusal turns the watcher off; an overlap does not; a broken redirect reconnects", () => {
  const w = connected();
  assert.equal(w.registeredReply("OK", undefined), false);
  assert.equal(w.registeredReply(undefined, new ServerReplyError("ERR Prefix 'a' overlaps with an existing prefix")), false);
  assert.equal(w.refused, null);
  assert.equal(w.registeredReply(undefined, new ServerReplyError("ERR The client ID you want redirect to does not exist")), true);
  assert.equal(w.registeredReply(["OK", new ServerReplyError("NOPERM no permission")], undefined), false);
  assert.match(w.refused ?? "", /NOPERM/);
});
