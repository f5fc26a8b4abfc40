// Polling and timing helpers.
import { setTimeout as delay } from "node:timers/promises";

/** Generous bound for "eventually" conditions on a shared 2-core machine (ms). */
export const PATIENCE_MS = 10_000;

/** REDIS_LOCK_TEST_TIME_FACTOR (default 1): multiplies the latency bounds of timing tests, for a
 *  machine slower or busier than the shared 2-core one the defaults were set on (the defaults
 *  must hold there with other suites running). */
export const TIMING_SCALE = ((): number => {
  const raw = process.env["REDIS_LOCK_TEST_TIME_FACTOR"];
  if (raw === undefined || raw === "") return 1;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 1) throw new Error(`REDIS_LOCK_TEST_TIME_FACTOR=${raw}: expected a number of at least 1`);
  return n;
})();

/** A latency bound of a timing test, scaled by {@link TIMING_SCALE}. */
export function scaled(ms: number): number {
  return ms * TIMING_SCALE;
}

/** Resolves after `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return delay(ms).then(() => undefined);
}

/** Options of {@link waitFor}. */
export interface WaitForOptions {
  /** Pause between polls (ms); default 5. */
  intervalMs?: number;
  /** Named in the failure message. */
  what?: string;
}

/**
 * Polls `cond` (sync or async) until it returns something truthy and returns that value;
 * rejects after `timeoutMs` (default {@link PATIENCE_MS}) naming `what`. An exception from
 * `cond` counts as "not yet" until the deadline, then is the failure's cause.
 */
export async function waitFor<T>(
  cond: () => T | Promise<T>,
  timeoutMs: number = PATIENCE_MS,
  opts: WaitForOptions = {},
): Promise<NonNullable<T>> {
  const interval = opts.intervalMs ?? 5;
  const deadline = performance.now() + timeoutMs;
  let lastError: unknown = undefined;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v as NonNullable<T>;
      lastError = undefined;
    } catch (e) {
      lastError = e;
    }
    if (performance.now() >= deadline) {
      const why = lastError instanceof Error ? `: last error ${lastError.message}` : "";
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${opts.what ?? "a condition"}${why}`, { cause: lastError });
    }
    await sleep(interval);
  }
}

/** Milliseconds since an arbitrary origin (monotonic). */
export function now(): number {
  return performance.now();
}

/** The p-th percentile (0..100) of `values` (nearest rank, inclusive); NaN when empty. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank] as number;
}

/** {@link waitFor} with the condition named first: `await until("the waiter queues", cond)`
 *  (boolean conditions; default patience {@link PATIENCE_MS}). */
export async function until(what: string, cond: () => boolean | Promise<boolean>, timeoutMs: number = PATIENCE_MS): Promise<void> {
  await waitFor(cond, timeoutMs, { what });
}
