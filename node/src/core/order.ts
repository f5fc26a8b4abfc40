/**
 * Several resources at once: the one global order they are taken in (byte order of the key, so
 * two requests over overlapping resources never wait for each other in a cycle), a repeated
 * resource refused, and the wait left for each resource. Port of the Rust client's
 * `proto/multi.rs`.
 * @internal
 */
import { InvalidRequestError } from "../errors.js";

/** The most resources one acquire takes. */
export const MAX_RESOURCES = 1024;

/** Compares two keys by their UTF-8 bytes. */
export function compareKeys(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/**
 * The resources in the global order (by UTF-8 bytes); refuses none, too many, a non-string and
 * a resource named twice, before anything is sent.
 */
export function ordered(resources: readonly string[]): string[] {
  if (!Array.isArray(resources)) throw new InvalidRequestError("resources must be an array of strings");
  if (resources.length === 0) throw new InvalidRequestError("no resources to lock");
  if (resources.length > MAX_RESOURCES) throw new InvalidRequestError(`${resources.length} resources in one request (at most ${MAX_RESOURCES})`);
  for (const r of resources) {
    if (typeof r !== "string") throw new InvalidRequestError(`a resource is a string, not ${typeof r}`);
  }
  const out = [...resources].sort(compareKeys);
  for (let i = 1; i < out.length; i++) {
    if (out[i] === out[i - 1]) throw new InvalidRequestError(`the resource ${JSON.stringify(out[i])} is named twice`);
  }
  return out;
}

/**
 * The wait left for the next resource of an acquire that began at `started` with a wait of
 * `wait` ms (Infinity: no limit), at `now`: undefined when there is no wait or it is spent (the
 * resource is then tried once, without waiting).
 */
export function waitLeft(wait: number | undefined, started: number, now: number): number | undefined {
  if (wait === undefined || wait <= 0) return undefined;
  if (wait === Infinity) return Infinity;
  const left = wait - Math.max(0, now - started);
  return left >= 1 ? left : undefined;
}
