/**
 * Fencing tokens as exact `bigint`s: a reply read as a JS number that is not a safe integer is
 * an error (it may have been rounded), never a token.
 * @internal
 */
import { TokenPrecisionError } from "../errors.js";

/** The token (or any integer reply) in `reply`, exactly: bigint, a decimal string, or a safe integer number. */
export function exactInteger(reply: unknown, what = "token"): bigint {
  if (typeof reply === "bigint") return reply;
  if (typeof reply === "number") {
    if (!Number.isSafeInteger(reply)) {
      throw new TokenPrecisionError(
        `the ${what} was read as the JavaScript number ${reply}, which is not a safe integer (it may have been rounded); ` +
          "read integer replies as strings (ioredis: stringNumbers) or bigint",
      );
    }
    return BigInt(reply);
  }
  if (typeof reply === "string" && /^-?\d+$/.test(reply)) return BigInt(reply);
  if (Buffer.isBuffer(reply)) return exactInteger(reply.toString("utf8"), what);
  throw new TypeError(`expected an integer ${what}, got ${describe(reply)}`);
}

/** A fencing token from a grant's reply: an exact positive integer. */
export function tokenFrom(reply: unknown): bigint {
  const t = exactInteger(reply, "fencing token");
  if (t < 1n) throw new TypeError(`a fencing token is at least 1, got ${t}`);
  return t;
}

/** The largest of some tokens (0n for none). */
export function maxToken(tokens: Iterable<bigint>): bigint {
  let m = 0n;
  for (const t of tokens) if (t > m) m = t;
  return m;
}

/** A short description of an unexpected reply. */
export function describe(v: unknown): string {
  if (typeof v === "bigint") return `${v}n`;
  try {
    return JSON.stringify(v, (_k, x: unknown) => (typeof x === "bigint" ? `${x}n` : x)) ?? String(v);
  } catch {
    return String(v);
  }
}
