// A TCP proxy in front of a real server that holds back chosen traffic, so a test can make one
// connection late without relying on load: the n-th connection it accepts can be connected to
// the server only after a delay (its handshake, so its readiness, comes late), and from the
// n-th request carrying a `WAIT` argument (counted over every connection, in the order the
// proxy reads them) what that connection sends can be held back for a while (that wait reaches
// the server after waits written later on other connections). Each connection's own bytes keep
// their order; replies pass at once.
import net from "node:net";

import type { Address } from "./clients.js";

export interface HoldBackOptions {
  /** ms before the n-th accepted connection (0-based) is connected to the server (0: at once). */
  connectionDelay?: (n: number) => number;
  /** ms the n-th request with a WAIT argument (0-based), and what follows it on its connection,
   *  is held back (0: passed at once). */
  waitDelay?: (n: number) => number;
}

/** `WAIT` as a RESP bulk string, the way every client library writes an argument. */
const WAIT_ARG = Buffer.from("$4\r\nWAIT\r\n");

export class HoldBackProxy implements Address {
  readonly host = "127.0.0.1";
  private accepted = 0;
  private waits = 0;
  private readonly sockets = new Set<net.Socket>();
  private readonly timers = new Set<ReturnType<typeof setTimeout>>();

  private constructor(
    private readonly server: net.Server,
    readonly port: number,
  ) {}

  /** A proxy on a free local port in front of `to`. */
  static async start(to: Address, opts: HoldBackOptions = {}): Promise<HoldBackProxy> {
    const server = net.createServer();
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    const addr = server.address();
    if (addr === null || typeof addr === "string") throw new Error("the proxy has no TCP port");
    const proxy = new HoldBackProxy(server, addr.port);
    server.on("connection", (client) => proxy.relay(client, to, opts));
    return proxy;
  }

  /** How many requests with a WAIT argument the proxy has read. */
  get waitsSeen(): number {
    return this.waits;
  }

  private later(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    this.timers.add(t);
  }

  private relay(client: net.Socket, to: Address, opts: HoldBackOptions): void {
    const n = this.accepted++;
    this.sockets.add(client);
    let upstream: net.Socket | null = null;
    let held = true; // until connected upstream
    const pending: Buffer[] = [];
    const flush = (): void => {
      while (!held && upstream !== null && pending.length > 0) {
        const chunk = pending.shift() as Buffer;
        if (chunk.includes(WAIT_ARG)) {
          const delay = opts.waitDelay?.(this.waits++) ?? 0;
          if (delay > 0) {
            held = true;
            this.later(delay, () => {
              held = false;
              upstream?.write(chunk);
              flush();
            });
            return;
          }
        }
        upstream.write(chunk);
      }
    };
    const closeBoth = (): void => {
      client.destroy();
      upstream?.destroy();
    };
    client.on("data", (chunk: Buffer) => {
      pending.push(chunk);
      flush();
    });
    client.on("error", closeBoth);
    client.on("close", () => {
      this.sockets.delete(client);
      closeBoth();
    });
    const connect = (): void => {
      if (client.destroyed) return;
      const up = net.connect(to.port, to.host);
      upstream = up;
      this.sockets.add(up);
      up.on("connect", () => {
        held = false;
        flush();
      });
      up.on("data", (chunk: Buffer) => client.write(chunk));
      up.on("error", closeBoth);
      up.on("close", () => {
        this.sockets.delete(up);
        closeBoth();
      });
    };
    const delay = opts.connectionDelay?.(n) ?? 0;
    if (delay > 0) this.later(delay, connect);
    else connect();
  }

  /** Stops listening and drops every connection through the proxy. */
  async close(): Promise<void> {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
