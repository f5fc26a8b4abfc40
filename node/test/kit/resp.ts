// A minimal RESP2 connection for the kit's own checks (PING, LOCK.INFO, INFO, CLUSTER ...):
// independent of the clients under test, and exact: integers are read as bigint.
import { Socket, createConnection } from "node:net";

/** A RESP2 reply: integers as bigint, strings as utf8, nil as null. */
export type RespValue = null | bigint | string | RespValue[];

/** An error reply (`-ERR ...`), message without the leading '-'. */
export class RespError extends Error {
  override readonly name = "RespError";
}

interface Pending {
  resolve(v: RespValue): void;
  reject(e: Error): void;
}

/** Encodes a command as a RESP array of bulk strings. */
export function encode(args: ReadonlyArray<string | number | bigint | Buffer>): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const a of args) {
    const b = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from("\r\n"));
  }
  return Buffer.concat(parts);
}

/** Parses one reply from `buf` at `pos`; returns it and the next position, or null when incomplete. */
export function parseReply(buf: Buffer, pos: number): { value: RespValue | RespError; next: number } | null {
  const eol = buf.indexOf("\r\n", pos);
  if (eol < 0) return null;
  const type = String.fromCharCode(buf[pos] ?? 0);
  const line = buf.toString("utf8", pos + 1, eol);
  const after = eol + 2;
  switch (type) {
    case "+":
      return { value: line, next: after };
    case "-":
      return { value: new RespError(line), next: after };
    case ":":
      return { value: BigInt(line), next: after };
    case "$": {
      const n = Number(line);
      if (n < 0) return { value: null, next: after };
      if (buf.length < after + n + 2) return null;
      return { value: buf.toString("utf8", after, after + n), next: after + n + 2 };
    }
    case "*": {
      const n = Number(line);
      if (n < 0) return { value: null, next: after };
      const items: RespValue[] = [];
      let p = after;
      for (let i = 0; i < n; i++) {
        const r = parseReply(buf, p);
        if (r === null) return null;
        // An error inside an array (EXEC) is kept as its text.
        items.push(r.value instanceof RespError ? `-${r.value.message}` : r.value);
        p = r.next;
      }
      return { value: items, next: p };
    }
    default:
      throw new Error(`RESP: unexpected type byte ${JSON.stringify(type)}`);
  }
}

/** One RESP2 connection to 127.0.0.1:port; commands are pipelined, replies matched in order. */
export class RespConn {
  private readonly socket: Socket;
  private buf: Buffer = Buffer.alloc(0);
  private readonly pending: Pending[] = [];
  private ended: Error | null = null;
  readonly ready: Promise<void>;

  constructor(readonly port: number, readonly host = "127.0.0.1") {
    this.socket = createConnection({ port, host });
    this.socket.setNoDelay(true);
    this.ready = new Promise((resolve, reject) => {
      this.socket.once("connect", () => resolve());
      this.socket.once("error", reject);
    });
    // The ready promise may be rejected with no one awaiting it yet.
    this.ready.catch(() => undefined);
    this.socket.on("data", (d: Buffer) => this.onData(d));
    this.socket.on("error", (e) => this.fail(e));
    this.socket.on("close", () => this.fail(new Error(`connection to ${host}:${port} closed`)));
  }

  private onData(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    let pos = 0;
    for (;;) {
      const r = parseReply(this.buf, pos);
      if (r === null) break;
      pos = r.next;
      const p = this.pending.shift();
      if (p === undefined) continue;
      if (r.value instanceof RespError) p.reject(r.value);
      else p.resolve(r.value);
    }
    this.buf = this.buf.subarray(pos);
  }

  private fail(e: Error): void {
    if (this.ended === null) this.ended = e;
    for (const p of this.pending.splice(0)) p.reject(e);
  }

  get closed(): boolean {
    return this.ended !== null;
  }

  /** Sends one command; rejects with RespError for an error reply, or after `timeoutMs`
   *  (then the connection is destroyed: later replies would be out of step). */
  send(args: ReadonlyArray<string | number | bigint | Buffer>, timeoutMs = 10_000): Promise<RespValue> {
    if (this.ended !== null) return Promise.reject(this.ended);
    return new Promise<RespValue>((resolve, reject) => {
      const timer = setTimeout(() => {
        const e = new Error(`no reply to ${String(args[0])} from ${this.host}:${this.port} within ${timeoutMs} ms`);
        this.fail(e);
        this.socket.destroy();
      }, timeoutMs);
      timer.unref();
      this.pending.push({
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.socket.write(encode(args));
    });
  }

  close(): void {
    this.fail(new Error("closed"));
    this.socket.destroy();
  }
}

/** Opens a connection, sends one command, closes. */
export async function command(port: number, args: ReadonlyArray<string | number | bigint | Buffer>, timeoutMs = 10_000): Promise<RespValue> {
  const c = new RespConn(port);
  try {
    await c.ready;
    return await c.send(args, timeoutMs);
  } finally {
    c.close();
  }
}
