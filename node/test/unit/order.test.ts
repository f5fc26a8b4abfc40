import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { compareKeys, ordered, waitLeft } from "../../src/core/order.js";
import { InvalidRequestError } from "../../src/errors.js";
import { rng, SEED } from "./rng.js";

describe("global order of resources", () => {
  it("orders by UTF-8 bytes, whatever order they are named in", () => {
    assert.deepEqual(ordered(["b", "a", "c"]), ["a", "b", "c"]);
    // UTF-16 order would put "\uffff" after "😀" (a surrogate pair); bytes put it before.
    assert.deepEqual(ordered(["😀", "\uffff"]), ["\uffff", "😀"]);
    assert.deepEqual(ordered(["Z", "a"]), ["Z", "a"]);
  });
  it("refuses none, a repeated resource, a non-string", () => {
    assert.throws(() => ordered([]), InvalidRequestError);
    assert.throws(() => ordered(["a", "b", "a"]), /named twice/);
    assert.throws(() => ordered([1 as unknown as string]), InvalidRequestError);
  });
  it("property: any permutation gives the same order, sorted by bytes", () => {
    const r = rng(SEED);
    const alphabet = ["a", "b", "é", "😀", "\u0000", "z", ":", "\uffff"];
    for (let i = 0; i < 1000; i++) {
      const set = new Set<string>();
      const n = r.int(1, 8);
      while (set.size < n) set.add(Array.from({ length: r.int(1, 4) }, () => r.pick(alphabet)).join(""));
      const xs = [...set];
      const ys = [...xs].sort(() => r.next() - 0.5);
      const a = ordered(xs);
      assert.deepEqual(a, ordered(ys));
      for (let j = 1; j < a.length; j++) assert.ok(compareKeys(a[j - 1] as string, a[j] as string) < 0);
    }
  });
  it("each resource waits only what is left", () => {
    assert.equal(waitLeft(undefined, 0, 0), undefined);
    assert.equal(waitLeft(0, 0, 0), undefined);
    assert.equal(waitLeft(2000, 100, 100), 2000);
    assert.equal(waitLeft(2000, 100, 1600), 500);
    assert.equal(waitLeft(2000, 100, 2100), undefined);
    assert.equal(waitLeft(2000, 100, 2099.5), undefined);
    assert.equal(waitLeft(Infinity, 0, 1e9), Infinity);
  });
});
