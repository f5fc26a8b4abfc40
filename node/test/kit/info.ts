// INFO / CLUSTER INFO / LOCK.INFO read into typed values.
import type { RespValue } from "./resp.js";

/** Parses `INFO`-style text (`name:value` lines, `# Section` headers) into a map; the first of a
 *  repeated name counts. */
export function parseInfo(text: string): Map<string, string> {
  const map = new Map<string, string>();
  for (const line of text.split(/\r?\n/)) {
    if (line.startsWith("#")) continue;
    const i = line.indexOf(":");
    if (i < 0) continue;
    const name = line.slice(0, i);
    if (!map.has(name)) map.set(name, line.slice(i + 1).trim());
  }
  return map;
}

/** One command's line of INFO commandstats. */
export interface CommandStat {
  calls: number;
  usec: number;
  usecPerCall: number;
  rejectedCalls: number;
  failedCalls: number;
}

/** Parses INFO commandstats text into a map from command name (lower case, e.g.
 *  `lock.acquire`, `client|tracking`) to its figures. */
export function parseCommandstats(text: string): Map<string, CommandStat> {
  const out = new Map<string, CommandStat>();
  for (const [name, value] of parseInfo(text)) {
    if (!name.startsWith("cmdstat_")) continue;
    const fields = new Map<string, string>();
    for (const kv of value.split(",")) {
      const j = kv.indexOf("=");
      if (j > 0) fields.set(kv.slice(0, j), kv.slice(j + 1));
    }
    const num = (k: string): number => Number(fields.get(k) ?? "0");
    out.set(name.slice("cmdstat_".length).toLowerCase(), {
      calls: num("calls"),
      usec: num("usec"),
      usecPerCall: num("usec_per_call"),
      rejectedCalls: num("rejected_calls"),
      failedCalls: num("failed_calls"),
    });
  }
  return out;
}

/** One holder of a lock, as LOCK.INFO reports it. */
export interface KitHolder {
  owner: string;
  count: bigint;
  ttl: bigint;
}

/** LOCK.INFO read exactly (integers bigint), independent of the package under test. */
export interface KitLockInfo {
  mode: string;
  fence: bigint;
  holders: KitHolder[];
  waiting: bigint;
  queue: string[];
  delay: bigint;
  capacity: bigint | null;
  raw: Map<string, RespValue>;
}

/** Reads a LOCK.INFO reply (RESP2 flat key/value array, or nil). */
export function parseLockInfo(reply: RespValue): KitLockInfo | null {
  if (reply === null) return null;
  if (!Array.isArray(reply)) throw new Error(`LOCK.INFO: unexpected reply ${String(reply)}`);
  const raw = new Map<string, RespValue>();
  for (let i = 0; i + 1 < reply.length; i += 2) raw.set(String(reply[i]), reply[i + 1] ?? null);
  const int = (k: string): bigint => {
    const v = raw.get(k);
    return typeof v === "bigint" ? v : 0n;
  };
  const holders: KitHolder[] = [];
  const h = raw.get("holders");
  if (Array.isArray(h)) {
    for (const e of h) {
      if (!Array.isArray(e)) continue;
      const [owner, count, ttl] = e;
      holders.push({
        owner: String(owner),
        count: typeof count === "bigint" ? count : 0n,
        ttl: typeof ttl === "bigint" ? ttl : 0n,
      });
    }
  }
  const q = raw.get("queue");
  const cap = raw.get("capacity");
  return {
    mode: String(raw.get("mode") ?? ""),
    fence: int("fence"),
    holders,
    waiting: int("waiting"),
    queue: Array.isArray(q) ? q.map(String) : [],
    delay: int("delay"),
    capacity: typeof cap === "bigint" ? cap : null,
    raw,
  };
}
