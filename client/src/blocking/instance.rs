//! Redis servers with the lock module, their connections, and how one request reaches all of
//! them at once.
//!
//! # Connections
//!
//! Every server has two small pools of idle connections: one for *short* commands (extend,
//! release, try-acquire: the server answers at once) and one for *blocking* requests (an acquire
//! with `WAIT`, answered when granted or when the wait is over). A request takes a connection
//! out of its pool, or opens one when the pool is empty (another thread is using it), and puts
//! it back once the reply has been read. The pools' mutexes are only held to take or return a
//! connection, never across I/O, so no request ever queues behind another one: in particular a
//! lease's extend or release never waits for a blocking wait on the same client. In the common
//! case (one request at a time) that is one short-command connection, plus one more per
//! concurrent blocking wait. A bound hold's connections (see [`crate::bound`]) are not pooled:
//! each belongs to one guard; [`exchange`] runs a request over either kind ([`Wire`]).
//!
//! # Timeouts
//!
//! Connecting, authenticating and every short reply are bounded by the server's timeout. A
//! blocking request's reply is bounded by its wait plus the timeout plus [`WAIT_REPLY_MARGIN`],
//! so that a read timeout never cuts a wait short (a cut wait would drop the connection, and a
//! grant made just before would be lost until its ttl).
//!
//! # Requests to several servers
//!
//! A request to N servers is scatter-gather on blocking sockets: the command is written to every
//! connection first, then each reply is read against one shared deadline. So the servers work
//! in parallel, a paused or dead server costs at most one timeout in total however many there
//! are, and no thread is spawned per request. Only (re)connecting several servers at once uses
//! threads, since connecting blocks.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::slots::WaitSlots;
use super::watch::{Target as WatchTarget, WatchLink};
use crate::proto::reply::{error_outcome, unreachable, NO_REPLY, WAIT_REPLY_MARGIN};
use crate::DEFAULT_WAIT_CONNECTIONS;
use crate::{LockError, Outcome};
use redis::{Client, Cmd, Connection, ConnectionInfo, ConnectionLike, IntoConnectionInfo, Value};
use std::sync::Arc;

/// Which pool a request draws its connection from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Answered at once: extend, release, an acquire without `WAIT`.
    Short,
    /// May block on the server for a while: an acquire with `WAIT`.
    Blocking,
}

/// Idle connections kept per pool and server; more are closed when they come back (they were
/// only needed while that many requests ran at once).
const MAX_IDLE: usize = 4;

/// One server. Connections are opened on demand, pooled while idle, and dropped after any I/O
/// failure (one may still carry a late reply); an I/O failure also closes the server's idle
/// connections, which are likely dead as well (a restarted server).
pub(crate) struct Instance {
    name: String,
    client: Client,
    /// AUTH and SELECT, sent by us once the socket timeouts are set (the crate would send them
    /// during its setup, where no read timeout applies yet).
    username: Option<String>,
    password: Option<String>,
    db: i64,
    timeout: Duration,
    /// Idle connections for short commands.
    short: Mutex<Vec<Connection>>,
    /// Idle connections for blocking requests.
    blocking: Mutex<Vec<Connection>>,
    /// The cap on connections for waits ([`crate::LockClient::max_wait_connections`]).
    pub(crate) wait_slots: WaitSlots,
    /// The short-command link with its loss watcher (see [`super::watch`]).
    pub(crate) link: Arc<WatchLink>,
}

impl Instance {
    /// `url` as for the `redis` crate (`redis://[user:password@]host:port/db`); `timeout`
    /// bounds connecting, authenticating and each reply (a blocking request's reply also gets
    /// its wait). Fails only on a malformed URL: the server is contacted on first use.
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self, LockError> {
        let info = url.into_connection_info().map_err(|e| LockError::Config {
            reason: format!("{url:?} is not a Redis URL: {e}"),
        })?;
        Self::from_info(info, timeout)
    }

    /// The same from parsed connection settings (as a `redis::Client` holds them).
    pub(crate) fn from_info(info: ConnectionInfo, timeout: Duration) -> Result<Self, LockError> {
        let settings = info.redis_settings();
        let username = settings.username().map(str::to_owned);
        let password = settings.password().map(str::to_owned);
        let db = settings.db();
        let name = format!("{}", info.addr());
        let link = Arc::new(WatchLink::new(WatchTarget {
            addr: info.addr().clone(),
            user: username.clone(),
            password: password.clone(),
            db,
            timeout: crate::proto::reply::usable_timeout(timeout),
        }));
        // Login and database are left to `connect`; no CLIENT SETINFO is sent.
        let settings = redis::RedisConnectionInfo::default()
            .set_protocol(settings.protocol())
            .set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        Ok(Instance {
            name,
            client: Client::open(info).map_err(|e| LockError::Config {
                reason: e.to_string(),
            })?,
            username,
            password,
            db,
            timeout: crate::proto::reply::usable_timeout(timeout),
            short: Mutex::new(Vec::new()),
            blocking: Mutex::new(Vec::new()),
            wait_slots: WaitSlots::new(DEFAULT_WAIT_CONNECTIONS),
            link,
        })
    }

    /// `host:port` of the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bounds connecting and each reply.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the server listens.
    pub(crate) fn addr(&self) -> &redis::ConnectionAddr {
        self.client.get_connection_info().addr()
    }

    /// The AUTH (user, password) and SELECT (db) a new connection sends.
    pub(crate) fn login(&self) -> (Option<&str>, Option<&str>, i64) {
        (self.username.as_deref(), self.password.as_deref(), self.db)
    }

    /// Opens a connection with every step bounded by the timeout.
    pub(crate) fn connect(&self) -> redis::RedisResult<Connection> {
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

    fn pool(&self, kind: Kind) -> MutexGuard<'_, Vec<Connection>> {
        let pool = match kind {
            Kind::Short => &self.short,
            Kind::Blocking => &self.blocking,
        };
        pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle connection of this kind, if there is one (the pool's lock is released at once).
    fn take(&self, kind: Kind) -> Option<Connection> {
        self.pool(kind).pop()
    }

    /// Returns a connection whose reply has been read in full.
    fn put_back(&self, kind: Kind, conn: Connection) {
        let mut pool = self.pool(kind);
        if conn.is_open() && pool.len() < MAX_IDLE {
            pool.push(conn);
        }
    }

    /// After an I/O failure: the idle connections are probably dead too.
    fn forget_idle(&self) {
        let idle: Vec<Connection> = [Kind::Short, Kind::Blocking]
            .into_iter()
            .flat_map(|k| std::mem::take(&mut *self.pool(k)))
            .collect();
        drop(idle); // closed outside the pools' locks
    }
}

fn is_io(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// A connection one request at a time can use: a pooled [`Connection`], or a bound hold's
/// dedicated connection ([`crate::bound::BoundLink`]).
pub(crate) trait Wire: Send + Sized {
    /// Opens one to `instance` (every step bounded by its timeout); the error's text otherwise.
    fn open(instance: &Instance) -> Result<Self, String>;
    /// Writes a packed command. After an error the connection is not used again.
    fn send(&mut self, packed: &[u8]) -> Result<(), String>;
    /// Reads one reply, waiting at most `timeout` (`None`: no limit). An error reply is
    /// `Ok(Value::ServerError)` or `Err(Refused)`; the flag says whether the connection can still
    /// carry requests after the error.
    fn recv(&mut self, timeout: Option<Duration>) -> Result<Value, (Outcome, bool)>;
}

impl Wire for Connection {
    fn open(instance: &Instance) -> Result<Self, String> {
        instance.connect().map_err(|e| e.to_string())
    }

    fn send(&mut self, packed: &[u8]) -> Result<(), String> {
        self.send_packed_command(packed).map_err(|e| e.to_string())
    }

    fn recv(&mut self, timeout: Option<Duration>) -> Result<Value, (Outcome, bool)> {
        // After any failure the connection is dropped: it may still carry a late reply.
        self.set_read_timeout(timeout)
            .and_then(|_| self.recv_response())
            .map_err(|e| {
                if is_io(&e) {
                    (unreachable(&e), false)
                } else {
                    (error_outcome(&e), false)
                }
            })
    }
}

/// Short commands (answered at once): over each server's link where it is up (pipelined with
/// the other threads' commands, and watched for losses), else over pooled connections; each
/// reply within the server's timeout. With `enough`, the answer comes once that many servers
/// replied over their links (any reply), without waiting for a slower one.
pub(crate) fn short_commands(
    instances: &[Instance],
    cmds: &[Option<Cmd>],
    enough: Option<usize>,
) -> Vec<Result<Value, Outcome>> {
    // One timeout for every reply, counted from the sending (as on the pooled connections).
    let timeout = instances.first().map_or(Duration::ZERO, |i| i.timeout);
    let deadline = Instant::now() + timeout;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut on_link = vec![false; cmds.len()];
    let mut on_pool: Vec<Option<Cmd>> = Vec::with_capacity(cmds.len());
    for (i, (instance, cmd)) in instances.iter().zip(cmds).enumerate() {
        let sent = cmd.as_ref().is_some_and(|c| instance.link.send(c, i, &tx));
        on_pool.push(if sent { None } else { cmd.clone() });
        if let Some(slot) = on_link.get_mut(i) {
            *slot = sent;
        }
    }
    drop(tx);
    let mut results = if on_pool.iter().any(Option::is_some) {
        pooled(instances, &on_pool, Kind::Short, None)
    } else {
        (0..cmds.len())
            .map(|_| Err(Outcome::Unreachable("not sent".into())))
            .collect()
    };
    let mut waiting = on_link.iter().filter(|l| **l).count();
    let mut replied = results.iter().filter(|r| r.is_ok()).count();
    for (i, sent) in on_link.iter().enumerate() {
        if *sent {
            if let Some(r) = results.get_mut(i) {
                *r = Err(Outcome::Unreachable(NO_REPLY.into()));
            }
        }
    }
    while waiting > 0 && enough.is_none_or(|n| replied < n) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((i, reply)) = rx.recv_timeout(left) else {
            break;
        };
        waiting -= 1;
        if reply.is_ok() {
            replied += 1;
        }
        if let Some(r) = results.get_mut(i) {
            *r = reply;
        }
    }
    results
}

/// Sends `cmds[i]` to `instances[i]` (where it is `Some`) for every i at once and collects the
/// replies. `wait` is the server-side WAIT of a blocking request (`None` for a short command):
/// the connections then come from the blocking pools and the reply deadline is lengthened by
/// the wait and [`WAIT_REPLY_MARGIN`]. An instance without a command gets
/// `Err(Unreachable("not sent"))`.
pub(crate) fn scatter_gather(
    instances: &[Instance],
    cmds: &[Option<Cmd>],
    wait: Option<Duration>,
) -> Vec<Result<Value, Outcome>> {
    if wait.is_none() {
        return short_commands(instances, cmds, None);
    }
    pooled(instances, cmds, Kind::Blocking, wait)
}

/// The commands over pooled connections of `kind`.
fn pooled(
    instances: &[Instance],
    cmds: &[Option<Cmd>],
    kind: Kind,
    wait: Option<Duration>,
) -> Vec<Result<Value, Outcome>> {
    // Connections owned by this request alone: nobody else waits for them, and we wait for
    // nobody.
    let mut conns: Vec<Option<Connection>> = instances
        .iter()
        .zip(cmds)
        .map(|(i, c)| c.as_ref().and_then(|_| i.take(kind)))
        .collect();
    let results = exchange(instances, &mut conns, cmds, wait);
    // What is left was read in full: clean, ready for the next request.
    for (i, conn) in instances.iter().zip(conns) {
        if let Some(conn) = conn {
            i.put_back(kind, conn);
        }
    }
    results
}

/// The body of a request to several servers, on connections of any [`Wire`] kind: opens the
/// missing connections (in parallel when more than one is missing), writes every command, then
/// reads each reply against one shared deadline (see [`scatter_gather`] for `wait`). On return,
/// `conns[i]` holds the connections that can carry another request (the others are dropped);
/// an instance whose command is `None` is not touched.
pub(crate) fn exchange<W: Wire>(
    instances: &[Instance],
    conns: &mut [Option<W>],
    cmds: &[Option<Cmd>],
    wait: Option<Duration>,
) -> Vec<Result<Value, Outcome>> {
    let mut results: Vec<Option<Result<Value, Outcome>>> = cmds
        .iter()
        .map(|c| match c {
            Some(_) => None,
            None => Some(Err(Outcome::Unreachable("not sent".into()))),
        })
        .collect();

    // Connect what is not connected, in parallel when more than one needs it.
    let needs = |slot: &Option<W>, result: &Option<Result<Value, Outcome>>| {
        slot.is_none() && result.is_none()
    };
    let missing = conns
        .iter()
        .zip(&results)
        .filter(|(c, r)| needs(c, r))
        .count();
    let connect = |i: &Instance, slot: &mut Option<W>| -> Option<Outcome> {
        match W::open(i) {
            Ok(c) => {
                *slot = Some(c);
                None
            }
            Err(e) => {
                i.forget_idle();
                Some(Outcome::Unreachable(e))
            }
        }
    };
    let failures: Vec<Option<Outcome>> = if missing > 1 {
        std::thread::scope(|s| {
            let handles: Vec<_> = instances
                .iter()
                .zip(conns.iter_mut())
                .zip(&results)
                .map(|((i, slot), result)| {
                    let todo = needs(slot, result);
                    s.spawn(move || if todo { connect(i, slot) } else { None })
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
            .zip(conns.iter_mut())
            .zip(&results)
            .map(|((i, slot), result)| {
                if needs(slot, result) {
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
    for (((i, slot), cmd), result) in instances
        .iter()
        .zip(conns.iter_mut())
        .zip(cmds)
        .zip(results.iter_mut())
    {
        if result.is_some() {
            continue;
        }
        let (Some(conn), Some(cmd)) = (slot.as_mut(), cmd) else {
            *result = Some(Err(Outcome::Unreachable("no connection".into())));
            continue;
        };
        if let Err(e) = conn.send(&cmd.get_packed_command()) {
            *slot = None;
            i.forget_idle();
            *result = Some(Err(Outcome::Unreachable(e)));
        }
    }

    // Gather, against one deadline for all. `None`: a wait too long to add to a clock, read
    // without a time limit (the server's WAIT ends it).
    let bound = instances.first().map_or(Duration::ZERO, |i| i.timeout);
    let bound = match wait {
        None => Some(bound),
        Some(w) => w
            .checked_add(bound)
            .and_then(|b| b.checked_add(WAIT_REPLY_MARGIN)),
    };
    let deadline = bound.and_then(|b| Instant::now().checked_add(b));
    for ((i, slot), result) in instances
        .iter()
        .zip(conns.iter_mut())
        .zip(results.iter_mut())
    {
        if result.is_some() {
            continue;
        }
        let Some(conn) = slot.as_mut() else {
            *result = Some(Err(Outcome::Unreachable("no connection".into())));
            continue;
        };
        let left = deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        *result = Some(match conn.recv(left) {
            Ok(Value::ServerError(e)) => Err(Outcome::from_error_text(format!(
                "{} {}",
                e.code(),
                e.details().unwrap_or("")
            ))),
            Ok(v) => Ok(v),
            Err((outcome, usable)) => {
                if !usable {
                    *slot = None;
                }
                if matches!(outcome, Outcome::Unreachable(_)) {
                    i.forget_idle();
                }
                Err(outcome)
            }
        });
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Outcome::Unreachable("not sent".into()))))
        .collect()
}
