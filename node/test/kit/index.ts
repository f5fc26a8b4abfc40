// The shared test kit for the Node package: real servers with the module (no mocks), clusters,
// TLS, client factories, child processes, polling and INFO helpers. See kit.ts for the Kit.
export { CLIENT_KINDS, Kit, useKit, type ClientKind, type HasAfter } from "./kit.js";
export {
  MODULE_PATH,
  REPO,
  SERVER_BINARY,
  Server,
  exited,
  freeClusterPort,
  freePort,
  tempDir,
  removeTempDir,
  type ServerOptions,
} from "./server.js";
export { Cluster, cliBinary, keySlot } from "./cluster.js";
export { TlsServer, makeCertificates, type Certificates } from "./tls.js";
export {
  HOST_VARIANTS,
  closeClient,
  hostDescription,
  hostModule,
  hostVariant,
  makeIoredis,
  makeIoredisCluster,
  makeNodeRedis,
  makeNodeRedis4,
  moduleVersion,
  type Address,
  type HostVariant,
  type NodeRedis4,
  type NodeRedis4Options,
  type NodeRedis5,
  type NodeRedis5Options,
} from "./clients.js";
export { PACKAGE_ENTRY, holderScript, parseHeld, spawnHolder, spawnNode, type Child, type HolderOptions, type SpawnNodeOptions } from "./child.js";
export { PATIENCE_MS, TIMING_SCALE, now, percentile, scaled, sleep, until, waitFor, type WaitForOptions } from "./wait.js";
export { parseCommandstats, parseInfo, parseLockInfo, type CommandStat, type KitHolder, type KitLockInfo } from "./info.js";
export { RespConn, RespError, command, encode, parseReply, type RespValue } from "./resp.js";
export { HoldBackProxy, type HoldBackOptions } from "./proxy.js";

import { parseCommandstats, type CommandStat } from "./info.js";
import type { Server } from "./server.js";

/** INFO commandstats of `server`, by command name in lower case (`lock.acquire`, ...). */
export async function commandstats(server: Server): Promise<Map<string, CommandStat>> {
  return parseCommandstats(String(await server.call(["INFO", "commandstats"])));
}

/** Calls of the module's commands (`lock.*`) on `server` since its last CONFIG RESETSTAT. */
export async function lockCalls(server: Server): Promise<number> {
  let n = 0;
  for (const [name, s] of await commandstats(server)) if (name.startsWith("lock.")) n += s.calls;
  return n;
}

/** How many times `command` (lower case, e.g. `lock.acquire`) ran on `server` since its last
 *  CONFIG RESETSTAT (0 when never). */
export async function commandCalls(server: Server, command: string): Promise<number> {
  return (await commandstats(server)).get(command.toLowerCase())?.calls ?? 0;
}

/** A maker of distinct key names `${prefix}:${name}:${pid}:${n}` (one per call), so tests of
 *  one file (and files run one after another against shared servers) never share a key. */
export function uniqueKeys(prefix: string): (name: string) => string {
  let n = 0;
  return (name) => `${prefix}:${name}:${process.pid}:${++n}`;
}
