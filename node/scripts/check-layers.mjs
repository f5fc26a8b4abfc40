// The package's layers, checked by `make lint` (lint-node): import arrows point down.
//   core/     the protocol, pure: imports only core/ and errors.ts (no I/O, no client library)
//   driver/   the connections: imports only driver/ and core/reply.ts
//   watcher.ts, lock.ts, redlock.ts, settings.ts, errors.ts, index.ts: the faces on top
// Also refuses runtime imports of ioredis / redis (they are the user's; only `import type`)
// and cycles between files through runtime imports (type-only imports vanish at build time).
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const src = join(dirname(fileURLToPath(import.meta.url)), "..", "src");
const files = [];
const walk = (d) => {
  for (const e of readdirSync(d, { withFileTypes: true })) {
    if (e.isDirectory()) walk(join(d, e.name));
    else if (e.name.endsWith(".ts")) files.push(relative(src, join(d, e.name)));
  }
};
walk(src);

// Runtime imports of a file: `import ... from "x"` and `export ... from "x"`, except
// `import type` / `export type` and imports whose every name is marked `type`.
function imports(file) {
  const text = readFileSync(join(src, file), "utf8");
  const out = [];
  const re = /^(import|export)\s+(type\s+)?([\s\S]*?)\s*from\s*"([^"]+)";/gm;
  for (const m of text.matchAll(re)) {
    if (m[2]) continue;
    const names = m[3].replace(/^\{|\}$/g, "").split(",").map((n) => n.trim()).filter(Boolean);
    if (m[3].trim().startsWith("{") && names.length > 0 && names.every((n) => n.startsWith("type "))) continue;
    out.push(m[4]);
  }
  return out;
}

const problems = [];
const edges = new Map();
for (const f of files) {
  const here = dirname(f);
  const targets = [];
  for (const spec of imports(f)) {
    if (/^(ioredis|redis|@redis\/)/.test(spec)) problems.push(`${f}: runtime import of the user's client library "${spec}" (use import type)`);
    if (!spec.startsWith(".")) continue;
    const target = relative(src, resolve(src, here, spec)).replace(/\.js$/, ".ts");
    targets.push(target);
    const layer = f.split("/")[0];
    if (layer === "core" && !(target.startsWith("core/") || target === "errors.ts"))
      problems.push(`${f} imports ${target}: core/ may import only core/ and errors.ts`);
    if (layer === "driver" && !(target.startsWith("driver/") || target === "core/reply.ts"))
      problems.push(`${f} imports ${target}: driver/ may import only driver/ and core/reply.ts`);
  }
  edges.set(f, targets);
}

// Cycles through runtime imports (depth-first search).
const state = new Map();
const path = [];
const visit = (f) => {
  state.set(f, 1);
  path.push(f);
  for (const t of edges.get(f) ?? []) {
    if (state.get(t) === 1) problems.push(`import cycle: ${[...path.slice(path.indexOf(t)), t].join(" -> ")}`);
    else if (!state.has(t)) visit(t);
  }
  path.pop();
  state.set(f, 2);
};
for (const f of files) if (!state.has(f)) visit(f);

if (problems.length) {
  for (const p of problems) console.error(`check-layers: ${p}`);
  process.exit(1);
}
console.log(`check-layers: ${files.length} files, layers and imports as documented, no cycles`);
