/**
 * What every adapter shares: reply normalisation, deadlines, and the per-server endpoint with
 * its command connection and its FIFO-gated pool of wait connections.
 * @internal
 */
import {
  ConnectionLostError,
  ReplyTimeoutError,
  ServerReplyError,
  UnsafeIntegerReplyError,
  type Conn,
  type Endpoint,
  type Reply,
  type SubscriberConn,
  type Target,
  type TargetOptions,
} from "./types.js";

/** What an adapter provides for one server. */
export interface ConnFactory {
  readonly name: string;
  /** A new connection of the package's own (no reconnect, no offline queue, no resend). */
  open(kind: "command" | "wait", signal?: AbortSignal): Promise<Conn>;
  openSubscriber(onInvalidate: (keys: string[] | null) => void): Promise<SubscriberConn>;
}

/** The longest a new connection may take to connect and be ready (TCP, TLS, AUTH, the
 *  client's ready check, and for a subscriber its CLIENT ID and SUBSCRIBE). A paused server
 *  (SIGSTOP) accepts the TCP connection in its kernel and then never answers: without this
 *  bound an acquire would hang on it for ever. */
export const CONNECT_DEADLINE_MS = 2000;

/**
 * Runs `step` (the connecting of a new client of ours) within {@link CONNECT_DEADLINE_MS} and
 * until `signal` aborts; when either comes first, `abandon()` closes the half-made client and
 * the promise rejects (ReplyTimeoutError, or the signal's reason). A late success after that
 * is closed too, so no connection leaks.
 */
export function connectWithin<T>(server: string, step: () => Promise<T>, abandon: () => void, signal?: AbortSignal): Promise<T> {
  if (signal?.aborted) {
    abandon();
    return Promise.reject(abortReason(signal));
  }
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const finish = (): boolean => {
      if (settled) return false;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      return true;
    };
    const giveUp = (why: unknown): void => {
      if (!finish()) return;
      abandon();
      reject(why);
    };
    const onAbort = (): void => giveUp(signal ? abortReason(signal) : new Error("aborted"));
    const timer = setTimeout(
      () => giveUp(new ReplyTimeoutError(`could not connect to ${server} within ${CONNECT_DEADLINE_MS} ms (is it paused or overloaded?)`)),
      CONNECT_DEADLINE_MS,
    );
    timer.unref?.();
    signal?.addEventListener("abort", onAbort, { once: true });
    step().then(
      (v) => {
        if (finish()) resolve(v);
        else abandon();
      },
      (e: unknown) => {
        if (finish()) reject(e);
      },
    );
  });
}

/** Whether `err` (or a class it inherits from) has one of `names` as its constructor name. */
export function hasClassName(err: unknown, names: readonly string[]): boolean {
  let proto: unknown = err !== null && typeof err === "object" ? Object.getPrototypeOf(err) : null;
  while (proto !== null && proto !== undefined && proto !== Object.prototype) {
    const ctor = (proto as { constructor?: { name?: unknown } }).constructor;
    if (ctor && typeof ctor.name === "string" && names.includes(ctor.name)) return true;
    proto = Object.getPrototypeOf(proto);
  }
  return false;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Turns a client library's error into ours: error replies (recognised by `isReply`) become
 *  ServerReplyError, everything else ConnectionLostError. */
export function mapError(err: unknown, server: string, isReply: (e: unknown) => boolean): Error {
  if (err instanceof ServerReplyError || err instanceof ConnectionLostError || err instanceof ReplyTimeoutError || err instanceof UnsafeIntegerReplyError) {
    return err;
  }
  if (isReply(err)) return new ServerReplyError(messageOf(err));
  return new ConnectionLostError(`connection to ${server} lost: ${messageOf(err)}`, { cause: err });
}

/** Normalises a raw reply where integers arrive as decimal strings and strings as Buffers
 *  (ioredis `callBuffer` with `stringNumbers`, node-redis v5 with a type mapping). */
export function normaliseTagged(raw: unknown, isReply: (e: unknown) => boolean): Reply {
  if (raw === null || raw === undefined) return null;
  if (typeof raw === "string") return BigInt(raw);
  if (typeof raw === "bigint") return raw;
  if (typeof raw === "number") return exactNumber(raw);
  if (Buffer.isBuffer(raw)) return raw.toString("utf8");
  if (raw instanceof Uint8Array) return Buffer.from(raw).toString("utf8");
  if (Array.isArray(raw)) return raw.map((x) => normaliseTagged(x, isReply));
  if (raw instanceof Error) return isReply(raw) ? new ServerReplyError(raw.message) : raw instanceof ServerReplyError ? raw : new ServerReplyError(raw.message);
  throw new TypeError(`unexpected reply value of type ${typeof raw}`);
}

/** Normalises a raw reply where integers arrive as JavaScript numbers and strings as strings
 *  (node-redis v4): a number outside the safe range is refused. */
export function normaliseNumbers(raw: unknown): Reply {
  if (raw === null || raw === undefined) return null;
  if (typeof raw === "number") return exactNumber(raw);
  if (typeof raw === "string") return raw;
  if (Buffer.isBuffer(raw)) return raw.toString("utf8");
  if (Array.isArray(raw)) return raw.map((x) => normaliseNumbers(x));
  if (raw instanceof Error) return new ServerReplyError(raw.message);
  throw new TypeError(`unexpected reply value of type ${typeof raw}`);
}

function exactNumber(n: number): bigint {
  if (!Number.isSafeInteger(n)) throw new UnsafeIntegerReplyError(n);
  return BigInt(n);
}

/** `p`, or a ReplyTimeoutError after `ms` (no timer is left running). */
export function withDeadline<T>(p: Promise<T>, ms: number | undefined, server: string): Promise<T> {
  if (ms === undefined || !Number.isFinite(ms)) return p;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new ReplyTimeoutError(`no reply from ${server} within ${ms} ms`)), Math.max(0, ms));
    timer.unref?.();
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/**
 * `p`, or `expired()`'s error after `ms` (no timer is left running; a late settlement of `p`
 * is ignored). `onExpire` runs when the time is up, so work behind `p` can stop.
 */
export function within<T>(p: Promise<T>, ms: number, expired: () => Error, onExpire?: () => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      if (settled) return;
      settled = true;
      onExpire?.();
      reject(expired());
    }, Math.max(0, ms));
    timer.unref?.();
    p.then(
      (v) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/** The longest routing (Target.endpointFor / rerouted) may take: the caller's deadline, and
 *  never more than {@link CONNECT_DEADLINE_MS}. */
export function routingLimit(deadlineMs?: number): number {
  if (deadlineMs === undefined || Number.isNaN(deadlineMs)) return CONNECT_DEADLINE_MS;
  return Math.max(0, Math.min(deadlineMs, CONNECT_DEADLINE_MS));
}

/** Calls each close callback once. */
export class CloseNotifier {
  private cbs: Array<(why: string) => void> = [];
  private why: string | null = null;
  get closed(): boolean {
    return this.why !== null;
  }
  add(cb: (why: string) => void): void {
    if (this.why !== null) {
      const why = this.why;
      queueMicrotask(() => cb(why));
    } else this.cbs.push(cb);
  }
  fire(why: string): void {
    if (this.why !== null) return;
    this.why = why;
    const cbs = this.cbs;
    this.cbs = [];
    for (const cb of cbs) {
      try {
        cb(why);
      } catch {
        // a close callback's failure must not stop the others
      }
    }
  }
}

export function abortReason(signal: AbortSignal): unknown {
  if (signal.reason !== undefined) return signal.reason;
  const e = new Error("This operation was aborted");
  e.name = "AbortError";
  return e;
}

interface Queued {
  resolve: (c: Conn) => void;
  reject: (e: unknown) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

/** One server: the command connection and the wait pool. */
export class PooledEndpoint implements Endpoint {
  readonly name: string;
  private cmd: Conn | null = null;
  private opening: Promise<Conn> | null = null;
  private hooks = new Set<(conn: Conn) => Promise<void>>();
  private busy = new Set<Conn>();
  private reserved = 0; // places taken by connections being opened
  private idle: Conn[] = [];
  private queue: Queued[] = [];
  private subs = new Set<SubscriberConn>();
  private closing = false;
  /** Settles once every wait-connection request made so far has settled: each request's
   *  connection is handed over only after the earlier ones' (see acquireWaitConn). */
  private handedInOrder: Promise<void> = Promise.resolve();
  /** A wait connection was handed over in this turn of the event loop: the next one waits for
   *  the next turn. Waits written to several connections at the same instant can reach the
   *  server's queue in any order (seen: node-redis v4, which writes on a setImmediate, had 16
   *  waits written in one turn queued 15, 0, 1, …); a turn apart, they almost always arrive in
   *  order, but not surely (a loaded machine once queued 0, 1, 4, 2, 3, …): the Redlock makes
   *  sure of the order of waits on one key (WaitLines, src/waitorder.ts). */
  private handedThisTurn = false;

  constructor(
    private readonly factory: ConnFactory,
    private readonly maxWait: number,
    private readonly maxIdle: number,
  ) {
    this.name = factory.name;
  }

  currentCommand(): Conn | null {
    return this.cmd !== null && !this.cmd.closed ? this.cmd : null;
  }

  onCommandOpen(hook: (conn: Conn) => Promise<void>): () => void {
    this.hooks.add(hook);
    return () => this.hooks.delete(hook);
  }

  command(): Promise<Conn> {
    if (this.closing) return Promise.reject(new ConnectionLostError(`the connections to ${this.name} are closed`));
    const cur = this.currentCommand();
    if (cur) return Promise.resolve(cur);
    if (this.opening) return this.opening;
    const opening = (async () => {
      const conn = await this.factory.open("command");
      if (this.closing) {
        conn.destroy();
        throw new ConnectionLostError(`the connections to ${this.name} are closed`);
      }
      conn.onClose(() => {
        if (this.cmd === conn) this.cmd = null;
      });
      for (const hook of [...this.hooks]) {
        try {
          await hook(conn);
        } catch {
          // a hook's failure (the watcher's registration) must not refuse the connection
        }
      }
      if (conn.closed) throw new ConnectionLostError(`connection to ${this.name} closed while being set up`);
      this.cmd = conn;
      return conn;
    })();
    this.opening = opening;
    const clear = (): void => {
      if (this.opening === opening) this.opening = null;
    };
    opening.then(clear, clear);
    return opening;
  }

  poolStats(): { busy: number; idle: number; queued: number } {
    return { busy: this.busy.size + this.reserved, idle: this.idle.length, queued: this.queue.length };
  }

  /**
   * A wait connection, handed over in call order: requests made one after the other (in one
   * tick, say) resolve in that order, so callers that send their wait as soon as they have
   * their connection write their waits in call order (whether the server reads them in that
   * order is not promised here: see handedThisTurn). Only the handing over is ordered: places are given FIFO and new connections open
   * in parallel; a connection made (or taken idle) early waits until every earlier request
   * has settled (resolved, or rejected: failed or aborted), and at most one is handed over
   * per turn of the event loop (so a client that writes on a later tick, node-redis v4, still
   * writes them a turn apart). A request that fails or is aborted rejects at once and holds up
   * no one. When `signal` fires while its connection is ready but an earlier request is still
   * connecting, the connection goes back to the pool unused and the request rejects with
   * ReplyTimeoutError (the hold-up is a slow connect, not a full pool).
   */
  acquireWaitConn(signal?: AbortSignal): Promise<Conn> {
    if (this.closing) return Promise.reject(new ConnectionLostError(`the connections to ${this.name} are closed`));
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const raw = this.queue.length === 0 && this.busy.size + this.reserved < this.maxWait ? this.hand(signal) : this.enqueue(signal);
    return this.inOrder(raw, signal);
  }

  /** `raw`'s connection, handed over once every earlier request has settled. */
  private inOrder(raw: Promise<Conn>, signal: AbortSignal | undefined): Promise<Conn> {
    const earlier = this.handedInOrder;
    const out = new Promise<Conn>((resolve, reject) => {
      let done = false;
      let ready: Conn | null = null;
      const onAbort = (): void => {
        // Only while the connection is ready and waits for its turn: before that, the queue
        // and the connecting answer the signal themselves.
        if (done || ready === null) return;
        done = true;
        const conn = ready;
        this.releaseWaitConn(conn);
        reject(new ReplyTimeoutError(`could not hand a wait connection to ${this.name} over before the request's time ran out (an earlier request's connection to it was still being made)`));
      };
      const settle = (): boolean => {
        if (done) return false;
        done = true;
        signal?.removeEventListener("abort", onAbort);
        return true;
      };
      raw.then(
        (conn) => {
          if (done) {
            this.releaseWaitConn(conn);
            return;
          }
          ready = conn;
          if (signal) {
            if (signal.aborted) {
              onAbort();
              return;
            }
            signal.addEventListener("abort", onAbort, { once: true });
          }
          const handOver = (): void => {
            if (done) return;
            if (this.handedThisTurn) {
              // One hand-over per turn of the event loop (see handedThisTurn).
              setImmediate(handOver);
              return;
            }
            settle();
            if (this.closing) {
              conn.destroy();
              reject(new ConnectionLostError(`the connections to ${this.name} were closed`));
              return;
            }
            this.handedThisTurn = true;
            setImmediate(() => {
              this.handedThisTurn = false;
            });
            resolve(conn);
          };
          void earlier.then(handOver);
        },
        (e: unknown) => {
          if (settle()) reject(e);
        },
      );
    });
    const settled = out.then(
      () => undefined,
      () => undefined,
    );
    this.handedInOrder = earlier.then(() => settled);
    return out;
  }

  /** Waits for a place (FIFO); rejects with the signal's reason if it fires meanwhile. */
  private enqueue(signal?: AbortSignal): Promise<Conn> {
    return new Promise<Conn>((resolve, reject) => {
      const entry: Queued = { resolve, reject, signal, onAbort: undefined };
      if (signal) {
        entry.onAbort = () => {
          const i = this.queue.indexOf(entry);
          if (i >= 0) this.queue.splice(i, 1);
          reject(abortReason(signal));
        };
        signal.addEventListener("abort", entry.onAbort, { once: true });
      }
      this.queue.push(entry);
    });
  }

  /** Takes a place and gives a connection (idle or new). */
  private async hand(signal?: AbortSignal): Promise<Conn> {
    this.reserved++;
    let conn: Conn | undefined;
    try {
      while (this.idle.length > 0) {
        const c = this.idle.pop();
        if (c && !c.closed) {
          conn = c;
          break;
        }
      }
      if (!conn) {
        try {
          conn = await this.factory.open("wait", signal);
        } catch (e) {
          // The signal cut the connecting short (not the queue for a place): say so, rather
          // than hand on the signal's reason, which is about the queue.
          if (signal?.aborted && e === signal.reason) {
            throw new ReplyTimeoutError(`could not connect to ${this.name} before the request's time ran out (is it paused or overloaded?)`);
          }
          throw e;
        }
      }
    } catch (e) {
      this.reserved--;
      this.pump();
      throw e;
    }
    this.reserved--;
    if (this.closing) {
      conn.destroy();
      this.pump();
      throw new ConnectionLostError(`the connections to ${this.name} are closed`);
    }
    const c = conn;
    this.busy.add(c);
    c.onClose(() => {
      if (this.busy.delete(c)) this.pump();
    });
    return c;
  }

  private pump(): void {
    while (this.queue.length > 0 && this.busy.size + this.reserved < this.maxWait && !this.closing) {
      const entry = this.queue.shift();
      if (!entry) break;
      if (entry.signal && entry.onAbort) entry.signal.removeEventListener("abort", entry.onAbort);
      this.hand(entry.signal).then(entry.resolve, entry.reject);
    }
  }

  releaseWaitConn(conn: Conn): void {
    const wasBusy = this.busy.delete(conn);
    if (!conn.closed && wasBusy && !this.closing && this.idle.length < this.maxIdle) {
      this.idle.push(conn);
      conn.onClose(() => {
        const i = this.idle.indexOf(conn);
        if (i >= 0) this.idle.splice(i, 1);
      });
    } else if (!conn.closed) {
      conn.destroy();
    }
    this.pump();
  }

  async subscribeInvalidations(onInvalidate: (keys: string[] | null) => void): Promise<SubscriberConn> {
    if (this.closing) throw new ConnectionLostError(`the connections to ${this.name} are closed`);
    const sub = await this.factory.openSubscriber(onInvalidate);
    if (this.closing) {
      sub.destroy();
      throw new ConnectionLostError(`the connections to ${this.name} are closed`);
    }
    this.subs.add(sub);
    sub.onClose(() => this.subs.delete(sub));
    return sub;
  }

  async close(): Promise<void> {
    this.closing = true;
    const queued = this.queue;
    this.queue = [];
    for (const q of queued) {
      if (q.signal && q.onAbort) q.signal.removeEventListener("abort", q.onAbort);
      q.reject(new ConnectionLostError(`the connections to ${this.name} were closed`));
    }
    const opening = this.opening;
    const all: Array<{ destroy(): void }> = [...this.busy, ...this.idle, ...this.subs];
    if (this.cmd) all.push(this.cmd);
    this.idle = [];
    this.cmd = null;
    for (const c of all) c.destroy();
    if (opening) await opening.then((c) => c.destroy(), () => undefined);
  }
}

/** One standalone server, whatever the client library: a single endpoint; the adapter only
 *  says how its connections are made and how the user's client is quit. */
export class StandaloneTarget implements Target {
  readonly name: string;
  readonly isCluster = false;
  private readonly endpoint: PooledEndpoint;
  constructor(
    readonly client: unknown,
    factory: ConnFactory,
    opts: Required<TargetOptions>,
    private readonly quitClient: () => Promise<void>,
  ) {
    this.name = factory.name;
    this.endpoint = new PooledEndpoint(factory, opts.maxWaitConnections, opts.maxIdleConnections);
  }
  async endpointFor(): Promise<Endpoint> {
    return this.endpoint;
  }
  async rerouted(): Promise<void> {
    // one server: nothing to refresh
  }
  async quitUserClient(): Promise<void> {
    try {
      await this.quitClient();
    } catch {
      // already closed
    }
  }
  close(): Promise<void> {
    return this.endpoint.close();
  }
}
