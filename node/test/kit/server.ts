// Real servers with the module, on free loopback ports, in temporary directories.
import { ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

import { parseInfo, parseLockInfo, type KitLockInfo } from "./info.js";
import { RespConn, RespError, type RespValue } from "./resp.js";
import { PATIENCE_MS, sleep } from "./wait.js";

/** The repository root (this file runs from node/build/test/kit/ or node/test/kit/). */
export const REPO = resolve(__dirname, existsSync(resolve(__dirname, "../../../../Cargo.toml")) ? "../../../.." : "../../..");
/** The server binary: `REDIS_LOCK_SERVER`, default `redis-server`. */
export const SERVER_BINARY = process.env["REDIS_LOCK_SERVER"] || "redis-server";
/** The module: `REDIS_LOCK_MODULE`, default the repository's debug build (absolute path). */
export const MODULE_PATH = resolve(process.env["REDIS_LOCK_MODULE"] || join(REPO, "target", "debug", "libredis_lock.so"));

// Every process the kit starts, killed synchronously when this process exits (a safety net
// under the kit's teardown: a crashed test file leaves no server behind).
const live = new Set<ChildProcess>();
const tempDirs = new Set<string>();
let exitHookInstalled = false;
function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const p of live) {
      try {
        if (p.pid !== undefined) {
          process.kill(p.pid, "SIGCONT");
          process.kill(p.pid, "SIGKILL");
        }
      } catch {
        // already gone
      }
    }
    for (const d of tempDirs) rmSync(d, { recursive: true, force: true });
  });
}

/** Registers a child process for the exit safety net (the kit's own use). */
export function track(p: ChildProcess): void {
  installExitHook();
  live.add(p);
  p.once("exit", () => live.delete(p));
}

/** A fresh temporary directory, removed at process exit at the latest. */
export function tempDir(prefix = "redis-lock-node-"): string {
  installExitHook();
  const d = mkdtempSync(join(tmpdir(), prefix));
  tempDirs.add(d);
  return d;
}

/** Removes a directory made by {@link tempDir}. */
export function removeTempDir(d: string): void {
  rmSync(d, { recursive: true, force: true });
  tempDirs.delete(d);
}

/** A free TCP port on 127.0.0.1 (the kernel's choice). */
export async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, "127.0.0.1");
  await once(srv, "listening");
  const addr = srv.address();
  srv.close();
  await once(srv, "close");
  if (addr === null || typeof addr === "string") throw new Error("no port");
  return addr.port;
}

async function portFree(port: number): Promise<boolean> {
  const srv = createServer();
  return new Promise((res) => {
    srv.once("error", () => res(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => res(true)));
  });
}

/** A free port at most 55535 whose port + 10000 (the cluster bus) is free too. */
export async function freeClusterPort(): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const p = await freePort();
    if (p <= 55535 && (await portFree(p + 10000))) return p;
  }
  throw new Error("no free port at or under 55535 with a free cluster bus port");
}

/** Waits until `p` has exited. */
export async function exited(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  await once(p, "exit");
}

/** How a server is started. */
export interface ServerOptions {
  /** Extra `--name value` arguments, after the defaults (so they override them). */
  args?: string[];
  /** `--appendonly yes` (with `appendfsync always`) instead of no persistence. */
  appendonly?: boolean;
  /** The module to load (default {@link MODULE_PATH}); null loads none. */
  module?: string | null;
  /** The server binary (default {@link SERVER_BINARY}). */
  binary?: string;
  /** Start as a cluster node (`--cluster-enabled yes`, a port with a free bus port). */
  cluster?: boolean;
  /** Use this directory (kept at close) instead of a fresh temporary one. */
  dir?: string;
  /** Use this port instead of a free one. */
  port?: number;
}

/** One server process with the module, on 127.0.0.1. */
export class Server {
  readonly host = "127.0.0.1";
  port = 0;
  readonly dir: string;
  private readonly ownsDir: boolean;
  private proc: ChildProcess | null = null;
  private admin: RespConn | null = null;
  private stopped = false;
  private closedForGood = false;

  constructor(readonly options: ServerOptions = {}) {
    this.ownsDir = options.dir === undefined;
    this.dir = options.dir ?? tempDir("redis-lock-node-srv-");
    if (options.port !== undefined) this.port = options.port;
  }

  /** "127.0.0.1:port". */
  get name(): string {
    return `${this.host}:${this.port}`;
  }

  /** `redis://127.0.0.1:port`. */
  get url(): string {
    return `redis://${this.host}:${this.port}`;
  }

  /** The process id (undefined when not running). */
  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Is the process running (possibly paused)? */
  get alive(): boolean {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** Is it stopped with SIGSTOP? */
  get paused(): boolean {
    return this.stopped;
  }

  /** The command line arguments (without the binary) for `port`. */
  argv(port: number): string[] {
    const o = this.options;
    const args = [
      "--port", String(port),
      "--bind", this.host,
      "--save", "",
      "--appendonly", o.appendonly ? "yes" : "no",
      "--dir", this.dir,
      "--logfile", join(this.dir, "server.log"),
    ];
    if (o.appendonly) args.push("--appendfsync", "always");
    const module = o.module === undefined ? MODULE_PATH : o.module;
    if (module !== null) args.push("--loadmodule", module);
    if (o.cluster) {
      args.push("--cluster-enabled", "yes", "--cluster-config-file", join(this.dir, "nodes.conf"), "--cluster-node-timeout", "5000");
    }
    args.push(...(o.args ?? []));
    return args;
  }

  /** Starts the process and waits until it answers PING (loading done). The first start picks
   *  a free port (up to 5 tries); later starts (a restart) reuse the port and directory. */
  async start(): Promise<void> {
    if (this.closedForGood) throw new Error("server closed");
    if (this.alive) return;
    const module = this.options.module === undefined ? MODULE_PATH : this.options.module;
    if (module !== null && !existsSync(module)) {
      throw new Error(`module not found at ${module} (set REDIS_LOCK_MODULE, or build it: cargo build --features test-hooks)`);
    }
    const fixed = this.port !== 0;
    const deadline = performance.now() + PATIENCE_MS;
    let last = "";
    for (let attempt = 0; ; attempt++) {
      const port = fixed ? this.port : this.options.cluster ? await freeClusterPort() : await freePort();
      const why = await this.spawnOn(port);
      if (why === null) {
        this.port = port;
        return;
      }
      last = why;
      if ((!fixed && attempt >= 4) || (fixed && performance.now() > deadline)) break;
      if (fixed) await sleep(100);
    }
    throw new Error(`${this.options.binary ?? SERVER_BINARY} did not start (${last}); log:\n${this.log()}`);
  }

  private async spawnOn(port: number): Promise<string | null> {
    const binary = this.options.binary ?? SERVER_BINARY;
    const p = spawn(binary, this.argv(port), { stdio: "ignore" });
    track(p);
    let spawnError: Error | null = null;
    p.once("error", (e) => {
      spawnError = e;
    });
    const deadline = performance.now() + PATIENCE_MS;
    while (performance.now() < deadline) {
      if (spawnError !== null) {
        throw new Error(`cannot start ${binary}: ${(spawnError as Error).message} (is it installed? scripts/ensure-deps.sh)`);
      }
      if (p.exitCode !== null || p.signalCode !== null) return `exited: ${p.exitCode ?? p.signalCode}`;
      const c = new RespConn(port);
      try {
        await c.ready;
        const r = await c.send(["PING"], 1000);
        if (r === "PONG") {
          this.proc = p;
          this.stopped = false;
          return null;
        }
      } catch {
        // not yet listening, or LOADING
      } finally {
        c.close();
      }
      await sleep(20);
    }
    p.kill("SIGKILL");
    await exited(p);
    return `no PING reply within ${PATIENCE_MS} ms`;
  }

  /** The last 2000 characters of the server's log. */
  log(): string {
    try {
      return readFileSync(join(this.dir, "server.log"), "utf8").slice(-2000);
    } catch {
      return "";
    }
  }

  private dropAdmin(): void {
    this.admin?.close();
    this.admin = null;
  }

  /** Sends one command on the kit's own admin connection (re-opened as needed). Integers come
   *  back as bigint; an error reply rejects with RespError. */
  async call(args: ReadonlyArray<string | number | bigint | Buffer>, timeoutMs = 10_000): Promise<RespValue> {
    if (this.admin === null || this.admin.closed) {
      this.dropAdmin();
      this.admin = new RespConn(this.port, this.host);
    }
    const c = this.admin;
    await c.ready;
    return c.send(args, timeoutMs);
  }

  /** `LOCK.INFO key`, read exactly; null when the key does not exist. */
  async lockInfo(key: string): Promise<KitLockInfo | null> {
    return parseLockInfo(await this.call(["LOCK.INFO", key]));
  }

  /** How many clients wait on `key` (LOCK.INFO `waiting`; 0 when the key does not exist). */
  async waiting(key: string): Promise<number> {
    const i = await this.lockInfo(key);
    return i === null ? 0 : Number(i.waiting);
  }

  /** The owners holding `key` now. */
  async holders(key: string): Promise<string[]> {
    const i = await this.lockInfo(key);
    return i === null ? [] : i.holders.map((h) => h.owner);
  }

  /** `INFO <section>` as a map. */
  async info(section: string): Promise<Map<string, string>> {
    return parseInfo(String(await this.call(["INFO", section])));
  }

  /** FLUSHALL and CONFIG RESETSTAT: a clean server for the next test. */
  async reset(): Promise<void> {
    await this.call(["FLUSHALL"]);
    await this.call(["CONFIG", "RESETSTAT"]);
  }

  /** SIGSTOP: the server keeps its sockets but answers nothing until {@link resume}. */
  pause(): void {
    if (!this.alive || this.proc === null) throw new Error(`server ${this.name} is not running`);
    this.proc.kill("SIGSTOP");
    this.stopped = true;
  }

  /** SIGCONT after {@link pause}. */
  resume(): void {
    if (this.proc !== null && this.alive) this.proc.kill("SIGCONT");
    this.stopped = false;
  }

  /** Sends a signal to the process (no wait). */
  signal(sig: NodeJS.Signals): void {
    if (this.proc === null) throw new Error(`server ${this.name} is not running`);
    this.proc.kill(sig);
  }

  /** SIGKILL (no shutdown save) and waits for the exit. */
  async kill(): Promise<void> {
    this.dropAdmin();
    const p = this.proc;
    if (p === null) return;
    if (this.stopped) p.kill("SIGCONT");
    p.kill("SIGKILL");
    await exited(p);
    this.proc = null;
    this.stopped = false;
  }

  /** A clean shutdown (SIGTERM: with appendonly the AOF is flushed) and waits for the exit
   *  (SIGKILL after the kit's patience). */
  async stop(): Promise<void> {
    this.dropAdmin();
    const p = this.proc;
    if (p === null) return;
    if (this.stopped) p.kill("SIGCONT");
    this.stopped = false;
    p.kill("SIGTERM");
    const t = setTimeout(() => p.kill("SIGKILL"), PATIENCE_MS);
    t.unref();
    await exited(p);
    clearTimeout(t);
    this.proc = null;
  }

  /** Stops (SIGTERM, or SIGKILL with `kill: true`) and starts again on the same port and
   *  directory with the same arguments: what survives is what was on disk. */
  async restart(opts: { kill?: boolean } = {}): Promise<void> {
    if (opts.kill) await this.kill();
    else await this.stop();
    await this.start();
  }

  /** Kills the process and removes its directory (unless it was given). Never throws. */
  async close(): Promise<void> {
    this.closedForGood = true;
    try {
      await this.kill();
    } catch {
      // gone
    }
    if (this.ownsDir) removeTempDir(this.dir);
  }
}

export { RespError };
