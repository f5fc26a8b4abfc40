/**
 * redis-lock-client: fair, fenced distributed locks for Node.js on the redis-lock Redis module —
 * a drop-in for redlock v5 (`import Redlock from "redis-lock-client"`), on ioredis and node-redis.
 * @packageDocumentation
 */
import Redlock from "./redlock.js";

export default Redlock;
export { Redlock, REDLOCK_NO_PERMITS, type RedlockAbortSignal, type RedlockUsingContext } from "./redlock.js";
export { Lock, type ExecutionResult, type LockMode } from "./lock.js";
export {
  ResourceLockedError,
  ExecutionError,
  LockLostError,
  DeadlockError,
  WrongKindError,
  CapacityMismatchError,
  MaxWaitersError,
  RefusedError,
  ModuleMissingError,
  NotOwnerError,
  TokenPrecisionError,
  ConnectionLimitError,
  InvalidRequestError,
  type ExecutionStats,
  type LossCause,
} from "./errors.js";
export {
  ConnectionLostError,
  ReplyTimeoutError,
  UnsafeIntegerReplyError,
  UnsupportedClientError,
} from "./core/reply.js";
export { defaultSettings, type Settings, type RedisClientLike } from "./settings.js";
export type { LockInfo, LockHolder } from "./core/info.js";
/** The package's version. */
export const VERSION = "0.1.0";
