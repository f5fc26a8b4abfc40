import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { constructorSettings, defaultSettings, resolveSettings, serverWait } from "../../src/settings.js";

describe("settings", () => {
  it("redlock's defaults and its rule: a non-number falls back", () => {
    const s = constructorSettings({ retryCount: "x" as unknown as number, driftFactor: 0.02 });
    assert.equal(s.retryCount, 10);
    assert.equal(s.driftFactor, 0.02);
    assert.deepEqual(
      { ...defaultSettings },
      { driftFactor: 0.01, retryCount: 10, retryDelay: 200, retryJitter: 100, automaticExtensionThreshold: 500 },
    );
  });
  it("maps redlock's retries to one server-side wait", () => {
    const base = constructorSettings();
    assert.equal(serverWait(base), 2000);
    assert.equal(serverWait(resolveSettings(base, { retryCount: 0 })), undefined);
    assert.equal(serverWait(resolveSettings(base, { retryCount: -1 })), Infinity);
    assert.equal(serverWait(resolveSettings(base, { retryCount: 3, retryDelay: 50 })), 150);
    assert.equal(serverWait(resolveSettings(base, { wait: 700, retryCount: 0 })), 700);
    assert.equal(serverWait(resolveSettings(base, { wait: 0 })), undefined);
    assert.equal(serverWait(resolveSettings(base, { wait: Infinity })), Infinity);
    assert.equal(resolveSettings(base, { wait: undefined }).wait, undefined);
  });
});
