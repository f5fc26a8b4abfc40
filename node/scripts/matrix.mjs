// The host library matrix: the package's tests (compiled in build/ by tsconfig.test.json) on each
// release of ioredis and node-redis the package claims, and a table of host library, version,
// Node, tests, passed, failed and time. The kit picks a release with REDIS_LOCK_NODE_HOST (see
// test/kit/clients.ts); the releases are the pinned devDependencies of package.json (`ioredis`,
// `ioredis6`, `redis4`, `redis`, `redis6`), so `npm ci` gives the same versions every time.
//
//   node scripts/matrix.mjs [--full] [variant ...]   the pinned releases (default: all five)
//   node scripts/matrix.mjs --latest                 the run of a throwaway copy whose `ioredis`
//                                                    and `redis` are the newest releases (made by
//                                                    `make test-latest-node`): every client kind
//
// Which files: an ioredis release runs every test file (the kit's admin and user clients are
// that release too); a node-redis release runs the files whose tables take the client kind
// (NODE_REDIS_FILES: connections, waits, loss notice, errors, TLS); --full runs every file on
// every release. A release whose `engines.node` this Node does not satisfy is reported as
// skipped. Each run's output goes to build/matrix/<variant>.log. Exit status 1 if any run failed.
import { spawn } from "node:child_process";
import { createWriteStream, existsSync, mkdirSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)));
const require = createRequire(join(ROOT, "package.json"));

/** The releases, as REDIS_LOCK_NODE_HOST names them (kept in step with test/kit/clients.ts). */
const VARIANTS = [
  { name: "ioredis5", library: "ioredis", module: "ioredis" },
  { name: "ioredis6", library: "ioredis", module: "ioredis6" },
  { name: "redis4", library: "redis", module: "redis4" },
  { name: "redis5", library: "redis", module: "redis" },
  { name: "redis6", library: "redis", module: "redis6" },
];

/** The named subset a node-redis release runs: every file whose tables take the client kind. */
const NODE_REDIS_FILES = [
  "hosts.test.js", // connections and protocols, loss notice, a long wait, errors as sentences
  "driver.test.js", // connections: commands, waits, exact integers, closes, deadlines
  "driver-review.test.js", // wait hand-over order, paused servers
  "watch.test.js", // the loss watcher: DEL, overwrite, take-over, reconnects
  "fifo.test.js", // 16 waiters granted in arrival order
  "review.test.js", // the package's API per client kind
  "surface.test.js", // redlock v5's surface per client kind
  "tls.test.js", // TLS with each kind
];

function testFiles(dir) {
  const out = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...testFiles(p));
    else if (e.name.endsWith(".test.js")) out.push(p);
  }
  return out.sort();
}

/** Whether this Node satisfies a `>=X[.Y[.Z]]` engines range (the only form the hosts use). */
function nodeSatisfies(range) {
  if (!range) return true;
  const m = /^\s*>=\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$/.exec(range);
  if (!m) return true;
  const want = [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)];
  const have = process.versions.node.split(".").map(Number);
  for (let i = 0; i < 3; i++) if ((have[i] ?? 0) !== want[i]) return (have[i] ?? 0) > want[i];
  return true;
}

function run(files, env, logPath) {
  return new Promise((resolvePromise) => {
    const log = createWriteStream(logPath);
    const started = performance.now();
    const child = spawn(process.execPath, ["--test", "--test-concurrency=1", ...files], { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      log.write(d);
    });
    child.stderr.on("data", (d) => log.write(d));
    child.on("close", (code) => {
      log.end();
      const num = (name) => Number(new RegExp(`^# ${name} (\\d+)`, "m").exec(out)?.[1] ?? NaN);
      resolvePromise({ code, tests: num("tests"), pass: num("pass"), fail: num("fail"), seconds: (performance.now() - started) / 1000 });
    });
  });
}

const args = process.argv.slice(2);
const latest = args.includes("--latest");
const full = args.includes("--full");
const chosen = args.filter((a) => !a.startsWith("--"));
for (const c of chosen) if (!VARIANTS.some((v) => v.name === c)) throw new Error(`unknown variant ${c}: one of ${VARIANTS.map((v) => v.name).join(", ")}`);

const buildDir = join(ROOT, "build", "test");
if (!existsSync(buildDir)) throw new Error(`${buildDir} is missing: compile the tests first (tsc -p tsconfig.test.json)`);
const all = testFiles(buildDir);
const logDir = join(ROOT, "build", "matrix");
mkdirSync(logDir, { recursive: true });

const runs = latest
  ? [{ name: "latest", label: `ioredis ${require("ioredis/package.json").version} + redis ${require("redis/package.json").version} (+ redis4 ${require("redis4/package.json").version})`, env: {}, files: all, engines: [require("ioredis/package.json").engines?.node, require("redis/package.json").engines?.node] }]
  : VARIANTS.filter((v) => chosen.length === 0 || chosen.includes(v.name)).map((v) => {
      const pkg = require(`${v.module}/package.json`);
      const files = full || v.library === "ioredis" ? all : NODE_REDIS_FILES.map((f) => join(buildDir, f));
      return { name: v.name, label: `${v.library} ${pkg.version}`, env: { REDIS_LOCK_NODE_HOST: v.name }, files, engines: [pkg.engines?.node] };
    });

const rows = [];
let failed = false;
const t0 = performance.now();
for (const r of runs) {
  const needs = r.engines.filter((e) => e && !nodeSatisfies(e));
  if (needs.length > 0) {
    rows.push([r.label, `Node ${process.versions.node}`, "-", "-", "-", `skipped (needs Node ${needs.join(", ")})`, "-"]);
    console.log(`== ${r.label}: skipped, it needs Node ${needs.join(", ")}`);
    continue;
  }
  const logPath = join(logDir, `${r.name}.log`);
  console.log(`== ${r.label} on Node ${process.versions.node}: ${r.files.length} files (log: ${logPath})`);
  const res = await run(r.files, { ...process.env, REDIS_LOCK_NODE_HOST: "", ...r.env }, logPath);
  const ok = res.code === 0 && res.fail === 0;
  if (!ok) failed = true;
  rows.push([r.label, `Node ${process.versions.node}`, String(r.files.length), String(res.tests), String(res.pass), ok ? "pass" : `FAIL (${res.fail} failed, exit ${res.code})`, `${res.seconds.toFixed(1)} s`]);
  console.log(`   ${ok ? "pass" : "FAIL"}: ${res.pass} of ${res.tests} tests passed in ${res.seconds.toFixed(1)} s`);
}

const head = ["host library", "Node", "files", "tests", "passed", "result", "time"];
const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
const line = (cells) => `| ${cells.map((c, i) => c.padEnd(widths[i])).join(" | ")} |`;
console.log(`\n${line(head)}\n|${widths.map((w) => "-".repeat(w + 2)).join("|")}|`);
for (const r of rows) console.log(line(r));
console.log(`\nmatrix: ${failed ? "FAILED" : "all passed"} in ${((performance.now() - t0) / 1000).toFixed(1)} s (server: ${process.env.REDIS_LOCK_SERVER || "redis-server"})`);
process.exit(failed ? 1 : 0);
