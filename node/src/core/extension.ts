/**
 * `using()`'s automatic extension, decided here: when to extend (redlock v5's timing), and what
 * a failed extension means. Pure: the caller passes the clocks and the facts.
 * @internal
 */

/**
 * How long to wait before extending a lock whose `expiration` (`Date.now()` ms) is given, at
 * `nowWall`: redlock v5 extends when less than `threshold` ms of the lock are left.
 */
export function extensionDelay(expiration: number, nowWall: number, threshold: number): number {
  return Math.max(0, expiration - nowWall - threshold);
}

/** What to do after an extension failed. */
export type AfterExtendFailure =
  /** The lock is lost (the error said so): abort the routine's signal with it. */
  | { readonly kind: "lost" }
  /** The servers did not confirm it (unreachable), and the lock is still valid: try again after `ms`. */
  | { readonly kind: "retry"; readonly ms: number }
  /** Not confirmed, and the validity ran out meanwhile: the lock is lost (expired). */
  | { readonly kind: "expired" };

/**
 * After an extension failed: `lost` when it reported a loss; else a retry while the lock is
 * still valid (after `retryDelay` ms, at most a quarter of what is left, at least 1 ms); else
 * the lock expired.
 */
export function afterExtendFailure(lost: boolean, validity: number, retryDelay: number): AfterExtendFailure {
  if (lost) return { kind: "lost" };
  if (validity > 0) return { kind: "retry", ms: Math.max(1, Math.min(retryDelay, validity / 4)) };
  return { kind: "expired" };
}
