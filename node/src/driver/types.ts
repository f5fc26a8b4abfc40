/**
 * The driver layer: how the package talks to Redis through the client a user already has
 * (ioredis `Redis`, ioredis `Cluster`, node-redis v4, v5 or v6), duck-typed, with no runtime
 * dependency on any of them. Every connection used here is the package's own, made with the
 * user's client's `duplicate()` (so host, port, TLS, auth and db are the user's).
 * @packageDocumentation
 */

export {
  ConnectionLostError,
  ReplyTimeoutError,
  ServerReplyError,
  UnsafeIntegerReplyError,
  UnsupportedClientError,
  isRedirect,
  type Arg,
  type Reply,
} from "../core/reply.js";
import type { Arg, Reply, ServerReplyError } from "../core/reply.js";

/** One connection of the package's own to one server. */
export interface Conn {
  /** host:port of the server. */
  readonly server: string;
  /** Sends one command; rejects with ServerReplyError (error reply), ConnectionLostError
   *  (connection closed before the reply) or ReplyTimeoutError (no reply within `deadlineMs`:
   *  the connection is left as it is; a caller that must not read a late reply destroys it). */
  send(args: Arg[], deadlineMs?: number): Promise<Reply>;
  /** Closes at once; pending sends reject with ConnectionLostError. */
  destroy(): void;
  readonly closed: boolean;
  /** Called once when the connection closes for any reason (including destroy); at once if it
   *  is closed already. */
  onClose(cb: (why: string) => void): void;
}

/** A connection subscribed to `__redis__:invalidate` (RESP2), for the watcher. (Added.) */
export interface SubscriberConn {
  /** The server's client id of this connection (the `REDIRECT` target). */
  readonly id: bigint;
  destroy(): void;
  readonly closed: boolean;
  onClose(cb: (why: string) => void): void;
}

/** One Redis server reached through a user's client. */
export interface Endpoint {
  /** "host:port". */
  readonly name: string;
  /** The shared command connection (opened on first use; re-opened after it closes). */
  command(): Promise<Conn>;
  /** The command connection if it is open now, else null (no connection is opened). (Added.) */
  currentCommand(): Conn | null;
  /** Called with each newly opened command connection, before command() hands it out (the
   *  watcher turns tracking on there). Returns a function that removes the hook. (Added.) */
  onCommandOpen(hook: (conn: Conn) => Promise<void>): () => void;
  /** A connection for one wait: from the idle pool or new; FIFO-gated by maxWaitConnections.
   *  Handed over in call order (per endpoint), at most one per turn of the event loop, so
   *  waits sent as soon as their connection is handed over reach the server's queue in call
   *  order; new connections still open in parallel, and a request that fails or is aborted
   *  holds up no later one. Rejects with the signal's reason (or an AbortError) when `signal`
   *  fires while queued for a place; with ReplyTimeoutError when it fires while connecting, or
   *  while the connection is ready and waits for an earlier request (it goes back unused). */
  acquireWaitConn(signal?: AbortSignal): Promise<Conn>;
  /** A finished wait's connection: kept idle (at most maxIdleConnections) or closed. Never call
   *  with a conn that carries a bound hold (keep it) or whose wait was cut short (destroy it
   *  instead). A destroyed or closed conn given here only frees its place. */
  releaseWaitConn(conn: Conn): void;
  /** Opens a subscriber connection calling `onInvalidate` with each invalidation's keys
   *  (null: a flush, every key). (Added.) */
  subscribeInvalidations(onInvalidate: (keys: string[] | null) => void): Promise<SubscriberConn>;
  /** Statistics of the wait pool (added): busy = handed out, idle = kept, queued = waiting for a place. */
  poolStats(): { busy: number; idle: number; queued: number };
  close(): Promise<void>;
}

/** What a user handed to new Redlock(...): one standalone server or an ioredis Cluster. */
export interface Target {
  readonly name: string;
  /** The endpoint serving `key` now (cluster: by slot, refreshed after MOVED / TRYAGAIN).
   *  Never takes longer than `deadlineMs` (the caller's time left; absent: no limit of the
   *  caller's) nor than CONNECT_DEADLINE_MS (2000 ms) in any case: an ioredis Cluster that has
   *  not connected yet is connected (its `connect()`) and its slots refreshed within that
   *  bound, else this rejects with ReplyTimeoutError naming the cluster. A standalone target
   *  answers at once. */
  endpointFor(key: string, deadlineMs?: number): Promise<Endpoint>;
  /** After a MOVED/ASK/TRYAGAIN/CLUSTERDOWN reply: refresh routing (a MOVED's new node is
   *  used at once). Bounded like {@link endpointFor}: by `deadlineMs` and by
   *  CONNECT_DEADLINE_MS; on expiry rejects with ReplyTimeoutError naming the cluster (what a
   *  MOVED said is kept). */
  rerouted(key: string, err: ServerReplyError, deadlineMs?: number): Promise<void>;
  readonly isCluster: boolean;
  /** The user's client object (reported in ExecutionStats votes, as redlock does). */
  readonly client: unknown;
  /** quit() the user's client (redlock's quit does this) after closing our connections. */
  quitUserClient(): Promise<void>;
  close(): Promise<void>;
}

/** Options of {@link targetFor}. */
export interface TargetOptions {
  /** At most this many wait connections busy at once per server (default 64). */
  maxWaitConnections?: number;
  /** At most this many idle wait connections kept per server (default 2). */
  maxIdleConnections?: number;
}
