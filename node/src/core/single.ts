/**
 * The acquire on one server as a state machine: each resource in the global order, with the
 * server-side wait that is left (`WAIT`, on a wait connection) or none; the lock's validity from
 * the earliest of its grants; given back everywhere when any resource is not granted, or when the
 * validity is already spent. Sends nothing, reads no clock.
 * @internal
 */
import { acquireArgs, classify, vote, type AcquireSpec, type Failure, type Outcome, type Vote } from "./protocol.js";
import { singleServerValidUntil } from "./lease.js";
import { waitLeft } from "./order.js";

/** What the face does next. */
export type OneStep =
  /**
   * Send `args` for `key`: with `wait` (ms, Infinity: no limit) on a wait connection, rebuilt
   * with `build(waitLeft)` once a connection is free; without, as a short command. Then call
   * {@link OneServerAttempt.replied}.
   */
  | { readonly kind: "send"; readonly key: string; readonly args: string[]; readonly wait: number | undefined; readonly build: (wait: number) => string[] }
  /** Every resource granted in time: tokens in the resources' order. */
  | { readonly kind: "granted"; readonly tokens: readonly bigint[]; readonly validUntil: number; readonly vote: Vote }
  /** Failed: give back `giveBack` (keys that were granted), then reject with the failure. */
  | { readonly kind: "failed"; readonly failure: Failure; readonly outcome: Outcome | undefined; readonly giveBack: readonly string[]; readonly vote: Vote };

/** One acquire on one server. */
export class OneServerAttempt {
  private i = 0;
  private sent = 0;
  private waited = false;
  private validUntil = Infinity;
  private readonly outcomes: Outcome[] = [];
  private readonly granted: string[] = [];

  constructor(
    private readonly resources: readonly string[],
    private readonly spec: AcquireSpec,
    private readonly owner: string,
    /** ms; undefined or 0: no wait; Infinity: no limit. */
    private readonly wait: number | undefined,
    private readonly started: number,
  ) {}

  /** When the last request was sent (its validity counts from then, or is checked). */
  get lastSent(): number {
    return this.sent;
  }

  /** The first step. */
  start(now: number): OneStep {
    return this.next(now);
  }

  private next(now: number): OneStep {
    const key = this.resources[this.i] as string;
    const left = waitLeft(this.wait, this.started, now);
    this.sent = now;
    this.waited = left !== undefined;
    return {
      kind: "send",
      key,
      args: acquireArgs(key, this.owner, this.spec, left),
      wait: left,
      build: (w: number) => acquireArgs(key, this.owner, this.spec, w),
    };
  }

  /** The outcome of the last send, at `now`. */
  replied(outcome: Outcome, now: number): OneStep {
    this.outcomes.push(outcome);
    const key = this.resources[this.i] as string;
    if (outcome.kind === "granted") {
      this.granted.push(key);
      this.validUntil = Math.min(this.validUntil, singleServerValidUntil(this.sent, this.waited, this.spec.ttl, now));
      this.i++;
      if (this.i < this.resources.length) return this.next(now);
    }
    const v = vote(this.outcomes, this.resources.length);
    if (v.kind === "for") {
      if (this.validUntil > now) return { kind: "granted", tokens: v.tokens, validUntil: this.validUntil, vote: v };
      // Never reported acquired when its validity is already spent.
      return { kind: "failed", failure: { kind: "expired" }, outcome: undefined, giveBack: [...this.granted], vote: v };
    }
    // A request whose answer never came (a deadline, a dropped connection) or could not be read
    // exactly may still have been granted: it is given back too.
    const mayHold = outcome.kind === "unreachable" || (outcome.kind === "refused" && outcome.refusal === "precision");
    const giveBack = mayHold ? [...this.granted, key] : [...this.granted];
    return { kind: "failed", failure: classify([v.outcome], 1), outcome: v.outcome, giveBack, vote: v };
  }
}
