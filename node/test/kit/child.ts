// Child Node processes a test can SIGKILL: a lock holder that acquires and then sleeps.
import { ChildProcess, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

import { hostModule } from "./clients.js";
import { exited, tempDir, track } from "./server.js";

/** The compiled package the tests import (build/src/index.js, next to build/test/). */
export const PACKAGE_ENTRY = resolve(__dirname, "../../src/index.js");

/** A running child Node process. */
export interface Child {
  readonly proc: ChildProcess;
  readonly pid: number;
  /** The line that said the child was ready (e.g. `held 17 owner`). */
  readonly readyLine: string;
  /** Every stdout line so far. */
  readonly lines: string[];
  /** Its stderr so far. */
  stderr(): string;
  /** Sends a signal and waits for the exit (SIGKILL by default). */
  kill(sig?: NodeJS.Signals): Promise<void>;
  /** Resolves when the process has exited. */
  readonly exited: Promise<void>;
}

/** Options of {@link spawnNode}. */
export interface SpawnNodeOptions {
  /** The first stdout line matching this means ready (default /^held\b/). */
  ready?: RegExp;
  /** How long to wait for it (ms, default 20 s). */
  timeoutMs?: number;
  /** Extra environment variables. */
  env?: Record<string, string>;
}

/** Runs `code` (CommonJS) in a new Node process and waits until it prints a line matching
 *  `ready`; kills it and rejects (with its output) when it exits or times out first. */
export async function spawnNode(code: string, opts: SpawnNodeOptions = {}): Promise<Child> {
  const dir = tempDir("redis-lock-node-child-");
  const file = join(dir, "child.js");
  writeFileSync(file, code);
  const proc = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...(opts.env ?? {}) } });
  track(proc);
  const lines: string[] = [];
  let err = "";
  let partial = "";
  const ready = opts.ready ?? /^held\b/;
  const done = exited(proc);
  const readyLine = await new Promise<string>((res, rej) => {
    const timer = setTimeout(() => fail(`no ready line within ${opts.timeoutMs ?? 20_000} ms`), opts.timeoutMs ?? 20_000);
    function fail(why: string): void {
      clearTimeout(timer);
      proc.kill("SIGKILL");
      rej(new Error(`child process: ${why}\nstdout: ${lines.join("\n")}${partial}\nstderr: ${err}`));
    }
    proc.stderr!.on("data", (d: Buffer) => {
      err += d.toString();
    });
    proc.stdout!.on("data", (d: Buffer) => {
      partial += d.toString();
      let i: number;
      while ((i = partial.indexOf("\n")) >= 0) {
        const line = partial.slice(0, i);
        partial = partial.slice(i + 1);
        lines.push(line);
        if (ready.test(line)) {
          clearTimeout(timer);
          res(line);
        }
      }
    });
    proc.once("exit", (code, sig) => fail(`exited (${code ?? sig}) before it was ready`));
  });
  return {
    proc,
    pid: proc.pid!,
    readyLine,
    lines,
    stderr: () => err,
    exited: done,
    kill: async (sig: NodeJS.Signals = "SIGKILL") => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(sig);
      await done;
    },
  };
}

/** What a holder child does. */
export interface HolderOptions {
  port: number;
  key: string;
  /** Lock duration (ms). */
  ttl: number;
  /** Take the lock with `bind: true` (package) / `BIND` (raw). */
  bind?: boolean;
  /** "package": `new Redlock([ioredis]).acquire(...)` from the compiled package (default);
   *  "raw": `LOCK.ACQUIRE` through ioredis (for testing the kit without the package). */
  via?: "package" | "raw";
  /** The owner for "raw" (default: `holder-<pid>`). */
  owner?: string;
}

/** The source of a holder: takes the lock, prints `held <token> <owner>`, then sleeps forever. */
export function holderScript(o: HolderOptions): string {
  const ioredis = JSON.stringify(require.resolve(hostModule("ioredis")));
  const head = `"use strict";
const Redis = require(${ioredis});
const client = new Redis({ host: "127.0.0.1", port: ${o.port}${(o.via ?? "package") === "raw" ? ", stringNumbers: true" : ""} });
client.on("error", () => {});
function fail(e) { process.stderr.write(String(e && e.stack || e) + "\\n"); process.exit(2); }
setInterval(() => {}, 1 << 30);
`;
  if ((o.via ?? "package") === "raw") {
    const owner = JSON.stringify(o.owner ?? "");
    return `${head}
const owner = ${owner} || ("holder-" + process.pid);
client.call("LOCK.ACQUIRE", ${JSON.stringify(o.key)}, owner, ${o.ttl}${o.bind ? ', "BIND"' : ""}).then((t) => {
  if (t === null) fail("not granted");
  process.stdout.write("held " + String(t) + " " + owner + "\\n");
}, fail);
`;
  }
  return `${head}
const mod = require(${JSON.stringify(PACKAGE_ENTRY)});
const Redlock = mod.Redlock || mod.default;
const redlock = new Redlock([client], { retryCount: 0 });
redlock.acquire([${JSON.stringify(o.key)}], ${o.ttl}${o.bind ? ", { bind: true }" : ""}).then((lock) => {
  process.stdout.write("held " + String(lock.fencingToken) + " " + lock.value + "\\n");
}, fail);
`;
}

/** Starts a holder child (see {@link holderScript}) and waits until it holds the lock. */
export function spawnHolder(o: HolderOptions): Promise<Child> {
  return spawnNode(holderScript(o));
}

/** Parses a holder's ready line: its token and owner. */
export function parseHeld(line: string): { token: bigint; owner: string } {
  const [, token, owner] = line.split(" ");
  if (token === undefined || owner === undefined) throw new Error(`not a held line: ${line}`);
  return { token: BigInt(token), owner };
}
