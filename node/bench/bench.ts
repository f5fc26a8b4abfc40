// Benchmark of the Node client (redis-lock-client) against redlock 5.0.0-beta.2 (polling), on one
// server with the module's release build, started here on a free loopback port:
//
// 1. Uncontended acquire + release pairs per second, one after the other from one client, with
//    what each pair costs the server (the `usec` of INFO commandstats) and commands per pair.
// 2. Hand-over with 16 waiters (each its own client and Redlock, in this process): the time from
//    a holder starting its release to the next holder's acquire returning, p50 and p99.
//
// Writes a markdown section between two markers at the end of `--out` (replacing an earlier
// one), or prints it. Run by `make bench-node` (and `make bench`); the module comes from
// REDIS_LOCK_MODULE (default: the repository's release build).
//
//   node build/bench/bench.js [--out docs/benchmarks.md] [--pairs N] [--repeats N] [--rounds N]
//                             [--only ours|redlock]
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { cpus, arch } from "node:os";
import { join } from "node:path";

import { Redis as IORedis } from "ioredis";

import Redlock from "../src/index.js";
import { closeClient, commandstats, makeIoredis, makeNodeRedis, now, percentile, REPO, Server, sleep } from "../test/kit/index.js";

// redlock's package.json "exports" name no types (NodeNext finds none): its API as used here.
interface PollingLock { release(): Promise<unknown> }
interface PollingRedlock { acquire(resources: string[], duration: number): Promise<PollingLock> }
type PollingSettings = { retryCount?: number; retryDelay?: number; retryJitter?: number };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const RedlockPolling = (require("redlock") as { default: new (clients: unknown[], settings?: PollingSettings) => PollingRedlock }).default;

const START = "<!-- node-bench:start -->";
const END = "<!-- node-bench:end -->";

interface Args {
  out: string | null;
  pairs: number;
  repeats: number;
  rounds: number;
  only: "ours" | "redlock" | null;
}

function parseArgs(argv: string[]): Args {
  const a: Args = { out: null, pairs: 3000, repeats: 5, rounds: 50, only: null };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i + 1];
    switch (argv[i]) {
      case "--out": a.out = v ?? null; i++; break;
      case "--pairs": a.pairs = Number(v); i++; break;
      case "--repeats": a.repeats = Number(v); i++; break;
      case "--rounds": a.rounds = Number(v); i++; break;
      case "--only": a.only = v === "ours" || v === "redlock" ? v : null; i++; break;
      default: throw new Error(`unknown argument ${argv[i]} (see the header of node/bench/bench.ts)`);
    }
  }
  return a;
}

function version(pkg: string): string {
  try {
    return String(JSON.parse(readFileSync(join(__dirname, "../../node_modules", pkg, "package.json"), "utf8")).version);
  } catch {
    return "?";
  }
}

/** The server's commandstats usec and calls, without INFO and CONFIG. */
async function serverFigures(s: Server): Promise<{ usec: number; calls: number }> {
  let usec = 0;
  let calls = 0;
  for (const [name, st] of await commandstats(s)) {
    if (name === "info" || name === "config" || name.startsWith("config|")) continue;
    usec += st.usec;
    calls += st.calls;
  }
  return { usec, calls };
}

type Pair = () => Promise<void>;
interface PairFigures { rate: number; usec: number; calls: number }

function median(xs: number[]): number {
  return percentile(xs, 50);
}

async function measurePairs(s: Server, pair: Pair, n: number, repeats: number): Promise<PairFigures> {
  for (let i = 0; i < Math.min(300, n); i++) await pair();
  const rates: number[] = [];
  const usecs: number[] = [];
  const calls: number[] = [];
  for (let r = 0; r < repeats; r++) {
    await s.call(["CONFIG", "RESETSTAT"]);
    const a = await serverFigures(s);
    const t0 = now();
    for (let i = 0; i < n; i++) await pair();
    const elapsed = (now() - t0) / 1000;
    const b = await serverFigures(s);
    rates.push(n / elapsed);
    usecs.push((b.usec - a.usec) / n);
    calls.push((b.calls - a.calls) / n);
  }
  return { rate: median(rates), usec: median(usecs), calls: median(calls) };
}

/** A waiter's acquire and release. */
interface Waiter { acquire(): Promise<void>; release(): Promise<void> }
interface HandoverFigures { p50: number; p99: number; max: number; rate: number; samples: number; again: number }

async function measureHandover(makeWaiter: () => Promise<Waiter>, waiters: number, rounds: number): Promise<HandoverFigures> {
  const ws: Waiter[] = [];
  for (let i = 0; i < waiters; i++) ws.push(await makeWaiter());
  const latencies: number[] = [];
  let released: number | null = null;
  let last = -1;
  let again = 0;
  const t0 = now();
  await Promise.all(
    ws.map(async (w, index) => {
      for (let r = 0; r < rounds; r++) {
        await w.acquire();
        const t = now();
        if (released !== null && index !== last) latencies.push(t - released);
        if (index === last) again++;
        last = index;
        released = null;
        await sleep(1);
        released = now();
        await w.release();
      }
    }),
  );
  const elapsed = (now() - t0) / 1000;
  return {
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    max: Math.max(...latencies),
    rate: (waiters * rounds) / elapsed,
    samples: latencies.length,
    again: (100 * again) / Math.max(1, waiters * rounds - 1),
  };
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2));
  const module = process.env["REDIS_LOCK_MODULE"] || join(REPO, "target", "release", "libredis_lock.so");
  if (!existsSync(module)) throw new Error(`no module at ${module} (cargo build --release, or set REDIS_LOCK_MODULE)`);
  const server = new Server({ module });
  const closers: (() => Promise<unknown>)[] = [];
  const pairs: [string, PairFigures][] = [];
  const handovers: [string, HandoverFigures][] = [];
  let serverName = "";
  try {
    await server.start();
    const info = await server.info("server");
    serverName = `${info.has("valkey_version") ? "valkey-server " + info.get("valkey_version") : "redis-server " + info.get("redis_version")}`;
    const ioredis = (): IORedis => {
      const c = makeIoredis(server);
      closers.push(() => closeClient(c));
      return c;
    };
    const ours = (r: Redlock): Redlock => {
      closers.push(() => r.quit());
      return r;
    };

    // 1. pairs
    const pairVariants: [string, () => Promise<Pair>, "ours" | "redlock"][] = [
      ["redis-lock-client `acquire` + `release` (ioredis)", async () => {
        const r = ours(new Redlock([ioredis()], { retryCount: 0 }));
        return async () => { await (await r.acquire(["bench:pairs"], 10_000)).release(); };
      }, "ours"],
      ["redis-lock-client `acquire` + `release` (node-redis 5)", async () => {
        const c = await makeNodeRedis(server);
        closers.push(() => closeClient(c));
        const r = ours(new Redlock([c], { retryCount: 0 }));
        return async () => { await (await r.acquire(["bench:pairs"], 10_000)).release(); };
      }, "ours"],
      [`redlock ${version("redlock")} \`acquire\` + \`release\` (ioredis)`, async () => {
        const r = new RedlockPolling([ioredis()], { retryCount: 0 });
        return async () => { await (await r.acquire(["bench:pairs"], 10_000)).release(); };
      }, "redlock"],
    ];
    for (const [name, make, who] of pairVariants) {
      if (args.only !== null && args.only !== who) continue;
      process.stderr.write(`pairs: ${name} ...\n`);
      pairs.push([name, await measurePairs(server, await make(), args.pairs, args.repeats)]);
      await server.call(["FLUSHALL"]);
    }

    // 2. hand-over
    const handoverVariants: [string, () => Promise<Waiter>, number, "ours" | "redlock"][] = [
      ["redis-lock-client (server FIFO queue, `wait: 60000`)", async () => {
        const r = ours(new Redlock([ioredis()], { wait: 60_000 }));
        let lock: Awaited<ReturnType<Redlock["acquire"]>> | null = null;
        return {
          acquire: async () => { lock = await r.acquire(["bench:handover"], 10_000); },
          release: async () => { await lock?.release(); },
        };
      }, args.rounds, "ours"],
      [`redlock ${version("redlock")} (polling: retryCount -1, retryDelay 10, retryJitter 5)`, async () => {
        const r = new RedlockPolling([ioredis()], { retryCount: -1, retryDelay: 10, retryJitter: 5 });
        let lock: PollingLock | null = null;
        return {
          acquire: async () => { lock = await r.acquire(["bench:handover"], 10_000); },
          release: async () => { await lock?.release(); },
        };
      }, args.rounds, "redlock"],
    ];
    for (const [name, make, rounds, who] of handoverVariants) {
      if (args.only !== null && args.only !== who) continue;
      process.stderr.write(`hand-over: ${name} ...\n`);
      handovers.push([name, await measureHandover(make, 16, rounds)]);
      await server.call(["FLUSHALL"]);
    }
  } finally {
    for (const c of closers.reverse()) await c().catch(() => undefined);
    await server.close();
  }

  const f = (x: number, d: number): string => x.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
  const lines = [
    START,
    "## Node.js client (redis-lock-client)",
    "",
    "Measured by `node/bench/bench.ts`; reproduce with `make bench-node` (or `make bench`, which runs it",
    `after the Python benchmark). ${new Date().toISOString().slice(0, 10)}, ${cpus().length} CPUs (${arch()}), Node ${process.version},`,
    `ioredis ${version("ioredis")}, node-redis ${version("redis")}, redlock ${version("redlock")}, ${serverName} with the module's release`,
    "build, on loopback; the client and the server are not pinned to CPUs, so figures move with the",
    "machine's load.",
    "",
    `Uncontended acquire + release, one pair after the other from one client (median of ${args.repeats} runs of`,
    `${args.pairs} pairs). Server cost per pair: the \`usec\` of INFO commandstats; commands per pair counts those`,
    "inside scripts too (redlock runs its acquire and release as Lua scripts).",
    "",
    "| lock | pairs/s | server µs per pair (commandstats) | commands per pair |",
    "| --- | ---: | ---: | ---: |",
    ...pairs.map(([name, m]) => `| ${name} | ${f(m.rate, 0)} | ${f(m.usec, 1)} | ${f(m.calls, 1)} |`),
    "",
    `Hand-over with 16 waiters: 16 clients, each with its own Redlock, in one Node process, each take the`,
    `lock ${args.rounds} times and hold it 1 ms; the latency is from a holder starting its release to another`,
    "waiter's acquire returning (a holder that takes the lock again itself hands nothing over: those are",
    "not samples, and the last column counts them).",
    "",
    "| lock | p50 ms | p99 ms | max ms | hand-overs/s | samples | taken again by its last holder |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ...handovers.map(([name, m]) => `| ${name} | ${f(m.p50, 2)} | ${f(m.p99, 2)} | ${f(m.max, 1)} | ${f(m.rate, 0)} | ${m.samples} | ${f(m.again, 0)} % |`),
    "",
    "redis-lock-client's waiters block in the server's queue (`LOCK.ACQUIRE ... WAIT`, each on its own",
    "connection) and the lock is handed to the head waiter inside the release, so a hand-over costs one",
    "reply; redlock's waiters poll (`SET NX` in a script every `retryDelay` ± `retryJitter` ms), so a",
    "hand-over waits for the next poll of whichever waiter comes first, and the order is random:",
    "the holder that just released, asking again at once, often wins against the 15 that waited (last",
    "column) while the others' polls wait; with the queue each release goes to the next in line.",
    END,
    "",
  ];
  const section = lines.join("\n");
  if (args.out !== null) {
    let text = existsSync(args.out) ? readFileSync(args.out, "utf8") : "";
    if (text.includes(START)) {
      const [before, rest] = [text.slice(0, text.indexOf(START)), text.slice(text.indexOf(START))];
      const after = rest.includes(END) ? rest.slice(rest.indexOf(END) + END.length) : "";
      text = before.replace(/\n+$/, "") + "\n\n" + after.replace(/^\n+/, "");
    }
    text = text.replace(/\n+$/, "") + "\n\n" + section;
    writeFileSync(args.out, text);
    process.stderr.write(`wrote the Node.js section of ${args.out}\n`);
  } else {
    process.stdout.write(section);
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
    process.exit(1);
  },
);
