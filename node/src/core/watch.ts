/**
 * The loss watcher's decisions, with no I/O (the face is `../watcher.ts`; the Rust client's
 * `proto/watch.rs` and the Python client's `_watch_core.py` are the model).
 *
 * Per server the watcher uses the endpoint's command connection, with
 * `CLIENT TRACKING on REDIRECT <subscriber id> BCAST NOLOOP PREFIX <key> ...`, and a subscriber
 * connection (RESP2) subscribed to `__redis__:invalidate`, where the server names each key
 * changed by any *other* connection (a flush names none: every key). `NOLOOP` keeps our own
 * acquires, extends and releases over the command connection quiet. An invalidation only says
 * "this key may have changed": the watcher re-reads the key, `LOCK.INFO key OWNER owner` for
 * each owner among its registrations (that entry alone, O(1) on the server whatever the number
 * of holders; one plain `LOCK.INFO key` on a server whose module predates `OWNER`), and judges
 * each registration (`judge`).
 *
 * Rules (as the other clients'):
 * - re-reads of one key at least `RECHECK_SPACING_MS` apart (and `SPACING_PER_HOLDER_MS` per
 *   holder the last re-read listed), one at a time: a change while a re-read is out or within
 *   the spacing makes the key *due*, re-read once the spacing is over;
 * - registered prefixes never overlap (the server refuses overlapping ones): a key covered by
 *   a registered prefix needs nothing; a key that is a prefix of registered ones makes the
 *   watcher replace the set, in one `MULTI` / `CLIENT TRACKING off` / `on ...` / `EXEC` (no
 *   change falls between); prefixes of keys no longer watched stay until more than
 *   `MAX_STALE` pile up or `MAX_IGNORED_PUSHES` pushes came for them;
 * - a new registration is followed by a re-read of its key (covering the moment between the
 *   grant and the registration); a re-read sent before a registration does not judge it;
 * - after the command connection is (re)opened, every prefix is registered again and every
 *   key re-read (changes while it was down were not pushed).
 */
import { infoArgs, ownerFormRefused, ownerInfoArgs } from "./protocol.js";
import { ServerReplyError, type Arg, type Reply } from "./reply.js";

/** How a watched hold was lost. */
export type LossCause = "expired" | "deleted" | "overwritten" | "taken" | "ended" | "connection-closed";

/** A few words for messages, per cause. */
export const LOSS_DESCRIPTIONS: Readonly<Record<LossCause, string>> = {
  expired: "its validity ran out without a confirmed extend",
  deleted: "its key was deleted (DEL, FLUSHALL, eviction or expiry)",
  overwritten: "its key was overwritten with another type",
  taken: "another owner holds it now",
  ended: "the server ended the hold",
  "connection-closed": "its bound connection closed",
};

/** The shortest time between two re-reads of one key (ms). */
export const RECHECK_SPACING_MS = 5;
/** At least this long per holder the last re-read listed between two re-reads of a key (ms):
 *  a plain `LOCK.INFO` lists every holder; a read of one owner's entry at most one. */
export const SPACING_PER_HOLDER_MS = 0.05;
/** Replace the registered set once more than this many prefixes are stale. */
export const MAX_STALE = 64;
/** Replace it once this many pushes came for keys no registration holds. */
export const MAX_IGNORED_PUSHES = 4;
/** The channel a RESP2 redirect target receives invalidations on. */
export const INVALIDATE_CHANNEL = "__redis__:invalidate";

/** `CLIENT TRACKING on REDIRECT <id> BCAST NOLOOP PREFIX p ...`. */
export function trackingOn(redirect: bigint, prefixes: readonly string[]): Arg[] {
  const out: Arg[] = ["CLIENT", "TRACKING", "on", "REDIRECT", redirect.toString(), "BCAST", "NOLOOP"];
  for (const p of prefixes) out.push("PREFIX", p);
  return out;
}

/** `CLIENT TRACKING off`. */
export const TRACKING_OFF: readonly Arg[] = ["CLIENT", "TRACKING", "off"];

/** Whether an error reply to a registration means the server will not track for us (an ACL
 *  without `client|tracking`, an unknown subcommand). "Overlapping" prefixes are no refusal. */
export function trackingRefused(errorText: string): boolean {
  return !errorText.toLowerCase().includes("overlap");
}

/** The smallest prefix set covering `keys`: no member a prefix of another (sorted). */
export function minimal(keys: Iterable<string>): string[] {
  const sorted = [...new Set(keys)].sort(byBytes);
  const out: string[] = [];
  for (const k of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && k.startsWith(last)) continue;
    out.push(k);
  }
  return out;
}

function byBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** The holders' owners in a `LOCK.INFO` reply (RESP2 flat key/value array); `undefined` when
 *  the reply is not one; `null` when the key does not exist. */
export function infoHolders(reply: Reply): string[] | null | undefined {
  if (reply === null) return null;
  if (!Array.isArray(reply) || reply.length % 2 !== 0) return undefined;
  for (let i = 0; i < reply.length; i += 2) {
    if (reply[i] === "holders") {
      const hs = reply[i + 1];
      if (!Array.isArray(hs)) return undefined;
      const owners: string[] = [];
      for (const h of hs) {
        if (!Array.isArray(h) || typeof h[0] !== "string") return undefined;
        owners.push(h[0]);
      }
      return owners;
    }
  }
  return [];
}

/** `holders_count` of a `LOCK.INFO` reply (module 0.4.0+): how many owners hold the key,
 *  listed or not; `undefined` when the reply has none. */
export function infoHoldersCount(reply: Reply): number | undefined {
  if (!Array.isArray(reply)) return undefined;
  for (let i = 0; i + 1 < reply.length; i += 2) {
    const v = reply[i + 1];
    if (reply[i] === "holders_count") return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined;
  }
  return undefined;
}

/** A re-read's verdict for one owner: `decided` false when nothing can be concluded (the
 *  re-read failed); otherwise `cause` null (still held) or the loss's cause. */
export interface Verdict {
  decided: boolean;
  cause: LossCause | null;
}

/** Judges a re-read (`LOCK.INFO key`): its reply, or the error it ended with. */
export function judge(reply: Reply | undefined, error: unknown, owner: string): Verdict {
  if (error !== undefined && error !== null) {
    if (error instanceof ServerReplyError && error.code === "WRONGTYPE") return { decided: true, cause: "overwritten" };
    return { decided: false, cause: null };
  }
  if (reply === undefined) return { decided: false, cause: null };
  if (reply instanceof ServerReplyError) {
    return reply.code === "WRONGTYPE" ? { decided: true, cause: "overwritten" } : { decided: false, cause: null };
  }
  const holders = infoHolders(reply);
  if (holders === undefined) return { decided: false, cause: null };
  if (holders === null) return { decided: true, cause: "deleted" };
  if (holders.includes(owner)) return { decided: true, cause: null };
  // A read of one owner's entry lists nobody else: `holders_count` says whether others hold it.
  const others = infoHoldersCount(reply) ?? holders.length;
  return { decided: true, cause: others > 0 ? "taken" : "ended" };
}

/** One watched hold. */
export class Registration {
  /** The number of the first re-read that may judge it. */
  first = 0;
  /** Found lost or removed. */
  done = false;
  /** Stopped by its owner: no report from now on. */
  cancelled = false;
  constructor(
    readonly key: string,
    readonly owner: string,
  ) {}
}

/** What the face does next: send `commands` (replies checked with `registeredReply`), then
 *  re-read `reads` (key, number). */
export interface Plan {
  commands: Arg[][];
  reads: Array<[string, number]>;
}

export function emptyPlan(): Plan {
  return { commands: [], reads: [] };
}

function extend(a: Plan, b: Plan): Plan {
  a.commands.push(...b.commands);
  a.reads.push(...b.reads);
  return a;
}

/** The state of one server's watcher. */
export class WatchCore {
  readonly regs = new Map<string, Registration[]>();
  /** The server refused `LOCK.INFO key OWNER owner` (a module before 0.4.0): plain re-reads. */
  plainInfo = false;
  registered = new Set<string>();
  /** The subscriber's client id while tracking is set up on the command connection. */
  redirect: bigint | null = null;
  private inFlight = new Set<string>();
  private due = new Set<string>();
  private lastRead = new Map<string, number>();
  private spacing = new Map<string, number>();
  private ignored = 0;
  private readsSent = 0;
  /** The server refused tracking: why (the watcher is then off). */
  refused: string | null = null;

  watched(): boolean {
    return this.regs.size > 0;
  }

  /** A held lock to watch: the registration to send (if its key is not covered) and a re-read. */
  add(reg: Registration, now: number): Plan {
    const list = this.regs.get(reg.key);
    if (list) list.push(reg);
    else this.regs.set(reg.key, [reg]);
    reg.first = this.readsSent + 1;
    if (this.redirect === null) return emptyPlan();
    const plan = this.cover(reg.key, now);
    // A replacement re-reads every key, this one included.
    if (plan.reads.some(([k]) => k === reg.key)) return plan;
    return extend(plan, this.readNowOrDue(reg.key, now));
  }

  /** A registration ends (lost, or stopped): the replacement of the registered set it may
   *  bring, with its re-reads. */
  remove(reg: Registration, now: number): Plan {
    if (!this.drop(reg)) return emptyPlan();
    if (this.redirect !== null && this.registered.size > this.regs.size + MAX_STALE) {
      return this.rebuild(now);
    }
    return emptyPlan();
  }

  /** Forgets a registration (no replacement): whether it was watched. */
  private drop(reg: Registration): boolean {
    reg.done = true;
    const list = this.regs.get(reg.key);
    const i = list ? list.indexOf(reg) : -1;
    if (!list || i < 0) return false;
    list.splice(i, 1);
    if (list.length === 0) {
      this.regs.delete(reg.key);
      this.due.delete(reg.key);
      this.lastRead.delete(reg.key);
      this.spacing.delete(reg.key);
    }
    return true;
  }

  /** Stops a registration: no report from now on. */
  cancel(reg: Registration, now: number): Plan {
    reg.cancelled = true;
    return this.remove(reg, now);
  }

  covered(key: string): boolean {
    for (const p of this.registered) if (key.startsWith(p)) return true;
    return false;
  }

  private cover(key: string, now: number): Plan {
    if (this.covered(key)) return emptyPlan();
    for (const p of this.registered) if (p.startsWith(key)) return this.rebuild(now, key);
    this.registered.add(key);
    return { commands: [trackingOn(this.redirectId(), [key])], reads: [] };
  }

  private redirectId(): bigint {
    if (this.redirect === null) throw new Error("watcher not connected");
    return this.redirect;
  }

  /** Replaces the registered set by the watched keys' (and `also`): one transaction, then a
   *  re-read of every watched key. `CLIENT TRACKING off` drops the broadcast invalidations the
   *  server still had to send for our prefixes (it sends them at the end of its event-loop
   *  iteration): a change made just before the replacement, in the same iteration, is never
   *  pushed. The re-reads go after the transaction (a plan's commands precede its reads; a key
   *  whose re-read is out or too recent is made due, re-read later). */
  private rebuild(now: number, also?: string): Plan {
    const keys = [...this.regs.keys()];
    if (also !== undefined) keys.push(also);
    const next = minimal(keys);
    this.ignored = 0;
    if (next.length === this.registered.size && next.every((p) => this.registered.has(p))) return emptyPlan();
    this.registered = new Set(next);
    const plan: Plan = { commands: this.replaceCommands(next), reads: [] };
    for (const key of this.regs.keys()) extend(plan, this.readNowOrDue(key, now));
    return plan;
  }

  private replaceCommands(set: string[]): Arg[][] {
    const cmds: Arg[][] = [["MULTI"], [...TRACKING_OFF]];
    if (set.length > 0) cmds.push(trackingOn(this.redirectId(), set));
    cmds.push(["EXEC"]);
    return cmds;
  }

  /** Tracking is to be set up (again) on a command connection, redirecting to `redirect`:
   *  register every key (replacing whatever that connection had) and re-read every key. */
  connected(redirect: bigint, now: number): Plan {
    this.redirect = redirect;
    this.inFlight.clear();
    this.due.clear();
    const set = minimal(this.regs.keys());
    this.registered = new Set(set);
    const plan: Plan = { commands: this.replaceCommands(set), reads: [] };
    for (const key of this.regs.keys()) {
      this.lastRead.delete(key);
      extend(plan, this.readNowOrDue(key, now));
    }
    return plan;
  }

  /** The command or subscriber connection is gone: nothing is tracked until `connected`. */
  disconnected(): void {
    this.redirect = null;
    this.registered = new Set();
    this.inFlight.clear();
  }

  /** The reply to a registration command (an EXEC reply's inner errors included): whether the
   *  connections must be set up again (the redirect target is gone). A refusal turns the
   *  watcher off (`refused`). */
  registeredReply(reply: Reply | undefined, error: unknown): boolean {
    const errors: unknown[] = [];
    if (error !== undefined && error !== null) errors.push(error);
    if (Array.isArray(reply)) for (const r of reply) if (r instanceof ServerReplyError) errors.push(r);
    let reconnect = false;
    for (const e of errors) {
      if (!(e instanceof ServerReplyError)) {
        reconnect = true;
        continue;
      }
      if (e.message.toLowerCase().includes("redirect")) reconnect = true;
      else if (e.code === "EXECABORT") continue;
      else if (trackingRefused(e.message)) this.refused = e.message;
    }
    return reconnect;
  }

  /** An invalidation (`null`: a flush, every key). */
  message(keys: string[] | null, now: number): Plan {
    let held: string[];
    if (keys === null) held = [...this.regs.keys()];
    else {
      held = [];
      for (const k of keys) {
        if (this.regs.has(k)) held.push(k);
        else this.ignored++;
      }
    }
    // A replacement re-reads every watched key (the pushed ones included) after its commands.
    const plan = this.ignored >= MAX_IGNORED_PUSHES && this.redirect !== null ? this.rebuild(now) : emptyPlan();
    const reread = new Set(plan.reads.map(([k]) => k));
    for (const k of held) if (!reread.has(k)) extend(plan, this.readNowOrDue(k, now));
    return plan;
  }

  private spacingOf(key: string): number {
    return this.spacing.get(key) ?? RECHECK_SPACING_MS;
  }

  private tooSoon(key: string, now: number): boolean {
    const last = this.lastRead.get(key);
    return last !== undefined && now - last < this.spacingOf(key) - 1e-6;
  }

  private readNowOrDue(key: string, now: number): Plan {
    if (this.redirect === null || this.inFlight.has(key) || this.tooSoon(key, now)) {
      this.due.add(key);
      return emptyPlan();
    }
    return { commands: [], reads: [this.startRead(key, now)] };
  }

  private startRead(key: string, now: number): [string, number] {
    this.inFlight.add(key);
    this.lastRead.set(key, now);
    this.readsSent++;
    return [key, this.readsSent];
  }

  /** When the next due re-read may go out (ms, the clock `now` is read from), if any. */
  nextDue(): number | null {
    let min: number | null = null;
    for (const k of this.due) {
      if (this.inFlight.has(k)) continue;
      const t = (this.lastRead.get(k) ?? 0) + this.spacingOf(k);
      if (min === null || t < min) min = t;
    }
    return min;
  }

  /** The due re-reads whose spacing is over. */
  tick(now: number): Plan {
    if (this.redirect === null) return emptyPlan();
    const ready = [...this.due].filter((k) => !this.inFlight.has(k) && !this.tooSoon(k, now)).sort();
    const plan = emptyPlan();
    for (const k of ready) {
      this.due.delete(k);
      plan.reads.push(this.startRead(k, now));
    }
    return plan;
  }

  /** Re-read `number` of `key` came back (`error`: an error, or no answer): the registrations
   *  found lost (now removed) with their causes. A re-read that decided nothing is due again. */
  readDone(key: string, number: number, reply: Reply | undefined, error: unknown): Array<[Registration, LossCause]> {
    return this.readsDone(key, number, new Map([[null, { reply, error }]]));
  }

  /** The commands of `plan`'s re-reads: for each key one `LOCK.INFO key OWNER owner` per owner
   *  among its registrations, or one plain `LOCK.INFO key` on a server without the option
   *  (`null` in `sent`); `sent` says which, for {@link readsDone}. */
  readRequests(plan: Plan): { cmds: Arg[][]; sent: Array<[string, number, Array<string | null>]> } {
    const cmds: Arg[][] = [];
    const sent: Array<[string, number, Array<string | null>]> = [];
    for (const [key, number] of plan.reads) {
      const owners: Array<string | null> = this.plainInfo
        ? [null]
        : [...new Set((this.regs.get(key) ?? []).filter((r) => !r.done).map((r) => r.owner))].sort();
      sent.push([key, number, owners]);
      for (const o of owners) cmds.push(o === null ? infoArgs(key) : ownerInfoArgs(key, o));
    }
    return { cmds, sent };
  }

  /** As {@link readDone}, for a re-read made of one read per owner (`got`: owner → reply or
   *  error; `null`: a plain read, for every owner). */
  readsDone(
    key: string,
    number: number,
    got: ReadonlyMap<string | null, { reply: Reply | undefined; error: unknown }>,
  ): Array<[Registration, LossCause]> {
    this.inFlight.delete(key);
    for (const [o, r] of got) {
      // An older module: the key is due again (undecided below), read in the plain form.
      if (o !== null && (ownerFormRefused(r.error) || ownerFormRefused(r.reply))) this.plainInfo = true;
    }
    const list = this.regs.get(key);
    if (!list || list.length === 0) return [];
    let n: number | null = got.size > 0 ? 0 : null;
    for (const { reply, error } of got.values()) {
      const hs = error === undefined && reply !== undefined && !(reply instanceof ServerReplyError) ? infoHolders(reply) : undefined;
      n = n === null || hs === undefined ? null : n + (hs === null ? 0 : hs.length);
    }
    if (n !== null && n * SPACING_PER_HOLDER_MS > RECHECK_SPACING_MS) this.spacing.set(key, n * SPACING_PER_HOLDER_MS);
    else this.spacing.delete(key);
    const lost: Array<[Registration, LossCause]> = [];
    let undecided = false;
    for (const reg of [...list]) {
      if (reg.done || reg.first > number) continue;
      const answer = got.get(null) ?? got.get(reg.owner);
      if (answer === undefined) {
        undecided = true; // an owner whose entry this re-read did not read
        continue;
      }
      const v = judge(answer.reply, answer.error, reg.owner);
      if (!v.decided) undecided = true;
      else if (v.cause !== null) lost.push([reg, v.cause]);
    }
    // No replacement here (its plan would have nowhere to go): a later one drops the stale prefixes.
    for (const [reg] of lost) this.drop(reg);
    if (undecided || (this.regs.get(key) ?? []).some((r) => r.first > number)) this.due.add(key);
    return lost;
  }

  /** Re-reads that got no answer (the connection failed): the reconnect re-reads. */
  connectionLostReads(reads: ReadonlyArray<[string, number]>): void {
    for (const [key] of reads) this.inFlight.delete(key);
  }
}
