/**
 * `Redlock`: redlock v5's class, on the lock module. One server: each resource waits in the
 * server's FIFO queue (`WAIT`). Several servers: a majority, with the waits queued on one
 * designated server (see `core/redlock.ts`).
 * @packageDocumentation
 */
import { EventEmitter } from "node:events";
import { randomBytes } from "node:crypto";
import { targetFor, withDeadline, ServerReplyError, type Arg, type Conn, type Endpoint, type Reply, type Target } from "./driver/index.js";
import { watchHold } from "./watcher.js";
import {
  ConnectionLimitError,
  ExecutionError,
  InvalidRequestError,
  LockLostError,
  type ExecutionStats,
} from "./errors.js";
import {
  QUORUM_MESSAGE,
  acquireOutcome,
  checkSpec,
  checkTtl,
  doneOutcome,
  errorOutcome,
  extendArgs,
  failureError,
  infoArgs,
  ownerFormRefused,
  ownerInfoArgs,
  releaseArgs,
  vote,
  voteError,
  waitArg,
  type AcquireSpec,
  type Kind,
  type Outcome,
  type Vote,
} from "./core/protocol.js";
import { holdsOrWaits, parseInfo, type LockInfo } from "./core/info.js";
import { confirmedValidUntil, quorumOf, waitedGrantNeedsCheck, type ServerAnswers, type Verdict } from "./core/lease.js";
import { ordered } from "./core/order.js";
import { RedlockAttempts, type ServerCommands, type Step } from "./core/redlock.js";
import { OneServerAttempt, type OneStep } from "./core/single.js";
import { afterExtendFailure, extensionDelay } from "./core/extension.js";
import { Hold, Lock, holdOf, makeLock, type ExecutionResult } from "./lock.js";
import { constructorSettings, resolveSettings, serverWait, type RedisClientLike, type Settings } from "./settings.js";
import { WaitLines, type WaitTurn } from "./waitorder.js";

/**
 * The second argument of a `using()` routine (as in `@sesamecare-oss/redlock`): the lock as it
 * stands now (replaced by each automatic extension, which returns a new `Lock`) and how many
 * extensions there were. redlock v5 routines take only the signal and may ignore it.
 */
export interface RedlockUsingContext {
  /** The current lock (its `expiration` and fencing tokens). */
  lock: Lock;
  /** How many times the lock was extended automatically so far. */
  extensions: number;
}

/** The `AbortSignal` a `using()` routine gets: aborted when the lock is lost, with the `LockLostError` in `error` (and `reason`). */
export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** Why several servers refuse semaphore permits (as the Rust client words it). */
export const REDLOCK_NO_PERMITS =
  "Redlock does not take semaphore permits: the servers' semaphores are independent, so grants from a majority do not bound " +
  "the holders to the capacity (capacity 2 on 3 servers: three owners can each hold a permit on a different pair of servers); " +
  "take permits from a Redlock of one server (for capacity 1, a Redlock write lock is the same thing)";

/** How long a reply to a command that does not wait may take before its server counts as a vote against, in ms. */
export function shortDeadline(duration: number): number {
  return Math.max(50, Math.min(Math.floor(duration / 10), 1000));
}

/** A client-side deadline past a server-side wait: the server's own timeout runs on its timer, a little late on a busy server. */
export const WAIT_REPLY_MARGIN = 1000;

/** How long a check that an earlier wait is in the server's queue (`LOCK.INFO`) may take, in ms. */
const PROBE_DEADLINE_MS = 1000;

const now = (): number => performance.now();

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(done, Math.max(0, ms));
    function done(): void {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }
    function aborted(): void {
      clearTimeout(t);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/** Internal acquire options. */
interface AcquireOptions {
  kind: Kind;
  capacity?: number;
  watch?: boolean;
}

/**
 * A Redlock over one or more Redis servers (one client each) with the lock module loaded.
 * A drop-in for redlock v5: same constructor, methods, events and errors; see the package docs
 * for the differences that remain.
 *
 * Waiting: redlock's `retryCount` / `retryDelay` become one wait in the server's FIFO queue of
 * `retryCount * retryDelay` ms (`retryCount: -1`: no limit, `0`: no wait; the `wait` setting
 * overrides both; `retryJitter` is not used). One server: each resource (in the global byte
 * order) waits with `LOCK.ACQUIRE … WAIT <ms left>` on a connection of its own. Several servers:
 * after a failed attempt the request queues on one designated server in slices of at most 1 s
 * (and a quarter of the duration), then asks the others; a bound request (`bind`) polls instead.
 *
 * Each round of an operation is one entry of `attempts` (one `ExecutionStats`, keyed by your
 * client objects); every vote against is also emitted as an `error` event, as redlock does.
 */
export default class Redlock extends EventEmitter {
  /** The clients it was given, as given. */
  readonly clients: Set<RedisClientLike>;
  /** The settings (redlock's five, defaults filled in, plus any of ours given). */
  readonly settings: Settings;
  /** redlock v5 has Lua scripts here; this package sends module commands, so they are empty and unused. */
  readonly scripts: {
    readonly acquireScript: { value: string; hash: string };
    readonly extendScript: { value: string; hash: string };
    readonly releaseScript: { value: string; hash: string };
  };
  private readonly targets: Target[];
  private readonly live = new Set<Hold>();
  /** This process's waits per server and key, in call order (see WaitLines). */
  private readonly lines = new WaitLines();
  /** Servers whose module refused `LOCK.INFO key OWNER owner` (before 0.4.0): the plain form. */
  private readonly plainInfo = new WeakSet<Target>();

  /**
   * @param clients One client per server (ioredis `Redis` or `Cluster`, node-redis v4/v5/v6): at least one.
   * @param settings redlock's settings and ours.
   * @param scripts Accepted for redlock compatibility and ignored (no Lua scripts are used).
   */
  constructor(clients: Iterable<RedisClientLike>, settings: Partial<Settings> = {}, scripts?: unknown) {
    super();
    void scripts;
    // As redlock: "error" events without a listener must not crash the process.
    this.on("error", () => {});
    this.clients = new Set(clients);
    if (this.clients.size === 0) throw new Error("Redlock must be instantiated with at least one redis client.");
    this.settings = constructorSettings(settings);
    const empty = { value: "", hash: "" };
    this.scripts = { acquireScript: empty, extendScript: empty, releaseScript: empty };
    const opts = settings.maxWaitConnections !== undefined ? { maxWaitConnections: settings.maxWaitConnections } : undefined;
    this.targets = [...this.clients].map((c) => targetFor(c, opts));
  }

  /** The servers' names (`host:port`), in the clients' order. */
  get servers(): string[] {
    return this.targets.map((t) => t.name);
  }

  /** Closes this package's connections, stops every watch, and runs `quit()` on every client (as redlock). */
  async quit(): Promise<void> {
    for (const h of this.live) h.stop();
    this.live.clear();
    await Promise.all(this.targets.map((t) => t.close().catch(() => undefined)));
    await Promise.all(this.targets.map((t) => t.quitUserClient()));
  }

  /** Acquires an exclusive lock on every resource for `duration` ms (`LOCK.ACQUIRE`), waiting in the servers' queue as the settings say. */
  acquire(resources: string[], duration: number, settings?: Partial<Settings>): Promise<Lock> {
    return this.acquireAs(resources, duration, settings, { kind: "write" });
  }

  /** Acquires a shared (read) lock on every resource (`LOCK.RWREAD`): readers share it, a writer excludes them. */
  acquireRead(resources: string[], duration: number, settings?: Partial<Settings>): Promise<Lock> {
    return this.acquireAs(resources, duration, settings, { kind: "read" });
  }

  /**
   * Takes one permit of the counting semaphore `resource` of `capacity` permits
   * (`LOCK.SEMACQUIRE`). One server only: a Redlock over several refuses (see {@link REDLOCK_NO_PERMITS}).
   */
  acquireSemaphore(resource: string, capacity: number, duration: number, settings?: Partial<Settings>): Promise<Lock> {
    return this.acquireAs([resource], duration, settings, { kind: "semaphore", capacity });
  }

  /** What `LOCK.INFO` says about `resource` (null: no such key). One server only: with several use {@link infoAll}. */
  async info(resource: string): Promise<LockInfo | null> {
    const t = this.targets[0] as Target;
    if (this.targets.length > 1) throw new InvalidRequestError("info() reads one server; this Redlock has several: use infoAll()");
    const ep = await t.endpointFor(resource);
    return parseInfo(await this.short(t, ep, resource, infoArgs(resource), 1000));
  }

  /** `LOCK.INFO` of `resource` on every server: server name → info, null (no key), or the error. */
  async infoAll(resource: string): Promise<Map<string, LockInfo | null | Error>> {
    const out = new Map<string, LockInfo | null | Error>();
    await Promise.all(
      this.targets.map(async (t) => {
        try {
          const ep = await t.endpointFor(resource);
          out.set(t.name, parseInfo(await this.short(t, ep, resource, infoArgs(resource), 1000)));
        } catch (e) {
          out.set(t.name, e instanceof Error ? e : new Error(String(e)));
        }
      }),
    );
    return out;
  }

  // ---- I/O helpers -------------------------------------------------------------------------

  /** A command that does not wait, on the endpoint's command connection; re-sent once after a cluster redirect. */
  /**
   * What server `t` says of `owner`'s hold of `key`, through `send`: `LOCK.INFO key OWNER owner`
   * (that entry alone, O(1) on the server whatever the number of holders), or the plain form on
   * a server whose module predates the option (learnt from its refusal, then kept for it).
   */
  private async ownInfo(t: Target, key: string, owner: string, send: (args: Arg[]) => Promise<Reply>): Promise<LockInfo | null> {
    if (!this.plainInfo.has(t)) {
      try {
        const reply = await send(ownerInfoArgs(key, owner));
        if (reply instanceof ServerReplyError) throw reply;
        return parseInfo(reply);
      } catch (e) {
        if (!ownerFormRefused(e)) throw e;
        this.plainInfo.add(t);
      }
    }
    const reply = await send(infoArgs(key));
    if (reply instanceof ServerReplyError) throw reply;
    return parseInfo(reply);
  }

  private async short(t: Target, ep: Endpoint, key: string, args: Arg[], deadline: number): Promise<Reply> {
    try {
      // The command connection may have to be opened first: that counts against the same
      // deadline (a paused server accepts TCP connections and then never answers).
      return await (await withDeadline(ep.command(), deadline, ep.name)).send(args, deadline);
    } catch (e) {
      if (e instanceof ServerReplyError && ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"].includes(e.code)) {
        await t.rerouted(key, e, deadline);
        const again = await t.endpointFor(key, deadline);
        return (await withDeadline(again.command(), deadline, again.name)).send(args, deadline);
      }
      throw e;
    }
  }

  private async shortOutcome(t: Target, key: string, args: Arg[], deadline: number, read: (r: Reply | Error) => Outcome, conn?: Conn): Promise<Outcome> {
    try {
      if (conn) return read(await conn.send(args, deadline));
      const ep = await t.endpointFor(key, deadline);
      return read(await this.short(t, ep, key, args, deadline));
    } catch (e) {
      return read(e instanceof Error ? e : new Error(String(e)));
    }
  }

  /** Gives back a grant that a cut-short wait may have made (NOTOWNER is fine), without waiting for it. */
  private giveBack(t: Target, key: string, owner: string): Promise<void> {
    return this.shortOutcome(t, key, releaseArgs(key, owner, true), 1000, doneOutcome).then(() => undefined);
  }

  /**
   * One server-side wait of `wait` ms on a wait connection (never re-sent; `build(ms)` makes the
   * command for the wait left once a connection is free). Cut short by the deadline (wait + 1 s)
   * or the signal: the connection is destroyed and the owner's possible grant given back. A
   * bound request (`bind`) keeps its connection: `keep(conn)` hands it to the caller, who
   * destroys it on failure; otherwise the connection goes back to the pool after a reply.
   */
  private async waitOn(
    t: Target,
    ep: Endpoint,
    key: string,
    owner: string,
    build: (wait: number) => Arg[],
    wait: number,
    signal: AbortSignal | undefined,
    bound: Conn | undefined,
    keep: ((c: Conn) => void) | undefined,
    rerouted = false,
  ): Promise<Outcome> {
    // The place in this process's line of waits on the key, taken before anything is awaited
    // so that it is the call order (see WaitLines).
    const turn = this.lines.join(ep.name, key);
    try {
      return await this.waitInLine(turn, t, ep, key, owner, build, wait, signal, bound, keep, rerouted);
    } finally {
      turn.dropped();
    }
  }

  /** {@link waitOn} with its place in the key's line: written once the earlier waits on the key are queued. */
  private async waitInLine(
    turn: WaitTurn,
    t: Target,
    ep: Endpoint,
    key: string,
    owner: string,
    build: (wait: number) => Arg[],
    wait: number,
    signal: AbortSignal | undefined,
    bound: Conn | undefined,
    keep: ((c: Conn) => void) | undefined,
    rerouted: boolean,
  ): Promise<Outcome> {
    const t0 = now();
    let conn: Conn;
    if (bound) conn = bound;
    else {
      // The pool may make us wait (maxWaitConnections): no longer than the wait itself.
      const gate = new AbortController();
      const onAbort = (): void => gate.abort(signal?.reason);
      signal?.addEventListener("abort", onAbort, { once: true });
      const timer = wait === Infinity ? undefined : setTimeout(() => gate.abort(new ConnectionLimitError(`every wait connection to ${ep.name} stayed busy for the whole wait (${Math.ceil(wait)} ms): raise maxWaitConnections, or wait longer`)), Math.ceil(wait));
      try {
        conn = await ep.acquireWaitConn(gate.signal);
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        // Only a request still queued for a place gets the gate's reason back (the driver
        // names a connect cut short by the gate as a timeout).
        if (e instanceof ConnectionLimitError) throw e;
        return errorOutcome(e);
      } finally {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      }
      keep?.(conn);
    }
    // Written only once the earlier waits of this process on the key are in the server's queue
    // (two connections' bytes can reach the server in either order); no longer than the wait.
    await turn.before(wait === Infinity ? Infinity : Math.max(0, wait - (now() - t0)), signal);
    const left = wait === Infinity ? Infinity : Math.max(1, wait - (now() - t0));
    const deadline = left === Infinity ? undefined : Math.ceil(left) + WAIT_REPLY_MARGIN;
    const onAbort = (): void => conn.destroy();
    signal?.addEventListener("abort", onAbort, { once: true });
    let cut = false;
    let outcome: Outcome;
    try {
      if (signal?.aborted) throw signal.reason;
      const reply = conn.send(build(left), deadline);
      turn.sent(reply, async () => {
        const c = await withDeadline(ep.command(), PROBE_DEADLINE_MS, ep.name);
        const send = (a: Arg[]): Promise<Reply> => c.send(a, PROBE_DEADLINE_MS);
        const info = await this.ownInfo(t, key, owner, send);
        if (holdsOrWaits(info, owner)) return true;
        // The owner form lists at most the first 1000 queued clients: a longer queue is read whole.
        const ws = info?.raw.get("waiters");
        if (info && Array.isArray(ws) && info.waiting > ws.length) return holdsOrWaits(parseInfo(await send(infoArgs(key))), owner);
        return false;
      });
      outcome = acquireOutcome(await reply);
    } catch (e) {
      outcome = acquireOutcome(e instanceof Error ? e : new Error(String(e)));
      // No answer, or a grant whose token could not be read exactly: it may hold, give it back.
      if (outcome.kind === "unreachable" || (outcome.kind === "refused" && outcome.refusal === "precision")) cut = true;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
    if (cut || signal?.aborted) {
      conn.destroy();
      await this.giveBack(t, key, owner);
      if (signal?.aborted) throw signal.reason;
      return outcome;
    }
    if (!keep) ep.releaseWaitConn(conn);
    if (outcome.kind === "redirect" && !rerouted) {
      // Not queued there: ask where the key lives now (once).
      const left = wait === Infinity ? undefined : Math.max(1, Math.ceil(wait - (now() - t0)));
      let again: Endpoint;
      try {
        await t.rerouted(key, new ServerReplyError(outcome.text), left);
        again = await t.endpointFor(key, left);
      } catch (e) {
        // Where the key lives now could not be learnt in time: this server's answer stands.
        return errorOutcome(e);
      }
      if (keep && again !== ep) return outcome;
      return this.waitOn(t, again, key, owner, build, wait === Infinity ? Infinity : Math.max(1, wait - (now() - t0)), signal, bound ?? (keep ? conn : undefined), keep, true);
    }
    return outcome;
  }

  private stats(votes: readonly Vote[], resources: number): ExecutionStats {
    const clients = [...this.clients];
    const s: ExecutionStats = {
      membershipSize: clients.length,
      quorumSize: quorumOf(clients.length),
      votesFor: new Set(),
      votesAgainst: new Map(),
    };
    votes.forEach((v, i) => {
      const c = clients[i] as RedisClientLike;
      if (v.kind === "for") s.votesFor.add(c);
      else {
        const err = voteError(v, resources);
        s.votesAgainst.set(c, err);
        this.emit("error", err);
      }
    });
    return s;
  }

  // ---- acquire -------------------------------------------------------------------------------

  private async acquireAs(resources: string[], duration: number, over: Partial<Settings> | undefined, opts: AcquireOptions): Promise<Lock> {
    checkTtl(duration);
    const s = resolveSettings(this.settings, over);
    const keys = ordered(resources);
    const spec: AcquireSpec = {
      kind: opts.kind,
      ttl: duration,
      ...(opts.capacity !== undefined ? { capacity: opts.capacity } : {}),
      ...(s.bind ? { bind: true } : {}),
      ...(s.lockDelay ? { lockDelay: s.lockDelay } : {}),
    };
    checkSpec(spec);
    if (this.targets.length > 1 && opts.kind === "semaphore") throw new InvalidRequestError(REDLOCK_NO_PERMITS);
    s.signal?.throwIfAborted();
    const owner = randomBytes(16).toString("hex");
    const wait = serverWait(s);
    const attempts: Promise<ExecutionStats>[] = [];
    const hold =
      this.targets.length === 1
        ? await this.acquireOne(keys, spec, owner, wait, s, attempts)
        : await this.acquireQuorum(keys, spec, owner, wait, s, attempts);
    if (hold.bound.size > 0) this.live.add(hold);
    if (opts.watch || s.onLost) {
      this.live.add(hold);
      if (s.onLost) {
        const cb = s.onLost;
        hold.onLoss((e) => cb(e));
      }
      // The validity runs while the watches are set up: its timer first, and the setting up
      // may take at most a quarter of what is left (a slow or paused server finishes its
      // watch later, in the background).
      hold.armExpiry();
      await this.watch(hold, Math.max(0, hold.lease.validity(now()) / 4));
      const lost = hold.lost ?? (hold.lease.validity(now()) <= 0 ? hold.markLost({ cause: "expired", resource: hold.resources[0] ?? "", detail: "" }) : null);
      if (lost) {
        // Never hand out a lock already lost: give back whatever is still held, then say why.
        hold.stop();
        this.live.delete(hold);
        await this.everywhere(hold, hold.resources, (k) => releaseArgs(k, owner, true), shortDeadline(duration), true).catch(() => undefined);
        throw new LockLostError(lost.resource, lost.cause, lost.detail, attempts);
      }
    }
    // The expiration (as redlock: Date.now() milliseconds, an integer) from the validity left now.
    return makeLock(this, hold, attempts, Math.floor(Date.now() + Math.max(0, hold.lease.validUntil - now())), resources);
  }

  private async acquireOne(keys: string[], spec: AcquireSpec, owner: string, wait: number | undefined, s: Settings, attempts: Promise<ExecutionStats>[]): Promise<Hold> {
    const t = this.targets[0] as Target;
    const deadline = shortDeadline(spec.ttl);
    const m = new OneServerAttempt(keys, spec, owner, wait, now());
    /** Resources granted after waiting in the server's queue: their validity is checked. */
    const waited: string[] = [];
    let bound: Conn | undefined;
    let boundEp: Endpoint | undefined;
    let step: OneStep = m.start(now());
    try {
      while (step.kind === "send") {
        const { key, args, wait: left, build } = step;
        let o: Outcome;
        let grantedAfterWait: string | undefined;
        if (left === undefined && !spec.bind) {
          o = await this.shortOutcome(t, key, args, deadline, acquireOutcome);
        } else {
          let ep: Endpoint;
          try {
            ep = await t.endpointFor(key, left === undefined ? deadline : Math.max(1, Math.ceil(left)));
          } catch (e) {
            // Where the key lives could not be learnt in time: no answer from that server.
            step = m.replied(errorOutcome(e), now());
            continue;
          }
          if (bound && boundEp !== ep) throw new InvalidRequestError("bind: every resource must live on one server node");
          if (left === undefined) {
            // A bound acquire without a wait: on the connection the hold is bound to.
            if (!bound) {
              bound = await ep.acquireWaitConn(s.signal);
              boundEp = ep;
            }
            o = await this.shortOutcome(t, key, args, deadline, acquireOutcome, bound);
          } else {
            o = await this.waitOn(t, ep, key, owner, build, left, s.signal, bound, spec.bind ? (c) => {
              bound = c;
              boundEp = ep;
            } : undefined);
            if (o.kind === "granted") grantedAfterWait = key;
          }
        }
        const at = now();
        // A long wait's grant is checked against the server below (its reply may have sat
        // unread); a short one is counted from its request, which is safe. Decided with the
        // same time the core counts the lease with.
        if (grantedAfterWait !== undefined && waitedGrantNeedsCheck(m.lastSent, spec.ttl, at)) waited.push(grantedAfterWait);
        step = m.replied(o, at);
      }
    } catch (e) {
      // Cut short (the user's signal, no wait connection free): give back every resource.
      await Promise.all(keys.map((k) => this.giveBack(t, k, owner)));
      bound?.destroy();
      throw e;
    }
    attempts.push(Promise.resolve(this.stats([step.vote], keys.length)));
    if (step.kind === "granted") {
      let validUntil: number | null = step.validUntil;
      // A grant that waited is counted from when its reply was read; the server granted it
      // earlier, by as long as the reply sat unread (a busy event loop). Ask the server how long
      // the hold has left (one LOCK.INFO per waited resource).
      for (const key of waited) {
        if (validUntil === null) break;
        const sent = now();
        let ttl: number | null | undefined;
        try {
          const ep = await t.endpointFor(key, deadline);
          const info = await this.ownInfo(t, key, owner, (a) => this.short(t, ep, key, a, deadline));
          ttl = info?.holders.find((h) => h.owner === owner)?.ttl ?? null;
        } catch {
          ttl = undefined; // no answer: keep the lease as counted from the reply
        }
        if (ttl !== undefined) validUntil = confirmedValidUntil(validUntil, sent, ttl, now());
      }
      if (validUntil === null) {
        await Promise.all(keys.map((k) => this.giveBack(t, k, owner)));
        bound?.destroy();
        throw failureError({ kind: "expired" }, attempts, [t.name]);
      }
      const hold = new Hold(owner, keys, spec, [t.name], validUntil, s.driftFactor);
      const tokens = step.tokens;
      keys.forEach((k, i) => hold.tokens.set(k, new Map([[t.name, tokens[i] as bigint]])));
      if (bound) hold.bound.set(0, bound);
      return hold;
    }
    await Promise.all(step.giveBack.map((k) => this.giveBack(t, k, owner)));
    bound?.destroy();
    throw failureError(step.failure, attempts, [t.name], step.outcome ? [step.outcome] : []);
  }

  /** Runs the Redlock machine's steps. */
  private async acquireQuorum(keys: string[], spec: AcquireSpec, owner: string, wait: number | undefined, s: Settings, attempts: Promise<ExecutionStats>[]): Promise<Hold> {
    const n = this.targets.length;
    const newOwner = (): string => randomBytes(16).toString("hex");
    const m = new RedlockAttempts({ resources: keys, spec, owner, n, wait, driftFactor: s.driftFactor, newOwner }, now());
    const deadline = shortDeadline(spec.ttl);
    // A bound request: each attempt's holds on a connection of their own per server.
    const conns = spec.bind ? new Map<number, Conn>() : undefined;
    const dropConns = (keep?: ReadonlySet<number>): void => {
      if (!conns) return;
      for (const [server, c] of conns) {
        if (keep?.has(server)) continue;
        c.destroy();
        conns.delete(server);
      }
    };
    const recordRound = (): void => {
      const round = m.takeRound();
      if (round) attempts.push(Promise.resolve(this.stats(round, keys.length)));
    };
    let step: Step = m.start(now());
    try {
      for (;;) {
        if (step.kind === "send") {
          const replies = await this.execute(step.to, m.owner, deadline, step.what === "release" ? doneOutcome : acquireOutcome, s.signal, conns);
          if (conns && step.what === "release") {
            // Given back: closing the connection also ends anything still bound to it. A
            // server that answered "held" keeps its connection (it holds nothing) for the next attempt.
            for (const sc of step.to) {
              conns.get(sc.server)?.destroy();
              conns.delete(sc.server);
            }
          }
          step = m.replied(replies, now());
        } else if (step.kind === "sleep") {
          await sleep(step.ms, s.signal);
          step = m.woke(now());
        } else if (step.kind === "granted") {
          recordRound();
          const hold = new Hold(step.owner, keys, spec, this.servers, step.validUntil, s.driftFactor);
          for (const [server, toks] of step.tokens) {
            keys.forEach((k, i) => {
              let per = hold.tokens.get(k);
              if (!per) hold.tokens.set(k, (per = new Map()));
              per.set(this.targets[server]?.name ?? String(server), toks[i] as bigint);
            });
          }
          if (conns) {
            // Servers that did not vote for may hold some resources on their connection: closing it ends them.
            dropConns(new Set(step.tokens.keys()));
            for (const [server, c] of conns) hold.bound.set(server, c);
          }
          return hold;
        } else {
          recordRound();
          throw failureError(step.failure, attempts, this.servers, step.outcomes);
        }
        recordRound();
      }
    } catch (e) {
      // Failed or cut short (the user's signal, no wait connection free): give back whatever any server may hold.
      dropConns();
      await Promise.all(this.targets.map((t) => Promise.all(keys.map((k) => this.giveBack(t, k, m.owner)))));
      throw e;
    }
  }

  /**
   * Carries out a send step: commands that do not wait are pipelined; a queued wait runs one
   * command after the other. A bound request's acquires go over `conns` (one per server, opened
   * for the attempt).
   */
  private async execute(
    to: readonly ServerCommands[],
    owner: string,
    deadline: number,
    read: (r: Reply | Error) => Outcome,
    signal?: AbortSignal,
    conns?: Map<number, Conn>,
  ): Promise<(Outcome | undefined)[][]> {
    const replies: (Outcome | undefined)[][] = this.targets.map(() => []);
    await Promise.all(
      to.map(async (sc) => {
        const t = this.targets[sc.server] as Target;
        const out = replies[sc.server] as (Outcome | undefined)[];
        if (sc.wait !== undefined) {
          for (const args of sc.commands) {
            const key = args[1] as string;
            const ep = await t.endpointFor(key).catch((e: unknown) => e as Error);
            const o = ep instanceof Error ? errorOutcome(ep) : await this.waitOn(t, ep, key, owner, (w) => withWait(args, w), sc.wait, signal, undefined, undefined);
            out.push(o);
            if (o.kind !== "granted") break;
          }
          return;
        }
        let conn: Conn | undefined = conns?.get(sc.server);
        if (conns && !conn && read === acquireOutcome) {
          try {
            const ep = await t.endpointFor(sc.commands[0]?.[1] as string, deadline);
            conn = await ep.acquireWaitConn(signal);
            conns.set(sc.server, conn);
          } catch (e) {
            const o = errorOutcome(e);
            out.push(...sc.commands.map(() => o));
            return;
          }
        }
        const via = conn && !conn.closed ? conn : undefined;
        const os = await Promise.all(sc.commands.map((args) => this.shortOutcome(t, args[1] as string, args, deadline, read, via)));
        out.push(...os);
      }),
    );
    return replies;
  }

  // ---- watch ---------------------------------------------------------------------------------

  /** Sets up the loss watcher on every server that granted each resource, waiting at most
   *  `budgetMs` for it (a watch still being set up after that is kept when it comes). */
  private async watch(hold: Hold, budgetMs: number): Promise<void> {
    if (hold.watching) return;
    hold.watching = true;
    const all = Promise.all(
      this.targets.map((t, server) =>
        Promise.all(
          hold.resources.map(async (key) => {
            // A server that did not grant this resource has nothing to watch.
            const granted = hold.tokens.get(key);
            if (granted !== undefined && !granted.has(this.servers[server] ?? "")) return;
            try {
              const ep = await t.endpointFor(key);
              const bound = hold.bound.get(server);
              const w = await watchHold(ep, key, hold.owner, bound ? { boundConn: bound } : {}, (cause, detail) => {
                hold.serverLost(server, key, { cause, resource: key, detail });
              });
              if (hold.stopped) w.stop();
              else hold.watches.push(w);
            } catch (e) {
              // A watch that cannot be set up does not declare a loss: the validity does.
              this.emit("error", e instanceof Error ? e : new Error(String(e)));
            }
          }),
        ),
      ),
    );
    let timer: NodeJS.Timeout | undefined;
    const budget = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, Math.ceil(budgetMs));
      timer.unref();
    });
    await Promise.race([all, budget]);
    if (timer) clearTimeout(timer);
  }

  // ---- release / extend ----------------------------------------------------------------------

  /** Sends one command per resource to every server; answers by server. */
  private async everywhere(hold: Hold | undefined, resources: readonly string[], build: (key: string) => string[], deadline: number, viaBound: boolean): Promise<ServerAnswers[]> {
    return Promise.all(
      this.targets.map(async (t, server) => {
        const bound = viaBound ? hold?.bound.get(server) : undefined;
        const conn = bound && !bound.closed ? bound : undefined;
        return Promise.all(resources.map((key) => this.shortOutcome(t, key, build(key), deadline, doneOutcome, conn)));
      }),
    );
  }

  private answersStats(answers: readonly ServerAnswers[], resources: number): ExecutionStats {
    return this.stats(answers.map((a) => vote(a, resources)), resources);
  }

  private async diagnose(hold: Hold, server: number, resource: number, text: string): Promise<LockLostError> {
    const t = this.targets[server] as Target;
    const key = hold.resources[resource] as string;
    let info: LockInfo | null | undefined;
    try {
      const ep = await t.endpointFor(key);
      info = await this.ownInfo(t, key, hold.owner, (a) => this.short(t, ep, key, a, 1000));
    } catch {
      info = undefined;
    }
    const loss = hold.lease.diagnosed(info, hold.owner, resource, text);
    return hold.markLost(loss);
  }

  /**
   * Releases the lock on every server (`LOCK.RELEASE key owner ALL`). Resolves when a majority
   * released it; rejects with `LockLostError` (naming the cause) when the lock was lost before,
   * or with `ExecutionError` when too few servers answered (the lock then ends at its ttl).
   * Releasing a lock again resolves to the first release's result.
   */
  async release(lock: Lock, settings?: Partial<Settings>): Promise<ExecutionResult> {
    void settings;
    lock.expiration = 0;
    const hold = holdOf(lock);
    if (hold?.releaseResult) return hold.releaseResult;
    hold?.stop();
    const resources = hold ? hold.resources : lock.resources;
    const answers = await this.everywhere(hold, resources, (k) => releaseArgs(k, lock.value, true), shortDeadline(hold?.spec.ttl ?? 1000), true);
    const attempts = [Promise.resolve(this.answersStats(answers, resources.length))];
    const closed = hold ? [...hold.bound.values()].some((c) => c.closed) : false;
    if (hold) {
      for (const c of hold.bound.values()) c.destroy();
      this.live.delete(hold);
    }
    if (!hold) {
      const votes = answers.map((a) => vote(a, resources.length));
      if (votes.filter((v) => v.kind === "for").length >= quorumOf(this.targets.length)) return { attempts };
      throw new ExecutionError(QUORUM_MESSAGE, attempts);
    }
    const v = hold.lease.releasedWith(answers, closed, now());
    switch (v.kind) {
      case "ok":
        hold.releaseResult = { attempts };
        return hold.releaseResult;
      default:
        throw await this.verdictError(hold, v, answers, attempts, false);
    }
  }

  /** The error a release or an extend rejects with when the servers' answers (`v`) are not a
   *  success: the loss (recorded on the hold when an extend found it), a closer look at a
   *  server that refused, or too few answers. */
  private async verdictError(
    hold: Hold,
    v: Exclude<Verdict, { kind: "ok" }>,
    answers: readonly ServerAnswers[],
    attempts: ReadonlyArray<Promise<ExecutionStats>>,
    record: boolean,
  ): Promise<Error> {
    switch (v.kind) {
      case "lost": {
        const e = record ? hold.markLost(v.loss) : (hold.lost ?? new LockLostError(v.loss.resource, v.loss.cause, v.loss.detail));
        return new LockLostError(e.resource, e.cause, e.detail, attempts);
      }
      case "diagnose": {
        const e = await this.diagnose(hold, v.server, v.resource, "");
        return new LockLostError(e.resource, e.cause, e.detail, attempts);
      }
      case "unreachable":
        return failureError({ kind: "unreachable", servers: unreachableOf(answers) }, attempts, this.servers, answers.map(firstBad));
    }
  }

  /**
   * Extends the lock to `duration` ms from now on every server (`LOCK.EXTEND`): resolves to a new
   * `Lock` (the old one's `expiration` becomes 0, as in redlock). Rejects with `LockLostError` when
   * the lock is lost, with `ExecutionError` when too few servers confirmed it in time.
   */
  async extend(existing: Lock, duration: number, settings?: Partial<Settings>): Promise<Lock> {
    void settings;
    checkTtl(duration);
    const hold = holdOf(existing);
    if (hold?.lost) throw hold.lost;
    if (existing.expiration < Date.now()) throw new ExecutionError("Cannot extend an already-expired lock.", []);
    const sent = now();
    const resources = hold ? hold.resources : existing.resources;
    const answers = await this.everywhere(hold, resources, (k) => extendArgs(k, existing.value, duration), shortDeadline(duration), false);
    const attempts = [Promise.resolve(this.answersStats(answers, resources.length))];
    if (!hold) {
      const votes = answers.map((a) => vote(a, resources.length));
      if (votes.filter((v) => v.kind === "for").length < quorumOf(this.targets.length)) throw new ExecutionError(QUORUM_MESSAGE, attempts);
      existing.expiration = 0;
      return new Lock(this, existing.resources, existing.value, attempts, Date.now() + duration - (Math.round(this.settings.driftFactor * duration) + 2));
    }
    // Released meanwhile (a release raced this extend): nothing is held, and no loss either.
    if (hold.lease.released) throw new ExecutionError("Cannot extend a lock that was released meanwhile.", attempts);
    // A server whose bound connection is known closed has ended the hold (or will, once it
    // reads the close), whatever it answered: its answers do not count.
    const closedOn = new Set([...hold.bound].filter(([, c]) => c.closed).map(([i]) => i));
    const counted = answers.map((a, i) => (closedOn.has(i) ? a.map(() => undefined) : a));
    const v = hold.lease.extended(counted, closedOn.size > 0, sent, duration, now());
    switch (v.kind) {
      case "ok": {
        existing.expiration = 0;
        hold.spec = { ...hold.spec, ttl: duration };
        if (hold.watching) hold.armExpiry();
        return makeLock(this, hold, attempts, Date.now() + Math.max(0, v.validUntil - now()), existing.resources);
      }
      default:
        throw await this.verdictError(hold, v, answers, attempts, true);
    }
  }

  // ---- using ---------------------------------------------------------------------------------

  /**
   * Runs `routine` under a lock on `resources`, extended automatically (when less than
   * `automaticExtensionThreshold` ms of it are left, as redlock) and watched: if the lock is lost
   * (its key deleted or overwritten, another owner holds it, an extension fails for good), the
   * routine's signal aborts with `signal.error` (and `signal.reason`) set to a `LockLostError`.
   * The lock is released when the routine ends; resolves to the routine's value, or rejects with
   * its error (a failed release after a loss does not hide it), or with `LockLostError` when the
   * routine succeeded but the lock turned out lost by its release.
   */
  using<T>(resources: string[], duration: number, settings: Partial<Settings>, routine?: (signal: RedlockAbortSignal, context: RedlockUsingContext) => Promise<T>): Promise<T>;
  using<T>(resources: string[], duration: number, routine: (signal: RedlockAbortSignal, context: RedlockUsingContext) => Promise<T>): Promise<T>;
  async using<T>(
    resources: string[],
    duration: number,
    settingsOrRoutine: Partial<Settings> | ((signal: RedlockAbortSignal, context: RedlockUsingContext) => Promise<T>) | undefined,
    optionalRoutine?: (signal: RedlockAbortSignal, context: RedlockUsingContext) => Promise<T>,
  ): Promise<T> {
    if (Math.floor(duration) !== duration) throw new Error("Duration must be an integer value in milliseconds.");
    const over = settingsOrRoutine && typeof settingsOrRoutine !== "function" ? settingsOrRoutine : undefined;
    const settings = resolveSettings(this.settings, over);
    const routine = optionalRoutine ?? settingsOrRoutine;
    if (typeof routine !== "function") throw new Error("INVARIANT: routine is not a function.");
    if (settings.automaticExtensionThreshold > duration - 100) {
      throw new Error("A lock `duration` must be at least 100ms greater than the `automaticExtensionThreshold` setting.");
    }
    const controller = new AbortController();
    const signal = controller.signal as RedlockAbortSignal;
    let lock = await this.acquireAs(resources, duration, over, { kind: "write", watch: true });
    const hold = holdOf(lock) as Hold;
    const abort = (e: LockLostError): void => {
      if (signal.aborted) return;
      signal.error = e;
      controller.abort(e);
    };
    hold.onLoss(abort);
    if (hold.lost) abort(hold.lost);
    let timer: NodeJS.Timeout | undefined;
    let extension: Promise<void> | undefined;
    let finished = false;
    const queue = (): void => {
      if (finished) return;
      timer = setTimeout(() => {
        timer = undefined;
        extension = extend();
      }, extensionDelay(lock.expiration, Date.now(), settings.automaticExtensionThreshold));
    };
    const extend = async (): Promise<void> => {
      for (;;) {
        if (finished || signal.aborted) return;
        try {
          lock = await lock.extend(duration);
          context.lock = lock;
          context.extensions += 1;
          queue();
          return;
        } catch (e) {
          const next = afterExtendFailure(e instanceof LockLostError, hold.lease.validity(now()), settings.retryDelay);
          if (next.kind === "lost") return abort(hold.lost ?? (e as LockLostError));
          if (next.kind === "retry") {
            await sleep(next.ms);
            continue;
          }
          const lost = hold.markLost({ cause: "expired", resource: hold.resources[0] ?? "", detail: e instanceof Error ? e.message : String(e) });
          return abort(lost);
        }
      }
    };
    const context: RedlockUsingContext = { lock, extensions: 0 };
    queue();
    let result: T;
    try {
      result = await routine(signal, context);
    } catch (routineError) {
      finished = true;
      await cleanup();
      await lock.release().catch(() => undefined);
      throw routineError;
    }
    finished = true;
    await cleanup();
    try {
      await lock.release();
    } catch (e) {
      // The work ran under the lock unless the lock was lost: only a loss fails the using.
      if (e instanceof LockLostError) throw e;
    }
    // The routine was told the lock was lost (its signal fired): part of its work may have run
    // without it, so using() does not report success, even when the servers still held it.
    if (signal.aborted) throw signal.error ?? signal.reason;
    return result;

    async function cleanup(): Promise<void> {
      if (timer) clearTimeout(timer);
      timer = undefined;
      if (extension) await extension.catch(() => undefined);
    }
  }
}

/** A queued command with the wait that is left (its `WAIT ms` replaced). */
function withWait(args: readonly string[], wait: number): string[] {
  const out = [...args];
  const i = out.indexOf("WAIT");
  if (i >= 0) out[i + 1] = waitArg(wait);
  return out;
}

/** The servers (indices) whose answers include a lost connection or no reply. */
function unreachableOf(answers: readonly ServerAnswers[]): number[] {
  const out: number[] = [];
  answers.forEach((a, i) => {
    if (a.some((o) => !o || o.kind === "unreachable")) out.push(i);
  });
  return out;
}

function firstBad(a: ServerAnswers): Outcome {
  return a.find((o): o is Outcome => !!o && o.kind !== "granted") ?? { kind: "granted", token: 0n };
}

export { Redlock };
