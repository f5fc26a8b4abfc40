// Builds the package: ES modules (dist/esm) and CommonJS (dist/cjs), each with its own type
// declarations (a .d.ts is read as ESM or CommonJS by the package.json beside it, so ESM and
// CommonJS consumers each need their own copy), from one source. Each output directory gets a package.json naming its module
// kind, so Node reads the .js files in it the right way whatever the package's own "type" is.
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
rmSync(join(root, "dist"), { recursive: true, force: true });
for (const [config, out, type] of [
  ["tsconfig.json", "esm", "module"],
  ["tsconfig.cjs.json", "cjs", "commonjs"],
]) {
  execFileSync(process.execPath, [tsc, "-p", join(root, config)], { stdio: "inherit" });
  if (type) {
    mkdirSync(join(root, "dist", out), { recursive: true });
    writeFileSync(join(root, "dist", out, "package.json"), JSON.stringify({ type }) + "\n");
  }
}
