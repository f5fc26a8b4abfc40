/**
 * `LOCK.INFO` read into a {@link LockInfo}: the RESP2 flat field/value array (our connections
 * speak RESP2), unknown fields kept in `raw`, holder entries may carry more elements.
 * @internal
 */
import type { Reply } from "./reply.js";
import { describe, exactInteger } from "./token.js";

/** One holder of a key, as `LOCK.INFO` lists it. */
export interface LockHolder {
  /** The owner string the hold was taken under (for a lock of this package: `lock.value`). */
  readonly owner: string;
  /** How many holds (re-entries, or semaphore permits) the owner has. */
  readonly count: number;
  /** How much longer the owner's holds last unless extended, in ms. */
  readonly ttl: number;
  /**
   * How long the owner has held the key, in ms from its first grant (module 0.3.0+); absent
   * when the server does not say or does not know the start (a hold restored from older files).
   */
  readonly held?: number;
  /** Elements after `[owner, count, ttl]` (from newer module versions), as sent. */
  readonly extra: readonly Reply[];
}

/** What `LOCK.INFO key` says about a lock or semaphore key. */
export interface LockInfo {
  /** `write`, `read`, `semaphore`, or `free` (only a lock-delay pending, or only waiters). */
  readonly mode: "write" | "read" | "semaphore" | "free";
  /** The last fencing token granted on this key. */
  readonly fence: bigint;
  /** The live holders. */
  readonly holders: readonly LockHolder[];
  /** How many clients wait in the key's queue. */
  readonly waiting: number;
  /** The modes the waiters ask for, head first. */
  readonly queue: readonly string[];
  /** What is left of a pending lock-delay, in ms (0 when none). */
  readonly delay: number;
  /** A semaphore's capacity (absent for a lock key). */
  readonly capacity?: number;
  /** How many owners hold the key, listed or not (module 0.4.0+; absent from an older module,
   *  which lists every holder). A read of one owner's entry (`OWNER`) lists that owner alone:
   *  this says whether others hold the key. */
  readonly holdersCount?: number;
  /** Every field as the server sent it, known or not. */
  readonly raw: ReadonlyMap<string, Reply>;
}

function num(v: Reply | undefined, field: string): number {
  if (v === undefined) return 0;
  const n = exactInteger(v, `LOCK.INFO ${field}`);
  return Number(n);
}

/** Reads a `LOCK.INFO` reply (nil → null). Throws a TypeError on a reply of another shape. */
export function parseInfo(reply: Reply): LockInfo | null {
  if (reply === null) return null;
  if (!Array.isArray(reply)) throw new TypeError(`unexpected LOCK.INFO reply ${describe(reply)}`);
  const raw = new Map<string, Reply>();
  for (let i = 0; i + 1 < reply.length; i += 2) {
    const k = reply[i];
    if (typeof k === "string") raw.set(k, reply[i + 1] ?? null);
  }
  const modeText = raw.get("mode");
  const mode = modeText === "write" || modeText === "read" || modeText === "semaphore" ? modeText : "free";
  const holders: LockHolder[] = [];
  const hs = raw.get("holders");
  if (Array.isArray(hs)) {
    for (const h of hs) {
      if (!Array.isArray(h) || h.length < 3) throw new TypeError(`unexpected LOCK.INFO holder ${describe(h)}`);
      const holder: LockHolder = { owner: String(h[0]), count: num(h[1], "holder count"), ttl: num(h[2], "holder ttl"), extra: h.slice(3) };
      // The fourth element (module 0.3.0+) is the hold's age; -1 when the server cannot know it.
      const held = h.length > 3 ? num(h[3], "holder held") : -1;
      holders.push(held >= 0 ? { ...holder, held } : holder);
    }
  }
  const q = raw.get("queue");
  const queue = Array.isArray(q) ? q.filter((x): x is string => typeof x === "string") : [];
  const fence = raw.has("fence") ? exactInteger(raw.get("fence"), "LOCK.INFO fence") : 0n;
  const info: LockInfo = {
    mode,
    fence,
    holders,
    waiting: num(raw.get("waiting"), "waiting"),
    queue,
    delay: num(raw.get("delay"), "delay"),
    ...(raw.has("capacity") ? { capacity: num(raw.get("capacity"), "capacity") } : {}),
    ...(raw.has("holders_count") ? { holdersCount: num(raw.get("holders_count"), "holders_count") } : {}),
    raw,
  };
  return info;
}

/** The hold count of `owner` in `info` (0 when it holds nothing, or the key is gone). */
export function holdCount(info: LockInfo | null, owner: string): number {
  return info?.holders.find((h) => h.owner === owner)?.count ?? 0;
}

/**
 * Whether `owner` holds `key` or waits in its queue, by `info` (nil: neither). Throws a
 * TypeError when the reply has no `waiters` field (a module older than that field): then the
 * queue's owners cannot be told.
 */
export function holdsOrWaits(info: LockInfo | null, owner: string): boolean {
  if (info === null) return false;
  if (info.holders.some((h) => h.owner === owner)) return true;
  const ws = info.raw.get("waiters");
  if (!Array.isArray(ws)) throw new TypeError("LOCK.INFO has no waiters field");
  return ws.some((w) => Array.isArray(w) && w[0] === owner);
}
