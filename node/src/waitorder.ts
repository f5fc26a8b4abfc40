/**
 * Waits of this process on one key of one server join the server's queue in call order.
 *
 * Each wait goes over a connection of its own, and bytes written to two connections a moment
 * apart can reach the server in either order (the kernel may deliver the later one first, or
 * the server's event loop may read it first; seen once under heavy load: 16 waits written a
 * turn of the event loop apart were queued 0, 1, 4, 2, 3, …). So a wait on a key is written
 * only once the previous wait of this process on that key is known to be in the server's queue
 * (its owner is among the key's waiters or holders: `LOCK.INFO`), or has its answer, or cannot
 * be checked. A wait with no earlier one pending on its key is written at once and checked by
 * no one.
 * @internal
 */

/** What a wait's place in its key's line needs from the caller once it is written. */
interface Written {
  /** Settles when the wait's answer (or error) is read. */
  readonly reply: Promise<unknown>;
  /** Whether the server has the wait queued (or granted); throws when that cannot be told. */
  readonly inQueue: () => Promise<boolean>;
}

/** The longest pause between two checks of an earlier wait that is not in the queue yet, in ms. */
const MAX_CHECK_PAUSE_MS = 20;

class Place {
  /** The previous wait on the key, until this one has waited for it. */
  prev: Place | undefined;
  private writtenResolve!: (w: Written | null) => void;
  private readonly written: Promise<Written | null>;
  private queuedOnce: Promise<void> | undefined;
  /** The wait has its connection and is about to be written (it called `before`). */
  ready = false;
  private over = false;

  constructor(
    prev: Place | undefined,
    private readonly onOver: (p: Place) => void,
  ) {
    this.prev = prev;
    this.written = new Promise((resolve) => {
      this.writtenResolve = resolve;
    });
  }

  /** Settles once this wait is in the server's queue, holds, has its answer, was never
   *  written, or cannot be checked: the next wait on the key may be written then. */
  queued(): Promise<void> {
    this.queuedOnce ??= this.written.then((w) => (w === null ? undefined : confirmQueued(w)));
    return this.queuedOnce;
  }

  sent(w: Written): void {
    if (this.over) return;
    this.writtenResolve(w);
    const done = (): void => this.finish();
    w.reply.then(done, done);
  }

  dropped(): void {
    if (this.over) return;
    this.writtenResolve(null);
    this.finish();
  }

  private finish(): void {
    if (this.over) return;
    this.over = true;
    this.prev = undefined;
    this.onOver(this);
  }
}

async function confirmQueued(w: Written): Promise<void> {
  let answered = false;
  const replied = w.reply.then(
    () => {
      answered = true;
    },
    () => {
      answered = true;
    },
  );
  let pause = 0;
  while (!answered) {
    let yes: boolean;
    try {
      yes = await Promise.race([w.inQueue(), replied.then(() => true)]);
    } catch {
      return; // cannot be told: hold no one up
    }
    if (yes || answered) return;
    pause = Math.min(pause === 0 ? 1 : pause * 2, MAX_CHECK_PAUSE_MS);
    await Promise.race([new Promise<void>((r) => setTimeout(r, pause).unref?.()), replied]);
  }
}

/** One wait's place in the line of its key: {@link WaitLines.join}. */
export interface WaitTurn {
  /**
   * Called once the wait has its connection, right before writing it: settles once every
   * earlier wait of this process on the key is in the server's queue (or holds, or is over),
   * or after `ms` (Infinity: no limit), or when `signal` fires, whichever is first; at once
   * when the previous wait has no connection yet. Never rejects: the caller looks at the
   * signal itself.
   */
  before(ms: number, signal?: AbortSignal): Promise<void>;
  /** The wait was written; `reply` settles with its answer. */
  sent(reply: Promise<unknown>, inQueue: () => Promise<boolean>): void;
  /** The wait ends without having been written (or has finished): a no-op once sent. */
  dropped(): void;
}

/** The lines of waits of one process, per server and key. */
export class WaitLines {
  private readonly last = new Map<string, Place>();

  /** Takes the next place on `key` of `server`: call in call order, before any await. */
  join(server: string, key: string): WaitTurn {
    const id = `${server}\n${key}`;
    const place = new Place(this.last.get(id), (p) => {
      if (this.last.get(id) === p) this.last.delete(id);
    });
    this.last.set(id, place);
    return {
      before: (ms, signal) => waitFor(place, ms, signal),
      sent: (reply, inQueue) => place.sent({ reply, inQueue }),
      dropped: () => place.dropped(),
    };
  }

  /** How many keys have a wait pending (tests: nothing is left behind). */
  get size(): number {
    return this.last.size;
  }
}

function waitFor(place: Place, ms: number, signal: AbortSignal | undefined): Promise<void> {
  const prev = place.prev;
  place.prev = undefined;
  place.ready = true;
  // A previous wait still waiting for a connection holds no one up: wait connections are
  // handed over in call order, so only a wait that does not need one (a bound acquire's) can
  // be ready first, and the connections may all be held by waits that it must not wait for.
  if (prev === undefined || !prev.ready || signal?.aborted) return Promise.resolve();
  return new Promise<void>((resolve) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const done = (): void => {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    if (Number.isFinite(ms)) timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
    void prev.queued().then(done);
  });
}
