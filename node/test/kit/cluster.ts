// A Redis Cluster of masters on loopback, the module loaded on each.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, join } from "node:path";

import { parseInfo } from "./info.js";
import { Server, SERVER_BINARY, type ServerOptions } from "./server.js";
import { waitFor } from "./wait.js";

/** The CLI that goes with the server binary (valkey-cli for valkey-server), found on PATH. */
export function cliBinary(): string {
  const names = SERVER_BINARY.includes("valkey") ? ["valkey-cli", "redis-cli"] : ["redis-cli", "valkey-cli"];
  // The CLI next to a server given by path comes first.
  if (SERVER_BINARY.includes("/")) {
    const dir = SERVER_BINARY.slice(0, SERVER_BINARY.lastIndexOf("/"));
    for (const n of names) if (existsSync(join(dir, n))) return join(dir, n);
  }
  for (const n of names) {
    for (const d of (process.env["PATH"] ?? "").split(delimiter)) {
      if (d && existsSync(join(d, n))) return join(d, n);
    }
  }
  throw new Error("redis-cli (or valkey-cli) is needed to create a cluster");
}

function run(cmd: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.join(" ")}: ${err.message}\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

const CRC16_TABLE: number[] = (() => {
  const t: number[] = [];
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t.push(c);
  }
  return t;
})();

/** The cluster hash slot of `key` (CRC16/XMODEM of the key or its `{hash tag}`, mod 16384). */
export function keySlot(key: string | Buffer): number {
  let b = Buffer.isBuffer(key) ? key : Buffer.from(key);
  const open = b.indexOf("{");
  if (open >= 0) {
    const close = b.indexOf("}", open + 1);
    if (close > open + 1) b = b.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of b) crc = ((crc << 8) ^ (CRC16_TABLE[((crc >> 8) ^ byte) & 0xff] as number)) & 0xffff;
  return crc % 16384;
}

/** Three (or more) masters, no replicas, made with `redis-cli --cluster create`. */
export class Cluster {
  /** Slot ranges per node port, read from CLUSTER SLOTS after creation. */
  private ranges: { start: number; end: number; port: number }[] = [];

  constructor(readonly nodes: Server[]) {}

  /** Starts `masters` nodes, creates the cluster and waits until every node reports
   *  `cluster_state:ok` and sees all 16384 slots covered. */
  static async start(masters = 3, options: ServerOptions = {}): Promise<Cluster> {
    const nodes: Server[] = [];
    const cluster = new Cluster(nodes);
    try {
      for (let i = 0; i < masters; i++) {
        const s = new Server({ ...options, cluster: true });
        nodes.push(s);
        await s.start();
      }
      await run(
        cliBinary(),
        ["--cluster", "create", ...nodes.map((n) => n.name), "--cluster-replicas", "0", "--cluster-yes"],
        60_000,
      );
      await waitFor(
        async () => {
          for (const n of nodes) {
            const info = parseInfo(String(await n.call(["CLUSTER", "INFO"])));
            if (info.get("cluster_state") !== "ok") return false;
            if (info.get("cluster_slots_ok") !== "16384") return false;
            if (info.get("cluster_known_nodes") !== String(masters)) return false;
          }
          return true;
        },
        30_000,
        { intervalMs: 100, what: "cluster_state:ok on every node" },
      );
      await cluster.refreshSlots();
      return cluster;
    } catch (e) {
      await cluster.close();
      throw e;
    }
  }

  /** Re-reads the slot map (CLUSTER SLOTS of the first node). */
  async refreshSlots(): Promise<void> {
    const reply = await this.nodes[0]!.call(["CLUSTER", "SLOTS"]);
    const ranges: { start: number; end: number; port: number }[] = [];
    if (Array.isArray(reply)) {
      for (const r of reply) {
        if (!Array.isArray(r)) continue;
        const [start, end, master] = r;
        if (Array.isArray(master)) ranges.push({ start: Number(start), end: Number(end), port: Number(master[1]) });
      }
    }
    this.ranges = ranges;
  }

  /** The node serving `key`'s slot. */
  nodeFor(key: string): Server {
    const slot = keySlot(key);
    const r = this.ranges.find((x) => x.start <= slot && slot <= x.end);
    const n = r && this.nodes.find((x) => x.port === r.port);
    if (!n) throw new Error(`no node serves slot ${slot}`);
    return n;
  }

  /** A key `${prefix}N` (the smallest N) served by `node`. */
  keyOn(node: Server, prefix = "k"): string {
    for (let i = 0; i < 100_000; i++) {
      const k = `${prefix}${i}`;
      if (this.nodeFor(k) === node) return k;
    }
    throw new Error(`no key with prefix ${prefix} on ${node.name}`);
  }

  /** One key per node (`keys[i]` served by `nodes[i]`): keys in different slots on different nodes. */
  keysOnEachNode(prefix = "k"): string[] {
    return this.nodes.map((n) => this.keyOn(n, prefix));
  }

  /** The startup nodes for a cluster client. */
  get startupNodes(): { host: string; port: number }[] {
    return this.nodes.map((n) => ({ host: n.host, port: n.port }));
  }

  /** Kills every node and removes their directories. Never throws. */
  async close(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.close()));
  }
}
