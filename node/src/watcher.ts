/**
 * The loss watcher's face (decisions in `core/watch.ts`): per endpoint, tracking on the
 * endpoint's command connection redirected to a subscriber connection of its own; each
 * invalidation of a watched key is followed by a `LOCK.INFO key OWNER owner` per owner among
 * the key's holds (a plain `LOCK.INFO key` on a server whose module predates `OWNER`) over the command connection,
 * judged for each watched hold. A bound hold's connection closing is a loss at once
 * ("connection-closed"); the command connection closing makes the watcher open it again,
 * register every key and re-read every key. A re-read that cannot be done declares nothing
 * (the lease's validity does that).
 * @internal
 */
import {
  Registration,
  WatchCore,
  emptyPlan,
  type LossCause,
  type Plan,
} from "./core/watch.js";
import { ConnectionLostError, type Conn, type Endpoint, type Reply, type SubscriberConn } from "./driver/types.js";

export type { LossCause } from "./core/watch.js";

/** Stops watching one hold (no report after it returns). */
export interface WatchHandle {
  stop(): void;
}

/** A watcher with nothing to watch for this long closes its subscriber and ends (ms). */
const IDLE_STOP_MS = 10_000;
/** While holds are watched and the connections are down, how often they are opened again (ms). */
const REOPEN_EVERY_MS = 500;
/** The deadline of a registration or a re-read (ms). */
const IO_DEADLINE_MS = 5_000;

function now(): number {
  return performance.now();
}

class Reg extends Registration {
  /** Reported to its owner (once). */
  reported = false;
  /** A PING over the bound connection is out. */
  checking = false;
  constructor(
    key: string,
    owner: string,
    readonly onLost: (cause: LossCause, detail: string) => void,
    readonly bound: Conn | undefined,
  ) {
    super(key, owner);
  }
}

class EndpointWatcher {
  readonly core = new WatchCore();
  private sub: SubscriberConn | null = null;
  private tracked: Conn | null = null;
  private settingUp: Promise<void> | null = null;
  private unhook: (() => void) | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private timerAt = 0;
  private reopenTimer: ReturnType<typeof setTimeout> | null = null;
  private idleTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(private readonly endpoint: Endpoint) {}

  /** Whether tracking is set up and running. */
  private up(): boolean {
    return this.tracked !== null && !this.tracked.closed && this.sub !== null && !this.sub.closed && this.core.redirect !== null;
  }

  async add(reg: Reg): Promise<void> {
    this.clearIdle();
    const plan = this.core.add(reg, now());
    if (this.core.refused !== null) return;
    if (this.up() && this.tracked) {
      await this.execute(this.tracked, plan);
    } else {
      await this.ensureUp();
    }
  }

  remove(reg: Reg): void {
    this.run(this.core.cancel(reg, now()));
    this.maybeIdle();
  }

  /** Sends a plan (a replacement of the registered set and its re-reads) when tracking is up. */
  private run(plan: Plan): void {
    if (plan.commands.length === 0 && plan.reads.length === 0) return;
    if (this.tracked && this.up()) void this.execute(this.tracked, plan);
    else this.core.connectionLostReads(plan.reads);
  }

  /** A loss found (a re-read's verdict, or a bound connection's close). A bound hold found
   *  gone by a re-read is reported as "connection-closed" when its connection turns out to be
   *  closed (the server's notice of the ended hold can overtake the socket's close): one PING
   *  over it tells. */
  lost(reg: Reg, cause: LossCause): void {
    if (reg.cancelled || reg.reported) return;
    if (!reg.done) this.run(this.core.remove(reg, now()));
    const bound = reg.bound;
    if (cause === "connection-closed" || !bound) {
      this.report(reg, cause);
    } else if (bound.closed) {
      this.report(reg, "connection-closed");
    } else if (!reg.checking) {
      reg.checking = true;
      bound.send(["PING"], 1000).then(
        () => this.report(reg, bound.closed ? "connection-closed" : cause),
        () => this.report(reg, "connection-closed"),
      );
    }
    this.maybeIdle();
  }

  private report(reg: Reg, cause: LossCause): void {
    if (reg.cancelled || reg.reported) return;
    reg.reported = true;
    try {
      reg.onLost(cause, "");
    } catch {
      // a callback's failure must not end the watcher
    }
  }

  private maybeIdle(): void {
    if (this.core.watched() || this.idleTimer) return;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = null;
      if (!this.core.watched()) this.shutdown();
    }, IDLE_STOP_MS);
    this.idleTimer.unref?.();
  }

  private clearIdle(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
  }

  /** Closes the subscriber and turns tracking off (nothing watched). */
  private shutdown(): void {
    const sub = this.sub;
    const tracked = this.tracked;
    this.sub = null;
    this.tracked = null;
    this.core.disconnected();
    this.unhook?.();
    this.unhook = null;
    this.clearTimers();
    sub?.destroy();
    if (tracked && !tracked.closed) tracked.send(["CLIENT", "TRACKING", "off"], IO_DEADLINE_MS).catch(() => undefined);
  }

  private clearTimers(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.reopenTimer) clearTimeout(this.reopenTimer);
    this.reopenTimer = null;
  }

  /** Sets up the subscriber and tracking on the command connection (once at a time). */
  ensureUp(): Promise<void> {
    if (this.settingUp) return this.settingUp;
    const p = this.setUp().catch(() => {
      this.scheduleReopen();
    });
    this.settingUp = p;
    const clear = (): void => {
      if (this.settingUp === p) this.settingUp = null;
    };
    p.then(clear, clear);
    return p;
  }

  private async setUp(): Promise<void> {
    if (!this.core.watched() || this.core.refused !== null) return;
    if (this.sub === null || this.sub.closed) {
      const sub = await this.endpoint.subscribeInvalidations((keys) => this.onInvalidate(sub, keys));
      this.sub = sub;
      sub.onClose(() => this.subClosed(sub));
      // A new redirect target: tracking on the command connection must point at it.
      this.tracked = null;
      this.core.disconnected();
    }
    if (!this.unhook) this.unhook = this.endpoint.onCommandOpen((conn) => this.track(conn));
    const cur = this.endpoint.currentCommand();
    if (cur) await this.track(cur);
    else {
      // The hook tracks a connection opened from now on; one whose opening had passed its
      // hooks already is tracked here.
      const conn = await this.endpoint.command();
      if (this.tracked !== conn) await this.track(conn);
    }
  }

  /** Turns tracking on for `conn` (a command connection) redirected to the subscriber. */
  private async track(conn: Conn): Promise<void> {
    const sub = this.sub;
    if (!sub || sub.closed || !this.core.watched() || this.tracked === conn || this.core.refused !== null) return;
    this.tracked = conn;
    conn.onClose(() => this.commandClosed(conn));
    const plan = this.core.connected(sub.id, now());
    await this.execute(conn, plan);
  }

  private commandClosed(conn: Conn): void {
    if (this.tracked !== conn) return;
    this.tracked = null;
    this.core.disconnected();
    if (this.core.watched()) void this.ensureUp();
  }

  private subClosed(sub: SubscriberConn): void {
    if (this.sub !== sub) return;
    this.sub = null;
    this.tracked = null;
    this.core.disconnected();
    if (this.core.watched()) void this.ensureUp();
  }

  private scheduleReopen(): void {
    if (this.reopenTimer || !this.core.watched() || this.core.refused !== null) return;
    this.reopenTimer = setTimeout(() => {
      this.reopenTimer = null;
      if (!this.up()) void this.ensureUp();
    }, REOPEN_EVERY_MS);
    this.reopenTimer.unref?.();
  }

  private onInvalidate(sub: SubscriberConn, keys: string[] | null): void {
    if (this.sub !== sub) return;
    const plan = this.core.message(keys, now());
    if (this.tracked && this.up()) void this.execute(this.tracked, plan);
    else this.arm();
  }

  /** Sends a plan's commands then its re-reads, pipelined, over `conn`; judges the re-reads. */
  private async execute(conn: Conn, plan: Plan): Promise<void> {
    if (plan.commands.length === 0 && plan.reads.length === 0) {
      this.arm();
      return;
    }
    const cmdReplies = plan.commands.map((c) => settle(conn.send(c, IO_DEADLINE_MS)));
    const { cmds: readCmds, sent } = this.core.readRequests(plan);
    const readReplies = readCmds.map((c) => settle(conn.send(c, IO_DEADLINE_MS)));
    let reconnect = false;
    for (const r of await Promise.all(cmdReplies)) {
      if (this.core.registeredReply(r.reply, r.error)) reconnect = true;
    }
    const reads = await Promise.all(readReplies);
    if (this.tracked !== conn) {
      // set up again meanwhile: the new set-up re-reads every key
      this.core.connectionLostReads(plan.reads);
      return;
    }
    const failed: Array<[string, number]> = [];
    let at = 0;
    for (const [key, number, owners] of sent) {
      const mine = reads.slice(at, at + owners.length);
      at += owners.length;
      if (mine.length < owners.length || mine.some((r) => r.error instanceof ConnectionLostError)) {
        failed.push([key, number]);
        continue;
      }
      const got = new Map(owners.map((o, i) => [o, mine[i] as { reply: Reply | undefined; error: unknown }]));
      for (const [reg, cause] of this.core.readsDone(key, number, got)) this.lost(reg as Reg, cause);
    }
    if (failed.length > 0) this.core.connectionLostReads(failed);
    if (reconnect && this.tracked === conn) {
      this.tracked = null;
      this.core.disconnected();
      this.sub?.destroy();
    }
    this.arm();
  }

  /** Runs the due re-reads when their spacing is over (one timer at a time). */
  private arm(): void {
    const at = this.core.nextDue();
    if (at === null) return;
    if (this.timer && this.timerAt <= at) return;
    if (this.timer) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => {
      this.timer = null;
      const plan = this.up() ? this.core.tick(now()) : emptyPlan();
      if (this.tracked && (plan.reads.length > 0 || plan.commands.length > 0)) void this.execute(this.tracked, plan);
      else this.arm();
    }, Math.max(0, at - now()));
    this.timer.unref?.();
  }
}

async function settle(p: Promise<Reply>): Promise<{ reply: Reply | undefined; error: unknown }> {
  try {
    return { reply: await p, error: undefined };
  } catch (error) {
    return { reply: undefined, error: error ?? new Error("unknown failure") };
  }
}

const watchers = new WeakMap<Endpoint, EndpointWatcher>();

/** Watches a hold of `owner` on `key` at `endpoint`: `onLost(cause, detail)` is called once
 *  when the server no longer has `owner` holding it (DEL, overwrite, another owner, the hold
 *  ended) or, for a bound hold, when `opts.boundConn` closes. Resolves once the watch is set up
 *  (or could not be: a server refusing tracking leaves the handle inert). */
export async function watchHold(
  endpoint: Endpoint,
  key: string,
  owner: string,
  opts: { boundConn?: Conn },
  onLost: (cause: LossCause, detail: string) => void,
): Promise<WatchHandle> {
  let w = watchers.get(endpoint);
  if (!w) {
    w = new EndpointWatcher(endpoint);
    watchers.set(endpoint, w);
  }
  const watcher = w;
  const bound = opts.boundConn;
  const reg = new Reg(key, owner, onLost, bound);
  if (bound) {
    bound.onClose(() => watcher.lost(reg, "connection-closed"));
  }
  if (!reg.cancelled) await watcher.add(reg);
  return {
    stop(): void {
      if (reg.cancelled) return;
      if (reg.done) {
        reg.cancelled = true;
        return;
      }
      watcher.remove(reg);
    },
  };
}

/** Test hook: the number of holds watched at `endpoint`. @internal */
export function watchedCount(endpoint: Endpoint): number {
  let n = 0;
  for (const list of watchers.get(endpoint)?.core.regs.values() ?? []) n += list.length;
  return n;
}
