/**
 * The Redlock acquire over several servers as a state machine: which commands go to which
 * servers, how long to sleep between rounds, and when a majority makes a lock. It sends nothing
 * and reads no clock: the face carries out each {@link Step} and hands back the outcomes and the
 * time (`performance.now()` ms). Port of the Rust client's `proto/redlock.rs`,
 * `WaitStrategy::Queue`, extended to several resources (all of them, in the global order, on
 * each server; a server votes for when it granted every one).
 *
 * The rounds: an attempt asks every server without waiting. Without a majority it releases
 * where it may hold (granted, or no answer), then — while the wait lasts — queues on one
 * designated server (the same for every waiter of the first resource) with the module's WAIT,
 * in slices of at most 1 s and a quarter of the ttl; when that server grants, the others are
 * asked without waiting, after pauses of 0, 1, 2, 4, 8 ms (the previous holder's releases may
 * still be on their way); without a majority it releases everywhere and backs off (20 ms
 * growing to 1 s, jittered).
 * @internal
 */
import { acquireArgs, classify, isFinal, releaseArgs, vote, type AcquireSpec, type Failure, type Outcome, type Vote } from "./protocol.js";
import { quorumOf, quorumValidUntil } from "./lease.js";

/** The longest server-side wait of one queue slice, in ms. */
export const QUEUE_SLICE = 1000;
/** After the designated server granted: the pauses (ms) before each ask of the others. */
export const OTHERS_PAUSES: readonly number[] = [0, 1, 2, 4, 8];
/** The first back-off after a queue round without a majority, in ms. */
export const BACKOFF_FLOOR = 20;
/** The random pause after a designated server that did not answer: [1, 20) ms. */
export const POLL_DELAY: readonly [number, number] = [1, 20];

/**
 * The server a waiter of `key` queues on: the same for every waiter of the key (one FIFO),
 * from the key's bytes (h = h * 31 + byte, 64-bit wrapping, as the Rust client), skipping
 * servers that did not answer the last attempt.
 */
export function designatedServer(key: string, answered: readonly boolean[], n: number): number {
  let h = 0n;
  for (const b of Buffer.from(key, "utf8")) h = (h * 31n + BigInt(b)) & 0xffff_ffff_ffff_ffffn;
  const m = Math.max(1, n);
  const home = Number(h % BigInt(m));
  for (let k = 0; k < m; k++) {
    const i = (home + k) % m;
    if (answered[i] ?? true) return i;
  }
  return home;
}

/** What one server is sent in a step: its commands, in order. */
export interface ServerCommands {
  readonly server: number;
  readonly commands: readonly string[][];
  /** The server-side wait of each command (queue slice): send on a wait connection, one after the other, stopping at the first that is not granted. */
  readonly wait?: number;
}

/** What a step sends. */
export type Sending = "attempt" | "queue" | "others" | "release";

/** What the face does next. */
export type Step =
  /** Send, then call {@link RedlockAttempts.replied} with one outcome list per server (by server index; servers not sent to: anything). */
  | { readonly kind: "send"; readonly what: Sending; readonly to: readonly ServerCommands[] }
  /** Sleep, then call {@link RedlockAttempts.woke}. */
  | { readonly kind: "sleep"; readonly ms: number }
  /** A majority granted: `tokens` by server index (one per resource, in order), under `owner`. */
  | { readonly kind: "granted"; readonly tokens: ReadonlyMap<number, readonly bigint[]>; readonly validUntil: number; readonly owner: string }
  /** The acquire failed; `outcomes` is what each server answered last. */
  | { readonly kind: "failed"; readonly failure: Failure; readonly outcomes: readonly Outcome[] };

/** The settings of one Redlock acquire. */
export interface RedlockRequest {
  /** The resources, in the global order. */
  readonly resources: readonly string[];
  readonly spec: AcquireSpec;
  readonly owner: string;
  /**
   * A bound request (`spec.bind`) takes a new owner per attempt from this (so a hold of an
   * earlier attempt, still bound to a connection given up on, is never re-entered), and polls
   * instead of queueing (a queued wait would bind the hold to the designated server's wait
   * connection alone).
   */
  readonly newOwner?: () => string;
  /** How many servers. */
  readonly n: number;
  /** How long to wait in ms: undefined or 0 = not at all, Infinity = no limit. */
  readonly wait: number | undefined;
  readonly driftFactor: number;
  /** A random number in [0, 1) (injectable for tests). */
  readonly random?: () => number;
}

type Phase =
  | { kind: "attempt"; sent: number }
  | { kind: "released"; failure: Failure; outcomes: Outcome[]; answered: boolean[] }
  | { kind: "queued"; designated: number; sent: number }
  | { kind: "queue-given-back"; next: "attempt" | "backoff" | "poll" }
  | { kind: "queue-given-back"; next: "fail"; failure: Failure; outcomes: Outcome[] }
  | { kind: "others"; sent: number; round: number; tokens: Map<number, bigint[]>; outcomes: Outcome[] }
  | { kind: "queue-released"; failure: Failure; outcomes: Outcome[] }
  | { kind: "backoff" }
  | { kind: "finished" };

/** True when a server may hold some resource after these outcomes (granted; no answer: it may
 *  grant late; or a grant whose token could not be read exactly). */
function mayHold(outcomes: readonly (Outcome | undefined)[] | undefined): boolean {
  return (outcomes ?? []).some(
    (o) => !!o && (o.kind === "granted" || o.kind === "unreachable" || (o.kind === "refused" && o.refusal === "precision")),
  );
}

/** The outcome standing for a server's vote. */
function voteOutcome(v: Vote): Outcome {
  return v.kind === "for" ? { kind: "granted", token: v.tokens[0] ?? 0n } : v.outcome;
}

/** One Redlock acquire, from its request to a grant or a failure. */
export class RedlockAttempts {
  readonly quorum: number;
  private readonly giveUp: number;
  private phase: Phase = { kind: "finished" };
  private backoff = 0;
  private attempts = 0;
  private readonly random: () => number;
  /** The votes of the last round that completed (an attempt, or a queue round), taken by {@link takeRound}. */
  private round: Vote[] | null = null;

  /** The owner of the attempt in progress. */
  owner: string;

  constructor(private readonly req: RedlockRequest, now: number) {
    this.owner = req.owner;
    this.quorum = quorumOf(req.n);
    const w = req.wait ?? 0;
    this.giveUp = w === Infinity ? Infinity : now + Math.max(0, w);
    this.random = req.random ?? Math.random;
  }

  /** The first step. */
  start(now: number): Step {
    return this.attempt(now);
  }

  /** The votes of a round that just completed (once), for ExecutionStats. */
  takeRound(): Vote[] | null {
    const r = this.round;
    this.round = null;
    return r;
  }

  private left(now: number): number {
    return Math.max(0, this.giveUp - now);
  }

  private acquire(wait?: number): string[][] {
    return this.req.resources.map((r) => acquireArgs(r, this.owner, this.req.spec, wait));
  }

  private release(): string[][] {
    return this.req.resources.map((r) => releaseArgs(r, this.owner, true));
  }

  private all(): number[] {
    return Array.from({ length: this.req.n }, (_, i) => i);
  }

  private attempt(now: number): Step {
    if (this.req.spec.bind && this.req.newOwner && this.attempts++ > 0) this.owner = this.req.newOwner();
    this.phase = { kind: "attempt", sent: now };
    return { kind: "send", what: "attempt", to: this.all().map((server) => ({ server, commands: this.acquire() })) };
  }

  private votes(replies: readonly (readonly (Outcome | undefined)[] | undefined)[], servers: readonly number[]): Map<number, Vote> {
    const m = new Map<number, Vote>();
    for (const s of servers) m.set(s, vote(replies[s] ?? [], this.req.resources.length));
    return m;
  }

  /** The outcomes of the last send, one list per server (by server index). */
  replied(replies: readonly (readonly (Outcome | undefined)[] | undefined)[], now: number): Step {
    const phase = this.phase;
    this.phase = { kind: "finished" };
    switch (phase.kind) {
      case "attempt":
        return this.attemptReplied(phase.sent, replies, now);
      case "released":
        return this.afterFailure(phase.failure, phase.outcomes, phase.answered, now);
      case "queued":
        return this.queueReplied(phase.designated, phase.sent, replies, now);
      case "queue-given-back":
        if (phase.next === "fail") return this.fail(phase.failure, phase.outcomes);
        if (phase.next === "attempt") return this.attempt(now);
        if (phase.next === "backoff") return this.backOff(BACKOFF_FLOOR, now);
        return this.poll(now);
      case "others": {
        const asked = this.all().filter((s) => !phase.tokens.has(s));
        const votes = this.votes(replies, asked);
        const outcomes = [...phase.outcomes];
        let refused = false;
        for (const [s, v] of votes) {
          outcomes[s] = voteOutcome(v);
          if (v.kind === "for") phase.tokens.set(s, [...v.tokens]);
          else if (v.outcome.kind === "refused") refused = true;
        }
        const done = phase.tokens.size >= this.quorum || refused || now >= this.giveUp || phase.round + 1 >= OTHERS_PAUSES.length;
        if (done) return this.queueFinished(phase.sent, phase.tokens, outcomes, now);
        return this.askOthers(phase.sent, phase.round + 1, phase.tokens, outcomes);
      }
      case "queue-released":
        if (isFinal(phase.failure)) return this.fail(phase.failure, phase.outcomes);
        return this.backOff(BACKOFF_FLOOR, now);
      case "backoff":
      case "finished":
        return this.attempt(now);
    }
  }

  /** After a sleep. */
  woke(now: number): Step {
    const phase = this.phase;
    this.phase = { kind: "finished" };
    if (phase.kind === "others") return this.sendOthers(phase.sent, phase.round, phase.tokens, phase.outcomes);
    return this.attempt(now);
  }

  private fail(failure: Failure, outcomes: readonly Outcome[]): Step {
    this.phase = { kind: "finished" };
    return { kind: "failed", failure, outcomes };
  }

  private attemptReplied(sent: number, replies: readonly (readonly (Outcome | undefined)[] | undefined)[], now: number): Step {
    const votes = this.votes(replies, this.all());
    const list = this.all().map((s) => votes.get(s) as Vote);
    this.round = list;
    const tokens = new Map<number, bigint[]>();
    list.forEach((v, s) => {
      if (v.kind === "for") tokens.set(s, [...v.tokens]);
    });
    const validUntil = quorumValidUntil(sent, this.req.spec.ttl, now, this.req.driftFactor);
    if (tokens.size >= this.quorum && validUntil !== null) {
      this.phase = { kind: "finished" };
      return { kind: "granted", tokens, validUntil, owner: this.owner };
    }
    const outcomes = list.map(voteOutcome);
    const answered = outcomes.map((o) => o.kind !== "unreachable");
    // Give back what we got, and whatever a slow server may still grant later.
    const to = this.all()
      .filter((server) => mayHold(replies[server]))
      .map((server) => ({ server, commands: this.release() }));
    const failure: Failure = tokens.size >= this.quorum ? { kind: "expired" } : classify(outcomes, this.quorum);
    if (to.length > 0) {
      this.phase = { kind: "released", failure, outcomes, answered };
      return { kind: "send", what: "release", to };
    }
    return this.afterFailure(failure, outcomes, answered, now);
  }

  private afterFailure(failure: Failure, outcomes: readonly Outcome[], answered: readonly boolean[], now: number): Step {
    if (now >= this.giveUp || isFinal(failure)) return this.fail(failure, outcomes);
    if (this.req.spec.bind) return this.poll(now);
    return this.queue(answered, now, failure, outcomes);
  }

  private queue(answered: readonly boolean[], now: number, failure: Failure, outcomes: readonly Outcome[]): Step {
    const designated = designatedServer(this.req.resources[0] ?? "", answered, this.req.n);
    const slice = Math.floor(Math.min(this.left(now), QUEUE_SLICE, this.req.spec.ttl / 4));
    if (slice < 1) {
      if (this.left(now) < 1) return this.fail(failure, outcomes);
      return this.attempt(now);
    }
    // The grant may come at any moment of the slice and the lease starts then: the validity
    // counts from the slice's start, the earliest moment it can have started.
    this.phase = { kind: "queued", designated, sent: now };
    return { kind: "send", what: "queue", to: [{ server: designated, commands: this.acquire(slice), wait: slice }] };
  }

  private queueReplied(designated: number, sent: number, replies: readonly (readonly (Outcome | undefined)[] | undefined)[], now: number): Step {
    const v = vote(replies[designated] ?? [], this.req.resources.length);
    if (v.kind === "for") {
      const tokens = new Map<number, bigint[]>([[designated, [...v.tokens]]]);
      const outcomes: Outcome[] = this.all().map(() => ({ kind: "busy" }));
      outcomes[designated] = voteOutcome(v);
      return this.askOthers(sent, 0, tokens, outcomes);
    }
    const o = v.outcome;
    if (o.kind === "refused" && o.refusal !== "maxwaiters") {
      // Typed as the server said it, whatever the quorum.
      const outcomes: Outcome[] = this.all().map(() => ({ kind: "busy" }));
      outcomes[designated] = o;
      this.round = this.all().map((s) => (s === designated ? v : { kind: "against", outcome: { kind: "busy" }, granted: 0 }));
      const failure = classify([o], 1);
      if (mayHold(replies[designated])) {
        this.phase = { kind: "queue-given-back", next: "fail", failure, outcomes };
        return { kind: "send", what: "release", to: [{ server: designated, commands: this.release() }] };
      }
      return this.fail(failure, outcomes);
    }
    const after: "attempt" | "backoff" | "poll" = o.kind === "busy" ? "attempt" : o.kind === "refused" ? "backoff" : "poll";
    if (mayHold(replies[designated])) {
      // Part of the resources was granted (or the server may grant late): give it back first.
      this.phase = { kind: "queue-given-back", next: after };
      return { kind: "send", what: "release", to: [{ server: designated, commands: this.release() }] };
    }
    if (after === "attempt") return this.attempt(now);
    if (after === "backoff") return this.backOff(BACKOFF_FLOOR, now);
    return this.poll(now);
  }

  private poll(now: number): Step {
    const [lo, hi] = POLL_DELAY;
    this.phase = { kind: "backoff" };
    return { kind: "sleep", ms: Math.min(lo + this.random() * (hi - lo), this.left(now)) };
  }

  private backOff(floor: number, now: number): Step {
    this.backoff = Math.min(QUEUE_SLICE, Math.max(floor, this.backoff * 2));
    const delay = this.backoff / 2 + this.random() * (this.backoff / 2);
    this.phase = { kind: "backoff" };
    return { kind: "sleep", ms: Math.min(delay, this.left(now)) };
  }

  private askOthers(sent: number, round: number, tokens: Map<number, bigint[]>, outcomes: Outcome[]): Step {
    const pause = OTHERS_PAUSES[round] ?? 0;
    if (pause > 0) {
      this.phase = { kind: "others", sent, round, tokens, outcomes };
      return { kind: "sleep", ms: pause };
    }
    return this.sendOthers(sent, round, tokens, outcomes);
  }

  private sendOthers(sent: number, round: number, tokens: Map<number, bigint[]>, outcomes: Outcome[]): Step {
    this.phase = { kind: "others", sent, round, tokens, outcomes };
    const to = this.all()
      .filter((s) => !tokens.has(s))
      .map((server) => ({ server, commands: this.acquire() }));
    return { kind: "send", what: "others", to };
  }

  private queueFinished(sent: number, tokens: Map<number, bigint[]>, outcomes: Outcome[], now: number): Step {
    this.round = this.all().map((s): Vote => {
      const t = tokens.get(s);
      if (t) return { kind: "for", tokens: t };
      const o = outcomes[s] ?? { kind: "busy" };
      return { kind: "against", outcome: o, granted: 0 };
    });
    if (tokens.size >= this.quorum) {
      const validUntil = quorumValidUntil(sent, this.req.spec.ttl, now, this.req.driftFactor);
      if (validUntil !== null) {
        this.phase = { kind: "finished" };
        return { kind: "granted", tokens, validUntil, owner: this.owner };
      }
    }
    const failure: Failure = tokens.size >= this.quorum ? { kind: "expired" } : classify(outcomes, this.quorum);
    this.phase = { kind: "queue-released", failure, outcomes };
    return { kind: "send", what: "release", to: this.all().map((server) => ({ server, commands: this.release() })) };
  }
}
