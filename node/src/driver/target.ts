/**
 * Which adapter drives a user's client, found by its shape; and sending one short command to
 * where a key lives (following cluster redirects).
 * @internal
 */
import { IoredisClusterTarget, IoredisTarget, type IoredisClusterLike, type IoredisLike } from "./ioredis.js";
import { NodeRedisTarget, type NodeRedisLike } from "./noderedis.js";
import { UnsupportedClientError, isRedirect, type Arg, type Reply, type Target, type TargetOptions } from "./types.js";

function isObject(x: unknown): x is Record<string, unknown> {
  return x !== null && typeof x === "object";
}

/** Detects ioredis Redis, ioredis Cluster, node-redis v4 and v5 (createClient) by shape. */
export function targetFor(client: unknown, options?: TargetOptions): Target {
  const opts: Required<TargetOptions> = {
    maxWaitConnections: options?.maxWaitConnections ?? 64,
    maxIdleConnections: options?.maxIdleConnections ?? 2,
  };
  if (!Number.isInteger(opts.maxWaitConnections) || opts.maxWaitConnections < 1) {
    throw new RangeError(`maxWaitConnections must be a positive integer, got ${String(opts.maxWaitConnections)}`);
  }
  if (!Number.isInteger(opts.maxIdleConnections) || opts.maxIdleConnections < 0) {
    throw new RangeError(`maxIdleConnections must be a non-negative integer, got ${String(opts.maxIdleConnections)}`);
  }
  if (!isObject(client)) throw new UnsupportedClientError("expected an ioredis or node-redis client");
  if (client["isCluster"] === true && typeof client["nodes"] === "function" && typeof client["refreshSlotsCache"] === "function") {
    return new IoredisClusterTarget(client as unknown as IoredisClusterLike, opts);
  }
  if (typeof client["duplicate"] === "function" && typeof client["callBuffer"] === "function" && isObject(client["options"])) {
    return new IoredisTarget(client as unknown as IoredisLike, opts);
  }
  if (typeof client["duplicate"] === "function" && typeof client["sendCommand"] === "function" && "isOpen" in client) {
    return new NodeRedisTarget(client as unknown as NodeRedisLike, opts);
  }
  if (typeof client["sendCommand"] === "function" && typeof client["getSlotMaster"] === "function") {
    throw new UnsupportedClientError("node-redis cluster clients (createCluster) are not supported: use ioredis Cluster or one client per master");
  }
  throw new UnsupportedClientError("expected an ioredis Redis or Cluster, or a node-redis v4/v5 client (createClient)");
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Sends one short (non-blocking) command about `key` over the command connection of the
 *  endpoint serving it, following MOVED / ASK / TRYAGAIN / CLUSTERDOWN replies (routing
 *  refreshed, sent again) for up to `attempts` tries. Never use it for a blocking wait. */
export async function sendRouted(target: Target, key: string, args: Arg[], deadlineMs?: number, attempts = 8): Promise<Reply> {
  for (let i = 1; ; i++) {
    const ep = await target.endpointFor(key);
    const conn = await ep.command();
    try {
      return await conn.send(args, deadlineMs);
    } catch (e) {
      if (!isRedirect(e) || i >= attempts) throw e;
      await target.rerouted(key, e);
      if (e.code !== "MOVED") await sleep(Math.min(200, 10 * 2 ** (i - 1)));
    }
  }
}
