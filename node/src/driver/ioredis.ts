/**
 * The ioredis adapters: a standalone `Redis` and a `Cluster`, duck-typed (no runtime import of
 * ioredis). Our connections are `duplicate()`s of the user's client (or, for a cluster, of the
 * cluster's own node clients) with overrides: integers read as decimal strings and strings as
 * Buffers (`callBuffer` + `stringNumbers`), no reconnect, no offline queue, no resend.
 * @internal
 */
import {
  CONNECT_DEADLINE_MS,
  CloseNotifier,
  PooledEndpoint,
  StandaloneTarget,
  connectWithin,
  hasClassName,
  mapError,
  normaliseTagged,
  routingLimit,
  withDeadline,
  within,
  type ConnFactory,
} from "./common.js";
import { slotOf } from "./slot.js";
import {
  ConnectionLostError,
  ReplyTimeoutError,
  ServerReplyError,
  type Arg,
  type Conn,
  type Endpoint,
  type Reply,
  type SubscriberConn,
  type Target,
  type TargetOptions,
} from "./types.js";

type Listener = (...args: unknown[]) => void;

/** The part of an ioredis `Redis` this package uses. */
export interface IoredisLike {
  readonly options: { host?: string; port?: number; path?: string } & Record<string, unknown>;
  readonly status: string;
  duplicate(override?: Record<string, unknown>): IoredisLike;
  connect(): Promise<unknown>;
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  subscribe(...channels: string[]): Promise<unknown>;
  disconnect(reconnect?: boolean): void;
  quit(): Promise<unknown>;
  on(event: string, listener: Listener): unknown;
}

/** The part of an ioredis `Cluster` this package uses. */
export interface IoredisClusterLike {
  readonly isCluster: true;
  readonly status: string;
  readonly slots: Array<string[] | undefined>;
  nodes(role?: "master" | "slave" | "all"): IoredisLike[];
  refreshSlotsCache(callback?: (err?: Error | null) => void): void;
  connect(): Promise<unknown>;
  quit(): Promise<unknown>;
}

/** The overrides of every connection of ours. `protocol: 2`: ioredis 6 speaks RESP3 by default
 *  (`HELLO 3`), and a RESP3 subscriber gets tracking invalidations as `invalidate` push frames,
 *  which ioredis does not hand to `message` listeners: the watcher would never hear of a loss.
 *  Our connections speak RESP2 whatever the user's client speaks (ioredis 5 knows no `protocol`
 *  option and always speaks RESP2); with it go the RESP2 reply shapes (`replyMapping`) and no
 *  maintenance-notification registration, which needs RESP3. */
export const IOREDIS_OVERRIDES: Readonly<Record<string, unknown>> = {
  protocol: 2,
  replyMapping: "legacy",
  maintNotifications: "disabled",
  lazyConnect: true,
  stringNumbers: true,
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  autoResubscribe: false,
  maxRetriesPerRequest: 0,
  retryStrategy: () => null,
  reconnectOnError: null,
  enableAutoPipelining: false,
  commandTimeout: undefined,
  socketTimeout: undefined,
  blockingTimeout: undefined,
  keyPrefix: "",
  monitor: false,
  readOnly: false,
};

export function isIoredisReply(e: unknown): boolean {
  return hasClassName(e, ["ReplyError"]);
}

export function ioredisServerName(options: { host?: string; port?: number; path?: string }): string {
  if (typeof options.path === "string" && options.path) return options.path;
  return `${options.host ?? "localhost"}:${options.port ?? 6379}`;
}

class IoredisConn implements Conn {
  private readonly notifier = new CloseNotifier();
  constructor(
    readonly server: string,
    private readonly r: IoredisLike,
  ) {
    r.on("error", () => undefined);
    const fire = (): void => this.notifier.fire("connection closed");
    r.on("close", fire);
    r.on("end", fire);
  }
  get closed(): boolean {
    return this.notifier.closed;
  }
  send(args: Arg[], deadlineMs?: number): Promise<Reply> {
    if (this.closed) return Promise.reject(new ConnectionLostError(`connection to ${this.server} is closed`));
    const [cmd, ...rest] = args;
    if (cmd === undefined) return Promise.reject(new TypeError("empty command"));
    let p: Promise<unknown>;
    try {
      p = this.r.callBuffer(typeof cmd === "string" ? cmd : cmd.toString("utf8"), ...rest);
    } catch (e) {
      return Promise.reject(mapError(e, this.server, isIoredisReply));
    }
    const server = this.server;
    return withDeadline(
      p.then(
        (raw) => normaliseTagged(raw, isIoredisReply),
        (e: unknown) => {
          throw mapError(e, server, isIoredisReply);
        },
      ),
      deadlineMs,
      server,
    );
  }
  destroy(): void {
    if (this.closed) return;
    this.notifier.fire("destroyed");
    this.r.disconnect(false);
  }
  onClose(cb: (why: string) => void): void {
    this.notifier.add(cb);
  }
}

class IoredisSubscriber implements SubscriberConn {
  private readonly notifier = new CloseNotifier();
  constructor(
    readonly id: bigint,
    private readonly r: IoredisLike,
  ) {
    const fire = (): void => this.notifier.fire("connection closed");
    r.on("close", fire);
    r.on("end", fire);
  }
  get closed(): boolean {
    return this.notifier.closed;
  }
  destroy(): void {
    if (this.closed) return;
    this.notifier.fire("destroyed");
    this.r.disconnect(false);
  }
  onClose(cb: (why: string) => void): void {
    this.notifier.add(cb);
  }
}

function invalidationKeys(message: unknown): string[] | null {
  if (message === null || message === undefined) return null;
  if (Array.isArray(message)) {
    return message.filter((k): k is Buffer | string => Buffer.isBuffer(k) || typeof k === "string").map((k) => k.toString());
  }
  if (Buffer.isBuffer(message)) return [message.toString("utf8")];
  return [];
}

/** Our connections to one server, made from an ioredis `Redis` (the user's, or a cluster node). */
export class IoredisFactory implements ConnFactory {
  readonly name: string;
  constructor(private readonly base: IoredisLike) {
    this.name = ioredisServerName(base.options);
  }
  private async dup(signal?: AbortSignal): Promise<IoredisLike> {
    const r = this.base.duplicate({ ...IOREDIS_OVERRIDES });
    r.on("error", () => undefined);
    try {
      await connectWithin(this.name, () => r.connect(), () => r.disconnect(false), signal);
    } catch (e) {
      r.disconnect(false);
      throw mapError(e, this.name, isIoredisReply);
    }
    return r;
  }
  async open(_kind: "command" | "wait", signal?: AbortSignal): Promise<Conn> {
    return new IoredisConn(this.name, await this.dup(signal));
  }
  async openSubscriber(onInvalidate: (keys: string[] | null) => void): Promise<SubscriberConn> {
    const r = await this.dup();
    try {
      const raw = normaliseTagged(await withDeadline(r.callBuffer("CLIENT", "ID"), CONNECT_DEADLINE_MS, this.name), isIoredisReply);
      if (typeof raw !== "bigint") throw new ServerReplyError(`ERR unexpected CLIENT ID reply`);
      const sub = new IoredisSubscriber(raw, r);
      r.on("messageBuffer", (channel: unknown, message: unknown) => {
        if (String(channel) !== "__redis__:invalidate") return;
        onInvalidate(invalidationKeys(message));
      });
      await withDeadline(r.subscribe("__redis__:invalidate"), CONNECT_DEADLINE_MS, this.name);
      return sub;
    } catch (e) {
      r.disconnect(false);
      throw mapError(e, this.name, isIoredisReply);
    }
  }
}

/** A standalone ioredis server. */
export function ioredisTarget(client: IoredisLike, opts: Required<TargetOptions>): Target {
  return new StandaloneTarget(client, new IoredisFactory(client), opts, async () => {
    if (client.status === "end" || client.status === "wait") return;
    await client.quit();
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** An ioredis Cluster: one endpoint per master, found by the key's slot. */
export class IoredisClusterTarget implements Target {
  readonly name = "cluster";
  readonly isCluster = true;
  private readonly endpoints = new Map<string, PooledEndpoint>();
  /** Slots learnt from MOVED replies, ahead of the cluster's own refresh. */
  private readonly moved = new Map<number, string>();
  /** Our call of the user's `connect()` while it runs (a lazyConnect cluster not connected yet). */
  private connecting: Promise<void> | null = null;
  private closed = false;
  constructor(
    readonly client: IoredisClusterLike,
    private readonly opts: Required<TargetOptions>,
  ) {}

  /** "the ioredis Cluster (startup nodes a:1, b:2)", for error messages. */
  private describe(): string {
    const raw = (this.client as unknown as Record<string, unknown>)["startupNodes"];
    const names: string[] = [];
    if (Array.isArray(raw)) {
      for (const n of raw as unknown[]) {
        if (typeof n === "string" || typeof n === "number") names.push(String(n));
        else if (n !== null && typeof n === "object") {
          const o = n as { host?: unknown; port?: unknown };
          names.push(`${typeof o.host === "string" ? o.host : "localhost"}:${typeof o.port === "number" || typeof o.port === "string" ? String(o.port) : "6379"}`);
        }
      }
    }
    if (names.length === 0) for (const n of this.client.nodes("all")) names.push(ioredisServerName(n.options));
    return names.length > 0 ? `the ioredis Cluster (startup nodes ${names.join(", ")})` : "the ioredis Cluster";
  }

  private refresh(): Promise<void> {
    return new Promise<void>((resolve) => {
      try {
        this.client.refreshSlotsCache(() => resolve());
      } catch {
        resolve();
      }
    });
  }

  private nodeOf(slot: number): string | undefined {
    return this.moved.get(slot) ?? this.client.slots[slot]?.[0];
  }

  /** The endpoint of the node serving `slot` if the cluster knows it now (opened on first use). */
  private known(slot: number): PooledEndpoint | undefined {
    const node = this.nodeOf(slot);
    if (node === undefined) return undefined;
    const existing = this.endpoints.get(node);
    if (existing) return existing;
    const base = this.client.nodes("master").find((n) => ioredisServerName(n.options) === node) ??
      this.client.nodes("all").find((n) => ioredisServerName(n.options) === node);
    if (!base) return undefined;
    const ep = new PooledEndpoint(new IoredisFactory(base), this.opts.maxWaitConnections, this.opts.maxIdleConnections);
    this.endpoints.set(node, ep);
    return ep;
  }

  async endpointFor(key: string, deadlineMs?: number): Promise<Endpoint> {
    if (this.closed) throw new ConnectionLostError("the cluster's connections are closed");
    const slot = slotOf(key);
    const ready = this.known(slot);
    if (ready) return ready;
    const limit = routingLimit(deadlineMs);
    const stop = { expired: false };
    return within(
      this.locate(slot, key, stop),
      limit,
      () =>
        new ReplyTimeoutError(
          `${this.describe()} did not say which node serves slot ${slot} (key ${JSON.stringify(key)}) within ${limit} ms: ` +
            `its nodes may be paused, overloaded or unreachable, or the cluster still connecting or without a master for the slot`,
        ),
      () => {
        stop.expired = true;
      },
    );
  }

  /** Connects a cluster not connected yet, then refreshes its slots until `slot` has a node;
   *  stops when `stop.expired` (the caller's time is up). */
  private async locate(slot: number, key: string, stop: { expired: boolean }): Promise<Endpoint> {
    if (this.client.status === "wait" && this.connecting === null) {
      const connecting = this.client.connect().then(
        () => undefined,
        () => undefined,
      );
      this.connecting = connecting;
      void connecting.then(() => {
        if (this.connecting === connecting) this.connecting = null;
      });
    }
    if (this.connecting) await this.connecting;
    for (let attempt = 0; attempt < 50 && !stop.expired; attempt++) {
      if (this.closed) throw new ConnectionLostError("the cluster's connections are closed");
      const ep = this.known(slot);
      if (ep) return ep;
      await this.refresh();
      if (attempt > 0 && !stop.expired) await sleep(Math.min(100, 10 * attempt));
    }
    throw new ConnectionLostError(`no cluster node known for slot ${slot} (key ${JSON.stringify(key)})`);
  }

  async rerouted(key: string, err: ServerReplyError, deadlineMs?: number): Promise<void> {
    const slot = slotOf(key);
    if (err.code === "MOVED") {
      const parts = err.message.split(" ");
      const to = parts[2];
      if (to) this.moved.set(slot, to.startsWith(":") ? `127.0.0.1${to}` : to);
    } else {
      this.moved.delete(slot);
    }
    const limit = routingLimit(deadlineMs);
    await within(
      this.refresh(),
      limit,
      () => new ReplyTimeoutError(`${this.describe()} did not refresh its slots within ${limit} ms after ${err.code} for slot ${slot} (key ${JSON.stringify(key)}): its nodes may be paused, overloaded or unreachable`),
    );
    // The cluster's own table is trusted again once it agrees with what MOVED said.
    const learnt = this.moved.get(slot);
    if (learnt !== undefined && this.client.slots[slot]?.[0] === learnt) this.moved.delete(slot);
  }

  async quitUserClient(): Promise<void> {
    if (this.client.status === "end") return;
    try {
      await this.client.quit();
    } catch {
      // already closed
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.endpoints.values()].map((e) => e.close()));
  }
}
