/**
 * Which adapter drives a user's client, found by its shape; and sending one short command to
 * where a key lives (following cluster redirects).
 * @internal
 */
import { IoredisClusterTarget, ioredisTarget, type IoredisClusterLike, type IoredisLike } from "./ioredis.js";
import { nodeRedisTarget, type NodeRedisLike } from "./noderedis.js";
import { ServerReplyError, UnsupportedClientError, isRedirect, type Arg, type Conn, type Endpoint, type Reply, type Target, type TargetOptions } from "./types.js";

function isObject(x: unknown): x is Record<string, unknown> {
  return x !== null && typeof x === "object";
}

/** Detects ioredis Redis, ioredis Cluster, node-redis v4, v5 and v6 (createClient) by shape. */
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
    return ioredisTarget(client as unknown as IoredisLike, opts);
  }
  if (typeof client["duplicate"] === "function" && typeof client["sendCommand"] === "function" && "isOpen" in client) {
    return nodeRedisTarget(client as unknown as NodeRedisLike, opts);
  }
  if (typeof client["sendCommand"] === "function" && typeof client["getSlotMaster"] === "function") {
    throw new UnsupportedClientError("node-redis cluster clients (createCluster) are not supported: use ioredis Cluster or one client per master");
  }
  throw new UnsupportedClientError("expected an ioredis Redis or Cluster, or a node-redis v4/v5/v6 client (createClient)");
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Sends one short (non-blocking) command about `key` over the command connection of the
 *  endpoint serving it, following MOVED / ASK / TRYAGAIN / CLUSTERDOWN replies (routing
 *  refreshed, sent again) for up to `attempts` tries. `deadlineMs` bounds each send and each
 *  routing step (Target.endpointFor / rerouted). Never use it for a blocking wait. */
export async function sendRouted(target: Target, key: string, args: Arg[], deadlineMs?: number, attempts = 8): Promise<Reply> {
  for (let i = 1; ; i++) {
    const ep = await target.endpointFor(key, deadlineMs);
    const conn = await ep.command();
    try {
      return await conn.send(args, deadlineMs);
    } catch (e) {
      if (!isRedirect(e) || i >= attempts) throw e;
      await target.rerouted(key, e, deadlineMs);
      if (e.code !== "MOVED") await sleep(Math.min(200, 10 * 2 ** (i - 1)));
    }
  }
}

/** What {@link sendWaitRouted} gives back: the reply, and the wait connection it came on (the
 *  caller keeps it for a bound hold, or hands it back with `endpoint.releaseWaitConn`). */
export interface WaitResult {
  reply: Reply;
  conn: Conn;
  endpoint: Endpoint;
}

/** Sends one blocking wait about `key` on a wait connection of the endpoint serving it. A wait
 *  the server *answered* with MOVED / ASK / TRYAGAIN / CLUSTERDOWN (its key moved away while
 *  it was queued: SPEC "Moving keys") is sent again where the key lives now, with fresh
 *  arguments from `args()` (the time left); a wait with no answer (connection lost, deadline,
 *  abort) is never sent again: its connection is destroyed and the error thrown
 *  (ConnectionLostError, ReplyTimeoutError, or the signal's reason). */
export async function sendWaitRouted(
  target: Target,
  key: string,
  args: () => Arg[],
  opts: { signal?: AbortSignal; deadlineMs?: () => number | undefined; attempts?: number } = {},
): Promise<WaitResult> {
  const attempts = opts.attempts ?? 8;
  for (let i = 1; ; i++) {
    const endpoint = await target.endpointFor(key, opts.deadlineMs?.());
    const conn = await endpoint.acquireWaitConn(opts.signal);
    let onAbort: (() => void) | undefined;
    try {
      const sent = conn.send(args(), opts.deadlineMs?.());
      const reply = opts.signal
        ? await new Promise<Reply>((resolve, reject) => {
            const signal = opts.signal as AbortSignal;
            onAbort = () => reject(signal.reason ?? new Error("aborted"));
            if (signal.aborted) onAbort();
            else signal.addEventListener("abort", onAbort, { once: true });
            sent.then(resolve, reject);
          })
        : await sent;
      return { reply, conn, endpoint };
    } catch (e) {
      if (isRedirect(e) && i < attempts) {
        // answered: the connection is in step and the wait is over; sent again where the key is
        endpoint.releaseWaitConn(conn);
        await target.rerouted(key, e, opts.deadlineMs?.());
        if (e.code !== "MOVED") await sleep(Math.min(200, 10 * 2 ** (i - 1)));
        continue;
      }
      if (e instanceof ServerReplyError) endpoint.releaseWaitConn(conn);
      else conn.destroy(); // cut short: never reused, never re-sent
      throw e;
    } finally {
      if (onAbort && opts.signal) opts.signal.removeEventListener("abort", onAbort);
    }
  }
}
