// TLS through the user's client's own options: the package's connections (made from the user's
// client) speak TLS too, for ioredis and node-redis v5 / v4.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import Redlock from "../src/index.js";
import { useKit, waitFor, type Kit, type TlsServer } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

describe("TLS", () => {
  const kit = useKit();
  let server: TlsServer;

  /** Connections on the TLS port: CLIENT LIST has no TLS column, so count all but the kit's. */
  async function clients(): Promise<number> {
    return String(await server.call(["CLIENT", "LIST"])).trim().split("\n").length - 1;
  }

  const makers: [string, () => Promise<Awaited<ReturnType<Kit["client"]>>>][] = [
    ["ioredis", async () => kit.ioredisTls(server)],
    ["node-redis", async () => kit.nodeRedis({ host: server.host, port: server.tlsPort }, { socket: { tls: true, ca: server.certs.ca, host: server.host, port: server.tlsPort } })],
    ["node-redis4", async () => kit.nodeRedis4({ host: server.host, port: server.tlsPort }, { socket: { tls: true, ca: server.certs.ca, host: server.host, port: server.tlsPort } })],
  ];

  for (const [kind, make] of makers) {
    test(`acquire, a queued wait and release over TLS (${kind})`, { timeout: TEST_TIMEOUT_MS }, async () => {
      server ??= await kit.tlsServer();
      const key = `tls:${kind}`;
      const a = new Redlock([await make()], { retryCount: 0 });
      const b = new Redlock([await make()], { retryCount: 0 });
      kit.defer(() => a.quit());
      kit.defer(() => b.quit());
      const held = await a.acquire([key], 10_000);
      assert.deepEqual(await server.holders(key), [held.value]);
      const waiting = b.acquire([key], 10_000, { wait: 20_000 });
      await waitFor(async () => (await server.waiting(key)) === 1, 10_000, { what: "the TLS wait queued" });
      await held.release();
      const lock = await waiting;
      assert.ok(lock.fencingToken > held.fencingToken);
      await lock.release();
      assert.ok((await clients()) >= 2);
      assert.equal(await server.lockInfo(key), null);
    });
  }
});
