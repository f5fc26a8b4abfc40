/**
 * Settings: redlock v5's five, with the same names and defaults, plus this package's own.
 *
 * How redlock's retry settings map to the server's queue: redlock polls `retryCount + 1` times,
 * `retryDelay ± retryJitter` ms apart. This package asks once and waits in the server's FIFO
 * queue (`LOCK.ACQUIRE … WAIT ms`) instead, for `wait` ms, which defaults to the time redlock's
 * retries would span on average:
 *
 * - `wait` given: that many ms (`Infinity`: no limit);
 * - else `retryCount === -1`: no limit (`WAIT 0` on one server);
 * - else `retryCount === 0`: no wait at all (one try, fail fast);
 * - else `retryCount * retryDelay` ms (redlock's defaults, 10 × 200: 2000 ms).
 *
 * `retryJitter` is accepted and not used for the wait (the server's queue needs no jitter).
 * @packageDocumentation
 */
import type { LockLostError } from "./errors.js";
import { checkWait } from "./core/protocol.js";

/**
 * A Redis client this package can lock through: an ioredis `Redis` or `Cluster`, or a node-redis
 * v4 / v5 client (`createClient()`). Only its shape is used; the package opens connections of
 * its own from it (`duplicate()`), and `redlock.quit()` quits it.
 */
export interface RedisClientLike {
  duplicate(...args: never[]): unknown;
}

/** The settings of a Redlock, and of each of its operations (`Partial<Settings>`). */
export interface Settings {
  /** Clock drift allowance as a fraction of the duration (plus 2 ms). Default 0.01. */
  readonly driftFactor: number;
  /** redlock's retries: mapped to a server-side wait (see the module comment). -1: no limit. Default 10. */
  readonly retryCount: number;
  /** redlock's pause between retries in ms: mapped to a server-side wait. Default 200. */
  readonly retryDelay: number;
  /** redlock's jitter in ms: accepted, not used (the server queues waiters in order). Default 100. */
  readonly retryJitter: number;
  /** `using()` extends the lock when less than this many ms of it are left. Default 500. */
  readonly automaticExtensionThreshold: number;
  /** How long to wait in the server's queue, in ms (`Infinity`: no limit; 0: not at all). Default from the retry settings. */
  readonly wait?: number;
  /** Bind the holds to connections of their own: when such a connection closes (the process dies), the server ends the hold at once. One server only. */
  readonly bind?: boolean;
  /** Write locks: when the hold ends other than by a release (ttl, bound connection closed), nobody gets the lock until this many ms later. */
  readonly lockDelay?: number;
  /** Cuts a wait short: the acquire rejects with `signal.reason` and leaves no grant behind. */
  readonly signal?: AbortSignal;
  /** Watch the lock: called once if it is lost (deleted, overwritten, taken, expired, bound connection closed). `using()` always watches. */
  readonly onLost?: (err: LockLostError) => void;
  /** Per server, how many wait connections may be busy at once (default 64). Constructor only. */
  readonly maxWaitConnections?: number;
}

/** redlock v5's defaults. */
export const defaultSettings: Readonly<Settings> = Object.freeze({
  driftFactor: 0.01,
  retryCount: 10,
  retryDelay: 200,
  retryJitter: 100,
  automaticExtensionThreshold: 500,
});

/** `base` with the fields of `over` that are set (redlock: a number replaces; ours: any defined value). */
export function resolveSettings(base: Settings, over?: Partial<Settings>): Settings {
  if (!over) return base;
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(over)) if (v !== undefined) out[k] = v;
  return out as unknown as Settings;
}

/** The constructor's settings, as redlock takes them (a non-number falls back to the default). */
export function constructorSettings(settings: Partial<Settings> = {}): Settings {
  const num = (v: unknown, d: number): number => (typeof v === "number" ? v : d);
  const out: Settings = {
    ...settings,
    driftFactor: num(settings.driftFactor, defaultSettings.driftFactor),
    retryCount: num(settings.retryCount, defaultSettings.retryCount),
    retryDelay: num(settings.retryDelay, defaultSettings.retryDelay),
    retryJitter: num(settings.retryJitter, defaultSettings.retryJitter),
    automaticExtensionThreshold: num(settings.automaticExtensionThreshold, defaultSettings.automaticExtensionThreshold),
  };
  return out;
}

/**
 * The server-side wait for these settings, in ms: undefined for none, `Infinity` for no limit
 * (see the module comment for the mapping from redlock's retry settings).
 */
export function serverWait(s: Settings): number | undefined {
  if (s.wait !== undefined) {
    checkWait(s.wait); // a negative, NaN or non-number wait is refused, never read as "no wait"
    if (s.wait === Infinity) return Infinity;
    return s.wait > 0 ? s.wait : undefined;
  }
  if (s.retryCount === -1) return Infinity;
  if (!(s.retryCount > 0)) return undefined;
  const w = s.retryCount * Math.max(0, s.retryDelay);
  return w > 0 ? w : undefined;
}
