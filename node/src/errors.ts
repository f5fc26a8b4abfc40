/**
 * The package's error classes. `ResourceLockedError` and `ExecutionError` keep redlock v5's
 * names, constructors and messages; every other failure of an operation on the lock extends
 * `ExecutionError`, so code written for redlock (`catch (e) { if (e instanceof ExecutionError) … }`)
 * still catches it.
 * @packageDocumentation
 */

import { sentence } from "./core/reply.js";
import type { RedisClientLike } from "./settings.js";

/** What one server (one of the user's clients) answered in one round of an operation. */
export type ExecutionStats = {
  /** How many servers (clients) the Redlock has. */
  readonly membershipSize: number;
  /** How many must agree: `floor(membershipSize / 2) + 1`. */
  readonly quorumSize: number;
  /** The clients whose server did what was asked (granted, extended, released). */
  readonly votesFor: Set<RedisClientLike>;
  /** The clients whose server did not, with the reason (a `ResourceLockedError` when the lock was held). */
  readonly votesAgainst: Map<RedisClientLike, Error>;
};

/**
 * The lock is held by someone else on a server (redlock v5's error, found in
 * `ExecutionStats.votesAgainst`): message `The operation was applied to: N of the M requested resources.`
 */
export class ResourceLockedError extends Error {
  /** The message, as redlock words it. */
  override readonly message: string;
  constructor(message: string) {
    super(message);
    this.message = message;
    this.name = "ResourceLockedError";
  }
}

/**
 * An operation could not reach a quorum (redlock v5's error). `attempts` holds one promise of
 * {@link ExecutionStats} per round (resolved once every server of the round answered).
 */
export class ExecutionError extends Error {
  /** The message. */
  override readonly message: string;
  /** One promise of stats per round of the operation. */
  readonly attempts: ReadonlyArray<Promise<ExecutionStats>>;
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>>) {
    super(sentence(message));
    this.message = sentence(message); // redlock's own messages are sentences already: unchanged
    this.attempts = attempts;
    this.name = "ExecutionError";
  }
}

/** How a held lock ended without its release. */
export type LossCause = "expired" | "deleted" | "overwritten" | "taken" | "ended" | "connection-closed";

/** A few words for a loss cause. */
export function describeLoss(cause: LossCause): string {
  switch (cause) {
    case "expired":
      return "its validity ran out without a confirmed extension";
    case "deleted":
      return "its key was deleted (DEL, FLUSHALL, eviction or expiry)";
    case "overwritten":
      return "its key was overwritten with another type";
    case "taken":
      return "another owner holds it now";
    case "ended":
      return "the server ended the hold";
    case "connection-closed":
      return "its bound connection closed";
  }
}

/**
 * The lock was lost before (or found lost by) this operation: what ran after the loss did not
 * run under the lock. `cause` says how, `noticedAt` when this process noticed (`Date.now()`).
 */
export class LockLostError extends ExecutionError {
  /** How the lock was lost. */
  override readonly cause: LossCause;
  /** The resource whose loss was noticed first. */
  readonly resource: string;
  /** When the loss was noticed (`Date.now()` milliseconds). */
  readonly noticedAt: number;
  /** What the server said, when a server said something. */
  readonly detail: string;
  constructor(resource: string, cause: LossCause, detail = "", attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(`The lock on ${JSON.stringify(resource)} was lost: ${describeLoss(cause)}${detail ? ` (${detail})` : ""}.`, attempts);
    this.cause = cause;
    this.resource = resource;
    this.noticedAt = Date.now();
    this.detail = detail;
    this.name = "LockLostError";
  }
}

/**
 * The server refused the request because it would deadlock (`-DEADLOCK`): a write request of an
 * owner that reads the key, or a wait that would close a cycle of waiting owners. Not retried.
 */
export class DeadlockError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "DeadlockError";
  }
}

/** The key is the other kind (`-WRONGKIND`): a permit asked of a lock key, or a lock of a semaphore key. Not retried. */
export class WrongKindError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "WrongKindError";
  }
}

/** The semaphore key exists with another capacity than the one asked for. Not retried. */
export class CapacityMismatchError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "CapacityMismatchError";
  }
}

/** The server's wait queue for the key (or its waiter limit) is full (`-MAXWAITERS`). */
export class MaxWaitersError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "MaxWaitersError";
  }
}

/**
 * The server refused the request with another error: `WRONGTYPE` (the key holds another Redis
 * type), an ACL refusal, an unexpected reply. Not retried.
 */
export class RefusedError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "RefusedError";
  }
}

/** The server has no lock module (`unknown command 'LOCK.…'`): load it with `loadmodule /path/to/libredis_lock.so`. */
export class ModuleMissingError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "ModuleMissingError";
  }
}

/** The owner does not hold the lock there (`-NOTOWNER`): released, expired, deleted. */
export class NotOwnerError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "NotOwnerError";
  }
}

/**
 * A reply read as a JavaScript number that is not a safe integer (it may have been rounded):
 * the package never rounds a fencing token.
 */
export class TokenPrecisionError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "TokenPrecisionError";
  }
}

/**
 * Every wait connection of a server (`maxWaitConnections`) stayed busy until the request's wait
 * ran out.
 */
export class ConnectionLimitError extends ExecutionError {
  constructor(message: string, attempts: ReadonlyArray<Promise<ExecutionStats>> = []) {
    super(message, attempts);
    this.name = "ConnectionLimitError";
  }
}

/** A request refused before anything was sent (bad duration, owner, capacity, option). */
export class InvalidRequestError extends Error {
  constructor(message: string) {
    super(sentence(message));
    this.name = "InvalidRequestError";
  }
}
