import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { WaitLines } from "../../src/waitorder.js";

/** A promise with its settling functions. */
function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Whether `p` has settled after the pending callbacks (and a few timer turns) ran. */
async function settledSoon(p: Promise<unknown>, ms = 30): Promise<boolean> {
  let done = false;
  void p.then(
    () => (done = true),
    () => (done = true),
  );
  await new Promise((r) => setTimeout(r, ms));
  return done;
}

describe("WaitLines: a wait on a key is written once the previous one is queued", () => {
  it("a wait with none before it on its key goes at once; other keys and servers are other lines", async () => {
    const lines = new WaitLines();
    const a = lines.join("s1", "k");
    const b = lines.join("s1", "other");
    const c = lines.join("s2", "k");
    for (const t of [a, b, c]) assert.ok(await settledSoon(t.before(Infinity)));
    for (const t of [a, b, c]) t.dropped();
    assert.equal(lines.size, 0);
  });

  it("the next waits until the server says the previous one is queued", async () => {
    const lines = new WaitLines();
    const first = lines.join("s", "k");
    const second = lines.join("s", "k");
    await first.before(Infinity);
    const next = second.before(Infinity);
    assert.equal(await settledSoon(next), false, "not before the first is written");
    const reply = deferred<unknown>();
    let answers = [false, false, true];
    let asked = 0;
    first.sent(reply.promise, async () => {
      asked++;
      return answers.shift() ?? true;
    });
    assert.ok(await settledSoon(next, 200), "once LOCK.INFO shows the first queued");
    assert.equal(asked, 3);
    answers = [];
    reply.resolve(1n);
    await reply.promise;
    second.dropped();
    await new Promise((r) => setImmediate(r));
    assert.equal(lines.size, 0, "nothing left behind");
  });

  it("the previous one's answer, its never being written, or a check that fails lets the next go", async () => {
    const lines = new WaitLines();
    // answered: never shown queued
    const a = lines.join("s", "k");
    const b = lines.join("s", "k");
    await a.before(Infinity);
    const reply = deferred<unknown>();
    a.sent(reply.promise, async () => false);
    const bNext = b.before(Infinity);
    assert.equal(await settledSoon(bNext), false);
    reply.reject(new Error("connection lost"));
    await assert.rejects(reply.promise);
    assert.ok(await settledSoon(bNext));
    // never written
    const c = lines.join("s", "k");
    const cNext = c.before(Infinity);
    assert.equal(await settledSoon(cNext), false);
    b.dropped();
    assert.ok(await settledSoon(cNext));
    // the check cannot be made
    const d = lines.join("s", "k");
    await settledSoon(Promise.resolve());
    c.sent(new Promise(() => undefined), async () => {
      throw new TypeError("LOCK.INFO has no waiters field");
    });
    assert.ok(await settledSoon(d.before(Infinity)));
  });

  it("a previous wait that has no connection yet holds no one up", async () => {
    const lines = new WaitLines();
    const a = lines.join("s", "k");
    const b = lines.join("s", "k");
    // a never called before(): still waiting for a wait connection
    assert.ok(await settledSoon(b.before(Infinity)));
    a.dropped();
    b.dropped();
    assert.equal(lines.size, 0);
  });

  it("waits no longer than its own time, nor past its signal", async () => {
    const lines = new WaitLines();
    const a = lines.join("s", "k");
    const b = lines.join("s", "k");
    const c = lines.join("t", "k");
    const d = lines.join("t", "k");
    await a.before(Infinity);
    await c.before(Infinity);
    // a and c are never written nor dropped
    const t0 = performance.now();
    await b.before(50);
    assert.ok(performance.now() - t0 >= 40);
    const ac = new AbortController();
    const dNext = d.before(Infinity, ac.signal);
    assert.equal(await settledSoon(dNext), false);
    ac.abort();
    assert.ok(await settledSoon(dNext));
  });
});
