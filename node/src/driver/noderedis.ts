/**
 * The node-redis adapters (v4, v5 and v6 `createClient()` clients), duck-typed (no runtime
 * import of redis). Our connections are `duplicate()`s of the user's client with overrides: no
 * reconnect, no offline queue, RESP2 (v6 speaks RESP3 by default; v5 may be asked to), no
 * legacy mode. v6 is driven as v5 (same `sendCommand` options and type mapping).
 *
 * Exact integers: v5 reads them as decimal strings through a per-command type mapping
 * (`NUMBER → String`, strings → Buffer, so the two stay apart). v4 has no such option: its
 * decoder builds a JavaScript number, so an integer above 2^53 - 1 is refused
 * (UnsafeIntegerReplyError), never rounded (the module's tokens are at most 2^53 - 1).
 * @internal
 */
import { CONNECT_DEADLINE_MS, CloseNotifier, PooledEndpoint, StandaloneTarget, connectWithin, hasClassName, mapError, normaliseNumbers, normaliseTagged, withDeadline, type ConnFactory } from "./common.js";
import {
  ConnectionLostError,
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

/** The part of a node-redis (v4, v5 or v6) client this package uses. */
export interface NodeRedisLike {
  readonly options?: { socket?: Record<string, unknown>; url?: string } & Record<string, unknown>;
  readonly isOpen: boolean;
  duplicate(overrides?: Record<string, unknown>): NodeRedisLike;
  connect(): Promise<unknown>;
  sendCommand(args: Arg[], options?: Record<string, unknown>): Promise<unknown>;
  subscribe(channel: string, listener: (message: unknown, channel: unknown) => void, bufferMode?: boolean): Promise<unknown>;
  on(event: string, listener: Listener): unknown;
  disconnect?(): Promise<unknown>;
  destroy?(): void;
  quit?(): Promise<unknown>;
  close?(): Promise<unknown>;
  /** v5 and v6 only. */
  withTypeMapping?: unknown;
}

/** RESP type bytes used as keys of node-redis v5's type mapping. */
const RESP_NUMBER = 58; // ':'
const RESP_SIMPLE_STRING = 43; // '+'
const RESP_BLOB_STRING = 36; // '$'

const V5_TYPE_MAPPING: Readonly<Record<number, unknown>> = {
  [RESP_NUMBER]: String,
  [RESP_SIMPLE_STRING]: Buffer,
  [RESP_BLOB_STRING]: Buffer,
};

export function isNodeRedisReply(e: unknown): boolean {
  return hasClassName(e, ["ErrorReply"]);
}

export function nodeRedisServerName(client: NodeRedisLike): string {
  const o = client.options ?? {};
  const s = o.socket ?? {};
  if (typeof s["path"] === "string") return s["path"];
  let host = typeof s["host"] === "string" ? s["host"] : undefined;
  let port = typeof s["port"] === "number" ? s["port"] : undefined;
  if ((host === undefined || port === undefined) && typeof o.url === "string") {
    try {
      const u = new URL(o.url);
      host ??= u.hostname || undefined;
      port ??= u.port ? Number(u.port) : undefined;
    } catch {
      // not a URL: defaults
    }
  }
  return `${host ?? "localhost"}:${port ?? 6379}`;
}

function destroyClient(c: NodeRedisLike): void {
  try {
    if (typeof c.destroy === "function") c.destroy();
    else if (typeof c.disconnect === "function") c.disconnect().catch(() => undefined);
  } catch {
    // already closed
  }
}

function watchClose(c: NodeRedisLike, notifier: CloseNotifier): void {
  c.on("end", () => notifier.fire("connection closed"));
  c.on("error", () => {
    // With reconnection off, an error closes the client: look once the client has updated.
    setImmediate(() => {
      if (!c.isOpen) notifier.fire("connection closed");
    });
  });
}

class NodeRedisConn implements Conn {
  private readonly notifier = new CloseNotifier();
  constructor(
    readonly server: string,
    private readonly c: NodeRedisLike,
    private readonly v5: boolean,
  ) {
    watchClose(c, this.notifier);
  }
  get closed(): boolean {
    return this.notifier.closed || !this.c.isOpen;
  }
  send(args: Arg[], deadlineMs?: number): Promise<Reply> {
    if (this.closed) return Promise.reject(new ConnectionLostError(`connection to ${this.server} is closed`));
    const server = this.server;
    let p: Promise<unknown>;
    try {
      p = this.v5 ? this.c.sendCommand(args, { typeMapping: V5_TYPE_MAPPING }) : this.c.sendCommand(args);
    } catch (e) {
      return Promise.reject(mapError(e, server, isNodeRedisReply));
    }
    return withDeadline(
      p.then(
        (raw) => (this.v5 ? normaliseTagged(raw, isNodeRedisReply) : normaliseNumbers(raw)),
        (e: unknown) => {
          throw mapError(e, server, isNodeRedisReply);
        },
      ),
      deadlineMs,
      server,
    );
  }
  destroy(): void {
    if (this.notifier.closed) return;
    this.notifier.fire("destroyed");
    destroyClient(this.c);
  }
  onClose(cb: (why: string) => void): void {
    if (!this.notifier.closed && !this.c.isOpen) this.notifier.fire("connection closed");
    this.notifier.add(cb);
  }
}

class NodeRedisSubscriber implements SubscriberConn {
  private readonly notifier = new CloseNotifier();
  constructor(
    readonly id: bigint,
    private readonly c: NodeRedisLike,
  ) {
    watchClose(c, this.notifier);
  }
  get closed(): boolean {
    return this.notifier.closed || !this.c.isOpen;
  }
  destroy(): void {
    if (this.notifier.closed) return;
    this.notifier.fire("destroyed");
    destroyClient(this.c);
  }
  onClose(cb: (why: string) => void): void {
    this.notifier.add(cb);
  }
}

/** Our connections to one server, made from a node-redis client. */
export class NodeRedisFactory implements ConnFactory {
  readonly name: string;
  readonly v5: boolean;
  constructor(private readonly base: NodeRedisLike) {
    this.name = nodeRedisServerName(base);
    this.v5 = typeof base.withTypeMapping === "function";
  }
  private async dup(signal?: AbortSignal): Promise<NodeRedisLike> {
    // No reconnect; no socket timeout (a wait may block for long: our own deadlines apply).
    const socket: Record<string, unknown> = { ...(this.base.options?.socket ?? {}), reconnectStrategy: false };
    delete socket["socketTimeout"];
    const overrides: Record<string, unknown> = { socket, disableOfflineQueue: true };
    if (this.v5) {
      overrides["RESP"] = 2;
      overrides["commandOptions"] = undefined;
      overrides["clientSideCache"] = undefined;
      overrides["emitInvalidate"] = undefined; // v6, RESP3-only: refused with RESP2 otherwise
      overrides["pingInterval"] = undefined;
      overrides["maintNotifications"] = "disabled"; // RESP3-only: refused with RESP2 otherwise
    } else {
      overrides["legacyMode"] = false;
      overrides["isolationPoolOptions"] = undefined;
      overrides["pingInterval"] = undefined;
    }
    const c = this.base.duplicate(overrides);
    c.on("error", () => undefined);
    try {
      await connectWithin(this.name, () => c.connect(), () => destroyClient(c), signal);
    } catch (e) {
      destroyClient(c);
      throw mapError(e, this.name, isNodeRedisReply);
    }
    return c;
  }
  async open(_kind: "command" | "wait", signal?: AbortSignal): Promise<Conn> {
    return new NodeRedisConn(this.name, await this.dup(signal), this.v5);
  }
  async openSubscriber(onInvalidate: (keys: string[] | null) => void): Promise<SubscriberConn> {
    const c = await this.dup();
    try {
      const raw = await withDeadline(c.sendCommand(["CLIENT", "ID"]), CONNECT_DEADLINE_MS, this.name);
      const id = typeof raw === "number" || typeof raw === "string" ? BigInt(raw) : null;
      if (id === null) throw new ServerReplyError("ERR unexpected CLIENT ID reply");
      const sub = new NodeRedisSubscriber(id, c);
      await withDeadline(c.subscribe(
        "__redis__:invalidate",
        (message: unknown) => {
          if (message === null || message === undefined) onInvalidate(null);
          else if (Array.isArray(message)) onInvalidate(message.map((k: unknown) => (Buffer.isBuffer(k) ? k.toString("utf8") : String(k))));
          else if (Buffer.isBuffer(message)) onInvalidate([message.toString("utf8")]);
        },
        true,
      ), CONNECT_DEADLINE_MS, this.name);
      return sub;
    } catch (e) {
      destroyClient(c);
      throw mapError(e, this.name, isNodeRedisReply);
    }
  }
}

/** A standalone server reached through a node-redis client. */
export function nodeRedisTarget(client: NodeRedisLike, opts: Required<TargetOptions>): Target {
  const factory = new NodeRedisFactory(client);
  return new StandaloneTarget(client, factory, opts, async () => {
    if (!client.isOpen) return;
    if (factory.v5 && typeof client.close === "function") await client.close();
    else if (typeof client.quit === "function") await client.quit();
  });
}
