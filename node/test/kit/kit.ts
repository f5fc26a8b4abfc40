// The Kit: everything a test file starts (servers, clusters, clients, child processes) is
// registered here and killed by close(), which useKit() runs in an after() hook, so a failing
// test still leaves nothing running and `node --test` exits.
import { after } from "node:test";

import type { Redis as IORedis, Cluster as IORedisCluster, ClusterOptions, RedisOptions } from "ioredis";

import { spawnHolder, spawnNode, type Child, type HolderOptions, type SpawnNodeOptions } from "./child.js";
import {
  closeClient,
  hostVariant,
  makeIoredis,
  makeIoredisCluster,
  makeNodeRedis,
  makeNodeRedis4,
  type Address,
  type NodeRedis4,
  type NodeRedis4Options,
  type NodeRedis5,
  type NodeRedis5Options,
} from "./clients.js";
import { Cluster } from "./cluster.js";
import { Server, type ServerOptions } from "./server.js";
import { TlsServer } from "./tls.js";

/** The clients the scenario tables run with. */
export type ClientKind = "ioredis" | "node-redis" | "node-redis4";
/** The {@link ClientKind}s the scenario tables run with: all three, or only the kind of the
 *  host library release REDIS_LOCK_NODE_HOST selects (see clients.ts). */
export const CLIENT_KINDS: readonly ClientKind[] = ((): readonly ClientKind[] => {
  const v = hostVariant();
  return v ? [v.kind] : ["ioredis", "node-redis", "node-redis4"];
})();

/** Owns what a test file (or one test) starts; {@link close} kills it all. */
export class Kit {
  private readonly servers_: Server[] = [];
  private readonly clusters: Cluster[] = [];
  private readonly clients: unknown[] = [];
  private readonly children: Child[] = [];
  private readonly cleanups: (() => unknown)[] = [];
  private closed = false;

  private check(): void {
    if (this.closed) throw new Error("kit already closed");
  }

  /** Starts a server with the module (see ServerOptions: extra args, appendonly, dir, ...). */
  async server(opts: ServerOptions = {}): Promise<Server> {
    this.check();
    const s = new Server(opts);
    this.servers_.push(s);
    await s.start();
    return s;
  }

  /** Starts `n` independent servers. */
  async servers(n: number, opts: ServerOptions = {}): Promise<Server[]> {
    const out: Server[] = [];
    for (let i = 0; i < n; i++) out.push(await this.server(opts));
    return out;
  }

  /** Starts a cluster of `masters` masters (default 3) with the module on each. */
  async cluster(masters = 3, opts: ServerOptions = {}): Promise<Cluster> {
    this.check();
    const c = await Cluster.start(masters, opts);
    this.clusters.push(c);
    return c;
  }

  /** Starts a server with a TLS listener (throwaway CA; `tlsPort`, `certs.ca`). */
  async tlsServer(opts: ServerOptions = {}): Promise<TlsServer> {
    this.check();
    const s = await TlsServer.startTls(opts);
    this.servers_.push(s);
    return s;
  }

  /** An ioredis client to `at`, disconnected at teardown. */
  ioredis(at: Address, opts: RedisOptions = {}): IORedis {
    this.check();
    const c = makeIoredis(at, opts);
    this.clients.push(c);
    return c;
  }

  /** An ioredis client over TLS to a {@link TlsServer} (verifying its certificate). */
  ioredisTls(s: TlsServer, opts: RedisOptions = {}): IORedis {
    return this.ioredis({ host: s.host, port: s.tlsPort }, { tls: { ca: s.certs.ca }, ...opts });
  }

  /** An ioredis Cluster client to a kit {@link Cluster}, disconnected at teardown. */
  ioredisCluster(c: Cluster, opts: ClusterOptions = {}): IORedisCluster {
    this.check();
    const client = makeIoredisCluster(c.startupNodes, opts);
    this.clients.push(client);
    return client;
  }

  /** A connected node-redis v5 client, destroyed at teardown. */
  async nodeRedis(at: Address, opts: NodeRedis5Options = {}): Promise<NodeRedis5> {
    this.check();
    const c = await makeNodeRedis(at, opts);
    this.clients.push(c);
    return c;
  }

  /** A connected node-redis v4 client (npm alias `redis4`), disconnected at teardown. */
  async nodeRedis4(at: Address, opts: NodeRedis4Options = {}): Promise<NodeRedis4> {
    this.check();
    const c = await makeNodeRedis4(at, opts);
    this.clients.push(c);
    return c;
  }

  /** A client of `kind` to `at` (connected), as the package receives it. */
  async client(kind: ClientKind, at: Address): Promise<IORedis | NodeRedis5 | NodeRedis4> {
    switch (kind) {
      case "ioredis":
        return this.ioredis(at);
      case "node-redis":
        return this.nodeRedis(at);
      case "node-redis4":
        return this.nodeRedis4(at);
    }
  }

  /** A client of `kind` (connected) over TLS to a {@link TlsServer}, verifying its certificate. */
  async clientTls(kind: ClientKind, s: TlsServer): Promise<IORedis | NodeRedis5 | NodeRedis4> {
    const at = { host: s.host, port: s.tlsPort };
    switch (kind) {
      case "ioredis":
        return this.ioredisTls(s);
      case "node-redis":
        return this.nodeRedis(at, { socket: { tls: true, ca: s.certs.ca } as NodeRedis5Options["socket"] });
      case "node-redis4":
        return this.nodeRedis4(at, { socket: { tls: true, ca: s.certs.ca } as NodeRedis4Options["socket"] });
    }
  }

  /** Starts a holder child process (acquires, prints `held <token> <owner>`, sleeps). */
  async holder(o: HolderOptions): Promise<Child> {
    this.check();
    const c = await spawnHolder(o);
    this.children.push(c);
    return c;
  }

  /** Runs `code` in a child Node process until it prints its ready line. */
  async node(code: string, opts: SpawnNodeOptions = {}): Promise<Child> {
    this.check();
    const c = await spawnNode(code, opts);
    this.children.push(c);
    return c;
  }

  /** Registers a cleanup (e.g. `() => redlock.quit()`), run first at teardown, newest first. */
  defer(fn: () => unknown): void {
    this.cleanups.push(fn);
  }

  /** Closes what the kit made: deferred cleanups (each bounded to 5 s), clients, child
   *  processes, clusters, servers. Never throws; safe to call twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const fn of this.cleanups.splice(0).reverse()) {
      try {
        await Promise.race([
          Promise.resolve().then(fn),
          new Promise((res) => setTimeout(res, 5000).unref()),
        ]);
      } catch {
        // a cleanup's failure must not keep the rest running
      }
    }
    await Promise.all(this.clients.splice(0).map((c) => closeClient(c)));
    await Promise.all(this.children.splice(0).map((c) => c.kill("SIGKILL").catch(() => undefined)));
    await Promise.all(this.clusters.splice(0).map((c) => c.close()));
    await Promise.all(this.servers_.splice(0).map((s) => s.close()));
  }
}

/** Something with node:test's `after` (a TestContext or SuiteContext). */
export interface HasAfter {
  after(fn: () => unknown): void;
}

/** A Kit closed after the current test (`useKit(t)`) or, at top level of a file, after all
 *  of the file's tests (`useKit()`). */
export function useKit(t?: HasAfter): Kit {
  const k = new Kit();
  if (t) t.after(() => k.close());
  else after(() => k.close());
  return k;
}
