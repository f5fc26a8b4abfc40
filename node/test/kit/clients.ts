// Client factories: ioredis, ioredis Cluster, node-redis v5 (`redis`) and v4 (`redis4`).
import { Cluster as IORedisCluster, Redis as IORedis, type ClusterOptions, type RedisOptions } from "ioredis";
import { createClient as createClient5 } from "redis";
import { createClient as createClient4 } from "redis4";

/** Where a client connects: a kit Server or any host/port. */
export interface Address {
  readonly host: string;
  readonly port: number;
}

/** The node-redis v5 client type. */
export type NodeRedis5 = ReturnType<typeof createClient5>;
/** The node-redis v4 client type. */
export type NodeRedis4 = ReturnType<typeof createClient4>;
/** node-redis v5 options. */
export type NodeRedis5Options = NonNullable<Parameters<typeof createClient5>[0]>;
/** node-redis v4 options. */
export type NodeRedis4Options = NonNullable<Parameters<typeof createClient4>[0]>;

/** A new ioredis client (default options but for host/port); errors while the server is down
 *  are recorded on `errors`, not thrown as unhandled events. */
export function makeIoredis(at: Address, opts: RedisOptions = {}): IORedis {
  const c = new IORedis({ host: at.host, port: at.port, ...opts });
  c.on("error", () => undefined);
  return c;
}

/** A new ioredis Cluster client from startup nodes. */
export function makeIoredisCluster(nodes: readonly Address[], opts: ClusterOptions = {}): IORedisCluster {
  const c = new IORedisCluster(nodes.map((n) => ({ host: n.host, port: n.port })), opts);
  c.on("error", () => undefined);
  return c;
}

/** A connected node-redis v5 client (socket options merged over host/port). */
export async function makeNodeRedis(at: Address, opts: NodeRedis5Options = {}): Promise<NodeRedis5> {
  const socket = { host: at.host, port: at.port, ...(opts.socket ?? {}) } as NodeRedis5Options["socket"];
  const c = createClient5({ ...opts, socket });
  c.on("error", () => undefined);
  await c.connect();
  return c as unknown as NodeRedis5;
}

/** A connected node-redis v4 client (socket options merged over host/port). */
export async function makeNodeRedis4(at: Address, opts: NodeRedis4Options = {}): Promise<NodeRedis4> {
  const socket = { host: at.host, port: at.port, ...(opts.socket ?? {}) } as NodeRedis4Options["socket"];
  const c = createClient4({ ...opts, socket });
  c.on("error", () => undefined);
  await c.connect();
  return c;
}

/** Closes any of the above at once, whatever its state. Never throws. */
export async function closeClient(c: unknown): Promise<void> {
  try {
    if (c instanceof IORedis || c instanceof IORedisCluster) {
      c.disconnect();
      return;
    }
    const nr = c as { isOpen?: boolean; destroy?: () => void; disconnect?: () => Promise<void> };
    if (nr.isOpen === false) return;
    if (typeof nr.destroy === "function") nr.destroy();
    else if (typeof nr.disconnect === "function") await nr.disconnect();
  } catch {
    // already closed
  }
}
