/**
 * The module's commands, built and checked before anything is sent, and what each reply means:
 * one typed {@link Outcome} per server and request. Pure: no I/O, no clock.
 * @internal
 */
import {
  CapacityMismatchError,
  DeadlockError,
  ExecutionError,
  InvalidRequestError,
  MaxWaitersError,
  ModuleMissingError,
  NotOwnerError,
  RefusedError,
  ResourceLockedError,
  TokenPrecisionError,
  WrongKindError,
  type ExecutionStats,
} from "../errors.js";
import { ServerReplyError, UnsafeIntegerReplyError, type Reply } from "./reply.js";
import { describe, exactInteger, tokenFrom } from "./token.js";

/** The largest ttl, wait and lock-delay the module accepts: 2^47 ms. */
export const MAX_MS = 2 ** 47;
/** The largest semaphore capacity: 2^31 - 1. */
export const MAX_CAPACITY = 2 ** 31 - 1;
/** The longest owner, in bytes. */
export const MAX_OWNER_BYTES = 1024;
/** redlock v5's message for a duration that is not an integer. */
export const DURATION_MESSAGE = "Duration must be an integer value in milliseconds.";

/** What a lock holds: exclusive, shared, or one semaphore permit. */
export type Kind = "write" | "read" | "semaphore";

/** What to acquire on each resource. */
export interface AcquireSpec {
  readonly kind: Kind;
  /** Lease in ms (1..2^47). */
  readonly ttl: number;
  /** Semaphore capacity (semaphore only). */
  readonly capacity?: number;
  /** BIND: the hold ends with the connection that took it. */
  readonly bind?: boolean;
  /** LOCKDELAY ms (write only; 0 = none). */
  readonly lockDelay?: number;
}

/** Checks a ttl / duration as the server would (and redlock's integer rule). */
export function checkTtl(ttl: number, what = "duration"): void {
  if (typeof ttl !== "number" || Math.floor(ttl) !== ttl) throw new InvalidRequestError(DURATION_MESSAGE);
  if (ttl < 1 || ttl > MAX_MS) throw new InvalidRequestError(`the ${what} ${ttl} ms is not between 1 and 2^47 ms`);
}

/** Checks an owner: 1 to 1024 bytes. */
export function checkOwner(owner: string): void {
  const n = Buffer.byteLength(owner, "utf8");
  if (n < 1 || n > MAX_OWNER_BYTES) throw new InvalidRequestError(`an owner is 1 to ${MAX_OWNER_BYTES} bytes, not ${n}`);
}

/** Checks a wait in ms: 0..2^47, or Infinity for no limit. */
export function checkWait(wait: number): void {
  if (typeof wait !== "number" || Number.isNaN(wait) || wait < 0) throw new InvalidRequestError(`a wait is 0 or more ms, not ${wait}`);
  if (wait !== Infinity && wait > MAX_MS) throw new InvalidRequestError(`the wait ${wait} ms is over 2^47 ms (use Infinity for no limit)`);
}

/** Refuses, before anything is sent, what the server would refuse. */
export function checkSpec(spec: AcquireSpec): void {
  checkTtl(spec.ttl);
  if (spec.kind === "semaphore") {
    const c = spec.capacity;
    if (typeof c !== "number" || !Number.isInteger(c) || c < 1 || c > MAX_CAPACITY) {
      throw new InvalidRequestError(`a semaphore capacity is an integer between 1 and ${MAX_CAPACITY}, not ${String(c)}`);
    }
  } else if (spec.capacity !== undefined) {
    throw new InvalidRequestError("a capacity applies to semaphores only");
  }
  if (spec.lockDelay !== undefined && spec.lockDelay !== 0) {
    if (spec.kind !== "write") throw new InvalidRequestError(`lockDelay applies to write locks only, not to ${spec.kind === "read" ? "read locks" : "semaphore permits"}`);
    const d = spec.lockDelay;
    if (typeof d !== "number" || Number.isNaN(d) || d < 0 || Math.ceil(d) > MAX_MS) throw new InvalidRequestError(`lockDelay ${d} ms is not between 0 and 2^47 ms`);
  }
}

/** The WAIT argument for a wait of `ms` (Infinity: no limit, WAIT 0), rounded up to whole ms. */
export function waitArg(ms: number): string {
  if (ms === Infinity) return "0";
  return String(Math.min(MAX_MS, Math.max(1, Math.ceil(ms))));
}

/**
 * `LOCK.ACQUIRE` / `LOCK.RWREAD` / `LOCK.SEMACQUIRE` for `key` under `owner`; `wait` in ms adds
 * `WAIT` (undefined or 0: no wait; Infinity: WAIT 0, no limit).
 */
export function acquireArgs(key: string, owner: string, spec: AcquireSpec, wait?: number): string[] {
  const ttl = String(spec.ttl);
  const args =
    spec.kind === "write"
      ? ["LOCK.ACQUIRE", key, owner, ttl]
      : spec.kind === "read"
        ? ["LOCK.RWREAD", key, owner, ttl]
        : ["LOCK.SEMACQUIRE", key, owner, String(spec.capacity), ttl];
  if (wait !== undefined && wait > 0) args.push("WAIT", waitArg(wait));
  if (spec.bind) args.push("BIND");
  if (spec.kind === "write" && spec.lockDelay) args.push("LOCKDELAY", String(Math.ceil(spec.lockDelay)));
  return args;
}

/** `LOCK.RELEASE key owner [ALL]`. */
export function releaseArgs(key: string, owner: string, all = true): string[] {
  return all ? ["LOCK.RELEASE", key, owner, "ALL"] : ["LOCK.RELEASE", key, owner];
}

/** `LOCK.EXTEND key owner ttl`. */
export function extendArgs(key: string, owner: string, ttl: number): string[] {
  return ["LOCK.EXTEND", key, owner, String(ttl)];
}

/** `LOCK.INFO key OWNER owner`: that owner's entry alone (module 0.4.0+, O(1) on the server
 *  whatever the number of holders), how the client checks its own holds. */
export function ownerInfoArgs(key: string, owner: string): string[] {
  return ["LOCK.INFO", key, "OWNER", owner];
}

/** Whether an error reply to {@link ownerInfoArgs} is a module older than 0.4.0 refusing the
 *  option ("wrong number of arguments for 'lock.info' command"): that server then gets the
 *  plain form. */
export function ownerFormRefused(e: unknown): boolean {
  return e instanceof ServerReplyError && e.message.toLowerCase().includes("wrong number of arg");
}

/** `LOCK.INFO key`. */
export function infoArgs(key: string): string[] {
  return ["LOCK.INFO", key];
}

/** Why a server refused a request. */
export type Refusal = "module-missing" | "deadlock" | "wrongkind" | "capacity" | "maxwaiters" | "notowner" | "wrongtype" | "precision" | "other";

/** What one server answered to one request. */
export type Outcome =
  /** Granted (acquire: the token), or done (release: remaining count, extend: 1). */
  | { readonly kind: "granted"; readonly token: bigint }
  /** Held by someone else (nil). */
  | { readonly kind: "busy" }
  /** An error reply. */
  | { readonly kind: "refused"; readonly refusal: Refusal; readonly text: string }
  /** MOVED / ASK / TRYAGAIN / CLUSTERDOWN: ask again where the key lives now. */
  | { readonly kind: "redirect"; readonly text: string }
  /** No answer (connection lost, no reply in time): the request's fate is unknown. */
  | { readonly kind: "unreachable"; readonly text: string; readonly error: Error };

const REDIRECTS = new Set(["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"]);

/** The kind of an error reply's text. */
export function refusalOf(text: string): Refusal {
  const trimmed = text.trimStart().replace(/^-/, "");
  const code = trimmed.split(/[ :]/, 1)[0] ?? "";
  const lower = trimmed.toLowerCase();
  if (lower.includes("unknown command") && lower.includes("lock.")) return "module-missing";
  switch (code) {
    case "NOTOWNER":
      return "notowner";
    case "DEADLOCK":
      return "deadlock";
    case "WRONGKIND":
      return "wrongkind";
    case "MAXWAITERS":
      return "maxwaiters";
    case "WRONGTYPE":
      return "wrongtype";
  }
  if (lower.includes("another capacity")) return "capacity";
  return "other";
}

/** The outcome of an error: a server's error reply, or a failure to reach it. */
export function errorOutcome(e: unknown): Outcome {
  // A reply the client library could read only as a rounded number (node-redis v4 above
  // 2^53 - 1): the server answered, but what it said cannot be used. Never rounded.
  if (e instanceof UnsafeIntegerReplyError) return { kind: "refused", refusal: "precision", text: e.message };
  if (e instanceof ServerReplyError) {
    if (REDIRECTS.has(e.code)) return { kind: "redirect", text: e.message };
    return { kind: "refused", refusal: refusalOf(e.message), text: e.message };
  }
  const error = e instanceof Error ? e : new Error(String(e));
  return { kind: "unreachable", text: error.message, error };
}

/** What an acquire's reply (or its error) means. */
export function acquireOutcome(r: Reply | Error): Outcome {
  if (r instanceof Error) return errorOutcome(r);
  if (r === null) return { kind: "busy" };
  try {
    return { kind: "granted", token: tokenFrom(r) };
  } catch (e) {
    return { kind: "refused", refusal: "other", text: `unexpected reply to an acquire: ${describe(r)} (${(e as Error).message})` };
  }
}

/** What a release's or extend's reply means: granted(count) when done. */
export function doneOutcome(r: Reply | Error): Outcome {
  if (r instanceof Error) return errorOutcome(r);
  try {
    return { kind: "granted", token: exactInteger(r, "count") };
  } catch {
    return { kind: "refused", refusal: "other", text: `unexpected reply ${describe(r)}` };
  }
}

/** One server's vote on a multi-resource request (the resources in order on that server). */
export type Vote =
  | { readonly kind: "for"; readonly tokens: readonly bigint[] }
  | { readonly kind: "against"; readonly outcome: Outcome; readonly granted: number };

/**
 * A server's vote from its per-resource outcomes (in the resources' order; `undefined` for a
 * resource not asked because an earlier one failed): for, when every resource was granted.
 */
export function vote(outcomes: readonly (Outcome | undefined)[], resources: number): Vote {
  const tokens: bigint[] = [];
  let against: Outcome | undefined;
  for (let i = 0; i < resources; i++) {
    const o = outcomes[i];
    if (o && o.kind === "granted") tokens.push(o.token);
    else {
      // The most telling answer: an error or a lost connection over a plain "busy".
      if (!against || (against.kind === "busy" && o && o.kind !== "busy")) against = o ?? against;
    }
  }
  if (tokens.length === resources) return { kind: "for", tokens };
  return { kind: "against", outcome: against ?? { kind: "busy" }, granted: tokens.length };
}

/** The error that stands for one server's vote against (what `votesAgainst` holds). */
export function voteError(v: Vote & { kind: "against" }, resources: number): Error {
  const o = v.outcome;
  switch (o.kind) {
    case "busy":
    case "granted":
      return new ResourceLockedError(`The operation was applied to: ${v.granted} of the ${resources} requested resources.`);
    case "unreachable":
      return o.error;
    case "redirect":
      return new RefusedError(o.text);
    case "refused":
      return refusalError(o.refusal, o.text, []);
  }
}

/** The typed error for a refusal. */
export function refusalError(refusal: Refusal, text: string, attempts: ReadonlyArray<Promise<ExecutionStats>>): ExecutionError {
  switch (refusal) {
    case "module-missing":
      return new ModuleMissingError(`The server does not have the lock module loaded (load it with loadmodule /path/to/libredis_lock.so): ${text}`, attempts);
    case "deadlock":
      return new DeadlockError(text, attempts);
    case "wrongkind":
      return new WrongKindError(text, attempts);
    case "capacity":
      return new CapacityMismatchError(text, attempts);
    case "maxwaiters":
      return new MaxWaitersError(text, attempts);
    case "notowner":
      return new NotOwnerError(text, attempts);
    case "precision":
      return new TokenPrecisionError(text, attempts);
    case "wrongtype":
    case "other":
      return new RefusedError(text, attempts);
  }
}

const PRECEDENCE: Refusal[] = ["module-missing", "precision", "deadlock", "wrongkind", "capacity", "maxwaiters", "notowner", "wrongtype", "other"];

/** Why a round failed, from every server's outcome and the quorum. */
export type Failure =
  | { readonly kind: "held" }
  /** A majority granted, but the lock's validity was spent by the time it had. */
  | { readonly kind: "expired" }
  | { readonly kind: "unreachable"; readonly servers: readonly number[] }
  | { readonly kind: "refused"; readonly refusal: Refusal; readonly text: string };

/**
 * Names a failed round: too few servers answered → unreachable; else the most specific refusal
 * any server gave (module missing, deadlock, wrong kind, capacity, max waiters, not owner,
 * other); else held.
 */
export function classify(outcomes: readonly Outcome[], quorum: number): Failure {
  const unreachable: number[] = [];
  outcomes.forEach((o, i) => {
    if (o.kind === "unreachable") unreachable.push(i);
  });
  if (outcomes.length - unreachable.length < quorum) return { kind: "unreachable", servers: unreachable };
  let best: { refusal: Refusal; text: string } | undefined;
  for (const o of outcomes) {
    if (o.kind === "redirect") {
      // Still redirected after the one re-route: the cluster is moving the key.
      if (!best) best = { refusal: "other", text: o.text };
      continue;
    }
    if (o.kind !== "refused") continue;
    if (!best || PRECEDENCE.indexOf(o.refusal) < PRECEDENCE.indexOf(best.refusal)) best = { refusal: o.refusal, text: o.text };
  }
  if (best) return { kind: "refused", ...best };
  return { kind: "held" };
}

/** True when trying again unchanged gets the same answer (a refusal; MAXWAITERS excepted). */
export function isFinal(f: Failure): boolean {
  return f.kind === "refused" && f.refusal !== "maxwaiters";
}

/** redlock v5's message for a failed quorum. */
export const QUORUM_MESSAGE = "The operation was unable to achieve a quorum during its retry window.";

/** The error a failed operation rejects with. `names` are the servers' names, in order. */
export function failureError(
  f: Failure,
  attempts: ReadonlyArray<Promise<ExecutionStats>>,
  names: readonly string[],
  why: readonly Outcome[] = [],
): ExecutionError {
  switch (f.kind) {
    case "held":
      return new ExecutionError(QUORUM_MESSAGE, attempts);
    case "expired":
      return new ExecutionError(`${QUORUM_MESSAGE} A majority granted the lock, but its validity was spent by then (the servers were too slow for the duration).`, attempts);
    case "unreachable": {
      const list = f.servers.map((i) => {
        const o = why[i];
        return `${names[i] ?? `#${i}`}${o && o.kind === "unreachable" ? ` (${o.text})` : ""}`;
      });
      return new ExecutionError(`${QUORUM_MESSAGE} The quorum could not be reached: ${f.servers.length} of ${names.length} servers did not answer: ${list.join(", ")}.`, attempts);
    }
    case "refused":
      return refusalError(f.refusal, f.text, attempts);
  }
}
