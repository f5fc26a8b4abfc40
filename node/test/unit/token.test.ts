import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { exactInteger, maxToken, tokenFrom } from "../../src/core/token.js";
import { TokenPrecisionError } from "../../src/errors.js";
import { rng, SEED } from "./rng.js";

describe("tokens are exact bigints", () => {
  it("reads bigint, decimal strings and safe numbers exactly", () => {
    assert.equal(tokenFrom(5n), 5n);
    assert.equal(tokenFrom("9007199254740993"), 9007199254740993n);
    assert.equal(tokenFrom(Buffer.from("42")), 42n);
    assert.equal(tokenFrom(Number.MAX_SAFE_INTEGER), 9007199254740991n);
  });
  it("never rounds: an unsafe number is a TokenPrecisionError", () => {
    assert.throws(() => tokenFrom(2 ** 53), TokenPrecisionError);
    assert.throws(() => tokenFrom(1882870173780672500), TokenPrecisionError);
    assert.throws(() => exactInteger(1.5), TokenPrecisionError);
  });
  it("refuses what is not a token", () => {
    assert.throws(() => tokenFrom(0n), TypeError);
    assert.throws(() => tokenFrom("12a"), TypeError);
    assert.throws(() => tokenFrom(null), TypeError);
    assert.throws(() => tokenFrom([1n]), TypeError);
  });
  it("property: every decimal string of a 63-bit integer reads back to the same bigint; two consecutive stay distinct", () => {
    const r = rng(SEED);
    for (let i = 0; i < 2000; i++) {
      const t = (BigInt(r.int(0, 2 ** 31 - 1)) << 32n) | BigInt(r.int(1, 2 ** 32 - 1));
      assert.equal(tokenFrom(t.toString()), t);
      assert.notEqual(tokenFrom((t + 1n).toString()), tokenFrom(t.toString()));
    }
  });
  it("maxToken", () => {
    assert.equal(maxToken([]), 0n);
    assert.equal(maxToken([3n, 9007199254740993n, 9007199254740992n]), 9007199254740993n);
  });
});
