import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { afterExtendFailure, extensionDelay } from "../../src/core/extension.js";

describe("using()'s extension", () => {
  it("extends when less than the threshold is left (redlock's timing)", () => {
    assert.equal(extensionDelay(10_000, 4_000, 500), 5_500);
    assert.equal(extensionDelay(10_000, 9_800, 500), 0);
  });
  it("a loss aborts, an unconfirmed extension retries while valid, then expires", () => {
    assert.deepEqual(afterExtendFailure(true, 5000, 200), { kind: "lost" });
    assert.deepEqual(afterExtendFailure(false, 5000, 200), { kind: "retry", ms: 200 });
    assert.deepEqual(afterExtendFailure(false, 100, 200), { kind: "retry", ms: 25 });
    assert.deepEqual(afterExtendFailure(false, 0.5, 200), { kind: "retry", ms: 1 });
    assert.deepEqual(afterExtendFailure(false, 0, 200), { kind: "expired" });
  });
});
