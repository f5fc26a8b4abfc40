// STAND-IN (library branch `nlib` only): a throwaway copy of the driver interface from
// /work/notes/NODE-DESIGN-26.md, so the library compiles and its tests run. The driver
// helper's real `node/src/driver/types.ts` replaces this file at merge (drop this one).

/** A command argument. */
export type Arg = string | Buffer;
/** A reply, normalised: integers bigint, strings utf8, nil null, arrays arrays (RESP2). */
export type Reply = null | bigint | string | Reply[];

/** The server answered with an error reply (message without the leading '-'). */
export class ServerReplyError extends Error {
  /** The first word of the message ("NOTOWNER", "ERR", "MOVED", ...). */
  readonly code: string;
  constructor(message: string) {
    super(message);
    this.name = "ServerReplyError";
    this.code = message.split(" ", 1)[0] ?? "";
  }
}
/** The connection failed, closed or was destroyed before the reply arrived. */
export class ConnectionLostError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConnectionLostError";
  }
}
/** No reply within the deadline given to send(). */
export class ReplyTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ReplyTimeoutError";
  }
}

/** One connection of ours. */
export interface Conn {
  readonly server: string;
  send(args: Arg[], deadlineMs?: number): Promise<Reply>;
  destroy(): void;
  readonly closed: boolean;
  onClose(cb: (why: string) => void): void;
}

/** One Redis server reached through a user's client. */
export interface Endpoint {
  readonly name: string;
  command(): Promise<Conn>;
  acquireWaitConn(signal?: AbortSignal): Promise<Conn>;
  releaseWaitConn(conn: Conn): void;
  close(): Promise<void>;
}

/** What a user handed to new Redlock(...). */
export interface Target {
  readonly name: string;
  endpointFor(key: string): Promise<Endpoint>;
  rerouted(key: string, err: ServerReplyError): Promise<void>;
  readonly isCluster: boolean;
  readonly client: unknown;
  quitUserClient(): Promise<void>;
  close(): Promise<void>;
}
