// Client factories: ioredis, ioredis Cluster, node-redis v5 (`redis`) and v4 (`redis4`).
//
// Which release of each host library a run uses is chosen by REDIS_LOCK_NODE_HOST (the version
// matrix, `make test-matrix-node`): unset, the tests use the devDependencies `ioredis` (5),
// `redis` (5) and `redis4` (4) and every client kind; set to one of {@link HOST_VARIANTS}, they
// use that release (an npm alias in node/package.json: `ioredis6`, `redis6`) for its family and
// run the client-kind tables with that family's kind only. The modules are loaded by name at
// run time (the types stay those of ioredis 5 and node-redis 5: a test only uses what every
// release in the matrix has).
import type * as IoredisModule from "ioredis";
import type { Cluster as IORedisCluster, Redis as IORedis, ClusterOptions, RedisOptions } from "ioredis";
import type * as NodeRedis5Module from "redis";
import type * as NodeRedis4Module from "redis4";

/** A host library release the matrix runs: family and npm module name (the alias). */
export interface HostVariant {
  /** The value of REDIS_LOCK_NODE_HOST. */
  readonly name: string;
  /** The client kind whose tables run (see kit.ts ClientKind). */
  readonly kind: "ioredis" | "node-redis" | "node-redis4";
  /** The module `require`d for that kind. */
  readonly module: string;
}

/** Every value REDIS_LOCK_NODE_HOST takes. */
export const HOST_VARIANTS: readonly HostVariant[] = [
  { name: "ioredis5", kind: "ioredis", module: "ioredis" },
  { name: "ioredis6", kind: "ioredis", module: "ioredis6" },
  { name: "redis4", kind: "node-redis4", module: "redis4" },
  { name: "redis5", kind: "node-redis", module: "redis" },
  { name: "redis6", kind: "node-redis", module: "redis6" },
];

/** The variant REDIS_LOCK_NODE_HOST selects, or null (unset: the default modules, every kind).
 *  An unknown value throws, naming the accepted ones. */
export function hostVariant(): HostVariant | null {
  const raw = process.env["REDIS_LOCK_NODE_HOST"];
  if (raw === undefined || raw === "") return null;
  const v = HOST_VARIANTS.find((h) => h.name === raw);
  if (!v) throw new Error(`REDIS_LOCK_NODE_HOST=${raw} is not one of ${HOST_VARIANTS.map((h) => h.name).join(", ")}`);
  return v;
}

/** The module name used for `kind` in this run. */
export function hostModule(kind: HostVariant["kind"]): string {
  const v = hostVariant();
  if (v && v.kind === kind) return v.module;
  return kind === "ioredis" ? "ioredis" : kind === "node-redis" ? "redis" : "redis4";
}

/** The installed version of `module` (its package.json), e.g. "6.1.0". */
export function moduleVersion(module: string): string {
  return (require(`${module}/package.json`) as { version: string }).version;
}

/** "ioredis 6.1.0" / "redis 5.12.1": the release a client kind runs with in this run. */
export function hostDescription(kind: HostVariant["kind"]): string {
  const m = hostModule(kind);
  return `${kind === "ioredis" ? "ioredis" : "redis"} ${moduleVersion(m)}`;
}

const ioredisLib = require(hostModule("ioredis")) as typeof IoredisModule;
const nodeRedisLib = require(hostModule("node-redis")) as typeof NodeRedis5Module;
const nodeRedis4Lib = require(hostModule("node-redis4")) as typeof NodeRedis4Module;
const createClient5 = nodeRedisLib.createClient;
const createClient4 = nodeRedis4Lib.createClient;

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
  const c = new ioredisLib.Redis({ host: at.host, port: at.port, ...opts });
  c.on("error", () => undefined);
  return c;
}

/** A new ioredis Cluster client from startup nodes. */
export function makeIoredisCluster(nodes: readonly Address[], opts: ClusterOptions = {}): IORedisCluster {
  const c = new ioredisLib.Cluster(nodes.map((n) => ({ host: n.host, port: n.port })), opts);
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
    if (c instanceof ioredisLib.Redis || c instanceof ioredisLib.Cluster) {
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
