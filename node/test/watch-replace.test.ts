/**
 * A DEL of a held key met by a replacement of the watcher's tracked prefixes.
 *
 * The watcher replaces its prefix set with `MULTI`, `CLIENT TRACKING off`, `CLIENT TRACKING on
 * ...`, `EXEC` (here: the release that leaves more than `MAX_STALE` registered prefixes stale).
 * Redis sends broadcast invalidations at the end of an event-loop iteration, and `CLIENT
 * TRACKING off` frees a prefix no other client tracks together with the keys not yet sent. A DEL
 * run in the same iteration as the replacement, before it, is therefore never pushed: unless the
 * watcher re-reads its keys after a replacement, the hold stays "held" until its ttl.
 *
 * Deterministic: `CLIENT PAUSE ALL` holds the DEL and then the replacement; when the pause ends
 * the server runs both, in that order, in one iteration (as client/tests/loss_race.rs does).
 */
import { before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Redis } from "ioredis";
import { targetFor } from "../src/driver/index.js";
import { MAX_STALE } from "../src/core/watch.js";
import { watchHold, type LossCause, type WatchHandle } from "../src/watcher.js";
import { CLIENT_KINDS, scaled, sleep, until, useKit, type Server } from "./kit/index.js";

const kit = useKit();

/** Far beyond the bound the loss must be noticed in: only a missed DEL waits for it. */
const TTL_MS = 30_000;
/** How long the server is paused: the DEL and the replacement both reach it meanwhile. Well
 *  under the watcher's request deadline (a timed-out request reopens the connection, which
 *  re-reads every key and would hide a missed push). */
const PAUSE_MS = 600;
/** More stale prefixes than the watcher keeps. */
const STALE = MAX_STALE + 1;

function staleKey(i: number): string {
  return `stale-${String(i).padStart(3, "0")}`;
}

for (const kind of CLIENT_KINDS) {
  describe(`watcher over ${kind}`, () => {
    let srv: Server;
    let admin: Redis;
    let deleter: Redis;
    before(async () => {
      srv = await kit.server();
      admin = kit.ioredis(srv);
      deleter = kit.ioredis(srv);
    });

    test("a DEL that the server runs just before a replacement of the tracked prefixes is noticed", async () => {
      const target = targetFor(await kit.client(kind, srv));
      try {
        const ep = await target.endpointFor("held");
        const conn = await ep.command();
        const watch = async (key: string, onLost: (cause: LossCause) => void): Promise<WatchHandle> => {
          assert.equal(typeof (await conn.send(["LOCK.ACQUIRE", key, "A", String(TTL_MS)])), "bigint");
          return watchHold(ep, key, "A", {}, onLost);
        };
        const losses: LossCause[] = [];
        const held = await watch("held", (cause) => losses.push(cause));
        // Every stale key registers a prefix of its own; stopping a watch leaves it registered.
        const stale: WatchHandle[] = [];
        for (let i = 0; i < STALE; i++) stale.push(await watch(staleKey(i), () => undefined));
        for (const h of stale.slice(0, -1)) h.stop();
        // Lets the registrations' own re-reads be answered (too short a wait could only hide the
        // bug: the re-read of "held" after the DEL would notice it).
        await sleep(scaled(300));
        assert.deepEqual(losses, [], "no loss before the DEL");

        assert.equal(await admin.call("CLIENT", "PAUSE", String(PAUSE_MS), "ALL"), "OK");
        const del = deleter.del("held");
        // The DEL reaches the (paused) server before the replacement.
        await sleep(PAUSE_MS / 6);
        // More than MAX_STALE stale prefixes now: this stop sends the replacement.
        stale[stale.length - 1]?.stop();
        assert.equal(await del, 1, "the key was held");

        await until("the loss of the deleted hold", () => losses.length > 0, scaled(3000));
        assert.deepEqual(losses, ["deleted"]);
        held.stop();
      } finally {
        await target.close();
      }
    });
  });
}
