// STAND-IN (library branch `nlib` only): a throwaway watcher that re-reads LOCK.INFO every
// 10 ms (the real one, by the driver helper, uses CLIENT TRACKING invalidations) so the
// library's tests run. The real `node/src/watcher.ts` replaces this file at merge (drop this one).

import type { Conn, Endpoint } from "./driver/types.js";
import { ServerReplyError } from "./driver/types.js";

/** How a watched hold was lost. */
export type LossCause = "expired" | "deleted" | "overwritten" | "taken" | "ended" | "connection-closed";
/** Stops a watch. */
export interface WatchHandle {
  stop(): void;
}

/** STAND-IN: polls LOCK.INFO. */
export async function watchHold(
  endpoint: Endpoint,
  key: string,
  owner: string,
  opts: { boundConn?: Conn },
  onLost: (cause: LossCause, detail: string) => void,
): Promise<WatchHandle> {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const lost = (cause: LossCause, detail: string): void => {
    if (stopped) return;
    stopped = true;
    if (timer) clearTimeout(timer);
    onLost(cause, detail);
  };
  opts.boundConn?.onClose((why) => lost("connection-closed", why));
  const tick = async (): Promise<void> => {
    if (stopped) return;
    try {
      const conn = await endpoint.command();
      const r = await conn.send(["LOCK.INFO", key], 1000);
      if (stopped) return;
      if (r === null) return lost("deleted", "the key is gone");
      if (Array.isArray(r)) {
        for (let i = 0; i + 1 < r.length; i += 2) {
          if (r[i] === "holders" && Array.isArray(r[i + 1])) {
            const hs = r[i + 1] as unknown[];
            const mine = hs.some((h) => Array.isArray(h) && h[0] === owner);
            if (!mine) return lost(hs.length ? "taken" : "ended", "the owner holds nothing");
          }
        }
      }
    } catch (e) {
      if (e instanceof ServerReplyError && e.code === "WRONGTYPE") return lost("overwritten", e.message);
    }
    if (!stopped) {
      timer = setTimeout(() => void tick(), 10);
      timer.unref();
    }
  };
  timer = setTimeout(() => void tick(), 10);
  timer.unref();
  return {
    stop(): void {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
  };
}
