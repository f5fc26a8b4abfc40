// STAND-IN (library branch `nlib` only): a throwaway ioredis-only driver so the library's tests
// run against a real server. The driver helper's real `node/src/driver/index.ts` replaces this
// file at merge (drop this one). It keeps to the interface in /work/notes/NODE-DESIGN-26.md.

import {
  ConnectionLostError,
  ReplyTimeoutError,
  ServerReplyError,
  type Arg,
  type Conn,
  type Endpoint,
  type Reply,
  type Target,
} from "./types.js";

export * from "./types.js";

interface IoRedisLike {
  options: { host?: string; port?: number };
  duplicate(overrides?: Record<string, unknown>): IoRedisLike;
  connect(): Promise<void>;
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  disconnect(): void;
  quit(): Promise<unknown>;
  once(event: string, cb: (...a: unknown[]) => void): unknown;
  on(event: string, cb: (...a: unknown[]) => void): unknown;
}

function isIoRedis(c: unknown): c is IoRedisLike {
  const o = c as Partial<IoRedisLike> | null;
  return !!o && typeof o.duplicate === "function" && typeof o.callBuffer === "function" && typeof o.options === "object";
}

function normalise(v: unknown): Reply {
  if (v === null || v === undefined) return null;
  if (Buffer.isBuffer(v)) return v.toString("utf8");
  if (typeof v === "string") return /^-?\d+$/.test(v) ? BigInt(v) : v;
  if (typeof v === "number") return BigInt(v);
  if (typeof v === "bigint") return v;
  if (Array.isArray(v)) return v.map(normalise);
  return String(v);
}

class IoConn implements Conn {
  closed = false;
  private readonly closers: ((why: string) => void)[] = [];
  private readonly pending = new Set<(e: Error) => void>();
  constructor(readonly server: string, private readonly redis: IoRedisLike) {
    redis.once("end", () => this.close("connection ended"));
  }
  private close(why: string): void {
    if (this.closed) return;
    this.closed = true;
    for (const p of [...this.pending]) p(new ConnectionLostError(`connection to ${this.server} closed: ${why}`));
    for (const cb of this.closers) cb(why);
  }
  send(args: Arg[], deadlineMs?: number): Promise<Reply> {
    if (this.closed) return Promise.reject(new ConnectionLostError(`connection to ${this.server} is closed`));
    const [cmd, ...rest] = args;
    return new Promise<Reply>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const fail = (e: Error): void => {
        if (timer) clearTimeout(timer);
        this.pending.delete(fail);
        reject(e);
      };
      this.pending.add(fail);
      if (deadlineMs !== undefined) {
        timer = setTimeout(() => fail(new ReplyTimeoutError(`no reply from ${this.server} in ${deadlineMs} ms`)), deadlineMs);
        timer.unref();
      }
      this.redis.callBuffer(String(cmd), ...rest).then(
        (v) => {
          if (!this.pending.has(fail)) return;
          this.pending.delete(fail);
          if (timer) clearTimeout(timer);
          resolve(normalise(v));
        },
        (e: unknown) => {
          if (!this.pending.has(fail)) return;
          const err = e as Error & { name?: string };
          if (err && err.name === "ReplyError") fail(new ServerReplyError(err.message));
          else fail(new ConnectionLostError(String(err && err.message)));
        },
      );
    });
  }
  destroy(): void {
    this.redis.disconnect();
    this.close("destroyed");
  }
  onClose(cb: (why: string) => void): void {
    if (this.closed) cb("closed");
    else this.closers.push(cb);
  }
}

class IoEndpoint implements Endpoint {
  private cmd: Promise<Conn> | undefined;
  private idle: Conn[] = [];
  private readonly all = new Set<Conn>();
  constructor(readonly name: string, private readonly client: IoRedisLike) {}
  private async open(): Promise<Conn> {
    const r = this.client.duplicate({
      lazyConnect: true,
      stringNumbers: true,
      enableOfflineQueue: true,
      autoResendUnfulfilledCommands: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      enableReadyCheck: false,
    });
    r.on("error", () => undefined);
    await r.connect();
    const c = new IoConn(this.name, r);
    this.all.add(c);
    c.onClose(() => this.all.delete(c));
    return c;
  }
  command(): Promise<Conn> {
    const cur = this.cmd;
    if (cur) {
      return cur.then((c) => {
        if (!c.closed) return c;
        if (this.cmd === cur) this.cmd = undefined;
        return this.command();
      }, () => {
        if (this.cmd === cur) this.cmd = undefined;
        return this.command();
      });
    }
    const p = this.open();
    this.cmd = p;
    p.catch(() => { if (this.cmd === p) this.cmd = undefined; });
    return p;
  }
  async acquireWaitConn(signal?: AbortSignal): Promise<Conn> {
    signal?.throwIfAborted();
    for (;;) {
      const c = this.idle.pop();
      if (!c) break;
      if (!c.closed) return c;
    }
    return this.open();
  }
  releaseWaitConn(conn: Conn): void {
    if (conn.closed) return;
    if (this.idle.length < 2) this.idle.push(conn);
    else conn.destroy();
  }
  async close(): Promise<void> {
    for (const c of [...this.all]) c.destroy();
    this.idle = [];
    this.cmd = undefined;
  }
}

class IoTarget implements Target {
  readonly name: string;
  readonly isCluster = false;
  private readonly endpoint: IoEndpoint;
  constructor(readonly client: IoRedisLike) {
    this.name = `${client.options.host ?? "localhost"}:${client.options.port ?? 6379}`;
    this.endpoint = new IoEndpoint(this.name, client);
  }
  async endpointFor(_key: string): Promise<Endpoint> {
    return this.endpoint;
  }
  async rerouted(_key: string, _err: ServerReplyError): Promise<void> {}
  async quitUserClient(): Promise<void> {
    await this.client.quit();
  }
  close(): Promise<void> {
    return this.endpoint.close();
  }
}

/** STAND-IN: ioredis `Redis` clients only. */
export function targetFor(client: unknown, _options?: { maxWaitConnections?: number; maxIdleConnections?: number }): Target {
  if (!isIoRedis(client)) throw new TypeError("stand-in driver: only ioredis Redis clients are supported");
  return new IoTarget(client);
}
