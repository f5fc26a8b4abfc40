/**
 * Replies and the errors of talking to a server, as the core reads them: plain values and
 * error classes with no I/O, shared by the core (which interprets replies) and the driver
 * (which produces them).
 */

/** One argument of a command. */
export type Arg = string | Buffer;

/** A reply, normalised: integers are always bigint; simple and bulk strings are string (utf8);
 *  nil is null; arrays are arrays (RESP2 flat key/value arrays for maps: our connections speak
 *  RESP2). An error inside an array (an `EXEC` reply) is a {@link ServerReplyError}. */
export type Reply = null | bigint | string | Reply[] | ServerReplyError;

/**
 * `message` as a sentence, so that every error of the package prints as `Name: Sentence.`
 * whatever wording it was built from (a server's error reply, a client library's message, our
 * own): trailing blanks dropped, a first word in lower case capitalised (a code name such as
 * `info()` or `maxWaitConnections` is left as it is), a full stop added when the text does not
 * end a sentence.
 */
export function sentence(message: string): string {
  let m = String(message).trimEnd();
  if (m === "") return "Unknown error.";
  if (/^[a-z]+(?=[\s,:;]|$)/.test(m)) m = m.charAt(0).toUpperCase() + m.slice(1);
  return /[.!?]$/.test(m) ? m : `${m}.`;
}

/** The server answered with an error reply (message without the leading '-'), e.g. "NOTOWNER ...". */
export class ServerReplyError extends Error {
  /** The first word of the message, e.g. "NOTOWNER", "WRONGTYPE", "MOVED", "ERR". */
  readonly code: string;
  constructor(message: string) {
    super(message);
    this.name = "ServerReplyError";
    const space = message.indexOf(" ");
    this.code = space < 0 ? message : message.slice(0, space);
  }
}

/** The connection failed, closed or was destroyed before the reply arrived (the request's fate is unknown). */
export class ConnectionLostError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(sentence(message), options);
    this.name = "ConnectionLostError";
  }
}

/** No reply within the deadline given to send(). */
export class ReplyTimeoutError extends Error {
  constructor(message: string) {
    super(sentence(message));
    this.name = "ReplyTimeoutError";
  }
}

/** An integer reply that a client library delivered as a JavaScript number outside
 *  `Number.isSafeInteger` (node-redis v4 has no way to read integers exactly): it may have been
 *  rounded, so it is refused rather than used. (Added to the design's interface.) */
export class UnsafeIntegerReplyError extends Error {
  /** The number as received (possibly rounded). */
  readonly received: number;
  constructor(received: number) {
    super(`The server's integer reply ${received} was read as an inexact JavaScript number (above 2^53 - 1); refused rather than rounded.`);
    this.name = "UnsafeIntegerReplyError";
    this.received = received;
  }
}

/** The user's client is not one this package can drive. */
export class UnsupportedClientError extends TypeError {
  constructor(message: string) {
    super(sentence(message));
    this.name = "UnsupportedClientError";
  }
}

/** Whether an error reply asks the request to be sent where the key lives now. */
export function isRedirect(err: unknown): err is ServerReplyError {
  return (
    err instanceof ServerReplyError &&
    (err.code === "MOVED" || err.code === "ASK" || err.code === "TRYAGAIN" || err.code === "CLUSTERDOWN")
  );
}
