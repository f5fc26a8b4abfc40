/**
 * What a lock knows about its hold, and what each answer to its extends and release means: the
 * one place that decides whether a lock is still held, lost (how), or released. Port of the
 * Rust client's `proto/lease.rs`. Time comes in as `performance.now()` milliseconds.
 * @internal
 */
import type { LossCause } from "../errors.js";
import type { LockInfo } from "./info.js";
import { holdCount } from "./info.js";
import type { Outcome } from "./protocol.js";

/** Clock drift allowance for a lease of `ttl` ms: `round(ttl * driftFactor) + 2` (as redlock). */
export function drift(ttl: number, driftFactor: number): number {
  return Math.round(ttl * driftFactor) + 2;
}

/** One server: the client's and the server's clocks still run separately. */
export const SINGLE_SERVER_MARGIN = 2;
/** Allowance for the transit of a waited grant's reply. */
export const WAITED_GRANT_MARGIN = 5;

/** How many of `n` servers make a majority (Redlock's quorum). */
export function quorumOf(n: number): number {
  return Math.floor(n / 2) + 1;
}

/** A waited grant may be counted from its request's sending when that costs at most this share
 *  of the ttl; a longer wait is counted from its reply and checked against the server. */
export const WAITED_UNCHECKED_SHARE = 0.05;

/**
 * Whether a grant that waited (request sent at `sent`, reply read at `now`) must be checked
 * against the server: its reply may have sat unread (a busy event loop), so counting from the
 * reply could overstate the lease; counting from the request is safe but loses the whole wait,
 * which is accepted only while the wait is short compared with the ttl.
 */
export function waitedGrantNeedsCheck(sent: number, ttl: number, now: number): boolean {
  return now - sent > ttl * WAITED_UNCHECKED_SHARE;
}

/**
 * The end of a single-server lease granted to a request sent at `sent`, answered at `now`. The
 * server granted after `sent`, so `sent + ttl` bounds the expiry from below. A grant that waited
 * long (see {@link waitedGrantNeedsCheck}) is counted from its reply's arrival less its transit
 * (a margin) instead, and the caller then checks it with {@link confirmedValidUntil}.
 */
export function singleServerValidUntil(sent: number, waited: boolean, ttl: number, now: number): number {
  const end = waited && waitedGrantNeedsCheck(sent, ttl, now) ? now + Math.max(0, ttl - WAITED_GRANT_MARGIN) : sent + ttl;
  return Math.max(now, end - SINGLE_SERVER_MARGIN);
}

/**
 * A one-server lease after a grant that waited, checked against the server: `LOCK.INFO` sent at
 * `infoSent` said the owner's hold has `holderTtl` ms left (null: the owner does not hold it).
 * The grant may have happened long before its reply was read (a busy event loop), so the
 * lease ends no later than what the server says, less the margin. Null when nothing is left.
 */
export function confirmedValidUntil(validUntil: number, infoSent: number, holderTtl: number | null, now: number): number | null {
  if (holderTtl === null) return null;
  const end = Math.min(validUntil, infoSent + holderTtl - SINGLE_SERVER_MARGIN);
  return end > now ? end : null;
}

/**
 * The end of a quorum lease whose requests were sent at `sent` (the earliest moment any of its
 * grants can have started), or null when it is already of no use at `now`.
 */
export function quorumValidUntil(sent: number, ttl: number, now: number, driftFactor: number): number | null {
  const validity = ttl - Math.max(0, now - sent) - drift(ttl, driftFactor);
  return validity > 0 ? now + validity : null;
}

/** How a loss reads from `LOCK.INFO` of the key, for `owner`: null while the owner still holds it. */
export function causeFromInfo(info: LockInfo | null, owner: string): LossCause | null {
  if (!info) return "deleted";
  if (holdCount(info, owner) > 0) return null;
  // A read of this owner's entry alone lists nobody else: `holdersCount` says whether others hold.
  return (info.holdersCount ?? info.holders.length) === 0 ? "ended" : "taken";
}

/** A loss, once recorded. */
export interface Loss {
  readonly cause: LossCause;
  readonly resource: string;
  readonly detail: string;
}

/** One server's answers to an extend or release (one outcome per resource, undefined: not sent). */
export type ServerAnswers = readonly (Outcome | undefined)[];

/** Counts what the servers answered to an extend or a release. */
export interface Tally {
  /** Servers that did it for every resource. */
  readonly ok: number;
  /** Servers that may still hold it: all but those that refused. */
  readonly holding: number;
  /** The first refusal: server, resource index, cause it points at, text. */
  readonly firstRefusal: { server: number; resource: number; cause: LossCause; text: string } | null;
}

/** The tally of per-server answers. */
export function tally(answers: readonly ServerAnswers[], resources: number): Tally {
  let ok = 0;
  let holding = 0;
  let firstRefusal: Tally["firstRefusal"] = null;
  answers.forEach((a, server) => {
    let all = true;
    let refused = false;
    for (let r = 0; r < resources; r++) {
      const o = a[r];
      if (!o || o.kind !== "granted") all = false;
      if (o && o.kind === "refused") {
        refused = true;
        if (!firstRefusal) firstRefusal = { server, resource: r, cause: o.refusal === "wrongtype" ? "overwritten" : "ended", text: o.text };
      }
    }
    if (all) ok++;
    if (!refused) holding++;
  });
  return { ok, holding, firstRefusal };
}

/** The answer to an extend or release once the lease read the servers' answers. */
export type Verdict =
  | { readonly kind: "ok"; readonly validUntil: number }
  | { readonly kind: "lost"; readonly loss: Loss }
  /** Read `LOCK.INFO` of `resource` on `server` and pass it to {@link Lease.diagnosed}. */
  | { readonly kind: "diagnose"; readonly server: number; readonly resource: number }
  /** Too few servers answered, the lock is not known lost. */
  | { readonly kind: "unreachable" };

/**
 * The state of one lock's hold. `validUntil` only moves forward while it has not passed (a new
 * ttl may shorten it); a loss, once recorded, is never cleared, except by a confirmed release
 * (the owner is the lock's own random value: a quorum release proves it held without a break).
 */
export class Lease {
  private lossRec: Loss | null = null;
  private releasedFlag = false;
  constructor(
    readonly resources: readonly string[],
    private ttlMs: number,
    readonly quorum: number,
    private until: number,
    readonly driftFactor: number,
  ) {}

  /** The ttl of the last grant or extend. */
  get ttl(): number {
    return this.ttlMs;
  }
  /** The end of the lease (performance.now() ms). */
  get validUntil(): number {
    return this.until;
  }
  /** True once released (successfully or not). */
  get released(): boolean {
    return this.releasedFlag;
  }

  /** The loss, if lost at `now` (recording an expiry when the validity ran out). */
  loss(now: number): Loss | null {
    if (!this.lossRec && !this.releasedFlag && now >= this.until) {
      this.lossRec = { cause: "expired", resource: this.resources[0] ?? "", detail: "" };
    }
    return this.lossRec;
  }

  /** The loss recorded so far, without looking at the time. */
  get recorded(): Loss | null {
    return this.lossRec;
  }

  /** How much longer the lock is certainly held, in ms (0 once lost or released). */
  validity(now: number): number {
    if (this.releasedFlag || this.loss(now)) return 0;
    return Math.max(0, this.until - now);
  }

  /** Records a loss a watcher found. True when it is the first (report it once). */
  lose(loss: Loss): boolean {
    if (this.lossRec || this.releasedFlag) return false;
    this.lossRec = loss;
    return true;
  }

  /** The answers to `LOCK.EXTEND … ttl` sent at `sent` (`closed`: a bound connection is closed). */
  extended(answers: readonly ServerAnswers[], closed: boolean, sent: number, ttl: number, now: number): Verdict {
    const t = tally(answers, this.resources.length);
    if (this.lossRec) return { kind: "lost", loss: this.lossRec };
    if (t.ok >= this.quorum) {
      if (now >= this.until) return this.record("expired", "");
      const v = ttl - Math.max(0, now - sent) - drift(ttl, this.driftFactor);
      if (v > 0) {
        // Same ttl: a later reply only moves the lease forward; a new ttl replaces it.
        this.until = ttl === this.ttlMs ? Math.max(this.until, now + v) : now + v;
        this.ttlMs = ttl;
        return { kind: "ok", validUntil: this.until };
      }
    }
    if (closed) return this.record("connection-closed", "");
    const few = this.tooFewHold(t);
    if (few) return few;
    if (now >= this.until) return this.record("expired", "");
    return { kind: "unreachable" };
  }

  /** The answers to the lock's `LOCK.RELEASE … ALL`. */
  releasedWith(answers: readonly ServerAnswers[], closed: boolean, now: number): Verdict {
    this.releasedFlag = true;
    const t = tally(answers, this.resources.length);
    if (t.ok >= this.quorum) {
      this.lossRec = null;
      return { kind: "ok", validUntil: now };
    }
    if (this.lossRec) return { kind: "lost", loss: this.lossRec };
    if (closed) return this.record("connection-closed", "", true);
    const few = this.tooFewHold(t, true);
    if (few) return few;
    if (now >= this.until) return this.record("expired", "", true);
    return { kind: "unreachable" };
  }

  /** After a "diagnose" verdict: what `LOCK.INFO` said (undefined when it could not be read). */
  diagnosed(info: LockInfo | null | undefined, owner: string, resource: number, text: string): Loss {
    const cause = (info !== undefined ? causeFromInfo(info, owner) : null) ?? "ended";
    const loss = { cause, resource: this.resources[resource] ?? "", detail: text };
    if (!this.lossRec) this.lossRec = loss;
    return this.lossRec;
  }

  private record(cause: LossCause, detail: string, force = false): Verdict {
    if (!this.lossRec || force) this.lossRec ??= { cause, resource: this.resources[0] ?? "", detail };
    return { kind: "lost", loss: this.lossRec };
  }

  private tooFewHold(t: Tally, _release = false): Verdict | null {
    if (t.holding >= this.quorum) return null;
    const r = t.firstRefusal;
    if (r && r.cause === "ended") return { kind: "diagnose", server: r.server, resource: r.resource };
    if (r) {
      this.lossRec ??= { cause: r.cause, resource: this.resources[r.resource] ?? "", detail: r.text };
      return { kind: "lost", loss: this.lossRec };
    }
    return this.record("ended", "");
  }
}
