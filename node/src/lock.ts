/**
 * A held lock: redlock v5's `Lock` (same fields and methods), plus fencing tokens, loss and
 * validity.
 * @packageDocumentation
 */
import type { Conn } from "./driver/types.js";
import { InvalidRequestError, LockLostError, type ExecutionStats } from "./errors.js";
import { Lease, quorumOf, type Loss } from "./core/lease.js";
import type { AcquireSpec } from "./core/protocol.js";
import { maxToken } from "./core/token.js";
import type { WatchHandle } from "./watcher.js";
import type Redlock from "./redlock.js";

/** What `release()` resolves to (redlock v5's type): one promise of stats per round. */
export type ExecutionResult = {
  attempts: ReadonlyArray<Promise<ExecutionStats>>;
};

/** What a lock holds: an exclusive lock, a shared (read) lock, or one semaphore permit. */
export type LockMode = "write" | "read" | "semaphore";

/** @internal The state shared by a lock and the locks its extensions return. */
export class Hold {
  readonly lease: Lease;
  /** resource → server name → token. */
  readonly tokens = new Map<string, Map<string, bigint>>();
  /** Bound connections by server index. */
  readonly bound = new Map<number, Conn>();
  readonly watches: WatchHandle[] = [];
  /** resource → servers whose hold of it was reported lost. */
  private readonly lostOn = new Map<string, Set<number>>();
  private lostError: LockLostError | null = null;
  private readonly listeners = new Set<(e: LockLostError) => void>();
  releaseResult: ExecutionResult | null = null;
  watching = false;
  stopped = false;

  constructor(
    readonly owner: string,
    readonly resources: readonly string[],
    public spec: AcquireSpec,
    readonly servers: readonly string[],
    validUntil: number,
    driftFactor: number,
  ) {
    this.lease = new Lease(resources, spec.ttl, quorumOf(servers.length), validUntil, driftFactor);
  }

  get lost(): LockLostError | null {
    if (!this.lostError) {
      const l = this.lease.recorded;
      if (l) this.lostError = new LockLostError(l.resource, l.cause, l.detail);
    }
    return this.lostError;
  }

  /** Called once when the lock is found lost. */
  onLoss(cb: (e: LockLostError) => void): () => void {
    this.listeners.add(cb);
    return () => this.listeners.delete(cb);
  }

  /**
   * Records a loss (the first one recorded wins) and tells the listeners, once. After a release
   * that succeeded, a late report (a watcher's) changes nothing.
   */
  markLost(loss: Loss): LockLostError {
    if (this.lease.released && !this.lease.recorded) return err(loss);
    this.lease.lose(loss);
    const rec = this.lease.recorded ?? loss;
    if (!this.lostError) this.lostError = err(rec);
    this.notify();
    // Lost for good: nothing left to watch.
    for (const w of this.watches.splice(0)) w.stop();
    return this.lostError;
  }

  private expiryTimer: NodeJS.Timeout | undefined;
  /** While watched: reports the loss (expired) when the validity runs out without an extension. */
  armExpiry(): void {
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    if (this.stopped || this.lease.released) return;
    const ms = Math.max(0, this.lease.validUntil - performance.now());
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      if (this.stopped || this.lease.released) return;
      if (this.lease.validUntil > performance.now()) return this.armExpiry();
      this.markLost({ cause: "expired", resource: this.resources[0] ?? "", detail: "" });
    }, Math.ceil(ms) + 1);
    this.expiryTimer.unref();
  }

  /** A watcher says the hold of `resource` on server `server` is gone. */
  serverLost(server: number, resource: string, loss: Loss): void {
    let set = this.lostOn.get(resource);
    if (!set) this.lostOn.set(resource, (set = new Set()));
    set.add(server);
    // Only servers that granted this resource hold it: those left must still be a majority.
    const holding = this.tokens.get(resource);
    const lostOn = set;
    const stillHeld = this.servers.filter((name, i) => (holding === undefined || holding.has(name)) && !lostOn.has(i)).length;
    if (stillHeld < this.lease.quorum) this.markLost(loss);
  }

  private notified = false;
  private notify(): void {
    if (this.notified || !this.lostError) return;
    this.notified = true;
    for (const cb of [...this.listeners]) {
      try {
        cb(this.lostError);
      } catch {
        // A listener's error must not stop the others.
      }
    }
  }

  /** Stops the watches (and the expiry timer). */
  stop(): void {
    this.stopped = true;
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    for (const w of this.watches.splice(0)) w.stop();
  }
}

function err(loss: Loss): LockLostError {
  return new LockLostError(loss.resource, loss.cause, loss.detail);
}

const holds = new WeakMap<Lock, Hold>();

/** @internal The hold behind a lock (undefined for a Lock built by hand). */
export function holdOf(lock: Lock): Hold | undefined {
  return holds.get(lock);
}

/** @internal Builds a lock on a hold. `resources` is the list as the caller named it (the hold
 *  keeps them in the global order it takes them in; `lock.resources` keeps the caller's order,
 *  as redlock does). */
export function makeLock(redlock: Redlock, hold: Hold, attempts: ReadonlyArray<Promise<ExecutionStats>>, expiration: number, resources: readonly string[] = hold.resources): Lock {
  const lock = new Lock(redlock, [...resources], hold.owner, attempts, expiration);
  holds.set(lock, hold);
  return lock;
}

/**
 * A lock that `acquire()`, `acquireRead()`, `acquireSemaphore()` or `extend()` returned. The
 * fields of redlock v5 keep their meaning: `value` is the owner (random, 32 hex digits) the
 * servers hold it under, `expiration` the `Date.now()` time until which it is certainly held
 * (0 once released or extended: the extension returns a new `Lock`).
 */
export class Lock {
  /** The Redlock it came from. */
  readonly redlock: Redlock;
  /** The resources (keys) as given. */
  readonly resources: string[];
  /** The owner the servers hold it under. */
  readonly value: string;
  /** One promise of stats per round of the acquire (or extend) that made it. */
  readonly attempts: ReadonlyArray<Promise<ExecutionStats>>;
  /** `Date.now()` milliseconds until which the lock is certainly held; 0 once released or replaced by an extension. */
  expiration: number;

  /** redlock v5's constructor (a lock built this way has no tokens; `release()` and `extend()` still work by its value). */
  constructor(redlock: Redlock, resources: string[], value: string, attempts: ReadonlyArray<Promise<ExecutionStats>>, expiration: number) {
    this.redlock = redlock;
    this.resources = resources;
    this.value = value;
    this.attempts = attempts;
    this.expiration = expiration;
  }

  /** `write` (acquire), `read` (acquireRead) or `semaphore` (acquireSemaphore). */
  get mode(): LockMode {
    return holds.get(this)?.spec.kind ?? "write";
  }

  /**
   * The fencing token of a lock from ONE server: that server's token for the resource (several
   * resources: the largest, which grows too, as the server's tokens come from one counter).
   * Exact, a `bigint`.
   *
   * Throws `InvalidRequestError` for a lock over several servers: each server counts on its own,
   * so the largest of a lock's tokens can be larger than the next holder's (granted by other
   * servers) and a storage guard comparing it would let the stale holder in. Compare per server
   * with {@link Lock.tokens} instead (docs/node.md, "Fencing tokens").
   */
  get fencingToken(): bigint {
    const h = holds.get(this);
    if (!h) return 0n;
    if (h.servers.length > 1) {
      throw new InvalidRequestError(
        "a lock over several servers has no single fencing token: each server counts on its own, so the largest token of one lock can exceed the next holder's; compare lock.tokens per server",
      );
    }
    let m = 0n;
    for (const per of h.tokens.values()) {
      const t = maxToken(per.values());
      if (t > m) m = t;
    }
    return m;
  }

  /** Every grant's token: resource → server name (`host:port`) → token. */
  get tokens(): ReadonlyMap<string, ReadonlyMap<string, bigint>> {
    return holds.get(this)?.tokens ?? new Map<string, ReadonlyMap<string, bigint>>();
  }

  /** Set once the lock is known lost (by the watcher, an extension, a release, or its validity running out). */
  get lost(): LockLostError | null {
    const h = holds.get(this);
    if (!h) return null;
    h.lease.loss(performance.now());
    return h.lost;
  }

  /** How many ms the lock is certainly held for (0 once lost or released). */
  validity(): number {
    const h = holds.get(this);
    if (!h) return Math.max(0, this.expiration - Date.now());
    return Math.floor(h.lease.validity(performance.now()));
  }

  /** Releases the lock on every server (as `redlock.release(this)`). */
  async release(): Promise<ExecutionResult> {
    return this.redlock.release(this);
  }

  /** Extends the lock to `duration` ms from now (as `redlock.extend(this, duration)`): resolves to a new `Lock`. */
  async extend(duration: number): Promise<Lock> {
    return this.redlock.extend(this, duration);
  }
}
