//! Blocked waiters: a blocking request on its own connection and thread, and RESP written by
//! hand for connections that are dropped without reading their reply.

use std::io::Write;
use std::thread::{self, JoinHandle};

use redis::{Connection, RedisResult, Value};

use crate::{query, wait_until, waiting, Server};

/// A blocking request (`LOCK.ACQUIRE` / `LOCK.RWREAD ... WAIT t`) running on its own
/// connection in its own thread.
pub struct Waiter {
    handle: JoinHandle<RedisResult<Value>>,
    words: Vec<String>,
}

impl Waiter {
    /// The reply, once it comes.
    pub fn join(self) -> RedisResult<Value> {
        join(self.handle)
    }

    /// The reply as a token, panicking with the reply if it was not an integer.
    pub fn token(self) -> i64 {
        match join(self.handle) {
            Ok(Value::Int(t)) => t,
            other => panic!("{:?}: expected a token, got {other:?}", self.words),
        }
    }

    /// Has the reply come?
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

fn join(handle: JoinHandle<RedisResult<Value>>) -> RedisResult<Value> {
    handle.join().expect("waiter thread panicked")
}

/// Sends `words` (a blocking request whose key is `words[1]`) on a new connection in a new
/// thread, then waits, watching through `observer`, until `LOCK.INFO` of the key shows
/// `expect_waiting` waiters.
pub fn spawn_waiter(
    server: &Server,
    observer: &mut Connection,
    words: &[&str],
    expect_waiting: i64,
) -> Waiter {
    spawn_waiter_in(server, observer, "0", words, expect_waiting)
}

/// [`spawn_waiter`] in database `db`: the request's connection selects it first (the
/// observer must already be in that database).
pub fn spawn_waiter_in(
    server: &Server,
    observer: &mut Connection,
    db: &str,
    words: &[&str],
    expect_waiting: i64,
) -> Waiter {
    let mut conn = server.client();
    if let Err(e) = query(&mut conn, &["SELECT", db]) {
        panic!("SELECT {db}: {e:?}");
    }
    let words: Vec<String> = words.iter().map(|s| s.to_string()).collect();
    let key = words[1].clone();
    let sent = words.clone();
    let handle = thread::spawn(move || {
        let refs: Vec<&str> = sent.iter().map(|s| s.as_str()).collect();
        query(&mut conn, &refs)
    });
    wait_until(&format!("waiter queued on {key} in db {db}"), || {
        waiting(observer, &key) == expect_waiting
    });
    Waiter { handle, words }
}

/// `words` as one RESP array of bulk strings.
pub fn resp(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Writes `words` as one RESP command in a single write, without reading any reply: for
/// connections a test drops while the command blocks, or many it leaves blocked.
pub fn send_raw(stream: &mut impl Write, words: &[&str]) -> std::io::Result<()> {
    stream.write_all(&resp(words))
}

#[cfg(test)]
mod tests {
    use super::resp;

    #[test]
    fn encodes_a_resp_array_of_bulk_strings() {
        assert_eq!(
            resp(&["LOCK.ACQUIRE", "leak:held", "d1-2", "1000", "WAIT", "0"]),
            b"*6\r\n$12\r\nLOCK.ACQUIRE\r\n$9\r\nleak:held\r\n$4\r\nd1-2\r\n$4\r\n1000\r\n\
              $4\r\nWAIT\r\n$1\r\n0\r\n"
                .to_vec()
        );
    }
}
