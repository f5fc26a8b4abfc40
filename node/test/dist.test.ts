// The built package (node/dist, made by `npm run build` / `make node-build`) loads as an ES
// module and as CommonJS through its package.json "exports", and its declarations type-check
// for a strict consumer of either kind without ioredis or node-redis types.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { before, describe, test } from "node:test";

import { tempDir } from "./kit/index.js";

/** A hanging test fails instead of keeping `node --test` running. */
const TEST_TIMEOUT_MS = 120_000;

/** node/ (this file runs from node/build/test/). */
const PKG = resolve(__dirname, "../..");
const DIST = join(PKG, "dist");

function run(cmd: string, args: string[], cwd: string): Promise<{ out: string; err: string; code: number }> {
  return new Promise((res) => {
    execFile(cmd, args, { cwd, timeout: 120_000 }, (e, out, err) => {
      res({ out, err, code: e ? (typeof e.code === "number" ? e.code : 1) : 0 });
    });
  });
}

/** A scratch directory inside the package (so `redis-lock-client` resolves to it by name,
 *  through the package's "exports", as it would for a user). */
function scratch(): string {
  const d = join(PKG, "build", "dist-check", String(process.pid));
  mkdirSync(d, { recursive: true });
  return d;
}

const NAMES = ["default", "Redlock", "Lock", "ExecutionError", "ResourceLockedError", "LockLostError"];

describe("the built dist", () => {
  before(() => {
    assert.ok(existsSync(join(DIST, "esm", "index.js")), `no ${DIST}/esm: build the package first (make node-build)`);
    assert.ok(existsSync(join(DIST, "cjs", "index.js")), "no dist/cjs");
    assert.ok(existsSync(join(DIST, "esm", "index.d.ts")), "no dist/esm/index.d.ts");
    assert.ok(existsSync(join(DIST, "cjs", "index.d.ts")), "no dist/cjs/index.d.ts");
  });

  test("loads as an ES module by its name", { timeout: TEST_TIMEOUT_MS }, async () => {
    const d = scratch();
    writeFileSync(
      join(d, "esm.mjs"),
      `import Redlock, * as all from "redis-lock-client";
const names = ${JSON.stringify(NAMES)}.filter((n) => !(n in all));
if (names.length) throw new Error("missing: " + names);
if (all.Redlock !== Redlock) throw new Error("default is not Redlock");
if (typeof Redlock !== "function") throw new Error("not a class");
if (!(new all.ExecutionError("x", []) instanceof Error)) throw new Error("errors");
console.log("esm ok", import.meta.url.includes("dist-check"));
`,
    );
    const r = await run(process.execPath, [join(d, "esm.mjs")], d);
    assert.equal(r.code, 0, r.err);
    assert.match(r.out, /esm ok/);
    // And it is the dist's ESM build that loaded.
    const which = await run(process.execPath, ["--input-type=module", "-e", `console.log(import.meta.resolve ? import.meta.resolve("redis-lock-client") : "")`], d);
    if (which.out.trim()) assert.match(which.out, /dist\/esm\/index\.js/);
  });

  test("loads as CommonJS by its name", { timeout: TEST_TIMEOUT_MS }, async () => {
    const d = scratch();
    writeFileSync(
      join(d, "cjs.cjs"),
      `const m = require("redis-lock-client");
const names = ${JSON.stringify(NAMES)}.filter((n) => !(n in m));
if (names.length) throw new Error("missing: " + names);
if (m.default !== m.Redlock) throw new Error("default is not Redlock");
if (!require.resolve("redis-lock-client").includes("dist/cjs/index.js")) throw new Error(require.resolve("redis-lock-client"));
console.log("cjs ok");
`,
    );
    const r = await run(process.execPath, [join(d, "cjs.cjs")], d);
    assert.equal(r.code, 0, r.err);
    assert.match(r.out, /cjs ok/);
  });

  test("the declarations type-check for strict ESM and CommonJS consumers", { timeout: TEST_TIMEOUT_MS }, async () => {
    const d = scratch();
    const use = `
const r = new Redlock([]);
async function f(): Promise<bigint> {
  const lock: Lock = await r.acquire(["k"], 1000, { retryCount: 0 });
  const t: bigint = lock.fencingToken;
  await lock.extend(1000);
  await r.using(["k"], 1000, async (signal) => signal.aborted);
  try { await lock.release(); } catch (e) { if (e instanceof ExecutionError) void e.attempts; }
  return t;
}
void f;
`;
    writeFileSync(join(d, "use.mts"), `import Redlock, { Lock, ExecutionError } from "redis-lock-client";\n${use}`);
    writeFileSync(join(d, "use.cts"), `import Redlock = require("redis-lock-client");\ntype Lock = Redlock.Lock;\nconst { ExecutionError } = Redlock;\n${use.replace("new Redlock(", "new Redlock.default(")}`);
    writeFileSync(
      join(d, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { strict: true, module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", noEmit: true, types: ["node"], skipLibCheck: false },
        files: ["use.mts"],
      }),
    );
    const tsc = join(PKG, "node_modules", "typescript", "bin", "tsc");
    const r = await run(process.execPath, [tsc, "-p", "tsconfig.json"], d);
    assert.equal(r.code, 0, `ESM consumer:\n${r.out}${r.err}`);
    writeFileSync(
      join(d, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { strict: true, module: "NodeNext", moduleResolution: "NodeNext", target: "ES2022", noEmit: true, types: ["node"], skipLibCheck: false },
        files: ["use.cts"],
      }),
    );
    const r2 = await run(process.execPath, [tsc, "-p", "tsconfig.json"], d);
    assert.equal(r2.code, 0, `CommonJS consumer:\n${r2.out}${r2.err}`);
  });

  test("the public declarations name no ioredis / node-redis types and no `any`", () => {
    const files: string[] = [];
    const walk = (dir: string): void => {
      for (const e of readdirSync(dir, { withFileTypes: true })) {
        if (e.isDirectory()) walk(join(dir, e.name));
        else if (e.name.endsWith(".d.ts")) files.push(join(dir, e.name));
      }
    };
    walk(join(DIST, "esm"));
    walk(join(DIST, "cjs"));
    assert.ok(files.length > 0);
    for (const f of files) {
      // Declarations only: TSDoc and line comments may say "any" in prose.
      const text = readFileSync(f, "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
      assert.doesNotMatch(text, /from ["'](ioredis6?|redis[46]?|@redis\/[^"']+)["']/, f);
      assert.doesNotMatch(text, /import\(["'](ioredis6?|redis[46]?|@redis\/[^"']+)["']\)/, f);
      assert.doesNotMatch(text, /:\s*any\b|<any>|any\[\]/, `${f} exposes any`);
    }
  });

  test("dist/esm and dist/cjs say their module kind; no import.meta in the CJS build", () => {
    assert.equal(JSON.parse(readFileSync(join(DIST, "esm", "package.json"), "utf8")).type, "module");
    assert.equal(JSON.parse(readFileSync(join(DIST, "cjs", "package.json"), "utf8")).type, "commonjs");
    const cjs = readFileSync(join(DIST, "cjs", "index.js"), "utf8");
    assert.doesNotMatch(cjs, /import\.meta/);
    void tempDir;
  });
});
