//! Redis servers with the lock module, and how one request reaches all of them at once.
//!
//! A request to N servers is scatter-gather on blocking sockets: the command is written to every
//! connection first, then each reply is read against one shared deadline. So the servers work
//! in parallel, a paused or dead server costs at most one timeout in total however many there
//! are, and no thread is spawned per request. Only (re)connecting several servers at once uses
//! threads, since connecting blocks.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, IntoConnectionInfo, Value};

/// What one server answered to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Granted (or done), with this server's fencing token where there is one (0 otherwise).
    Granted(u64),
    /// Held by someone else (the command replied nil).
    Held,
    /// The server answered with an error (NOTOWNER, DEADLOCK, WRONGTYPE, ...).
    Refused(String),
    /// No answer: connection refused, reset or timed out.
    Unreachable(String),
}

/// One server. Its connection is opened on first use and dropped after any I/O failure (it may
/// still carry a late reply), to be reopened by the next request.
pub struct Instance {
    name: String,
    client: Client,
    /// AUTH and SELECT, sent by us once the socket timeouts are set (the crate would send them
    /// during its setup, where no read timeout applies yet).
    username: Option<String>,
    password: Option<String>,
    db: i64,
    timeout: Duration,
    conn: Mutex<Option<Connection>>,
}

impl Instance {
    /// `url` as for the `redis` crate (`redis://[user:password@]host:port/db`); `timeout`
    /// bounds connecting, authenticating and each reply. Fails only on a malformed URL: the
    /// server is contacted on first use.
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        let mut info = url.into_connection_info()?;
        let username = info.redis.username.take();
        let password = info.redis.password.take();
        let db = std::mem::take(&mut info.redis.db);
        let name = format!("{}", info.addr);
        Ok(Instance {
            name,
            client: Client::open(info)?,
            username,
            password,
            db,
            timeout: timeout.max(Duration::from_millis(1)),
            conn: Mutex::new(None),
        })
    }

    /// `host:port` of the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens a connection with every step bounded by the timeout.
    fn connect(&self) -> redis::RedisResult<Connection> {
        let mut conn = self.client.get_connection_with_timeout(self.timeout)?;
        conn.set_read_timeout(Some(self.timeout))?;
        conn.set_write_timeout(Some(self.timeout))?;
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password).query::<()>(&mut conn)?;
        }
        if self.db != 0 {
            redis::cmd("SELECT").arg(self.db).query::<()>(&mut conn)?;
        }
        Ok(conn)
    }
}

fn lock_slot(i: &Instance) -> MutexGuard<'_, Option<Connection>> {
    i.conn.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_io(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// Sends `cmds[i]` to `instances[i]` for every i at once and collects the replies. `extra`
/// lengthens the deadline (a server-side WAIT).
pub(crate) fn scatter_gather(
    instances: &[Instance],
    cmds: &[Cmd],
    extra: Duration,
) -> Vec<Result<Value, Outcome>> {
    // Lock every connection in index order (the same order for every caller: no deadlock).
    let mut slots: Vec<MutexGuard<'_, Option<Connection>>> =
        instances.iter().map(lock_slot).collect();
    let mut results: Vec<Option<Result<Value, Outcome>>> = vec![None; instances.len()];

    // Connect what is not connected, in parallel when more than one needs it.
    let missing = slots.iter().filter(|s| s.is_none()).count();
    let connect = |i: &Instance, slot: &mut Option<Connection>| -> Option<Outcome> {
        match i.connect() {
            Ok(c) => {
                *slot = Some(c);
                None
            }
            Err(e) => Some(Outcome::Unreachable(e.to_string())),
        }
    };
    let failures: Vec<Option<Outcome>> = if missing > 1 {
        std::thread::scope(|s| {
            let handles: Vec<_> = instances
                .iter()
                .zip(slots.iter_mut().map(|guard| &mut **guard))
                .map(|(i, slot)| {
                    s.spawn(move || {
                        if slot.is_none() {
                            connect(i, slot)
                        } else {
                            None
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Some(Outcome::Unreachable("connect thread panicked".into()))
                    })
                })
                .collect()
        })
    } else {
        instances
            .iter()
            .zip(slots.iter_mut())
            .map(|(i, slot)| {
                if slot.is_none() {
                    connect(i, slot)
                } else {
                    None
                }
            })
            .collect()
    };
    for (result, failure) in results.iter_mut().zip(failures) {
        if let Some(f) = failure {
            *result = Some(Err(f));
        }
    }

    // Scatter.
    for ((slot, cmd), result) in slots.iter_mut().zip(cmds).zip(results.iter_mut()) {
        if result.is_some() {
            continue;
        }
        let Some(conn) = slot.as_mut() else {
            *result = Some(Err(Outcome::Unreachable("no connection".into())));
            continue;
        };
        if let Err(e) = conn.send_packed_command(&cmd.get_packed_command()) {
            **slot = None;
            *result = Some(Err(Outcome::Unreachable(e.to_string())));
        }
    }

    // Gather, against one deadline for all.
    let deadline = Instant::now() + instances.first().map_or(Duration::ZERO, |i| i.timeout) + extra;
    for (slot, result) in slots.iter_mut().zip(results.iter_mut()) {
        if result.is_some() {
            continue;
        }
        let Some(conn) = slot.as_mut() else {
            *result = Some(Err(Outcome::Unreachable("no connection".into())));
            continue;
        };
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let reply = conn
            .set_read_timeout(Some(left))
            .and_then(|_| conn.recv_response());
        *result = Some(match reply {
            Ok(Value::ServerError(e)) => Err(Outcome::Refused(format!(
                "{} {}",
                e.code(),
                e.details().unwrap_or("")
            ))),
            Ok(v) => Ok(v),
            Err(e) if is_io(&e) => {
                **slot = None;
                Err(Outcome::Unreachable(e.to_string()))
            }
            Err(e) => Err(Outcome::Refused(e.to_string())),
        });
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Outcome::Unreachable("not sent".into()))))
        .collect()
}

/// Milliseconds for a command argument: at least 1 (the module refuses 0).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
